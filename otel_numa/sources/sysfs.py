"""NUMA topology and per-node memory, hugepages and numastat from sysfs.

Layout read (all under ``<sysfs-root>``):
- ``devices/system/node/{online,possible}`` and the ``nodeN`` directories (ids may be sparse)
- ``devices/system/node/nodeN/{cpulist,cpumap,distance,meminfo,numastat}``
- ``devices/system/node/nodeN/hugepages/hugepages-<kB>kB/{nr_hugepages,free_hugepages}``
- ``devices/system/cpu/online`` (or, when it is absent or unusable, ``cpuN/online`` and ``cpuN/topology``)
- ``kernel/mm/hugepages/hugepages-<kB>kB/`` on a kernel without NUMA

Each file is judged on its own and costs only the values computed from it. A file that is missing is not
an error (a node or pool going away, an older kernel); one that cannot be read, is empty, was cut short
(the kernel ends every line with a newline), does not parse or is out of range is handed to the caller's
error sink, and the read goes on without it. Without a sink a corrupt file fails the whole read and an
unreadable one is skipped. A missing ``devices/system/cpu`` raises :class:`SourceMissing`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from otel_numa.model import HugepagePool, NodeMemory, NumaNode, Topology
from otel_numa.sources.errors import SourceCorrupt, SourceError, SourceMissing, SourceUnavailable
from otel_numa.sources.files import (
    SYMLINK,
    ErrorSink,
    format_cpulist,
    naming,
    parse_cpulist,
    parse_cpumask,
    read_text,
    read_value_text,
    report,
    whole_lines,
)
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

# Receives (node id, error) for a node's file that is unreadable or corrupt; the read goes on without it.
NodeErrorHandler = Callable[[int, SourceError], None]


def node_path(sysfs_root: Path, node_id: int) -> Path:
    return sysfs_root / NODE_DIR / f"node{node_id}"


def nodes_by_cpu(topology: Topology) -> dict[int, tuple[int, ...]]:
    """CPU id -> ids of the nodes whose CPUs it is among (more than one only with buggy firmware)."""
    claims: dict[int, list[int]] = {}
    for node in topology.nodes:
        for cpu in node.cpus:
            claims.setdefault(cpu, []).append(node.id)
    return {cpu: tuple(node_ids) for cpu, node_ids in sorted(claims.items())}


# --- one file, judged on its own -------------------------------------------------------------------


def _read_item(path: str | Path, parse: Callable[[str], T], on_error: ErrorSink | None) -> T | None:
    """A one-value file (a count, a list, a mask, a row) parsed; ``None`` when it is missing or bad."""
    try:
        text = read_value_text(path)
    except SourceMissing:
        return None
    except SourceError as error:
        report(error, on_error)
        return None
    try:
        return parse(text)
    except SourceCorrupt as error:
        report(SourceCorrupt(f"{path}: {error}", error_type=error.error_type), on_error)
        return None


def _read_lines(path: str | Path, on_error: ErrorSink | None) -> str | None:
    """A multi-line file's whole lines (a line cut short is reported and dropped); ``None`` when missing
    or unreadable."""
    try:
        text = read_text(path)
    except SourceMissing:
        return None
    except SourceError as error:
        report(error, on_error)
        return None
    kept, cut = whole_lines(text, path)
    if cut is not None:
        report(cut, on_error)
    return kept


def _numbered_entries(
    directory: str | Path, pattern: re.Pattern[str], on_error: ErrorSink | None = None
) -> dict[int, str]:
    """Entries of ``directory`` whose whole name matches ``pattern``, by the number in it.

    The kernel makes these (``nodeN``, ``cpuN``, ``hugepages-<kB>kB``) real directories: one that is a
    symbolic link could lead out of the sysfs root, so it is left out and reported (``symlink``)."""
    try:
        with os.scandir(directory) as entries:
            names = []
            for entry in entries:
                if not entry.is_symlink():
                    names.append(entry.name)
                elif pattern.fullmatch(entry.name) is not None and on_error is not None:
                    on_error(
                        SourceCorrupt(f"{entry.path}: a symbolic link, not followed", error_type=SYMLINK)
                    )
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


def _parse_count(text: str) -> int:
    """A count or flag: a non-negative decimal that fits the int64 the exporters carry."""
    stripped = text.strip()
    if not (stripped.isascii() and stripped.isdigit()) or int(stripped) > MAX_AMOUNT:
        raise SourceCorrupt("not a count")  # contents never quoted: a link may lead anywhere
    return int(stripped)


def _parse_id_list(text: str) -> tuple[int, ...]:
    return tuple(sorted(parse_cpulist(text)))


def _parse_distance_row(text: str) -> list[int]:
    try:
        return [_parse_count(value) for value in text.split()]
    except SourceCorrupt as exc:
        raise SourceCorrupt("bad distance row") from exc


def _ignore(_error: SourceError) -> None:
    """A sink for reads that only look for changes; the read that follows reports what is wrong."""


# --- topology ------------------------------------------------------------------------------------


def _online_cpus_from_cpu_dirs(cpu_dir: Path, on_error: ErrorSink | None) -> frozenset[int] | None:
    """The ``cpuN`` whose ``online`` is not 0; ``None`` when there is no ``cpuN`` directory at all.

    A CPU whose ``online`` file is missing (often cpu0, which cannot go offline) or unusable is online
    when its ``topology`` directory is there: the kernel removes it while a CPU is offline. A tree that
    has no ``topology`` directory for any CPU cannot tell, and counts such a CPU as online.
    """
    entries = _numbered_entries(cpu_dir, _CPU_NAME)
    if not entries:
        return None
    with_topology: dict[int, bool] = {}

    def has_topology(cpu: int) -> bool:
        if cpu not in with_topology:
            with_topology[cpu] = os.path.isdir(f"{cpu_dir}/{entries[cpu]}/topology")
        return with_topology[cpu]

    online: set[int] = set()
    for cpu, name in entries.items():
        flag = _read_item(f"{cpu_dir}/{name}/online", _parse_count, on_error)
        if flag is not None:
            if flag != 0:
                online.add(cpu)
        elif has_topology(cpu) or not any(has_topology(other) for other in entries):
            online.add(cpu)
    return frozenset(online)


def _read_online_cpus(sysfs_root: Path, on_error: ErrorSink | None) -> frozenset[int] | None:
    """The online CPUs: ``cpu/online`` when it is usable, else the ``cpuN`` directories; ``None`` when
    neither tells."""
    cpu_dir = sysfs_root / CPU_DIR
    online = _read_item(cpu_dir / "online", parse_cpulist, on_error)
    if online is not None:
        return online
    return _online_cpus_from_cpu_dirs(cpu_dir, on_error)


def _node_ids(sysfs_root: Path, on_error: ErrorSink | None = None) -> tuple[int, ...]:
    """Ids of the ``nodeN`` directories, sorted; empty on a kernel without NUMA."""
    try:
        return tuple(sorted(_numbered_entries(sysfs_root / NODE_DIR, _NODE_NAME, on_error)))
    except SourceMissing:
        return ()


def _raw_text(path: Path) -> str | None:
    try:
        text = read_text(path)
    except SourceError:
        return None
    return text if text.endswith("\n") else None


def topology_signature(sysfs_root: Path) -> tuple[str, ...]:
    """A cheap value that changes when nodes or CPUs go on- or offline, so the topology is re-read then.

    It never fails on a bad file (the topology read reports those); a missing ``devices/system/cpu``
    raises :class:`SourceMissing`.
    """
    node_online = _raw_text(sysfs_root / NODE_DIR / "online")
    if node_online is None:
        node_online = "dirs:" + format_cpulist(frozenset(_node_ids(sysfs_root)))
    cpu_online = _raw_text(sysfs_root / CPU_DIR / "online")
    if cpu_online is None:
        from_dirs = _online_cpus_from_cpu_dirs(sysfs_root / CPU_DIR, _ignore)
        cpu_online = "dirs:" + ("?" if from_dirs is None else format_cpulist(from_dirs))
    return (f"nodes={node_online.strip()}", f"cpus={cpu_online.strip()}")


def _read_node_cpus(path: Path, on_error: ErrorSink | None) -> frozenset[int] | None:
    """The node's CPUs as its ``cpulist`` (or, when that is missing or bad, ``cpumap``) states them;
    ``None`` when neither can be used."""
    readers: tuple[tuple[str, Callable[[str], frozenset[int]]], ...] = (
        ("cpulist", parse_cpulist),
        ("cpumap", parse_cpumask),
    )
    for name, parse in readers:
        cpus = _read_item(path / name, parse, on_error)
        if cpus is not None:
            return cpus
    return None


def _distance_targets(
    count: int,
    online: tuple[int, ...],
    possible: tuple[int, ...] | None,
    present: tuple[int, ...],
    may_guess: bool = True,
) -> tuple[int, ...]:
    """The node ids that a ``distance`` row of ``count`` values refers to.

    The kernel prints one value per online node. Some snapshots disagree (a row with a value for an
    offline node): then the first id list of the right length wins. A shorter row is the first online ids'
    (unless ``may_guess`` is false: an id list could not be read); a longer one matches no list, so no
    value is known to be whose, and none is reported.
    """
    for candidate in (online, possible, present):
        if candidate is not None and len(candidate) == count:
            return candidate
    return online[:count] if may_guess and count < len(online) else ()


def _read_distances(
    path: Path,
    online: tuple[int, ...],
    possible: tuple[int, ...] | None,
    present: tuple[int, ...],
    on_error: ErrorSink | None,
    may_guess: bool = True,
) -> dict[int, int]:
    values = _read_item(path / "distance", _parse_distance_row, on_error)
    if values is None:
        return {}
    known = set(present)
    targets = _distance_targets(len(values), online, possible, present, may_guess)
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


def read_topology(sysfs_root: Path, *, on_error: ErrorSink | None = None) -> Topology:
    """Nodes, their online CPUs and distances.

    A node whose CPUs cannot be known (no usable ``cpulist`` or ``cpumap``, or no usable online mask) has
    ``cpus_known=False`` and no CPUs; a node whose ``distance`` is unusable has no distances.
    """
    online_cpus = _read_online_cpus(sysfs_root, on_error)
    present = _node_ids(sysfs_root, on_error)
    if not present:
        only = NumaNode(
            id=0, cpus=online_cpus or frozenset(), distances={}, cpus_known=online_cpus is not None
        )
        return Topology(
            nodes=(only,),
            online_cpus=online_cpus or frozenset(),
            numa_enabled=False,
            overlapping_cpus=frozenset(),
        )

    node_dir = sysfs_root / NODE_DIR
    list_errors: list[SourceError] = []

    def on_list_error(error: SourceError) -> None:
        list_errors.append(error)
        report(error, on_error)

    online_nodes = _read_item(node_dir / "online", _parse_id_list, on_list_error) or present
    possible_nodes = _read_item(node_dir / "possible", _parse_id_list, on_list_error)
    nodes: list[NumaNode] = []
    for node_id in present:
        path = node_path(sysfs_root, node_id)
        cpus = _read_node_cpus(path, on_error)
        if cpus is None and not path.is_dir():
            continue  # the node went away while we were reading
        known = cpus is not None and online_cpus is not None
        nodes.append(
            NumaNode(
                id=node_id,
                cpus=cpus & online_cpus if cpus is not None and online_cpus is not None else frozenset(),
                distances=_read_distances(
                    path, online_nodes, possible_nodes, present, on_error, may_guess=not list_errors
                ),
                cpus_known=known,
            )
        )
    ordered = tuple(nodes)
    overlap = _overlapping_cpus(ordered)
    _warn_overlap_once(overlap, ordered)
    return Topology(
        nodes=ordered,
        online_cpus=online_cpus or frozenset(),
        numa_enabled=True,
        overlapping_cpus=overlap,
    )


# --- memory ------------------------------------------------------------------------------------


def node_memory(fields: Mapping[str, int]) -> NodeMemory | None:
    """Total, free and used from meminfo fields, each known on its own; ``None`` when none is.

    Used is MemUsed, else MemTotal - MemFree (and free, without MemFree, MemTotal - MemUsed).
    """
    total, free, used = fields.get("MemTotal"), fields.get("MemFree"), fields.get("MemUsed")
    if used is None and total is not None and free is not None:
        used = max(total - free, 0)
    elif free is None and total is not None and used is not None:
        free = max(total - used, 0)
    if total is None and free is None and used is None:
        return None
    return NodeMemory(total_bytes=total, free_bytes=free, used_bytes=used)


# --- hugepages -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _PoolFiles:
    """The counter files of one ``hugepages-<kB>kB`` directory."""

    size_kib: int
    directory: str
    total_path: str
    free_path: str


def _list_pools(directory: str | Path) -> tuple[_PoolFiles, ...]:
    """The pools under ``directory``, smallest page size first (``SourceMissing`` when it is absent)."""
    sizes = _numbered_entries(directory, _HUGEPAGES_NAME)
    return tuple(
        _PoolFiles(
            size_kib,
            f"{directory}/{name}",
            f"{directory}/{name}/nr_hugepages",
            f"{directory}/{name}/free_hugepages",
        )
        for size_kib, name in sorted(sizes.items())
    )


def _read_pool_files(
    listed: tuple[_PoolFiles, ...], on_error: ErrorSink | None
) -> tuple[tuple[HugepagePool, ...], bool]:
    """Each pool with the counters that could be read, and whether every pool directory is still there."""
    pools: list[HugepagePool] = []
    complete = True
    for files in listed:
        total = _read_item(files.total_path, _parse_count, on_error)
        free = _read_item(files.free_path, _parse_count, on_error)
        if (total is None or free is None) and not os.path.isdir(files.directory):
            complete = False
        if total is not None or free is not None:
            pools.append(HugepagePool(size_kib=files.size_kib, total_pages=total, free_pages=free))
    return tuple(pools), complete


def _read_pools(directory: Path, on_error: ErrorSink | None) -> tuple[HugepagePool, ...] | None:
    """The ``hugepages-<kB>kB`` pools under ``directory`` by size; ``None`` when the directory is absent."""
    try:
        listed = _list_pools(directory)
    except SourceMissing:
        return None
    except SourceError as error:
        report(error, on_error)
        return None
    return _read_pool_files(listed, on_error)[0]


def _pools_from_meminfo(procfs_root: Path) -> tuple[HugepagePool, ...] | None:
    """The one pool /proc/meminfo describes; its errors are counted by the memory read of the same file."""
    try:
        fields = read_meminfo(procfs_root, on_error=_ignore)
    except SourceError:
        return None
    total, free, size_bytes = (
        fields.get("HugePages_Total"),
        fields.get("HugePages_Free"),
        fields.get("Hugepagesize"),
    )
    if (total is None and free is None) or not size_bytes:
        return None
    return (HugepagePool(size_kib=size_bytes // 1024, total_pages=total, free_pages=free),)


# --- numastat ------------------------------------------------------------------------------------


def parse_numastat(text: str, path: str | Path, on_error: ErrorSink | None = None) -> dict[str, int]:
    """``numa_hit 123`` lines as ``{"hit": 123, ...}`` (see the names in ``_NUMASTAT_NAMES``); each line
    stands alone, a bad one is reported (without a sink: raised) and left out."""
    counters: dict[str, int] = {}
    bad: list[str] = []
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        try:
            if len(parts) != 2:
                raise SourceCorrupt(line)
            key, value = parts
            counters[_NUMASTAT_NAMES.get(key, key.removeprefix("numa_"))] = _parse_count(value)
        except SourceCorrupt:
            bad.append(line)
    if bad:
        report(SourceCorrupt(f"{path}: {len(bad)} bad numastat line(s)"), on_error)
    return counters


# --- per-node reads, every round -----------------------------------------------------------------


class NodeFiles:
    """Memory, hugepages and numastat per node of one topology, read with paths joined once.

    Build one per topology and call its readers every round. A node's hugepage pool directories are listed
    the first time its pools are read and listed again only when a pool directory is gone (so a page size
    that appears later shows up with the next topology or after such a change); a node without a
    ``hugepages`` directory is looked at again every round. Each reader hands a bad file to
    ``on_node_error`` with its node and goes on; without a handler a corrupt file fails the read.
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

    def _per_node(
        self, read_one: Callable[[int, ErrorSink | None], T | None], on_node_error: NodeErrorHandler | None
    ) -> dict[int, T]:
        result: dict[int, T] = {}
        for node_id in self._topology.node_ids:
            sink = None if on_node_error is None else _node_sink(on_node_error, node_id)
            value = read_one(node_id, sink)
            if value is not None:
                result[node_id] = value
        return result

    def memory(self, *, on_node_error: NodeErrorHandler | None = None) -> dict[int, NodeMemory]:
        """Memory per node from ``nodeN/meminfo`` (or, without NUMA, ``<procfs>/meminfo``), in bytes.

        A node whose meminfo is missing, or has none of MemTotal, MemFree and MemUsed, is absent. Without
        NUMA a missing or unreadable ``<procfs>/meminfo`` raises; without a procfs root nothing is known.
        """
        if not self._topology.numa_enabled:
            if self._procfs_root is None:
                return {}
            sink = None if on_node_error is None else _node_sink(on_node_error, self._topology.nodes[0].id)
            memory = node_memory(read_meminfo(self._procfs_root, on_error=sink))
            return {} if memory is None else {self._topology.nodes[0].id: memory}
        self._require_node_dir()
        return self._per_node(self._node_memory, on_node_error)

    def _node_memory(self, node_id: int, on_error: ErrorSink | None) -> NodeMemory | None:
        path = self._meminfo_paths[node_id]
        text = _read_lines(path, on_error)
        if text is None:
            return None
        try:
            fields = parse_meminfo(text, on_error=naming(path, on_error))
        except SourceCorrupt as error:  # only without a sink
            raise SourceCorrupt(f"{path}: {error}") from error
        return node_memory(fields)

    def hugepages(
        self, *, on_node_error: NodeErrorHandler | None = None
    ) -> dict[int, tuple[HugepagePool, ...]]:
        """Hugepage pools per node, smallest page size first; each counter file stands alone.

        Only nodes with memory have a ``hugepages`` directory; the others are absent. Without NUMA, node 0
        gets the machine's pools from ``kernel/mm/hugepages``, else (very old kernels) from
        ``<procfs>/meminfo`` when there is a procfs root.
        """
        if not self._topology.numa_enabled:
            sink = None if on_node_error is None else _node_sink(on_node_error, self._topology.nodes[0].id)
            pools = _read_pools(self._sysfs_root / GLOBAL_HUGEPAGES_DIR, sink)
            if pools is None and self._procfs_root is not None:
                pools = _pools_from_meminfo(self._procfs_root)
            return {} if pools is None else {self._topology.nodes[0].id: pools}
        self._require_node_dir()
        return self._per_node(self._node_pools, on_node_error)

    def _node_pools(self, node_id: int, on_error: ErrorSink | None) -> tuple[HugepagePool, ...] | None:
        listed = self._listed_pools.get(node_id)
        if listed is not None:
            pools, complete = _read_pool_files(listed, on_error)
            if complete:
                return pools
        # never listed, or a pool went away since: list the directory now
        self._listed_pools.pop(node_id, None)
        try:
            listed = _list_pools(self._hugepage_dirs[node_id])
        except SourceMissing:
            return None  # a node without memory has no pools
        except SourceError as error:
            report(error, on_error)
            return None
        self._listed_pools[node_id] = listed
        return _read_pool_files(listed, on_error)[0]

    def numastat(self, *, on_node_error: NodeErrorHandler | None = None) -> dict[int, dict[str, int]]:
        """Page allocation counters per node; a node without ``numastat`` (or no NUMA at all) is absent."""
        if not self._topology.numa_enabled:
            return {}
        self._require_node_dir()
        return self._per_node(self._node_numastat, on_node_error)

    def _node_numastat(self, node_id: int, on_error: ErrorSink | None) -> dict[str, int] | None:
        path = self._numastat_paths[node_id]
        text = _read_lines(path, on_error)
        if text is None:
            return None
        counters = parse_numastat(text, path, on_error)
        return counters if counters or not text.strip() else None


def _node_sink(handler: NodeErrorHandler, node_id: int) -> ErrorSink:
    return lambda error: handler(node_id, error)
