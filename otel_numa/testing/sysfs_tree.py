"""Builders of synthetic ``sys/`` and ``proc/`` trees, written in the kernel's own file formats.

Typical use::

    sysfs_root, procfs_root = write_machine(tmp_path, [
        NodeSpec(0, cpus=range(4), mem_total_kib=8 << 20, mem_free_kib=6 << 20, hugepages={2048: (512, 500)}),
        NodeSpec(1, cpus=range(4, 8), mem_total_kib=8 << 20, mem_free_kib=7 << 20),
    ])

The formats follow the kernel sources (drivers/base/node.c, drivers/base/cpu.c, fs/proc/meminfo.c,
fs/proc/stat.c, mm/hugetlb.c) and the hwloc snapshots under tests/fixtures/hwloc/. Tests that need a
broken tree write a correct one and then damage it (see :func:`write_file`, :func:`set_cpu_online`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Columns of a /proc/stat "cpuN" line: user nice system idle iowait irq softirq steal guest guest_nice
PROC_STAT_COLUMNS = 10

# The counters of nodeN/numastat, in the kernel's order
NUMASTAT_KEYS = ("numa_hit", "numa_miss", "numa_foreign", "interleave_hit", "local_node", "other_node")

DEFAULT_HUGEPAGE_KIB = 2048


@dataclass(frozen=True)
class NodeSpec:
    """One NUMA node as the kernel would show it. Memory in KiB (the unit of meminfo's ``kB``)."""

    id: int
    cpus: Collection[int] = ()
    mem_total_kib: int = 0
    mem_free_kib: int = 0
    mem_used_kib: int | None = None  # None: total - free, as the kernel computes it
    # page size in KiB -> (nr_hugepages, free_hugepages); only written when the node has memory
    hugepages: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    # nodeN/numastat values by the kernel's key; missing standard keys are written as 0. None: no file.
    numastat: Mapping[str, int] | None = field(default_factory=dict)
    # the distance row as written (one value per online node); None: 10 to itself, 20 to the others
    distances: Sequence[int] | None = None


def uniform_nodes(
    count: int,
    cpus_per_node: int,
    *,
    mem_total_kib: int = 16 << 20,
    mem_free_kib: int = 12 << 20,
    hugepages: Mapping[int, tuple[int, int]] | None = None,
) -> list[NodeSpec]:
    """``count`` nodes with consecutive CPU blocks (node i holds CPUs i*n .. i*n+n-1), e.g. 16 x 64."""
    return [
        NodeSpec(
            id=node_id,
            cpus=range(node_id * cpus_per_node, (node_id + 1) * cpus_per_node),
            mem_total_kib=mem_total_kib,
            mem_free_kib=mem_free_kib,
            hugepages=dict(hugepages or {}),
            numastat={"numa_hit": 1000 * (node_id + 1), "local_node": 900 * (node_id + 1)},
        )
        for node_id in range(count)
    ]


# --- formats -------------------------------------------------------------------------------------


def format_cpulist(cpus: Iterable[int]) -> str:
    """The kernel's ``%*pbl`` list: ``0-3,8,10-11`` (empty string for no CPU)."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    index = 0
    while index < len(ordered):
        end = index
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        ranges.append(str(ordered[index]) if end == index else f"{ordered[index]}-{ordered[end]}")
        index = end + 1
    return ",".join(ranges)


def format_cpumask(cpus: Iterable[int], nr_cpu_ids: int) -> str:
    """The kernel's ``%*pb`` mask over ``nr_cpu_ids`` bits: 32-bit hex words, most significant first,
    the first word only as wide as its bits need (48 CPUs: ``0000,0000003f``; 8 CPUs: ``ff``)."""
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    words = max((nr_cpu_ids + 31) // 32, 1)
    top_bits = nr_cpu_ids - 32 * (words - 1)
    chunks = [f"{(value >> (32 * word)) & 0xFFFFFFFF:08x}" for word in reversed(range(words))]
    chunks[0] = chunks[0][-max((top_bits + 3) // 4, 1) :]
    return ",".join(chunks)


def format_node_meminfo(
    node_id: int, fields: Sequence[tuple[str, int | None]], *, hugepage_counts: bool
) -> str:
    """``Node N Name:  value kB`` lines; ``None`` values are skipped, ``HugePages_*`` carry no unit."""
    lines = []
    for name, value in fields:
        if value is None:
            continue
        if hugepage_counts and name.startswith("HugePages_"):
            lines.append(f"Node {node_id} {name + ':':<16} {value:5d}")
        else:
            lines.append(f"Node {node_id} {name + ':':<15} {value:8d} kB")
    return "\n".join(lines) + "\n"


def format_proc_meminfo(fields: Sequence[tuple[str, int]]) -> str:
    """/proc/meminfo lines: ``MemTotal:       16384 kB``; ``HugePages_*`` are plain counts."""
    lines = []
    for name, value in fields:
        if name.startswith("HugePages_"):
            lines.append(f"{name + ':':<16}{value:8d}")
        else:
            lines.append(f"{name + ':':<16}{value:8d} kB")
    return "\n".join(lines) + "\n"


def default_cpu_ticks(cpu: int) -> tuple[int, ...]:
    """Plausible, distinct per-CPU /proc/stat ticks (all 10 columns) for tests that need any."""
    return (1000 + cpu, 10 + cpu, 500 + cpu, 100000 + cpu, 40 + cpu, 0, 7 + cpu, 0, 0, 0)


def format_proc_stat(ticks_by_cpu: Mapping[int, Sequence[int]]) -> str:
    """/proc/stat with the aggregate ``cpu`` line, one ``cpuN`` line per CPU and the usual trailer."""
    width = max((len(ticks) for ticks in ticks_by_cpu.values()), default=PROC_STAT_COLUMNS)
    totals = [0] * width
    for ticks in ticks_by_cpu.values():
        for column, tick in enumerate(ticks):
            totals[column] += tick
    lines = ["cpu  " + " ".join(map(str, totals))]
    lines += [f"cpu{cpu} " + " ".join(map(str, ticks)) for cpu, ticks in sorted(ticks_by_cpu.items())]
    lines += [
        "intr 12345 0 9 0 0",
        "ctxt 67890",
        "btime 1700000000",
        "processes 4242",
        "procs_running 1",
        "procs_blocked 0",
        "softirq 1000 0 100 0 200 0 0 300 0 0 400",
    ]
    return "\n".join(lines) + "\n"


# --- writing -------------------------------------------------------------------------------------


def write_file(path: Path, text: str) -> Path:
    """Write ``text`` to ``path``, creating its parents."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def _default_distance_row(node_id: int, online_nodes: Sequence[int]) -> list[int]:
    return [10 if other == node_id else 20 for other in online_nodes]


def _write_hugepage_pool(directory: Path, total: int, free: int) -> None:
    write_file(directory / "nr_hugepages", f"{total}\n")
    write_file(directory / "free_hugepages", f"{free}\n")
    write_file(directory / "surplus_hugepages", "0\n")


def _write_node(
    node_dir: Path,
    spec: NodeSpec,
    *,
    online_nodes: Sequence[int],
    nr_cpu_ids: int,
    cpu_files: Collection[str],
    hugepage_sizes: Collection[int],
    default_hugepage_kib: int,
    meminfo_blank_first_line: bool,
) -> None:
    node_dir.mkdir(parents=True, exist_ok=True)
    if "cpulist" in cpu_files:
        write_file(node_dir / "cpulist", format_cpulist(spec.cpus) + "\n")
    if "cpumap" in cpu_files:
        write_file(node_dir / "cpumap", format_cpumask(spec.cpus, nr_cpu_ids) + "\n")
    row = spec.distances if spec.distances is not None else _default_distance_row(spec.id, online_nodes)
    write_file(node_dir / "distance", " ".join(map(str, row)) + "\n")

    used = spec.mem_used_kib if spec.mem_used_kib is not None else spec.mem_total_kib - spec.mem_free_kib
    default_pool = spec.hugepages.get(default_hugepage_kib, (0, 0)) if spec.mem_total_kib else (0, 0)
    meminfo = format_node_meminfo(
        spec.id,
        [
            ("MemTotal", spec.mem_total_kib),
            ("MemFree", spec.mem_free_kib),
            ("MemUsed", used),
            ("Active", used // 2),
            ("Inactive", used // 4),
            ("Dirty", 0),
            ("FilePages", used // 4),
            ("AnonHugePages", 0),
            ("HugePages_Total", default_pool[0]),
            ("HugePages_Free", default_pool[1]),
            ("HugePages_Surp", 0),
        ],
        hugepage_counts=True,
    )
    write_file(node_dir / "meminfo", ("\n" if meminfo_blank_first_line else "") + meminfo)

    if spec.numastat is not None:
        values = {key: 0 for key in NUMASTAT_KEYS} | dict(spec.numastat)
        write_file(node_dir / "numastat", "".join(f"{key} {value}\n" for key, value in values.items()))

    if spec.mem_total_kib > 0:  # the kernel gives hugepage pools only to nodes with memory
        for size_kib in sorted(hugepage_sizes):
            total, free = spec.hugepages.get(size_kib, (0, 0))
            _write_hugepage_pool(node_dir / "hugepages" / f"hugepages-{size_kib}kB", total, free)


def _write_cpu_dir(
    cpu_dir: Path, possible: Sequence[int], online: Collection[int], *, online_file: bool, per_cpu: bool
) -> None:
    cpu_dir.mkdir(parents=True, exist_ok=True)
    for cpu in possible if per_cpu else ():
        (cpu_dir / f"cpu{cpu}").mkdir()
        # cpu0 usually cannot be unplugged and then has no "online" file at all
        if cpu != 0 or cpu not in online:
            (cpu_dir / f"cpu{cpu}" / "online").write_text("1\n" if cpu in online else "0\n")
    if online_file:
        write_file(cpu_dir / "online", format_cpulist(online) + "\n")
        write_file(cpu_dir / "offline", format_cpulist(set(possible) - set(online)) + "\n")
    write_file(cpu_dir / "possible", format_cpulist(possible) + "\n")
    write_file(cpu_dir / "present", format_cpulist(possible) + "\n")


def write_machine(
    root: Path,
    nodes: Sequence[NodeSpec],
    online_cpus: Iterable[int] | None = None,
    with_numa: bool = True,
    cpu_times: Mapping[int, Sequence[int]] | None = None,
    *,
    possible_cpus: Iterable[int] | None = None,
    online_nodes: Iterable[int] | None = None,
    cpu_online_file: bool = True,
    cpu_dirs: bool = True,
    node_cpu_files: Collection[str] = ("cpulist", "cpumap"),
    hugepage_sizes_kib: Collection[int] | None = None,
    global_hugepages: bool = True,
    meminfo_blank_first_line: bool = False,
) -> tuple[Path, Path]:
    """Write ``root/sys`` and ``root/proc`` for a machine made of ``nodes``; returns (sysfs, procfs) roots.

    - ``online_cpus``: default every CPU of every node; ``possible_cpus`` (the ``cpuN`` directories)
      default to those plus the online ones.
    - ``with_numa=False``: no ``devices/system/node`` (a kernel without NUMA); ``nodes`` still give
      the memory and hugepages, summed into /proc/meminfo and ``kernel/mm/hugepages``.
    - ``cpu_times``: /proc/stat ticks per CPU (columns as in :data:`PROC_STAT_COLUMNS`; a shorter
      sequence writes an older kernel's shorter line); default :func:`default_cpu_ticks` per online CPU.
    - ``cpu_online_file=False``: no ``devices/system/cpu/online``, only the ``cpuN/online`` files.
    - ``cpu_dirs=False``: no ``cpuN`` directories at all (much faster for thousands of CPUs; the
      readers only need them when ``cpu/online`` is absent).
    - ``node_cpu_files``: which of ``cpulist``/``cpumap`` each node gets.
    - ``hugepage_sizes_kib``: page sizes every node with memory has a pool for (default: the sizes the
      specs mention); ``global_hugepages=False`` leaves out ``kernel/mm/hugepages``.
    - ``meminfo_blank_first_line``: nodeN/meminfo starts with an empty line, as on 2.6 kernels.
    """
    sysfs_root, procfs_root = root / "sys", root / "proc"
    node_cpus = {cpu for spec in nodes for cpu in spec.cpus}
    online = set(online_cpus) if online_cpus is not None else set(node_cpus)
    possible = sorted(set(possible_cpus) if possible_cpus is not None else node_cpus | online)
    nr_cpu_ids = (max(possible) + 1) if possible else 1
    sizes = (
        set(hugepage_sizes_kib)
        if hugepage_sizes_kib is not None
        else {size for spec in nodes for size in spec.hugepages}
    )
    default_size = DEFAULT_HUGEPAGE_KIB if DEFAULT_HUGEPAGE_KIB in sizes or not sizes else min(sizes)

    if not (cpu_dirs or cpu_online_file):
        raise ValueError("without cpuN directories the online CPUs need devices/system/cpu/online")
    _write_cpu_dir(
        sysfs_root / "devices/system/cpu", possible, online, online_file=cpu_online_file, per_cpu=cpu_dirs
    )

    if with_numa:
        node_dir = sysfs_root / "devices/system/node"
        node_ids = sorted(spec.id for spec in nodes)
        online_node_ids = sorted(online_nodes) if online_nodes is not None else node_ids
        write_file(node_dir / "online", format_cpulist(online_node_ids) + "\n")
        write_file(node_dir / "possible", format_cpulist(set(online_node_ids) | set(node_ids)) + "\n")
        write_file(
            node_dir / "has_cpu", format_cpulist(spec.id for spec in nodes if set(spec.cpus) & online) + "\n"
        )
        write_file(
            node_dir / "has_memory", format_cpulist(spec.id for spec in nodes if spec.mem_total_kib) + "\n"
        )
        for spec in nodes:
            _write_node(
                node_dir / f"node{spec.id}",
                spec,
                online_nodes=online_node_ids,
                nr_cpu_ids=nr_cpu_ids,
                cpu_files=node_cpu_files,
                hugepage_sizes=sizes,
                default_hugepage_kib=default_size,
                meminfo_blank_first_line=meminfo_blank_first_line,
            )

    pools = {
        size: (
            sum(spec.hugepages.get(size, (0, 0))[0] for spec in nodes if spec.mem_total_kib),
            sum(spec.hugepages.get(size, (0, 0))[1] for spec in nodes if spec.mem_total_kib),
        )
        for size in sizes
    }
    if global_hugepages:
        for size, (total, free) in pools.items():
            _write_hugepage_pool(sysfs_root / "kernel/mm/hugepages" / f"hugepages-{size}kB", total, free)

    total_kib = sum(spec.mem_total_kib for spec in nodes)
    free_kib = sum(spec.mem_free_kib for spec in nodes)
    default_total, default_free = pools.get(default_size, (0, 0))
    write_file(
        procfs_root / "meminfo",
        format_proc_meminfo(
            [
                ("MemTotal", total_kib),
                ("MemFree", free_kib),
                ("MemAvailable", free_kib),
                ("Buffers", 0),
                ("Cached", (total_kib - free_kib) // 4),
                ("SwapTotal", 0),
                ("SwapFree", 0),
                ("AnonHugePages", 0),
                ("HugePages_Total", default_total),
                ("HugePages_Free", default_free),
                ("HugePages_Rsvd", 0),
                ("HugePages_Surp", 0),
                ("Hugepagesize", default_size),
                ("Hugetlb", sum(size * pool[0] for size, pool in pools.items())),
            ]
        ),
    )
    ticks = cpu_times if cpu_times is not None else {cpu: default_cpu_ticks(cpu) for cpu in sorted(online)}
    write_file(procfs_root / "stat", format_proc_stat(ticks))
    return sysfs_root, procfs_root


def set_cpu_online(sysfs_root: Path, cpu: int, online: bool) -> None:
    """Hot-plug one CPU the way the kernel shows it: ``cpuN/online`` and, when present, ``cpu/online``."""
    cpu_dir = sysfs_root / "devices/system/cpu"
    write_file(cpu_dir / f"cpu{cpu}" / "online", "1\n" if online else "0\n")
    online_path = cpu_dir / "online"
    if online_path.exists():
        current = _parse_list(online_path.read_text())
        updated = current | {cpu} if online else current - {cpu}
        online_path.write_text(format_cpulist(updated) + "\n")
        possible = _parse_list((cpu_dir / "possible").read_text())
        write_file(cpu_dir / "offline", format_cpulist(possible - updated) + "\n")


def _parse_list(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus
