"""Wires sources, collectors, the snapshot store, the pipeline and the HTTP endpoints together.

Only the parts the enabled metrics need are built (:meth:`otel_numa.cli.settings.Settings.to_options`
decides): a switched-off group's sources are never opened. A snapshot is built in isolated stages
(:mod:`otel_numa.snapshot.stages`): machine, allocation, container usage, enrichment.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any

from prometheus_client import generate_latest

from otel_numa.accounting.allocation import compute_allocation
from otel_numa.daemon.heap import HeapPolicy
from otel_numa.daemon.scheduler import Scheduler, WithDeadline
from otel_numa.endpoints.health import HealthServer
from otel_numa.endpoints.metrics_page import MetricsServer
from otel_numa.export.pipeline import Pipeline, build_pipeline
from otel_numa.instruments.catalogue import PROCESS_METRICS
from otel_numa.model import Allocation, ContainerUsage, KubeletState, MachineUsage, ProcessUsage
from otel_numa.options import AgentOptions
from otel_numa.snapshot.collectors.background import BackgroundSources
from otel_numa.snapshot.collectors.cgroups import CgroupCollector, ContainerLogNames
from otel_numa.snapshot.collectors.dra import DraPlacer
from otel_numa.snapshot.collectors.kubelet import KubeletCollector
from otel_numa.snapshot.collectors.machine import MachineCollector
from otel_numa.snapshot.memo import LastResult
from otel_numa.snapshot.source_status import SourceRegistry
from otel_numa.snapshot.stages import Stage
from otel_numa.snapshot.store import Snapshot, SnapshotStore
from otel_numa.snapshot.watch import CheckpointWatcher
from otel_numa.sources import roots
from otel_numa.sources.errors import SourceError
from otel_numa.sources.process import OwnProcess

log = logging.getLogger(__name__)

# How long a read that hangs may hold: --once (it then prints what it has), the start-up snapshot (the
# agent then serves, not ready), a background cgroup walk (the push then carries the last good walk).
ONCE_WAIT_S = 10.0
START_WAIT_S = 2.0  # SIGTERM during start-up must still end within the grace period
BACKGROUND_READ_WAIT_S = 1.0


class CannotListen(OSError):
    """An address the agent serves on cannot be bound (taken, not local, not permitted)."""

    def __init__(self, setting: str, host: str, port: int, cause: OSError) -> None:
        reason = (cause.strerror or str(cause)).lower()
        super().__init__(
            f"cannot listen on {host}:{port} ({setting}): {reason}; stop what uses it or choose another "
            f"--{setting.replace('_', '-')}"
        )
        self.setting = setting


class Agent:
    def __init__(self, options: AgentOptions, heap: HeapPolicy | None = None) -> None:
        """``heap``: the long-running process's heap policy (otel_numa.daemon.serve); None leaves the heap
        alone."""
        self.options = options
        self._heap = heap
        self.sources = SourceRegistry()
        machine = options.machine
        self._machine = MachineCollector(
            machine.sysfs_root, machine.procfs_root, self.sources, parts=machine.parts
        )
        self._kubelet = KubeletCollector(options.kubelet, self.sources) if options.kubelet else None
        # places DRA devices on NUMA nodes; only when a metric counts devices
        self._dra = (
            DraPlacer(options.kubelet.cdi_spec_dirs, machine.sysfs_root, machine.procfs_root, self.sources)
            if options.kubelet is not None and options.kubelet.place_dra_devices
            else None
        )
        # podresources and the runtime: refreshed by the scheduler, only read by snapshot builds
        self.background = BackgroundSources(options.podresources, options.runtime, self.sources)
        self._cgroups: CgroupCollector | None = None
        if options.cgroups is not None:
            cgroups = options.cgroups
            names = ContainerLogNames(cgroups.container_logs_root)
            machine_collector = self._machine
            self._cgroups = CgroupCollector(
                cgroups.cgroup_root,
                names,
                self.sources,
                memory_types=cgroups.memory_types,
                topology=lambda: machine_collector.topology,
            )
        self._allocation: LastResult[Allocation] = LastResult()
        self._process = OwnProcess() if PROCESS_METRICS & set(options.metrics) else None
        self._process_failed = False
        # Each stage counts its internal errors on the source it mainly reads.
        tracker = self.sources.tracker
        self._machine_stage: Stage[MachineUsage | None] = Stage("machine", tracker("sysfs"), None)
        self._allocation_stage = Stage("allocation", tracker("cpu_manager"), (KubeletState(), Allocation()))
        self._usage_stage: Stage[tuple[ContainerUsage, ...]] = Stage("container_usage", tracker("cgroup"), ())
        self._enrichment_stage = Stage("enrichment", tracker("cri"), Allocation())
        self.store = SnapshotStore(self._build_snapshot, stale=self._stale_snapshot)
        self._check_roots()
        self.pipeline: Pipeline | None = None
        self._health: HealthServer | None = None
        self._prometheus_server: MetricsServer | None = None
        self.scheduler: Scheduler | None = None
        self.watcher: CheckpointWatcher | None = None
        self._stopped = threading.Event()

    def _check_roots(self) -> None:
        """A root that holds none of what it should is a mount mistake: warn once and report its sources
        as failing, so a mis-mounted DaemonSet does not look healthy."""
        options = self.options
        problems: list[tuple[str | None, tuple[str, ...]]] = [
            (roots.sysfs_problem(options.machine.sysfs_root), ("sysfs",))
        ]
        if options.kubelet is not None and options.kubelet.checkpoints:
            checkpoints = tuple(sorted(options.kubelet.checkpoints))
            problems.append((roots.kubelet_problem(options.kubelet.kubelet_root), checkpoints))
        if options.cgroups is not None:
            problems.append((roots.cgroup_problem(options.cgroups.cgroup_root), ("cgroup",)))
        for problem, names in problems:
            if problem is not None:
                log.warning("%s; numa.agent.source.success is 0 for %s", problem, ", ".join(names))
                for name in names:
                    self.sources.tracker(name).wrong_root(problem)

    # Snapshot -----------------------------------------------------------------------------------

    def _build_snapshot(self) -> Snapshot:
        self.sources.count_stuck_reads()  # a background read that hangs (the cgroup walk) is counted too
        machine = self._machine_stage.run(self._machine.collect)
        stages: list[Stage[Any]] = [self._machine_stage]
        kubelet, allocation = KubeletState(), Allocation()
        if self._kubelet is not None:
            kubelet, allocation = self._allocation_stage.run(lambda: self._allocate(machine))
            stages.append(self._allocation_stage)
        if self.background.runtime is not None:
            allocated = allocation
            allocation = self._enrichment_stage.run(lambda: self.background.enrich(allocated))
            stages.append(self._enrichment_stage)
        usage: tuple[ContainerUsage, ...] = ()
        if self._cgroups is not None:
            cgroups, joined_allocation = self._cgroups, allocation
            usage = self._usage_stage.run(
                lambda: cgroups.containers(joined_allocation, machine, kubelet.live_pods)
            )
            stages.append(self._usage_stage)
        return Snapshot(
            taken_at=time.monotonic(),
            machine=machine,
            allocation=allocation,
            sources=self.sources.reports(),
            container_usage=usage,
            stages=tuple(stage.report for stage in stages if stage.report is not None),
            series_forgetting=self.pipeline.forgetting_supported if self.pipeline is not None else None,
            process=self._read_process(),
        )

    def _stale_snapshot(self, latest: Snapshot | None, now: float) -> Snapshot:
        """What a collection serves while a build hangs: the last good data, aged to now, with the stuck
        reads counted as ``timeout`` errors."""
        self.sources.count_stuck_reads()
        if latest is None:
            return Snapshot(
                taken_at=now, machine=None, allocation=Allocation(), sources=self.sources.reports()
            )
        return replace(latest, taken_at=now, sources=self.sources.reports())

    def healthy(self) -> bool:
        """False once one collection has run longer than the stall timeout (``/healthz``)."""
        return self.store.stalled_for() <= self.options.stall_timeout_s

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
        assert self._kubelet is not None
        # the checkpoints are judged against the machine: ids it does not have make a file not its own
        topology = machine.topology if machine is not None else None
        cpus = topology.online_cpus if topology is not None else frozenset()
        nodes = frozenset(topology.node_ids) if topology is not None else None
        kubelet = self.background.merge(self._kubelet.collect(max(cpus) if cpus else None, nodes))
        if machine is None:  # no topology yet: nothing can be put on a NUMA node
            return kubelet, Allocation()
        if self._dra is not None:
            placed, unknown = self._dra.place(kubelet, machine.pci, machine.topology)
            if placed or unknown:
                kubelet = replace(kubelet, dra_numa=placed, dra_unknown=unknown)
        reserved = self.options.kubelet.reserved_cpus if self.options.kubelet is not None else None
        allocation = self._allocation.get(
            (machine.topology, kubelet), lambda: compute_allocation(kubelet, machine.topology, reserved)
        )
        self.background.count_disagreements(allocation)
        return kubelet, allocation

    # One-shot mode ------------------------------------------------------------------------------

    def refresh_background(self) -> None:
        """Every background read at once, in this thread (``--once`` and in-process use: no scheduler)."""
        if self._cgroups is not None:
            self._cgroups.refresh()
        self.background.refresh_once()

    def exposition_once(self) -> bytes:
        """The Prometheus text exposition of one collection; a read that hangs costs it at most
        :data:`ONCE_WAIT_S` (its source is then counted as a ``timeout``)."""
        WithDeadline(self.refresh_background, ONCE_WAIT_S, "otel-numa-once")()
        self.store.fresh_wait_s = ONCE_WAIT_S
        pipeline = build_pipeline(self.options, self.store, exporters=("prometheus",))
        try:
            assert pipeline.registry is not None
            return generate_latest(pipeline.registry)
        finally:
            pipeline.shutdown(timeout_s=1)

    # Serving ------------------------------------------------------------------------------------

    def start(self) -> None:
        options, export = self.options, self.options.export
        if options.health_address is not None:
            host, port = options.health_address
            try:
                self._health = HealthServer(host, port, lambda: self.store.ready, self.healthy)
            except OSError as exc:
                raise CannotListen("health_address", host, port, exc) from exc
            self._health.start()
        self.pipeline = build_pipeline(options, self.store)
        if self._heap is not None:
            self.pipeline.after_push = self._heap.after_push
            if self.pipeline.registry is not None:
                self.pipeline.registry.after_collection = self._heap.after_collection
        self.background.live_pods_listener = self.pipeline.forget_departed
        if self.pipeline.registry is not None and export.prometheus_address is not None:
            host, port = export.prometheus_address
            try:
                self._prometheus_server = MetricsServer(
                    host,
                    port,
                    self.pipeline.registry,
                    export.tls,
                    app=self.pipeline.page_app(),
                    after_response=self._heap.after_response if self._heap is not None else None,
                )
            except OSError as exc:
                raise CannotListen("prometheus_address", host, port, exc) from exc
        # Take the first snapshot now, so /readyz turns green without waiting for a scrape.
        self.store.refresh(wait_s=START_WAIT_S)
        # the cgroup walk reads a few files per container: one that hangs must not hold the push
        cgroup_refresh = (
            [WithDeadline(self._cgroups.refresh, BACKGROUND_READ_WAIT_S, "otel-numa-cgroups")]
            if self._cgroups is not None
            else []
        )
        self.scheduler = Scheduler(
            options.interval_s,
            [*self.background.tasks, self._push],
            min_trigger_gap_s=options.push_min_interval_s,
            periodic_tasks=cgroup_refresh,
            closing_tasks=[self._heap.after_round] if self._heap is not None else [],
        )
        self.scheduler.start()
        # A kubelet state change runs at once: podresources and runtime refresh, then an OTLP push.
        if self._kubelet is not None:
            self.watcher = CheckpointWatcher(self._kubelet.watched_files, self.scheduler.trigger)
            self.watcher.start()
        log.info("otel-numa serving node %s with exporters %s", options.node_name, ",".join(export.exporters))
        self._log_where()

    def _log_where(self) -> None:
        """Every address served and every source found or missed, so the start-up log answers 'where is
        the page' and 'what does it see' without a scrape."""
        options, export = self.options, self.options.export
        if self._prometheus_server is not None and export.prometheus_address is not None:
            scheme = "https" if export.tls is not None else "http"
            log.info("Prometheus page: %s://%s/metrics", scheme, _url_host(*export.prometheus_address))
        if "otlp" in export.exporters:
            log.info(
                "OTLP push: %s (%s) every %gs", export.otlp_url, export.otlp_protocol, options.interval_s
            )
        if self._health is not None and options.health_address is not None:
            where = _url_host(*options.health_address)
            log.info("health: http://%s/healthz and http://%s/readyz", where, where)
        reports = self.sources.reports()
        found = [r.name for r in reports if r.present and r.last_ok is not False]
        missed = [r.name for r in reports if not r.present or r.last_ok is False]
        log.info("sources found: %s; missed: %s", ", ".join(found) or "none", ", ".join(missed) or "none")

    def _push(self) -> None:
        if self.pipeline is not None:
            self.pipeline.push(timeout_s=self.options.export.otlp_timeout_s)

    def wait(self) -> None:
        self._stopped.wait()

    def request_stop(self) -> None:
        self._stopped.set()

    def stop(self, timeout_s: float = 4.0) -> None:
        """Flush and stop within ``timeout_s``, even with a dead or hung collector."""
        deadline = time.monotonic() + timeout_s
        push_stuck = False
        if self.watcher is not None:
            self.watcher.stop(timeout_s=0.2)
        if self.scheduler is not None:
            self.scheduler.stop(timeout_s=BACKGROUND_READ_WAIT_S + 0.5)
            push_stuck = self.scheduler.running
        if self._prometheus_server is not None:
            self._prometheus_server.shutdown()
        if self._health is not None:
            self._health.stop()
        if self.pipeline is not None:
            # One last export with what is left of the budget, unless a push already hangs on the collector.
            budget = min(self.options.export.otlp_timeout_s, deadline - time.monotonic() - 0.5)
            if not push_stuck and budget > 0.2:
                self.pipeline.push(timeout_s=budget)
            self.pipeline.shutdown(max(0.1, deadline - time.monotonic()))
        if not push_stuck:
            self.background.close()


def _url_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
