"""Builds one snapshot from the agent's collectors, in isolated stages.

The builder owns every collector the enabled metrics need (a switched-off group's sources are never
opened) and turns their values into a :class:`~otel_numa.snapshot.store.Snapshot`:

1. machine: sysfs and procfs (:class:`MachineCollector`);
2. allocation: the kubelet's checkpoints, then podresources' last answer merged over them
   (:meth:`BackgroundSources.merge`: where podresources answers, its live pods and allocations win), DRA
   devices placed on NUMA nodes, then :func:`compute_allocation`;
3. enrichment: the container runtime's last view (opt-in);
4. container usage: the cgroup walk's last result joined with the allocation, each container's record
   compared with its effective cpusets, and the CPUs each NUMA node has pinned to one pod.

Each stage is a failure domain of its own (:mod:`otel_numa.snapshot.stages`). RPCs and the cgroup walk run
in the background (:meth:`refresh_background`, or the scheduler's tasks); a build only reads their last
results.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from otel_numa.accounting.allocation import compute_allocation
from otel_numa.accounting.dra_claims import needing_kernel_cpus
from otel_numa.model import Allocation, ContainerUsage, KubeletState, MachineUsage, ProcessUsage, Source
from otel_numa.options import AgentOptions
from otel_numa.snapshot.collectors.background import BackgroundSources
from otel_numa.snapshot.collectors.cgroups import CgroupCollector, ContainerLogNames, Joined
from otel_numa.snapshot.collectors.dra import DraPlacer
from otel_numa.snapshot.collectors.dra_records import DraRecords
from otel_numa.snapshot.collectors.kubelet import KubeletCollector
from otel_numa.snapshot.collectors.machine import MachineCollector
from otel_numa.snapshot.container_limit import ContainerLimit
from otel_numa.snapshot.identity import kept, kept_parts
from otel_numa.snapshot.memo import LastResult
from otel_numa.snapshot.source_status import SourceRegistry
from otel_numa.snapshot.stages import Stage
from otel_numa.snapshot.store import Snapshot
from otel_numa.sources import roots
from otel_numa.sources.errors import SourceError
from otel_numa.sources.process import OwnProcess

log = logging.getLogger(__name__)


class SnapshotBuilder:
    def __init__(self, options: AgentOptions, sources: SourceRegistry) -> None:
        self.options = options
        self.sources = sources
        machine = options.machine
        self.machine = MachineCollector(machine.sysfs_root, machine.procfs_root, sources, parts=machine.parts)
        kubelet = options.kubelet
        self.kubelet = KubeletCollector(kubelet, sources) if kubelet is not None else None
        # places DRA devices on NUMA nodes; only when a metric counts devices
        self._dra = (
            DraPlacer(kubelet.cdi_spec_dirs, machine.sysfs_root, machine.procfs_root, sources)
            if kubelet is not None and kubelet.place_dra_devices
            else None
        )
        self._dra_records = DraRecords(sources)  # what DRA CPU and memory drivers gave their claims
        self._kernel_wanted: LastResult[frozenset[tuple[str, str]]] = LastResult()
        # podresources and the runtime: refreshed in the background, only read by builds
        self.background = BackgroundSources(
            options.podresources, options.runtime, sources, topology=lambda: self.machine.topology
        )
        self.cgroups: CgroupCollector | None = None
        if options.cgroups is not None:
            machine_collector = self.machine
            self.cgroups = CgroupCollector(
                options.cgroups.cgroup_root,
                ContainerLogNames(options.cgroups.container_logs_root),
                sources,
                memory_types=options.cgroups.memory_types,
                topology=lambda: machine_collector.topology,
            )
        self._allocation: LastResult[Allocation] = LastResult()
        self._last: Snapshot | None = None
        self._process = OwnProcess() if options.own_process else None
        self._process_failed = False
        # Each stage counts its internal errors on the source it mainly reads.
        tracker = sources.tracker
        self._machine_stage: Stage[MachineUsage | None] = Stage("machine", tracker(Source.SYSFS), None)
        self._allocation_stage = Stage(
            "allocation", tracker(Source.CPU_MANAGER), (KubeletState(), Allocation())
        )
        self._usage_stage: Stage[Joined] = Stage("container_usage", tracker(Source.CGROUP), ((), None))
        self._enrichment_stage = Stage("enrichment", tracker(Source.CRI), Allocation())
        self._container_limit = ContainerLimit(tracker(Source.CPU_MANAGER))  # the allocation stage's source
        self._check_roots()

    def _check_roots(self) -> None:
        """A root that holds none of what it should is a mount mistake: warn once and report its sources
        as failing, so a mis-mounted DaemonSet does not look healthy."""
        options = self.options
        problems: list[tuple[str | None, tuple[str, ...]]] = [
            (roots.sysfs_problem(options.machine.sysfs_root), (Source.SYSFS,))
        ]
        if options.kubelet is not None and options.kubelet.checkpoints:
            checkpoints = tuple(sorted(options.kubelet.checkpoints))
            problems.append((roots.kubelet_problem(options.kubelet.kubelet_root), checkpoints))
        if options.cgroups is not None:
            problems.append((roots.cgroup_problem(options.cgroups.cgroup_root), (Source.CGROUP,)))
        for problem, names in problems:
            if problem is not None:
                log.warning("%s; numa.agent.source.success is 0 for %s", problem, ", ".join(names))
                for name in names:
                    self.sources.tracker(name).wrong_root(problem)

    def build(self) -> Snapshot:
        self.sources.count_stuck_reads()  # a background read that hangs (the cgroup walk) is counted too
        machine = self._machine_stage.run(self.machine.collect)
        stages: list[Stage[Any]] = [self._machine_stage]
        kubelet, allocation = KubeletState(), Allocation()
        if self.kubelet is not None:
            kubelet, allocation = self._allocation_stage.run(lambda: self._allocate(machine))
            stages.append(self._allocation_stage)
        if self.background.runtime is not None:
            allocated = allocation
            allocation = self._enrichment_stage.run(lambda: self.background.enrich(allocated))
            stages.append(self._enrichment_stage)
        allocation = self._container_limit.apply(allocation)  # the totals above count every container
        usage: tuple[ContainerUsage, ...] = ()
        pinned: Mapping[int, int] | None = None
        if self.cgroups is not None:
            cgroups, joined_allocation = self.cgroups, allocation
            usage, pinned = self._usage_stage.run(
                lambda: cgroups.join(joined_allocation, machine, kubelet.live_pods)
            )
            stages.append(self._usage_stage)
        last = self._last
        if last is not None:
            # what did not change is the last snapshot's object: the instruments' promise (snapshot.identity)
            machine = kept_parts(machine, last.machine) if machine is not None else None
            allocation = kept(allocation, last.allocation)
            usage = kept(usage, last.container_usage)
            pinned = kept(pinned, last.cpu_pinned)
        snapshot = Snapshot(
            taken_at=time.monotonic(),
            machine=machine,
            allocation=allocation,
            sources=self.sources.reports(),
            container_usage=usage,
            cpu_pinned=pinned,
            stages=tuple(stage.report for stage in stages if stage.report is not None),
            process=self._read_process(),
        )
        self._last = snapshot
        return snapshot

    def stale(self, latest: Snapshot | None, now: float) -> Snapshot:
        """What a collection serves while a build hangs: the last good data, aged to now, with the stuck
        reads counted as ``timeout`` errors."""
        self.sources.count_stuck_reads()
        if latest is None:
            return Snapshot(
                taken_at=now, machine=None, allocation=Allocation(), sources=self.sources.reports()
            )
        return replace(latest, taken_at=now, sources=self.sources.reports())

    def close(self) -> None:
        """Close the background sources' channels, the cgroup watch and the files kept open."""
        self.background.close()
        if self.cgroups is not None:
            self.cgroups.close()

    def refresh_background(self) -> None:
        """Every background read at once, in this thread (``--once`` and in-process use: no scheduler)."""
        if self.cgroups is not None:
            self.cgroups.refresh()
        self.background.refresh_once()

    def _read_process(self) -> ProcessUsage | None:
        """The agent's own cost, once per snapshot (every callback of a collection reads this one)."""
        if self._process is None:
            return None
        try:
            usage = self._process.read()
        except SourceError as exc:
            if not self._process_failed:
                log.warning("%s; the process.* series are left out", exc)
            self._process_failed = True
            return None
        self._process_failed = False
        return usage

    def _allocate(self, machine: MachineUsage | None) -> tuple[KubeletState, Allocation]:
        assert self.kubelet is not None
        # the checkpoints are judged against the machine: ids it does not have make a file not its own
        topology = machine.topology if machine is not None else None
        cpus = topology.online_cpus if topology is not None else frozenset()
        nodes = frozenset(topology.node_ids) if topology is not None else None
        kubelet = self.background.merge(self.kubelet.collect(max(cpus) if cpus else None, nodes))
        if machine is None:  # no topology yet: nothing can be put on a NUMA node
            return kubelet, Allocation()
        if self._dra is not None:
            placed, unknown = self._dra.place(kubelet, machine.pci, machine.topology)
            if placed or unknown:
                kubelet = replace(kubelet, dra_numa=placed, dra_unknown=unknown)
            records = self._dra_records.read(kubelet, self._dra.cdi_devices, machine.topology)
            if records:
                kubelet = replace(kubelet, dra_records=records)
            # a CPU claim that names no cpuset holds its containers' effective CPUs: the cgroup walk's
            state = kubelet
            wanted = self._kernel_wanted.get(
                (kubelet.podresources, records), lambda: needing_kernel_cpus(state)
            )
            if wanted and self.cgroups is not None:
                kubelet = replace(kubelet, kernel_cpus=self.cgroups.effective_cpus(wanted))
        reserved = self.options.kubelet.reserved_cpus if self.options.kubelet is not None else None
        allocation = self._allocation.get(
            (machine.topology, kubelet), lambda: compute_allocation(kubelet, machine.topology, reserved)
        )
        self.background.count_disagreements(allocation)
        return kubelet, allocation
