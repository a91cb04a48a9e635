"""Wires sources, collectors, the snapshot store, the pipeline and the HTTP endpoints together."""

from __future__ import annotations

import logging
import threading
import time

from prometheus_client import generate_latest, start_http_server

from otel_numa.accounting import compute_allocation
from otel_numa.collectors.background import BackgroundSources
from otel_numa.collectors.cgroups import CgroupCollector, ContainerLogNames, container_usage_enabled
from otel_numa.collectors.kubelet import KubeletCollector
from otel_numa.collectors.machine import MachineCollector
from otel_numa.health_server import HealthServer
from otel_numa.model import Allocation, KubeletState, Topology
from otel_numa.pipeline import Pipeline, build_pipeline
from otel_numa.scheduler import Scheduler
from otel_numa.settings import Settings, parse_host_port
from otel_numa.snapshot import Snapshot, SnapshotStore
from otel_numa.source_status import SourceRegistry
from otel_numa.watch import CheckpointWatcher

log = logging.getLogger(__name__)


class Agent:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sources = SourceRegistry()
        self._machine = MachineCollector(settings.sysfs_root, settings.procfs_root, self.sources)
        self._kubelet = KubeletCollector(settings.kubelet_root, settings.pod_logs_root, self.sources)
        # podresources and the runtime: refreshed by the scheduler, only read by snapshot builds
        self.background = BackgroundSources(settings, self.sources)
        self._cgroups: CgroupCollector | None = None
        if container_usage_enabled(settings):
            names = ContainerLogNames(settings.container_logs_root)
            self._cgroups = CgroupCollector(settings.cgroup_root, names, self.sources)
        self._allocation_inputs: tuple[object, ...] = ()
        self._allocation = Allocation()
        self.store = SnapshotStore(self._build_snapshot)
        self.pipeline: Pipeline | None = None
        self._health: HealthServer | None = None
        self._prometheus_server: object | None = None
        self.scheduler: Scheduler | None = None
        self.watcher: CheckpointWatcher | None = None
        self._stopped = threading.Event()

    def _build_snapshot(self) -> Snapshot:
        machine = self._machine.collect()
        kubelet = self.background.merge(self._kubelet.collect())
        allocation = self._account(kubelet, machine.topology) if machine is not None else Allocation()
        return Snapshot(
            taken_at=time.monotonic(),
            machine=machine,
            allocation=allocation,
            sources=self.sources.reports(),
            container_usage=(
                self._cgroups.containers(allocation, machine, kubelet.live_pods) if self._cgroups else ()
            ),
        )

    def _account(self, kubelet: KubeletState, topology: Topology) -> Allocation:
        """Accounting is redone only when an input changed (collectors return the same objects otherwise)."""
        inputs = (topology, *(getattr(kubelet, name) for name in KubeletState.__slots__))
        if len(inputs) != len(self._allocation_inputs) or any(
            new is not old for new, old in zip(inputs, self._allocation_inputs, strict=True)
        ):
            self._allocation = compute_allocation(kubelet, topology, self.settings.reserved_cpus)
            self._allocation_inputs = inputs
        return self.background.finish(self._allocation)  # memoised too

    # One-shot mode ------------------------------------------------------------------------------

    def refresh_background(self) -> None:
        """Every background read at once, in this thread (``--once`` and in-process use: no scheduler)."""
        if self._cgroups is not None:
            self._cgroups.refresh()
        self.background.refresh_once()

    def exposition_once(self) -> bytes:
        """The Prometheus text exposition of one collection."""
        self.refresh_background()
        pipeline = build_pipeline(self.settings, self.store, exporters=("prometheus",))
        try:
            assert pipeline.registry is not None
            return generate_latest(pipeline.registry)
        finally:
            pipeline.shutdown(timeout_s=1)

    # Serving ------------------------------------------------------------------------------------

    def start(self) -> None:
        settings = self.settings
        if settings.health_address != "none":
            host, port = parse_host_port(settings.health_address)
            self._health = HealthServer(host, port, lambda: self.store.ready)
            self._health.start()
        self.pipeline = build_pipeline(settings, self.store)
        self.background.attach(self.pipeline.meter_provider)
        if self.pipeline.registry is not None and settings.prometheus_address != "none":
            host, port = parse_host_port(settings.prometheus_address)
            self._prometheus_server, _ = start_http_server(port, addr=host, registry=self.pipeline.registry)
        # Take the first snapshot now, so /readyz turns green without waiting for a scrape.
        self.store.refresh()
        self.scheduler = Scheduler(
            settings.interval,
            [*self.background.tasks, self._push],
            min_trigger_gap_s=settings.push_min_interval,
            periodic_tasks=[self._cgroups.refresh] if self._cgroups is not None else [],
        )
        self.scheduler.start()
        # A kubelet state change runs at once: podresources and runtime refresh, then an OTLP push.
        self.watcher = CheckpointWatcher(self._kubelet.watched_files, self.scheduler.trigger)
        self.watcher.start()
        log.info(
            "otel-numa serving node %s with exporters %s", settings.node_name, ",".join(settings.exporters)
        )

    def _push(self) -> None:
        if self.pipeline is not None:
            self.pipeline.push(timeout_s=self.settings.otlp_timeout)

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
            self.scheduler.stop(timeout_s=0.5)
            push_stuck = self.scheduler.running
        for server in (self._prometheus_server, self._health):
            shutdown = getattr(server, "shutdown", None) or getattr(server, "stop", None)
            if shutdown is not None:
                shutdown()
        if self.pipeline is not None:
            # One last export with what is left of the budget, unless a push already hangs on the collector.
            budget = min(self.settings.otlp_timeout, deadline - time.monotonic() - 0.5)
            if not push_stuck and budget > 0.2:
                self.pipeline.push(timeout_s=budget)
            self.pipeline.shutdown(max(0.1, deadline - time.monotonic()))
        if not push_stuck:
            self.background.close()
