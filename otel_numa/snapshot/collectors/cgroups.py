"""Per-container NUMA usage from the kubelet's cgroups: read in the background, joined at collection time.

:meth:`CgroupCollector.refresh` runs in the agent's background thread at the export interval (it reads a few
files per container: too much work for a scrape) and publishes a :class:`CgroupView`; the last good view is
kept when the cgroup tree cannot be listed. A round lists the tree again only when a directory of it had
entries made or removed since the last listing (inotify: :mod:`otel_numa.sources.directory_watch`; without
it, every round), and reads every container's counters, kept open between rounds, parsing a container's
again only when they changed (:mod:`otel_numa.sources.cgroup_rounds`); a round in which nothing changed
hands back the very objects of the last one. On cgroup v2 a round first reads the kubepods cgroups' own
``cpu.stat`` and ``memory.numa_stat``, which the kernel sums over every container below them: while those
keep their bytes and nothing was made, removed or written in the tree, no container's files are read at
all (:mod:`otel_numa.sources.subtree_counters`). A container's cpuset files (v2) are read again only when a
cpuset of its cgroup or of a cgroup above it was written (inotify reports ``write(2)`` on cgroupfs: the
runtime pinning a container), when the machine's CPUs changed, and at least every
:data:`CPUSETS_MAX_AGE_S`: the kernel also changes effective cpusets without a write (CPU hotplug, a
partition elsewhere in the tree), which nothing reports. A container whose cgroup vanishes while it is
read has stopped and is left out silently; a container whose files cannot be read or parsed is left out and
counted as an error of the ``cgroup`` source, without blanking the others; a cpuset file that cannot be
trusted costs only its container's cpusets (the kernel's view of it) that round.
:meth:`CgroupCollector.join` joins the latest view with the kubelet's allocation when a snapshot is built,
compares each container's record with its cpusets, counts the CPUs each NUMA node has pinned to one pod,
and redoes it only when an input changed.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from otel_numa.accounting.kernel_view import pinned_per_node
from otel_numa.accounting.usage import (
    DEFAULT_MEMORY_TYPES,
    JoinMemo,
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
from otel_numa.sources.cgroup_rounds import CgroupRounds
from otel_numa.sources.cgroups import (
    ContainerCgroup,
    container_directories,
    detect_cgroup_layout,
    find_container_cgroups,
    kubepods_cgroups,
)
from otel_numa.sources.container_logs import ContainerLogListing
from otel_numa.sources.directory_watch import DirectoryWatch
from otel_numa.sources.errors import SourceCorrupt, SourceError, SourceMissing
from otel_numa.sources.files import MAX_CPU_ID
from otel_numa.sources.subtree_counters import SUMMED_FILES, SubtreeCounters

log = logging.getLogger(__name__)

# every container's cpuset files are read at least this often, written or not
CPUSETS_MAX_AGE_S = 60.0
# files whose writes change a cgroup's effective cpusets, or its children's
_CPUSET_WRITES = ("cpuset.", "cgroup.subtree_control")

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
    """Container names from the ``/var/log/containers`` link names, listed again when the directory changed
    (:class:`~otel_numa.sources.container_logs.ContainerLogListing`). A missing directory is logged once;
    an unreadable one keeps the last names.
    """

    def __init__(self, container_logs_root: Path) -> None:
        self._listing = ContainerLogListing(container_logs_root)
        self._listed: Mapping[str, ContainerIdentity] | None = None
        self._names: Mapping[str, ContainerIdentity] = {}
        self._reported: str | None = None

    def __call__(self) -> Mapping[str, ContainerIdentity]:
        try:
            listed = self._listing.identities()
            if listed is not self._listed:
                self._names = _kept_where_equal(dict(listed), self._names)
                self._listed = listed
            self._reported = None
        except SourceError as error:
            self._listed = None
            if isinstance(error, SourceMissing):
                self._names = {}
            if self._reported != str(error):
                self._reported = str(error)
                log.warning(
                    "container names unavailable, containers without a name are not reported: %s", error
                )
        return self._names


def _held_where_equal(
    found: tuple[ContainerCgroup, ...], before: tuple[ContainerCgroup, ...]
) -> tuple[ContainerCgroup, ...]:
    """``found``, with the cgroup listed before wherever one is equal: its path string keys the files kept
    open, the watch and the last readings, and is then held once, not once for each listing."""
    held = {cgroup: cgroup for cgroup in before}
    return tuple(held.get(cgroup, cgroup) for cgroup in found)


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
        self._to_read = {layout: memory_types_to_read(memory_types, layout) for layout in ("v1", "v2")}
        self._reader = reader
        self._topology = topology  # the machine's, when known: ids beyond it make a file corrupt
        self._max_containers = max_containers
        self._clock = clock
        self._view: CgroupView | None = None
        # the tree as last listed, the directories watched for entries made or removed, and the files
        self._walked: tuple[CgroupLayout, tuple[ContainerCgroup, ...]] | None = None
        # a counter file written is a tree on a disk (a test's): its sums above need not follow
        self._watch = DirectoryWatch(written_prefixes=_CPUSET_WRITES, noticed_prefixes=SUMMED_FILES)
        self._walk_dirs: set[str] = set()
        self._container_dirs: set[str] = set()
        self._unwatched: set[str] = set()  # containers' directories not watched: cpusets read every round
        self._cpusets_read_at = -CPUSETS_MAX_AGE_S  # when every container's cpusets were last read
        self._list_again = True  # a directory of the tree first watched, or not watched: list it next round
        self._rounds = CgroupRounds(max_containers)
        # the kubepods cgroups' sums, and what the last round that read every container read them with
        self._kubepods: tuple[str, ...] = ()
        self._sums = SubtreeCounters()
        self._quiet: tuple[object, ...] | None = None
        # the join, remembered with its inputs; CPU time splits advance once per round's readings
        self._join_lock = threading.Lock()
        self._joined: LastResult[Joined] = LastResult()
        self._join_memo = JoinMemo()  # each container's last join (a pod change joins only its containers)
        self._effective: LastResult[Mapping[tuple[str, str], frozenset[int]]] = LastResult()
        self._cpu_usages: tuple[ContainerNumaUsage, ...] | None = None
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
        changed = self._watch.changed()
        written = self._watch.written()
        counters_written = self._watch.noticed()
        walked = self._walked
        if walked is None or changed is None or self._list_again or not changed.isdisjoint(self._walk_dirs):
            try:
                listed: list[str] = []
                layout = detect_cgroup_layout(self._root)
                found = find_container_cgroups(self._root, listed)
                walked = (layout, _held_where_equal(found, walked[1] if walked is not None else ()))
                self._kubepods = kubepods_cgroups(self._root, layout)
            except SourceMissing as error:
                self._view = self._walked = None
                self._tracker.failed(error)
                return
            except SourceError as error:
                self._walked = None
                self._tracker.failed(error)  # keep the last good view
                return
            self._watch_tree(*walked, listed)
            self._walked = walked
        replaced = self._watch.watched if changed is None else changed  # where a file may have been replaced
        self._rounds.changed(replaced)
        self._sums.changed(replaced)
        layout, cgroups = walked
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

        def failed(cgroup: ContainerCgroup, error: SourceError) -> None:
            # a new error, without the traceback whose frames would hold the file's text until a cyclic
            # collection; named by its cgroup
            message = str(error) if str(error).startswith(cgroup.path) else f"{cgroup.path}: {error}"
            failures.append(type(error)(message, error_type=error.error_type))

        usages: Sequence[ContainerNumaUsage]
        if self._reader is None:
            cpusets_of = self._cpusets_to_read(changed, written)
            # nothing made, removed or written in the tree: only the counters the kernel keeps may differ
            quiet = changed == set() and cpusets_of == set() and not counters_written
            usages = self._read_all(layout, cgroups, cpusets_of, quiet, failures, failed)
        else:
            usages = self._read_each(self._reader, layout, cgroups, failed)
        last = self._view
        same = last is not None and (
            last.usages is usages
            or (len(last.usages) == len(usages) and all(map(operator.is_, last.usages, usages)))
        )
        self._view = CgroupView(
            layout, last.usages if same and last is not None else tuple(usages), self._names(), self._clock()
        )
        self._tracker.succeeded(partly=bool(failures))
        for failure in failures:
            self._tracker.failed(failure)

    def _watch_tree(
        self, layout: CgroupLayout, cgroups: tuple[ContainerCgroup, ...], listed: list[str]
    ) -> None:
        """Watch the directories just listed (a container comes or goes by an entry there) and the
        containers' own (a file replaced there is opened again); keep files open only where watched."""
        # the strings the watch already holds for directories listed before, not a copy of each
        held = {directory: directory for directory in self._walk_dirs}
        walk_dirs = {held.get(directory, directory) for directory in (str(self._root), *listed)}
        container_dirs = {
            directory for cgroup in cgroups for directory in container_directories(cgroup, layout)
        }
        missed = self._watch.watch(walk_dirs | container_dirs)
        # an entry made between the listing and its watch went unseen: a directory first watched now is
        # listed again next round, as is one that cannot be watched
        self._list_again = (
            not self._watch.available or bool(walk_dirs - self._walk_dirs) or bool(missed & walk_dirs)
        )
        self._walk_dirs = walk_dirs
        self._container_dirs = container_dirs - missed
        self._unwatched = {cgroup.path for cgroup in cgroups if cgroup.path not in self._container_dirs}
        self._rounds.keep_only(cgroups, self._container_dirs)
        self._sums.keep_only(self._kubepods)

    def close(self) -> None:
        """Close the watch and the files kept open."""
        self._watch.close()
        self._rounds.close()
        self._sums.close()

    def _cpusets_to_read(self, changed: set[str] | None, written: set[str]) -> set[str] | None:
        """The directories of the containers whose cpusets this round reads; ``None``: every container's
        (no inotify, the queue overflowed, a cpuset above the containers was written, or it is time)."""
        now = self._clock()
        if (
            changed is None
            or not self._watch.available
            or now - self._cpusets_read_at >= CPUSETS_MAX_AGE_S
            or not written <= self._container_dirs
        ):
            self._cpusets_read_at = now
            return None
        # a file replaced (a disk or tmpfs tree) is read again too, as is a directory not watched
        return written | changed | self._unwatched

    def _read_all(
        self,
        layout: CgroupLayout,
        cgroups: tuple[ContainerCgroup, ...],
        cpusets_of: Container[str] | None,
        quiet: bool,
        failures: list[SourceError],
        failed: Callable[[ContainerCgroup, SourceError], None],
    ) -> Sequence[ContainerNumaUsage]:
        """Every container's usage, bounded by the machine's NUMA ids and CPUs once its topology is known;
        a cpuset that cannot be trusted costs only that container's cpusets. When the round is ``quiet``
        (nothing in the tree made, removed or written) and the kubepods cgroups' sums are those of the last
        round that read every container without a failure, that round's usages again, unread."""
        topology = self._topology()
        nodes = frozenset(topology.node_ids) if topology is not None and topology.nodes else None
        cpus = topology.online_cpus if topology is not None and topology.online_cpus else None
        sums = self._sums.read(self._kubepods) if layout == "v2" else None  # before the containers' files
        inputs = (layout, cgroups, nodes, cpus, sums)
        last = self._view
        if quiet and sums is not None and inputs == self._quiet and last is not None:
            return last.usages
        self._quiet = None
        failed_before = len(failures)
        usages = self._rounds.read_all(
            cgroups,
            layout,
            self._to_read[layout],
            nodes,
            max(cpus) if cpus else MAX_CPU_ID,
            machine_cpus=cpus,
            on_cpuset_error=failures.append,
            on_error=failed,
            cpusets_of=cpusets_of,
        )
        if len(failures) == failed_before:  # a failure is counted again every round: read again
            self._quiet = inputs
        return usages

    @staticmethod
    def _read_each(
        reader: UsageReader,
        layout: CgroupLayout,
        cgroups: tuple[ContainerCgroup, ...],
        failed: Callable[[ContainerCgroup, SourceError], None],
    ) -> list[ContainerNumaUsage]:
        """Every container's usage as ``reader`` gives it (a reader of the caller's choosing)."""
        usages: list[ContainerNumaUsage] = []
        for cgroup in cgroups:
            try:
                usage = reader(cgroup, layout)
            except SourceError as error:
                failed(cgroup, error)
                continue
            if usage is not None:  # None: the container stopped meanwhile
                usages.append(usage)
        return usages

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
                    self._join_memo,
                )
                return usage, _pinned(view, usage, topology)

            inputs = (view.layout, view.usages, view.names, allocation, nodes, live_pods, topology)
            return self._joined.get(inputs, join)

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

        return self._effective.get((view.usages, view.names, wanted), find)

    def _advance_cpu_time(self, view: CgroupView, nodes: MachineNodes) -> Mapping[str, CpuTimeSplit]:
        if view.usages is self._cpu_usages and nodes == self._cpu_machine:
            return self._cpu_time
        advanced: dict[str, CpuTimeSplit] = {}
        for usage in view.usages:
            if usage.cpu_time_s is None or usage.cpus is None:
                continue
            shares = cpu_shares(usage.cpus, nodes)
            if not shares:
                continue
            previous = self._cpu_time.get(usage.container_id)
            # the same readings again (the machine changed): keep the totals, do not count their time twice
            advanced[usage.container_id] = (
                previous
                if view.usages is self._cpu_usages and previous is not None
                else advance_cpu_time(previous, usage.cpu_time_s, shares)
            )
        self._cpu_usages, self._cpu_machine, self._cpu_time = view.usages, nodes, advanced
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
