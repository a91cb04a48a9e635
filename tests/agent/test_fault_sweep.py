"""One bad file costs exactly the numbers that depend on it: a fault sweep over real trees.

For every hwloc snapshot and the generated large node, files under ``devices/system/node``,
``devices/system/cpu``, ``/proc/stat``, ``/proc/meminfo`` and each kubelet checkpoint, and on the captured
H200 guest the PCI functions' files, the DRA checkpoint and a CDI spec, are made missing,
empty, garbage, truncated (cut inside a line) and a directory, one at a time. Each variant runs
``otel-numa --once`` through its command line and is compared with the clean run of the same tree:

- the agent exits 0;
- a series that does not depend on the broken file is exactly equal, and no series appears;
- a series that depends on it is absent or equal, never a different number;
- the error counter of the file's source moves (a missing file is never an error, and a file the agent does
  not read moves nothing); the other sources' counters and every stage's success stay as they were.

"Depends on" is :func:`cost_of`, written from the table "What a broken file costs" of
docs/decisions/collection.md, not from the code. Files are sampled deterministically: every kind of file
the agent reads (``nodeN/meminfo``, ``cpuN/online``, ...) twice per tree (once on the large node, whose
kinds are the snapshots' own), and three files per tree that it does not read. Each tree is a test of its
own.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from otel_numa.testing.fault_sweep import (
    SWEEP_SUMMARY,
    VARIANTS,
    Exposition,
    SeriesKey,
    Variant,
    changed,
    damage,
    files_under,
    parse,
    pick,
    run_once,
    write_devices_tree,
)
from otel_numa.testing.hwloc import extract_snapshot, snapshot_names
from otel_numa.testing.large_node import LargeNodeSpec, write_large_node
from otel_numa.testing.sysfs_tree import NodeSpec, write_machine
from tests.support import FIXTURES

SWEPT = ("sys/devices/system/node", "sys/devices/system/cpu", "proc/stat", "proc/meminfo")
KUBELET_FILES = ("cpu_manager_state", "memory_manager_state", "device-plugins/kubelet_internal_checkpoint")

# --- the dependency rule: docs/decisions/collection.md, "What a broken file costs" ---

CPU_SERIES = (
    "numa_cpu_capacity",
    "numa_cpu_time_seconds_total",
    "numa_cpu_allocated",
    "numa_cpu_allocatable",
    "numa_container_cpu_allocated",
)
MEMORY_MANAGER_SERIES = (
    "numa_memory_allocatable_bytes",
    "numa_memory_allocated_bytes",
    "numa_hugepages_allocatable_bytes",
    "numa_hugepages_allocated_bytes",
    "numa_container_memory_allocated_bytes",
    "numa_container_hugepages_allocated_bytes",
)

Labels = frozenset[tuple[str, str]]
SeriesRule = Callable[[str, Labels], bool]


@dataclass(frozen=True)
class Cost:
    """What breaking one file may cost: the series it may remove, and whose error counter moves."""

    source: str  # numa_source of the file
    may_remove: SeriesRule
    read: bool = True  # False: the agent does not read this file in this tree, so nothing moves


def _names(*names: str, node: str | None = None, size: str | None = None) -> SeriesRule:
    def rule(name: str, labels: Labels) -> bool:
        return (
            name in names
            and (node is None or ("numa_node_id", node) in labels)
            and (size is None or ("k8s_hugepage_size", size) in labels)
        )

    return rule


def _size_label(kib: int) -> str:
    """The kubelet's page size names (2048 kB: ``2Mi``), as the README's metric table shows them."""
    for unit, factor in (("Gi", 1 << 20), ("Mi", 1 << 10)):
        if kib % factor == 0:
            return f"{kib // factor}{unit}"
    return f"{kib}Ki"


NOTHING = Cost("sysfs", lambda _name, _labels: False, read=False)


def cost_of(tree: Path, relative: str) -> Cost:
    """The table of docs/decisions/collection.md as code: what breaking ``relative`` (under the tree's top)
    may cost."""
    sysfs, numa = tree / "sys", (tree / "sys/devices/system/node").is_dir()
    if relative == "proc/stat":
        return Cost("procfs", _names("numa_cpu_time_seconds_total"))
    if relative == "proc/meminfo":
        if numa:
            return NOTHING  # read only on a kernel without NUMA
        return Cost("procfs", _names("numa_memory_capacity_bytes", "numa_memory_usage_bytes"))
    kubelet = {
        "kubelet/cpu_manager_state": ("cpu_manager", ("numa_cpu_allocated", "numa_container_cpu_allocated")),
        "kubelet/memory_manager_state": ("memory_manager", MEMORY_MANAGER_SERIES),
        "kubelet/device-plugins/kubelet_internal_checkpoint": (
            "device_manager",
            ("numa_device_allocated", "numa_container_device_allocated"),
        ),
    }
    if relative in kubelet:
        source, series = kubelet[relative]
        # a container's alignment depends on every checkpoint that pins something
        return Cost(source, _names(*series, "numa_container_aligned"))
    if relative == "kubelet/dra_manager_state":
        return Cost("dra_manager", _names("numa_device_allocated", "numa_container_device_allocated"))
    if relative.startswith("cdi/"):  # its devices' placement, so their drivers' device numbers
        return Cost("cdi", _names("numa_device_allocated", "numa_container_device_allocated"))
    function = re.fullmatch(r"sys/bus/pci/devices/[^/]+/(class|numa_node|local_cpulist)", relative)
    if function is not None:
        # a bad class: its node's counts; a bad node: its class's counts, and DRA devices placed by it
        return Cost("sysfs", _names("numa_pci_device_count", "numa_device_allocated"))
    cpu = re.fullmatch(r"sys/devices/system/cpu/(online|cpu\d+/online)", relative)
    if cpu is not None:
        if cpu.group(1) != "online" and (sysfs / "devices/system/cpu/online").is_file():
            return NOTHING  # cpuN/online is read only when cpu/online is absent or unusable
        return Cost("sysfs", _names(*CPU_SERIES))
    if relative in ("sys/devices/system/node/online", "sys/devices/system/node/possible"):
        return Cost("sysfs", _names("numa_node_distance"))
    node = re.fullmatch(r"sys/devices/system/node/node(\d+)/(.+)", relative)
    if node is None:
        return NOTHING
    node_id, name = node.groups()
    if name == "cpumap" and (sysfs / "devices/system/node" / f"node{node_id}" / "cpulist").is_file():
        return NOTHING  # read only when cpulist is absent or unusable
    if name in ("cpulist", "cpumap"):
        return Cost("sysfs", _names(*CPU_SERIES, node=node_id))
    if name == "distance":
        return Cost("sysfs", _names("numa_node_distance", node=node_id))
    if name == "meminfo":
        return Cost("sysfs", _names("numa_memory_capacity_bytes", "numa_memory_usage_bytes", node=node_id))
    if name == "numastat":
        return Cost("sysfs", _names("numa_memory_page_allocations_total", node=node_id))
    pool = re.fullmatch(r"hugepages/hugepages-(\d+)kB/(nr|free)_hugepages", name)
    if pool is not None:
        counter = "numa_hugepages_capacity_bytes" if pool.group(2) == "nr" else "numa_hugepages_free_bytes"
        return Cost("sysfs", _names(counter, node=node_id, size=_size_label(int(pool.group(1)))))
    return NOTHING


# --- comparing a run with the clean one -----------------------------------------------------------

# timings, and the agent's own process cost, vary by run
TIMINGS = re.compile(r"numa_agent_.*_(age|duration)_seconds|process_.*")


def _source_of(key: SeriesKey) -> str | None:
    return dict(key[1]).get("numa_source")


def _errors(exposition: Exposition) -> dict[str, float]:
    totals: dict[str, float] = {}
    for (name, labels), value in exposition.items():
        if name == "numa_agent_source_errors_total":
            source = dict(labels)["numa_source"]
            totals[source] = totals.get(source, 0.0) + value
    return totals


def problems(cost: Cost, variant: Variant, clean: Exposition, broken: Exposition) -> list[str]:
    """Every way ``broken`` differs from ``clean`` beyond what ``cost`` allows (both may hold only the
    samples that differ: see :func:`changed`)."""
    found: list[str] = []
    for key in sorted(clean.keys() | broken.keys()):
        name, labels = key
        if TIMINGS.fullmatch(name) or (name.startswith("numa_agent_") and _source_of(key) == cost.source):
            continue  # timings vary by run; the broken source's own health is judged below
        before, after = clean.get(key), broken.get(key)
        if before is None:
            found.append(f"new series {name}{dict(labels)} = {after}")
        elif after is None:
            if not cost.may_remove(name, labels):
                found.append(f"lost {name}{dict(labels)} (was {before})")
        elif after != before:
            found.append(f"{name}{dict(labels)}: {before} -> {after}")
    before_errors, after_errors = _errors(clean), _errors(broken)
    counted = after_errors.get(cost.source, 0.0) - before_errors.get(cost.source, 0.0)
    if cost.read and variant != "missing" and counted <= 0:
        found.append(f"no error counted under numa_source={cost.source}")
    if (not cost.read or variant == "missing") and counted != 0:
        found.append(f"{counted} error(s) counted under numa_source={cost.source} for a file that costs none")
    return found


# --- the trees ---------------------------------------------------------------------------------------


@dataclass
class Tree:
    name: str
    top: Path  # holds sys/, proc/ and kubelet/
    args: list[str]
    files: list[str]  # relative to top, sampled


def _args(top: Path, kubelet: Path) -> list[str]:
    nowhere = top / "absent"
    return [
        *("--sysfs-root", str(top / "sys"), "--procfs-root", str(top / "proc")),
        *("--kubelet-root", str(kubelet), "--podresources-socket", "none"),
        *("--pod-logs-root", str(nowhere), "--container-logs-root", str(nowhere)),
        *("--cgroup-root", str(nowhere), "--node-name", "sweep", "--log-level", "error"),
    ]


def sample(top: Path, candidates: list[str], per_read_kind: int, unread: int) -> list[str]:
    """``per_read_kind`` files of each kind the agent reads (a kind: the path with every number as ``N``),
    and ``unread`` of the files it does not read."""
    kinds: dict[str, list[str]] = {}
    ignored: list[str] = []
    for relative in candidates:
        if cost_of(top, relative).read:
            kinds.setdefault(re.sub(r"\d+", "N", relative), []).append(relative)
        else:
            ignored.append(relative)
    chosen = [name for kind, members in sorted(kinds.items()) for name in pick(members, per_read_kind, kind)]
    return chosen + pick(ignored, unread, str(top.name))


LARGE_NODE = "large-node"
DEVICES_TREE = "h200-devices"
TREE_NAMES = [*snapshot_names(), DEVICES_TREE, LARGE_NODE]


def build_tree(name: str, base: Path) -> Tree:
    """One tree of the sweep under ``base``, with its sample of files."""
    if name == DEVICES_TREE:
        return _devices_tree(base)
    if name == LARGE_NODE:
        # the largest machine (16 nodes, 1,024 CPUs), with fewer pods than the default to keep each run
        # short, and one file of each kind: its kinds are the snapshots' kinds, its point is its size
        large = write_large_node(base / "large", LargeNodeSpec(pods=50, cgroups=False))
        files = sample(large.root, files_under(large.root, SWEPT), per_read_kind=1, unread=3)
        kubelet_files = [f"kubelet/{n}" for n in KUBELET_FILES]
        return Tree(name, large.root, _args(large.root, large.kubelet_root), [*files, *kubelet_files])
    top = extract_snapshot(name, base)
    kubelet = top / "kubelet"
    kubelet.mkdir()
    files = files_under(top, SWEPT)
    return Tree(name, top, _args(top, kubelet), sample(top, files, per_read_kind=2, unread=3))


def _devices_tree(base: Path) -> Tree:
    """The captured H200 guest with DRA claims (:func:`write_devices_tree`): the placed devices' own PCI
    files, a sample of the others, the DRA checkpoint and the CDI spec are swept."""
    tree = write_devices_tree(base, FIXTURES / "machines" / "h200-vm.tar.bz2")
    functions = files_under(tree.top, ["sys/bus/pci/devices"])
    others = sample(tree.top, sorted(set(functions) - set(tree.placed_files)), per_read_kind=1, unread=2)
    args = [*_args(tree.top, tree.kubelet), "--cdi-spec-dirs", str(tree.cdi)]
    return Tree(DEVICES_TREE, tree.top, args, [*tree.placed_files, *others, *tree.state_files])


def test_dependency_rule_reads_the_readme_table(tmp_path: Path) -> None:
    """The rule itself, on a few paths whose costs docs/decisions/collection.md states in words."""
    (tmp_path / "sys/devices/system/node/node3").mkdir(parents=True)
    (tmp_path / "sys/devices/system/node/node3/cpulist").write_text("0-3\n")
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    meminfo = cost_of(tmp_path, "sys/devices/system/node/node3/meminfo")
    assert meminfo.may_remove("numa_memory_capacity_bytes", frozenset({("numa_node_id", "3")}))
    assert not meminfo.may_remove("numa_memory_capacity_bytes", frozenset({("numa_node_id", "2")}))
    assert not meminfo.may_remove("numa_cpu_capacity", frozenset({("numa_node_id", "3")}))
    assert not cost_of(tmp_path, "sys/devices/system/node/node3/cpumap").read  # cpulist is there
    assert cost_of(tmp_path, "sys/devices/system/cpu/cpu7/online").read  # no cpu/online
    pool = cost_of(tmp_path, "sys/devices/system/node/node3/hugepages/hugepages-1048576kB/free_hugepages")
    labels = frozenset({("numa_node_id", "3"), ("k8s_hugepage_size", "1Gi")})
    assert pool.may_remove("numa_hugepages_free_bytes", labels)
    assert not pool.may_remove("numa_hugepages_capacity_bytes", labels)
    assert not cost_of(tmp_path, "proc/meminfo").read  # a NUMA kernel: memory comes from sysfs
    assert cost_of(tmp_path, "kubelet/memory_manager_state").source == "memory_manager"
    assert not cost_of(tmp_path, "sys/devices/system/cpu/cpu0/cache/index0/size").read


def test_the_comparison_catches_a_wrong_number(tmp_path: Path, quiet_logging: None) -> None:
    """The comparison fails a run that loses or changes what the broken file does not give."""
    top = tmp_path / "tree"
    write_machine(
        top, [NodeSpec(0, cpus=[0, 1], mem_total_kib=4096, mem_free_kib=1024), NodeSpec(1, cpus=[2])]
    )
    (top / "kubelet").mkdir()
    args = _args(top, top / "kubelet")
    clean = run_once(args)[1]
    meminfo = "sys/devices/system/node/node0/meminfo"
    restore = damage(top / meminfo, "garbage")
    try:
        broken = run_once(args)[1]
    finally:
        restore()
    assert problems(cost_of(top, meminfo), "garbage", *changed(clean, broken)) == []
    numastat = cost_of(top, "sys/devices/system/node/node0/numastat")  # a wrong rule for this damage
    assert any(
        "lost numa_memory_capacity_bytes" in found
        for found in problems(numastat, "garbage", *changed(clean, broken))
    )
    wrong = broken.replace(
        'numa_cpu_capacity{k8s_node_name="sweep",numa_node_id="1"} 1.0',
        'numa_cpu_capacity{k8s_node_name="sweep",numa_node_id="1"} 2.0',
    )
    assert wrong != broken
    assert any(
        "numa_cpu_capacity" in found
        for found in problems(cost_of(top, meminfo), "garbage", *changed(clean, wrong))
    )
    assert problems(cost_of(top, meminfo), "garbage", *changed(clean, clean)) == [
        "no error counted under numa_source=sysfs"
    ]


@pytest.mark.parametrize("tree_name", TREE_NAMES)
def test_fault_sweep(
    tree_name: str, tmp_path: Path, quiet_logging: None, request: pytest.FixtureRequest
) -> None:
    """Each tree is its own test, so that parallel workers share the sweep; tests/conftest.py adds their
    counts up in the run's summary."""
    tree = build_tree(tree_name, tmp_path)
    failures: list[str] = []
    variants = 0
    counted = 0
    status, clean_text = run_once(tree.args)
    assert status == 0, f"{tree.name}: clean run exited {status}"
    assert ("numa_node_count", frozenset()) in parse(clean_text), tree.name
    for relative in tree.files:
        cost = cost_of(tree.top, relative)
        for variant in VARIANTS:
            restore = damage(tree.top / relative, variant)
            try:
                status, text = run_once(tree.args)
            finally:
                restore()
            variants += 1
            where = f"{tree.name}: {relative} {variant}"
            if status != 0:
                failures.append(f"{where}: exit status {status}")
                continue
            found = problems(cost, variant, *changed(clean_text, text))
            failures += [f"{where}: {problem}" for problem in found]
            counted += cost.read and variant != "missing"
    request.node.user_properties.append((SWEEP_SUMMARY, (variants, len(tree.files), counted)))
    assert not failures, f"{len(failures)} problems, first ones:\n" + "\n".join(failures[:40])
