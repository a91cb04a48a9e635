"""sysfs/procfs -> :class:`MachineUsage`, with the topology cached until the online masks change.

What depends only on the topology (file paths, hugepage pool listings, the CPU -> node map for
/proc/stat) is prepared when it is read, so that a round is only the reads and the sums.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from otel_numa.model import MachineUsage, Topology
from otel_numa.source_status import SourceRegistry, SourceTracker
from otel_numa.sources import sysfs
from otel_numa.sources.errors import SourceError
from otel_numa.sources.procfs import NodeCpuTimes
from otel_numa.sources.sysfs import NodeFiles

T = TypeVar("T")
V = TypeVar("V")


class MachineCollector:
    def __init__(self, sysfs_root: Path, procfs_root: Path, registry: SourceRegistry) -> None:
        self._sysfs_root = sysfs_root
        self._procfs_root = procfs_root
        self._sysfs = registry.tracker("sysfs")
        self._procfs = registry.tracker("procfs")
        self._topology_key: tuple[str, ...] | None = None
        self._topology: Topology | None = None
        self._node_files: NodeFiles | None = None
        self._cpu_times: NodeCpuTimes | None = None
        self._last: MachineUsage | None = None

    def _read_topology(self) -> Topology:
        """The cached topology, re-read only when the online node/CPU masks changed."""
        key = sysfs.topology_signature(self._sysfs_root)
        if key != self._topology_key or self._topology is None:
            topology = sysfs.read_topology(self._sysfs_root, self._procfs_root)
            self._node_files = NodeFiles(self._sysfs_root, topology, self._procfs_root)
            self._cpu_times = NodeCpuTimes(sysfs.nodes_by_cpu(topology))
            self._topology = topology
            self._topology_key = key
        return self._topology

    def collect(self) -> MachineUsage | None:
        failed: set[str] = set()

        def read(tracker: SourceTracker, reader: Callable[[], T], fallback: T) -> T:
            try:
                return reader()
            except SourceError as error:
                tracker.failed(error)
                failed.add(tracker.name)
                return fallback

        topology = read(self._sysfs, self._read_topology, self._topology)
        node_files, cpu_times = self._node_files, self._cpu_times
        if topology is None or node_files is None or cpu_times is None:
            return None
        # Keep the last good value of a part that fails this round, as long as the topology is the same.
        last = self._last if self._last is not None and self._last.topology is topology else None

        def per_node(
            reader: Callable[[sysfs.NodeErrorHandler], Mapping[int, V]], previous: Mapping[int, V] | None
        ) -> dict[int, V]:
            """A per-node sysfs read in which one bad node costs only that node's fresh value."""
            bad_nodes: list[int] = []

            def on_node_error(node_id: int, error: SourceError) -> None:
                self._sysfs.failed(error)
                failed.add(self._sysfs.name)
                bad_nodes.append(node_id)

            values = dict(read(self._sysfs, lambda: reader(on_node_error), previous or {}))
            for node_id in bad_nodes:
                if previous is not None and node_id in previous:
                    values[node_id] = previous[node_id]
            return values

        usage = MachineUsage(
            topology=topology,
            memory=per_node(
                lambda on_error: node_files.memory(on_node_error=on_error), last.memory if last else None
            ),
            hugepages=per_node(
                lambda on_error: node_files.hugepages(on_node_error=on_error),
                last.hugepages if last else None,
            ),
            numastat=per_node(
                lambda on_error: node_files.numastat(on_node_error=on_error),
                last.numastat if last else None,
            ),
            cpu_time=read(
                self._procfs, lambda: cpu_times.read(self._procfs_root), last.cpu_time if last else {}
            ),
        )
        for tracker in (self._sysfs, self._procfs):
            if tracker.name not in failed:
                tracker.succeeded()
        self._last = usage
        return usage
