"""Per-container NUMA usage from the kubelet's cgroups: read in the background, joined at collection time.

:meth:`CgroupCollector.refresh` runs in the agent's background thread at the export interval (it reads a few
files per container: too much work for a scrape) and publishes a :class:`CgroupView`; the last good view is
kept when the cgroup tree cannot be listed. A container whose cgroup vanishes while it is read has stopped
and is left out silently; a container whose files cannot be read or parsed is left out and counted as an
error of the ``cgroup`` source, without blanking the others; a cpuset file that cannot be trusted costs only
its container's cpusets (the kernel's view of it) that round. :meth:`CgroupCollector.join` joins the latest
view with the kubelet's allocation when a snapshot is built, compares each container's record with its
cpusets, counts the CPUs each NUMA node has pinned to one pod, and redoes it only when an input changed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from otel_numa.accounting.kernel_view import pinned_per_node
from otel_numa.accounting.usage import (
    DEFAULT_MEMORY_TYPES,
    MachineNodes,
    advance_cpu_time,
    cpu_shares,
    join_usage,
    memory_types_to_read,
)
from otel_numa.model import (
    Allocation,
    CgroupLayout,
    ContainerIdentity,
    ContainerNumaUsage,
    ContainerUsage,
    CpuTimeSplit,
    MachineUsage,
    Source,
    Topology,
)
from otel_numa.snapshot.container_limit import MAX_CONTAINERS, OVER_LIMIT
from otel_numa.snapshot.memo import LastResult
from otel_numa.snapshot.source_status import SourceRegistry
from otel_numa.sources.cgroups import (
    ContainerCgroup,
    detect_cgroup_layout,
    find_container_cgroups,
    read_container_usage,
)
from otel_numa.sources.container_logs import read_container_identities
from otel_numa.sources.errors import SourceCorrupt, SourceError, SourceMissing
from otel_numa.sources.files import MAX_CPU_ID

log = logging.getLogger(__name__)

# container id -> identity; any provider will do (container log links, the container runtime)
NameLookup = Callable[[], Mapping[str, ContainerIdentity]]
UsageReader = Callable[[ContainerCgroup, CgroupLayout], ContainerNumaUsage | None]
# the containers' usage, and the CPUs each NUMA node has pinned to one pod (None: not known)
Joined = tuple[tuple[ContainerUsage, ...], Mapping[int, int] | None]


@dataclass(frozen=True, slots=True)
class CgroupView:
    layout: CgroupLayout
    usages: tuple[ContainerNumaUsage, ...]
    names: Mapping[str, ContainerIdentity]
    read_at: float  # time.monotonic() when the round ended


class ContainerLogNames:
    """Container names from the ``/var/log/containers`` link names, listed again every round.

    Listing is cheap (one directory) and a directory's mtime may be too coarse to notice a link made just
    after the last listing, so no cache. A missing directory is logged once; an unreadable one keeps the
    last names.
    """

    def __init__(self, container_logs_root: Path) -> None:
        self._root = container_logs_root
        self._names: Mapping[str, ContainerIdentity] = {}
        self._reported: str | None = None

    def __call__(self) -> Mapping[str, ContainerIdentity]:
        try:
            self._names = _kept_where_equal(read_container_identities(self._root), self._names)
            self._reported = None
        except SourceError as error:
            if isinstance(error, SourceMissing):
                self._names = {}
            if self._reported != str(error):
                self._reported = str(error)
                log.warning(
                    "container names unavailable, containers without a name are not reported: %s", error
                )
        return self._names


def _kept_where_equal(
    names: dict[str, ContainerIdentity], previous: Mapping[str, ContainerIdentity]
) -> Mapping[str, ContainerIdentity]:
    """``names``, with last round's identity object wherever it is equal, and last round's mapping itself
    when all are: series made from a container's name then share its strings with those made before,
    instead of holding a copy from each round that made one."""
    for container_id, identity in names.items():
        kept = previous.get(container_id)
        if kept is not None and kept is not identity and kept == identity:
            names[container_id] = kept
    return previous if names == previous else names


class CgroupCollector:
    def __init__(
        self,
        cgroup_root: Path,
        names: NameLookup,
        registry: SourceRegistry,
        *,
        memory_types: frozenset[str] = DEFAULT_MEMORY_TYPES,
        reader: UsageReader | None = None,
        clock: Callable[[], float] = time.monotonic,
        topology: Callable[[], Topology | None] = lambda: None,
        max_containers: int = MAX_CONTAINERS,
    ) -> None:
        self._root = cgroup_root
        self._names = names
        self._tracker = registry.tracker(Source.CGROUP)
        self._memory_types = memory_types
        self._to_read = memory_types_to_read(memory_types)
        self._reader = reader
        self._topology = topology  # the machine's, when known: ids beyond it make a file corrupt
        self._max_containers = max_containers
        self._clock = clock
        self._view: CgroupView | None = None
        # the join, remembered with its inputs; CPU time splits advance once per view
        self._join_lock = threading.Lock()
        self._joined: LastResult[Joined] = LastResult()
        self._effective: LastResult[Mapping[tuple[str, str], frozenset[int]]] = LastResult()
        self._cpu_view: CgroupView | None = None
        self._cpu_machine: MachineNodes | None = None
        self._cpu_time: dict[str, CpuTimeSplit] = {}

    @property
    def view(self) -> CgroupView | None:
        """The last good view; ``None`` before the first round or when there is no kubepods hierarchy."""
        return self._view

    def refresh(self) -> None:
        """Read every container's usage once (the background task)."""
        with self._tracker.timed():
            self._refresh()

    def _refresh(self) -> None:
        try:
            layout = detect_cgroup_layout(self._root)
            cgroups = find_container_cgroups(self._root)
        except SourceMissing as error:
            self._view = None
            self._tracker.failed(error)
            return
        except SourceError as error:
            self._tracker.failed(error)  # keep the last good view
            return
        usages: list[ContainerNumaUsage] = []
        failures: list[SourceError] = []
        # past the limit the rest are left out and counted once a round (container_limit.py)
        if len(cgroups) > self._max_containers:
            failures.append(
                SourceCorrupt(
                    f"{self._root}: more than {self._max_containers} containers; the rest are left out",
                    error_type=OVER_LIMIT,
                )
            )
            # the first by pod UID, as the records' series keep theirs: the same pods have both
            by_pod = sorted(cgroups, key=lambda cgroup: (cgroup.pod_uid, cgroup.container_id))
            cgroups = tuple(by_pod[: self._max_containers])
        read = self._reader or self._bounded_reader(failures.append)
        for cgroup in cgroups:
            try:
                usage = read(cgroup, layout)
            except SourceError as error:
                # a new error, without the traceback whose frames would hold the file's text until a cyclic
                # collection; named by its cgroup
                message = str(error) if str(error).startswith(cgroup.path) else f"{cgroup.path}: {error}"
                failures.append(type(error)(message, error_type=error.error_type))
                continue
            if usage is not None:  # None: the container stopped meanwhile
                usages.append(usage)
        self._view = CgroupView(layout, tuple(usages), self._names(), self._clock())
        self._tracker.succeeded(partly=bool(failures))
        for failure in failures:
            self._tracker.failed(failure)

    def _bounded_reader(self, cpuset_failed: Callable[[SourceError], None]) -> UsageReader:
        """The file reader, bounded by the machine's NUMA ids and CPUs once its topology is known; a cpuset
        that cannot be trusted goes to ``cpuset_failed`` and costs only that container's cpusets."""
        topology, to_read = self._topology(), self._to_read
        nodes = frozenset(topology.node_ids) if topology is not None and topology.nodes else None
        cpus = topology.online_cpus if topology is not None and topology.online_cpus else None
        cpu_limit = max(cpus) if cpus else MAX_CPU_ID
        return lambda cgroup, layout: read_container_usage(
            cgroup, layout, to_read, nodes, cpu_limit, machine_cpus=cpus, on_cpuset_error=cpuset_failed
        )

    def containers(
        self, allocation: Allocation, machine: MachineUsage | None, live_pods: frozenset[str] | None = None
    ) -> tuple[ContainerUsage, ...]:
        """The latest view joined with ``allocation``; recomputed only when the view or an input changed."""
        return self.join(allocation, machine, live_pods)[0]

    def join(
        self, allocation: Allocation, machine: MachineUsage | None, live_pods: frozenset[str] | None = None
    ) -> Joined:
        """The latest view joined with ``allocation``, and the CPUs each NUMA node has pinned to one pod
        (by the joined containers' effective cpusets: sandboxes, which have no name, run anywhere and are
        left out); recomputed only when the view or an input changed. Nothing without a view."""
        view = self._view
        if view is None:
            return (), None
        topology = machine.topology if machine is not None else None
        memory = (
            {node: m.total_bytes for node, m in machine.memory.items() if m.total_bytes is not None}
            if machine is not None
            else {}
        )
        nodes = MachineNodes.of(topology, memory)
        with self._join_lock:

            def join() -> Joined:
                assert view is not None
                cpu_time = self._advance_cpu_time(view, nodes)
                usage = join_usage(
                    view.usages,
                    view.layout,
                    view.names,
                    allocation,
                    nodes,
                    cpu_time,
                    live_pods,
                    self._memory_types,
                )
                return usage, _pinned(view, usage, topology)

            return self._joined.get((view, allocation, nodes, live_pods, topology), join)

    def effective_cpus(self, wanted: frozenset[tuple[str, str]]) -> Mapping[tuple[str, str], frozenset[int]]:
        """The last view's effective CPUs of the ``wanted`` (pod uid, container name), where known."""
        view = self._view
        if view is None or not wanted:
            return {}

        def find() -> Mapping[tuple[str, str], frozenset[int]]:
            assert view is not None
            found: dict[tuple[str, str], frozenset[int]] = {}
            for usage in view.usages:
                identity = view.names.get(usage.container_id)
                if identity is not None and usage.cpus is not None:
                    key = (usage.pod_uid, identity.container_name)
                    if key in wanted:
                        found[key] = usage.cpus
            return found

        return self._effective.get((view, wanted), find)

    def _advance_cpu_time(self, view: CgroupView, nodes: MachineNodes) -> Mapping[str, CpuTimeSplit]:
        if view is self._cpu_view and nodes == self._cpu_machine:
            return self._cpu_time
        advanced: dict[str, CpuTimeSplit] = {}
        for usage in view.usages:
            if usage.cpu_time_s is None or usage.cpus is None:
                continue
            shares = cpu_shares(usage.cpus, nodes)
            if not shares:
                continue
            previous = self._cpu_time.get(usage.container_id)
            # the same view again (the machine changed): keep the totals, do not count its time twice
            advanced[usage.container_id] = (
                previous
                if view is self._cpu_view and previous is not None
                else advance_cpu_time(previous, usage.cpu_time_s, shares)
            )
        self._cpu_view, self._cpu_machine, self._cpu_time = view, nodes, advanced
        return advanced


def _pinned(
    view: CgroupView, usage: tuple[ContainerUsage, ...], topology: Topology | None
) -> Mapping[int, int] | None:
    """Pinned CPUs per NUMA node; unknown without a topology, or when the view has containers and none of
    them could be named (no way to leave the sandboxes out)."""
    if topology is None or (view.usages and not usage):
        return None
    return pinned_per_node(
        ((container.container.pod_uid, container.cpus) for container in usage if container.cpus is not None),
        topology,
    )
