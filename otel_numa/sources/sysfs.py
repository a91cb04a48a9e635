"""NUMA topology and per-node memory, hugepages and numastat from sysfs.

Layout read (all under ``<sysfs-root>``):
- ``devices/system/node/online`` and the ``nodeN`` directories (ids may be sparse)
- ``devices/system/node/nodeN/{cpulist,cpumap,distance,meminfo,numastat}``
- ``devices/system/node/nodeN/hugepages/hugepages-<kB>kB/{nr_hugepages,free_hugepages}``
- ``devices/system/cpu/online`` (or ``cpuN/online`` when absent)
- ``kernel/mm/hugepages/hugepages-<kB>kB/`` on a kernel without NUMA

Errors: a missing root directory raises :class:`SourceMissing`, content that does not parse raises
:class:`SourceCorrupt`. A per-node file that vanishes or cannot be read (a node going offline mid-read)
only drops that node's value for that file.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from otel_numa.model import HugepagePool, NodeMemory, NumaNode, Topology
from otel_numa.sources.errors import SourceCorrupt, SourceError, SourceMissing, SourceUnavailable
from otel_numa.sources.files import format_cpulist, parse_cpulist, parse_cpumask
from otel_numa.sources.procfs import MAX_AMOUNT, parse_meminfo, read_meminfo

T = TypeVar("T")

logger = logging.getLogger(__name__)

NODE_DIR = Path("devices/system/node")
CPU_DIR = Path("devices/system/cpu")
GLOBAL_HUGEPAGES_DIR = Path("kernel/mm/hugepages")

_NODE_NAME = re.compile(r"node(\d+)")
_CPU_NAME = re.compile(r"cpu(\d+)")
_HUGEPAGES_NAME = re.compile(r"hugepages-(\d+)kB")

# nodeN/numastat key -> the value of the numa.numastat.type attribute; other keys lose a "numa_" prefix
_NUMASTAT_NAMES = {
    "numa_hit": "hit",
    "numa_miss": "miss",
    "numa_foreign": "foreign",
    "interleave_hit": "interleave_hit",
    "local_node": "local",
    "other_node": "other",
}

# Overlap sets already warned about, so that a buggy firmware is reported once per process.
_reported_overlaps: set[frozenset[int]] = set()


def node_path(sysfs_root: Path, node_id: int) -> Path:
    return sysfs_root / NODE_DIR / f"node{node_id}"


def nodes_by_cpu(topology: Topology) -> dict[int, tuple[int, ...]]:
    """CPU id -> ids of the nodes whose CPUs it is among (more than one only with buggy firmware)."""
    claims: dict[int, list[int]] = {}
    for node in topology.nodes:
        for cpu in node.cpus:
            claims.setdefault(cpu, []).append(node.id)
    return {cpu: tuple(node_ids) for cpu, node_ids in sorted(claims.items())}


# --- small readers -------------------------------------------------------------------------------

# More than any sysfs attribute holds (one page): such a file comes back in a single read.
_READ_SIZE = 1 << 16


def _read_file(path: str | Path) -> str:
    """:func:`otel_numa.sources.files.read_text` with os-level calls, for files read every round.

    A read shorter than asked for ends the file: sysfs returns an attribute whole, a regular file up to
    its end.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # read-only, never created
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise SourceMissing(f"{path}: not found") from exc
    except OSError as exc:
        raise SourceUnavailable(f"{path}: {exc.strerror or exc}") from exc
    try:
        data = os.read(fd, _READ_SIZE)
        if len(data) == _READ_SIZE:
            chunks = [data]
            while chunk := os.read(fd, _READ_SIZE):
                chunks.append(chunk)
            data = b"".join(chunks)
    except OSError as exc:  # e.g. a directory in place of the file
        raise SourceUnavailable(f"{path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    return data.rstrip(b"\x00").decode("utf-8", errors="replace")


def _read_optional_file(path: str | Path) -> str | None:
    try:
        return _read_file(path)
    except SourceMissing:
        return None


def _numbered_entries(directory: str | Path, pattern: re.Pattern[str]) -> dict[int, str]:
    """Entries of ``directory`` whose whole name matches ``pattern``, by the number in it."""
    try:
        with os.scandir(directory) as entries:
            names = [entry.name for entry in entries]
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise SourceMissing(f"{directory}: not found") from exc
    except OSError as exc:
        raise SourceUnavailable(f"{directory}: {exc.strerror or exc}") from exc
    found: dict[int, str] = {}
    for name in names:
        match = pattern.fullmatch(name)
        if match is not None:
            found[int(match.group(1))] = name
    return found


def _read_node_file(path: str | Path, *, strict: bool = False) -> str | None:
    """A per-node (or per-CPU) file; ``None`` when it vanished or (unless ``strict``) is unreadable."""
    try:
        return _read_file(path)
    except SourceMissing:
        return None
    except SourceUnavailable as error:
        if strict:
            raise
        logger.debug("skipping unreadable %s: %s", path, error)
        return None


# Receives (node id, error) for a node whose file is unreadable or corrupt; that node is left out.
NodeErrorHandler = Callable[[int, SourceError], None]


def _per_node(
    node_ids: Iterable[int], read_one: Callable[[int, bool], T | None], on_node_error: NodeErrorHandler | None
) -> dict[int, T]:
    """``read_one`` for every node. Without a handler a corrupt node fails the whole read (and unreadable
    files are skipped); with one, each bad node is reported and the good nodes are still returned."""
    result: dict[int, T] = {}
    for node_id in node_ids:
        try:
            value = read_one(node_id, on_node_error is not None)
        except SourceError as error:
            if on_node_error is None:
                raise
            on_node_error(node_id, error)
            continue
        if value is not None:
            result[node_id] = value
    return result


def _parse_int(text: str, path: str | Path) -> int:
    """A count or flag: a non-negative decimal that fits the int64 the exporters carry."""
    stripped = text.strip()
    if not (stripped.isascii() and stripped.isdigit()) or int(stripped) > MAX_AMOUNT:
        raise SourceCorrupt(f"{path}: not a count: {stripped[:40]!r}")
    return int(stripped)


def _read_optional_cpulist(path: Path) -> tuple[int, ...] | None:
    text = _read_optional_file(path)
    return None if text is None else tuple(sorted(parse_cpulist(text)))


# --- topology ------------------------------------------------------------------------------------


def _online_cpus_from_cpu_dirs(cpu_dir: Path) -> frozenset[int]:
    """Every ``cpuN`` whose ``online`` is not 0; a CPU without the file (often cpu0) cannot go offline."""
    online: set[int] = set()
    for cpu, name in _numbered_entries(cpu_dir, _CPU_NAME).items():
        text = _read_node_file(cpu_dir / name / "online")
        if text is None or _parse_int(text, cpu_dir / name / "online") != 0:
            online.add(cpu)
    return frozenset(online)


def _read_online_cpus(sysfs_root: Path) -> frozenset[int]:
    cpu_dir = sysfs_root / CPU_DIR
    text = _read_optional_file(cpu_dir / "online")
    if text is not None:
        return parse_cpulist(text)
    return _online_cpus_from_cpu_dirs(cpu_dir)


def _node_ids(sysfs_root: Path) -> tuple[int, ...]:
    """Ids of the ``nodeN`` directories, sorted; empty on a kernel without NUMA."""
    try:
        return tuple(sorted(_numbered_entries(sysfs_root / NODE_DIR, _NODE_NAME)))
    except SourceMissing:
        return ()


def topology_signature(sysfs_root: Path) -> tuple[str, ...]:
    """A cheap value that changes when nodes or CPUs go on- or offline, so the topology is re-read then."""
    node_online = _read_optional_file(sysfs_root / NODE_DIR / "online")
    if node_online is None:
        node_online = "dirs:" + format_cpulist(frozenset(_node_ids(sysfs_root)))
    cpu_online = _read_optional_file(sysfs_root / CPU_DIR / "online")
    if cpu_online is None:
        cpu_online = "dirs:" + format_cpulist(_online_cpus_from_cpu_dirs(sysfs_root / CPU_DIR))
    return (f"nodes={node_online.strip()}", f"cpus={cpu_online.strip()}")


def _read_node_cpus(path: Path) -> frozenset[int] | None:
    """The node's CPUs as its ``cpulist`` (or ``cpumap``) states them; ``None`` when neither can be read."""
    readers: tuple[tuple[str, Callable[[str], frozenset[int]]], ...] = (
        ("cpulist", parse_cpulist),
        ("cpumap", parse_cpumask),
    )
    for name, parse in readers:
        text = _read_node_file(path / name)
        if text is not None:
            return parse(text)
    return None


def _distance_targets(
    count: int, online: tuple[int, ...], possible: tuple[int, ...] | None, present: tuple[int, ...]
) -> tuple[int, ...]:
    """The node ids that a ``distance`` row of ``count`` values refers to.

    The kernel prints one value per online node. Some snapshots disagree (a row with a value for an
    offline node): then the first id list of the right length wins, else the online ids as far as they go.
    """
    for candidate in (online, possible, present):
        if candidate is not None and len(candidate) == count:
            return candidate
    return online[:count]


def _read_distances(
    path: Path, online: tuple[int, ...], possible: tuple[int, ...] | None, present: tuple[int, ...]
) -> dict[int, int]:
    text = _read_node_file(path / "distance")
    if text is None:
        return {}
    try:
        values = [int(value) for value in text.split()]
    except ValueError as exc:
        raise SourceCorrupt(f"{path / 'distance'}: bad distance row {text.strip()[:80]!r}") from exc
    known = set(present)
    targets = _distance_targets(len(values), online, possible, present)
    return {target: value for target, value in zip(targets, values, strict=False) if target in known}


def _overlapping_cpus(nodes: tuple[NumaNode, ...]) -> frozenset[int]:
    seen: set[int] = set()
    overlap: set[int] = set()
    for node in nodes:
        overlap.update(node.cpus & seen)
        seen.update(node.cpus)
    return frozenset(overlap)


def _warn_overlap_once(overlap: frozenset[int], nodes: tuple[NumaNode, ...]) -> None:
    if not overlap or overlap in _reported_overlaps:
        return
    _reported_overlaps.add(overlap)
    claimants = [node.id for node in nodes if node.cpus & overlap]
    logger.warning(
        "NUMA nodes %s all claim CPUs %s (buggy firmware?); reporting them as the kernel states them",
        ",".join(map(str, claimants)),
        format_cpulist(overlap),
    )


def read_topology(sysfs_root: Path, procfs_root: Path) -> Topology:
    """Nodes, their online CPUs and distances.

    ``procfs_root`` is not needed today (everything comes from sysfs); it is accepted so that every
    machine reader takes the same roots.
    """
    online_cpus = _read_online_cpus(sysfs_root)
    present = _node_ids(sysfs_root)
    if not present:
        only = NumaNode(id=0, cpus=online_cpus, distances={})
        return Topology(
            nodes=(only,), online_cpus=online_cpus, numa_enabled=False, overlapping_cpus=frozenset()
        )

    node_dir = sysfs_root / NODE_DIR
    online_nodes = _read_optional_cpulist(node_dir / "online") or present
    possible_nodes = _read_optional_cpulist(node_dir / "possible")
    nodes: list[NumaNode] = []
    for node_id in present:
        path = node_path(sysfs_root, node_id)
        cpus = _read_node_cpus(path)
        if cpus is None and not path.is_dir():
            continue  # the node went away while we were reading
        nodes.append(
            NumaNode(
                id=node_id,
                cpus=(cpus or frozenset()) & online_cpus,
                distances=_read_distances(path, online_nodes, possible_nodes, present),
            )
        )
    ordered = tuple(nodes)
    overlap = _overlapping_cpus(ordered)
    _warn_overlap_once(overlap, ordered)
    return Topology(nodes=ordered, online_cpus=online_cpus, numa_enabled=True, overlapping_cpus=overlap)


# --- memory ------------------------------------------------------------------------------------


def _node_memory(fields: Mapping[str, int]) -> NodeMemory | None:
    """Total, free and used from meminfo fields; ``None`` when too few of them are there to tell."""
    total = fields.get("MemTotal")
    if total is None:
        return None
    free = fields.get("MemFree")
    used = fields.get("MemUsed")
    if free is None:
        if used is None:
            return None
        free = max(total - used, 0)
    elif used is None:
        used = max(total - free, 0)
    return NodeMemory(total_bytes=total, free_bytes=free, used_bytes=used)


# --- hugepages -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _PoolFiles:
    """The counter files of one ``hugepages-<kB>kB`` directory."""

    size_kib: int
    total_path: str
    free_path: str


def _list_pools(directory: str | Path) -> tuple[_PoolFiles, ...]:
    """The pools under ``directory``, smallest page size first (``SourceMissing`` when it is absent)."""
    sizes = _numbered_entries(directory, _HUGEPAGES_NAME)
    return tuple(
        _PoolFiles(size_kib, f"{directory}/{name}/nr_hugepages", f"{directory}/{name}/free_hugepages")
        for size_kib, name in sorted(sizes.items())
    )


def _read_pool_files(
    listed: tuple[_PoolFiles, ...], *, strict: bool
) -> tuple[tuple[HugepagePool, ...], bool]:
    """The pools whose two counters could be read, and whether some pool's counter was gone."""
    pools: list[HugepagePool] = []
    complete = True
    for files in listed:
        total_text = _read_node_file(files.total_path, strict=strict)
        free_text = _read_node_file(files.free_path, strict=strict)
        if total_text is None or free_text is None:
            complete = False
            continue
        pools.append(
            HugepagePool(
                size_kib=files.size_kib,
                total_pages=_parse_int(total_text, files.total_path),
                free_pages=_parse_int(free_text, files.free_path),
            )
        )
    return tuple(pools), complete


def _read_pools(directory: Path, *, strict: bool = False) -> tuple[HugepagePool, ...] | None:
    """The ``hugepages-<kB>kB`` pools under ``directory`` by size; ``None`` when the directory is absent."""
    try:
        listed = _list_pools(directory)
    except SourceMissing:
        return None
    except SourceUnavailable:
        if strict:
            raise
        return None
    return _read_pool_files(listed, strict=strict)[0]


def _pools_from_meminfo(procfs_root: Path) -> tuple[HugepagePool, ...] | None:
    fields = read_meminfo(procfs_root)
    total, free, size_bytes = (
        fields.get("HugePages_Total"),
        fields.get("HugePages_Free"),
        fields.get("Hugepagesize"),
    )
    if total is None or free is None or size_bytes is None:
        return None
    return (HugepagePool(size_kib=size_bytes // 1024, total_pages=total, free_pages=free),)


# --- numastat ------------------------------------------------------------------------------------


def parse_numastat(text: str, path: str | Path) -> dict[str, int]:
    """``numa_hit 123`` lines as ``{"hit": 123, ...}`` (see the names in ``_NUMASTAT_NAMES``)."""
    counters: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2:
            raise SourceCorrupt(f"{path}: bad numastat line {line[:80]!r}")
        key, value = parts
        name = _NUMASTAT_NAMES.get(key, key.removeprefix("numa_"))
        counters[name] = _parse_int(value, path)
    return counters


# --- per-node reads, every round -----------------------------------------------------------------


class NodeFiles:
    """Memory, hugepages and numastat per node of one topology, read with paths joined once.

    Build one per topology and call its readers every round. A node's hugepage pool directories are listed
    the first time its pools are read and listed again only when a counter file is gone (so a page size
    that appears later shows up with the next topology or after such an error); a node without a
    ``hugepages`` directory is looked at again every round.
    """

    def __init__(self, sysfs_root: Path, topology: Topology, procfs_root: Path | None = None) -> None:
        self._sysfs_root = sysfs_root
        self._procfs_root = procfs_root
        self._topology = topology
        node_dir = sysfs_root / NODE_DIR
        self._node_dir = str(node_dir)
        self._meminfo_paths = {node_id: f"{node_dir}/node{node_id}/meminfo" for node_id in topology.node_ids}
        self._numastat_paths = {
            node_id: f"{node_dir}/node{node_id}/numastat" for node_id in topology.node_ids
        }
        self._hugepage_dirs = {
            node_id: f"{node_dir}/node{node_id}/hugepages" for node_id in topology.node_ids
        }
        self._listed_pools: dict[int, tuple[_PoolFiles, ...]] = {}

    def _require_node_dir(self) -> None:
        if not os.path.isdir(self._node_dir):
            raise SourceMissing(f"{self._node_dir}: not found")

    def memory(self, *, on_node_error: NodeErrorHandler | None = None) -> dict[int, NodeMemory]:
        """See :func:`read_node_memory`; without NUMA and without a procfs root nothing is known."""
        if not self._topology.numa_enabled:
            if self._procfs_root is None:
                return {}
            memory = _node_memory(read_meminfo(self._procfs_root))
            return {} if memory is None else {self._topology.nodes[0].id: memory}
        self._require_node_dir()
        return _per_node(self._topology.node_ids, self._node_memory, on_node_error)

    def _node_memory(self, node_id: int, strict: bool) -> NodeMemory | None:
        text = _read_node_file(self._meminfo_paths[node_id], strict=strict)
        return None if text is None else _node_memory(parse_meminfo(text))

    def hugepages(
        self, *, on_node_error: NodeErrorHandler | None = None
    ) -> dict[int, tuple[HugepagePool, ...]]:
        """See :func:`read_hugepages`."""
        if not self._topology.numa_enabled:
            pools = _read_pools(self._sysfs_root / GLOBAL_HUGEPAGES_DIR)
            if pools is None and self._procfs_root is not None:
                pools = _pools_from_meminfo(self._procfs_root)
            return {} if pools is None else {self._topology.nodes[0].id: pools}
        self._require_node_dir()
        return _per_node(self._topology.node_ids, self._node_pools, on_node_error)

    def _node_pools(self, node_id: int, strict: bool) -> tuple[HugepagePool, ...] | None:
        listed = self._listed_pools.get(node_id)
        if listed is not None:
            pools, complete = _read_pool_files(listed, strict=strict)
            if complete:
                return pools
        # never listed, or a pool went away since: list the directory now
        self._listed_pools.pop(node_id, None)
        try:
            listed = _list_pools(self._hugepage_dirs[node_id])
        except SourceMissing:
            return None  # a node without memory has no pools
        except SourceUnavailable:
            if strict:
                raise
            return None
        self._listed_pools[node_id] = listed
        return _read_pool_files(listed, strict=strict)[0]

    def numastat(self, *, on_node_error: NodeErrorHandler | None = None) -> dict[int, dict[str, int]]:
        """See :func:`read_numastat`."""
        if not self._topology.numa_enabled:
            return {}
        self._require_node_dir()
        return _per_node(self._topology.node_ids, self._node_numastat, on_node_error)

    def _node_numastat(self, node_id: int, strict: bool) -> dict[str, int] | None:
        path = self._numastat_paths[node_id]
        text = _read_node_file(path, strict=strict)
        return None if text is None else parse_numastat(text, path)


def read_node_memory(
    sysfs_root: Path, procfs_root: Path, topology: Topology, *, on_node_error: NodeErrorHandler | None = None
) -> dict[int, NodeMemory]:
    """Memory per node from ``nodeN/meminfo`` (or ``<procfs>/meminfo`` without NUMA), in bytes.

    A node whose meminfo vanished, or lacks MemTotal, is absent from the result.
    """
    return NodeFiles(sysfs_root, topology, procfs_root).memory(on_node_error=on_node_error)


def read_hugepages(
    sysfs_root: Path,
    topology: Topology,
    *,
    procfs_root: Path | None = None,
    on_node_error: NodeErrorHandler | None = None,
) -> dict[int, tuple[HugepagePool, ...]]:
    """Hugepage pools per node, smallest page size first.

    Only nodes with memory have a ``hugepages`` directory; the others are absent from the result. Without
    NUMA, node 0 gets the machine's pools from ``kernel/mm/hugepages``, else (very old kernels) from
    ``<procfs_root>/meminfo`` when ``procfs_root`` is given.
    """
    return NodeFiles(sysfs_root, topology, procfs_root).hugepages(on_node_error=on_node_error)


def read_numastat(
    sysfs_root: Path, topology: Topology, *, on_node_error: NodeErrorHandler | None = None
) -> dict[int, dict[str, int]]:
    """Page allocation counters per node; a node without ``numastat`` (or no NUMA at all) is absent."""
    return NodeFiles(sysfs_root, topology).numastat(on_node_error=on_node_error)
