"""sysfs/procfs -> :class:`MachineUsage`, with the topology cached until the online masks change.

What depends only on the topology (file paths, hugepage pool listings, the CPU -> node map for
/proc/stat) is prepared when it is read, so that a round is only the reads and the sums. Each file is
judged on its own: a bad one is counted as an error of its source and costs only the values computed
from it, which keep their last good value while the topology stays the same. A topology read that met a
bad file is read again next round rather than cached.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from otel_numa.model import NO_PCI, HugepagePool, MachineUsage, NodeMemory, PciDevices, Source, Topology
from otel_numa.options import MachinePart
from otel_numa.snapshot.source_status import SourceRegistry, SourceTracker
from otel_numa.sources import pci, sysfs
from otel_numa.sources.errors import SourceError
from otel_numa.sources.procfs import NodeCpuTimes
from otel_numa.sources.sysfs import NodeFiles

T = TypeVar("T")
V = TypeVar("V")

ALL_MACHINE_PARTS: frozenset[MachinePart] = frozenset(MachinePart)


class MachineCollector:
    """Reads the machine every round; ``parts`` names what is needed besides the topology (always read):
    a part left out is an empty mapping in :class:`MachineUsage` and none of its files is opened."""

    def __init__(
        self,
        sysfs_root: Path,
        procfs_root: Path,
        registry: SourceRegistry,
        *,
        parts: frozenset[MachinePart] = ALL_MACHINE_PARTS,
    ) -> None:
        self._sysfs_root = sysfs_root
        self._procfs_root = procfs_root
        self._parts = parts
        self._sysfs = registry.tracker(Source.SYSFS)
        self._procfs = registry.tracker(Source.PROCFS)
        self._topology_key: tuple[str, ...] | None = None
        self._topology: Topology | None = None
        self._topology_complete = False
        # PCI functions are read with the topology, never per round (their NUMA nodes follow from it)
        self._pci: PciDevices = NO_PCI
        self._pci_complete = True
        self._node_files: NodeFiles | None = None
        self._cpu_times: NodeCpuTimes | None = None
        self._last: MachineUsage | None = None

    @property
    def topology(self) -> Topology | None:
        """The last topology read (``None`` before the first round): what bounds other sources' ids."""
        return self._topology

    def _read_topology(self, failed: set[str]) -> Topology:
        """The cached topology, re-read when the online node/CPU masks changed or the last read met a bad
        file; a node whose CPUs cannot be read now keeps its last good CPUs while the online CPUs stay."""
        key = sysfs.topology_signature(self._sysfs_root)
        if key == self._topology_key and self._topology is not None and self._topology_complete:
            if not self._pci_complete:
                self._read_pci(self._topology, failed)
            return self._topology
        errors: list[SourceError] = []
        topology = sysfs.read_topology(self._sysfs_root, on_error=errors.append)
        for error in errors:
            self._sysfs.failed(error)
            failed.add(self._sysfs.name)
        topology = _keep_known_cpus(topology, self._topology)
        if topology != self._topology or self._topology is None:
            self._node_files = NodeFiles(self._sysfs_root, topology, self._procfs_root)
            self._cpu_times = NodeCpuTimes(sysfs.nodes_by_cpu(topology))
            self._topology = topology
        self._topology_key = key
        self._topology_complete = not errors
        self._read_pci(self._topology, failed)
        return self._topology

    def _read_pci(self, topology: Topology, failed: set[str]) -> None:
        """The PCI functions on ``topology``; a read that met a bad file is done again next round, the
        functions it could read kept meanwhile."""
        if MachinePart.PCI not in self._parts:
            return
        errors: list[SourceError] = []
        pci_devices = pci.read_pci_devices(self._sysfs_root, topology, on_error=errors.append)
        for error in errors:
            self._sysfs.failed(error)
            failed.add(self._sysfs.name)
        self._pci = self._pci if pci_devices == self._pci else pci_devices
        self._pci_complete = not errors

    def collect(self) -> MachineUsage | None:
        failed: set[str] = set()

        def read(tracker: SourceTracker, reader: Callable[[], T], fallback: T) -> T:
            return _read(tracker, reader, fallback, failed)

        topology = read(self._sysfs, lambda: self._read_topology(failed), self._topology)
        node_files, cpu_times = self._node_files, self._cpu_times
        if topology is None or node_files is None or cpu_times is None:
            return None
        # Keep the last good value of a part that fails this round, as long as the topology is the same.
        last = self._last if self._last is not None and self._last.topology is topology else None
        # without NUMA, memory comes from /proc/meminfo
        memory_tracker = self._sysfs if topology.numa_enabled else self._procfs

        def per_node(
            part: MachinePart,
            tracker: SourceTracker,
            reader: Callable[[sysfs.NodeErrorHandler], Mapping[int, V]],
            previous: Mapping[int, V] | None,
            merge: Callable[[V | None, V], V],
        ) -> dict[int, V]:
            """A per-node read in which a bad file costs only its own values, kept from the last round."""
            if part not in self._parts:
                return {}
            bad_nodes: set[int] = set()

            def on_node_error(node_id: int, error: SourceError) -> None:
                tracker.failed(error)
                failed.add(tracker.name)
                bad_nodes.add(node_id)

            values = dict(read(tracker, lambda: reader(on_node_error), previous or {}))
            for node_id in bad_nodes:
                if previous is not None and node_id in previous:
                    values[node_id] = merge(values.get(node_id), previous[node_id])
            return values

        with self._sysfs.timed():
            memory: Mapping[int, NodeMemory] = per_node(
                MachinePart.MEMORY,
                memory_tracker,
                lambda on_error: node_files.memory(on_node_error=on_error),
                last.memory if last else None,
                _merge_memory,
            )
            hugepages: Mapping[int, tuple[HugepagePool, ...]] = per_node(
                MachinePart.HUGEPAGES,
                self._sysfs,
                lambda on_error: node_files.hugepages(on_node_error=on_error),
                last.hugepages if last else None,
                _merge_pools,
            )
            numastat: Mapping[int, Mapping[str, int]] = per_node(
                MachinePart.NUMASTAT,
                self._sysfs,
                lambda on_error: node_files.numastat(on_node_error=on_error),
                last.numastat if last else None,
                lambda fresh, old: {**old, **(fresh or {})},
            )
        with self._procfs.timed():
            cpu_time = self._cpu_time(cpu_times, failed, last.cpu_time if last else None)
        usage = MachineUsage(topology, memory, hugepages, numastat, cpu_time, self._pci)
        procfs_read = MachinePart.CPU_TIME in self._parts or (
            MachinePart.MEMORY in self._parts and not topology.numa_enabled
        )
        for tracker in (self._sysfs, self._procfs) if procfs_read else (self._sysfs,):
            if tracker.name not in failed:
                tracker.succeeded()
        self._last = usage
        return usage

    def _cpu_time(
        self,
        cpu_times: NodeCpuTimes,
        failed: set[str],
        previous: Mapping[int, Mapping[str, float]] | None,
    ) -> Mapping[int, Mapping[str, float]]:
        """Per-node CPU time; a node that lost a CPU's line this round keeps its last good value."""
        if MachinePart.CPU_TIME not in self._parts:
            return {}
        had_error = False

        def on_error(error: SourceError) -> None:
            nonlocal had_error
            had_error = True
            self._procfs.failed(error)
            failed.add(self._procfs.name)

        fresh: dict[int, Mapping[str, float]] = dict(
            _read(self._procfs, lambda: cpu_times.read(self._procfs_root, on_error), previous or {}, failed)
        )
        if had_error and previous is not None:
            for node_id, modes in previous.items():
                fresh.setdefault(node_id, modes)
        return fresh


def _read(tracker: SourceTracker, reader: Callable[[], T], fallback: T, failed: set[str]) -> T:
    """``reader()``, or ``fallback`` (the last good value) when the whole read fails."""
    try:
        return reader()
    except SourceError as error:
        tracker.failed(error)
        failed.add(tracker.name)
        return fallback


def _keep_known_cpus(topology: Topology, previous: Topology | None) -> Topology:
    """``topology`` with each node whose CPUs are unknown given its last good CPUs, when the online CPUs
    are the same as then."""
    if previous is None or all(node.cpus_known for node in topology.nodes):
        return topology
    if previous.online_cpus != topology.online_cpus:
        return topology
    known = {node.id: node for node in previous.nodes if node.cpus_known}
    nodes = tuple(
        replace(node, cpus=known[node.id].cpus, cpus_known=True)
        if not node.cpus_known and node.id in known
        else node
        for node in topology.nodes
    )
    return replace(topology, nodes=nodes)


def _merge_memory(fresh: NodeMemory | None, old: NodeMemory) -> NodeMemory:
    if fresh is None:
        return old
    return NodeMemory(
        total_bytes=fresh.total_bytes if fresh.total_bytes is not None else old.total_bytes,
        free_bytes=fresh.free_bytes if fresh.free_bytes is not None else old.free_bytes,
        used_bytes=fresh.used_bytes if fresh.used_bytes is not None else old.used_bytes,
    )


def _merge_pools(
    fresh: tuple[HugepagePool, ...] | None, old: tuple[HugepagePool, ...]
) -> tuple[HugepagePool, ...]:
    by_size = {pool.size_kib: pool for pool in old}
    for pool in fresh or ():
        before = by_size.get(pool.size_kib)
        by_size[pool.size_kib] = (
            pool
            if before is None
            else HugepagePool(
                pool.size_kib,
                pool.total_pages if pool.total_pages is not None else before.total_pages,
                pool.free_pages if pool.free_pages is not None else before.free_pages,
            )
        )
    return tuple(by_size[size] for size in sorted(by_size))
