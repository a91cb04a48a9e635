"""Wires the snapshot builder and store, the pipeline, the scheduler and the HTTP endpoints together.

What is read and how a snapshot is built is :mod:`otel_numa.snapshot.builder`'s job; the agent serves it.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable

from prometheus_client import generate_latest

from otel_numa.daemon.heap import HeapPolicy
from otel_numa.daemon.scheduler import Scheduler, WithDeadline
from otel_numa.endpoints.health import HealthServer
from otel_numa.endpoints.metrics_page import MetricsServer
from otel_numa.export.pipeline import Pipeline, build_pipeline
from otel_numa.options import AgentOptions
from otel_numa.snapshot.builder import SnapshotBuilder
from otel_numa.snapshot.source_status import SourceRegistry
from otel_numa.snapshot.store import SnapshotStore
from otel_numa.snapshot.watch import CheckpointWatcher

log = logging.getLogger(__name__)

# How long a read that hangs may hold: --once (it then prints what it has), the start-up snapshot (the
# agent then serves, not ready), a background cgroup walk (the push then carries the last good walk).
ONCE_WAIT_S = 10.0
START_WAIT_S = 2.0  # SIGTERM during start-up must still end within the grace period
BACKGROUND_READ_WAIT_S = 1.0
PUSH_TIMER_INTERVALS = 2  # without refreshes, pushes every two --interval


class CannotListen(OSError):
    """An address the agent serves on cannot be bound (taken, not local, not permitted)."""

    def __init__(self, setting: str, host: str, port: int, cause: OSError) -> None:
        reason = (cause.strerror or str(cause)).lower()
        flag = f"--{setting.replace('_', '-')}"
        advice = {
            errno.EADDRINUSE: f"another process (a second agent?) listens there: stop it or choose another "
            f"{flag}",
            errno.EADDRNOTAVAIL: f"{host} is not an address of this machine: give {flag} one of its "
            f"addresses, or 0.0.0.0:{port} for all of them",
            errno.EACCES: f"ports below 1024 need a capability the agent does not have: choose a port above "
            f"1023 in {flag}",
        }.get(cause.errno or 0, f"choose another {flag}")
        super().__init__(f"cannot listen on {host}:{port} ({setting}): {reason}; {advice}")
        self.setting = setting


class Agent:
    def __init__(self, options: AgentOptions, heap: HeapPolicy | None = None) -> None:
        """``heap``: the long-running process's heap policy (otel_numa.daemon.serve); None leaves the heap
        alone."""
        self.options = options
        self._heap = heap
        self.sources = SourceRegistry()
        self.builder = SnapshotBuilder(options, self.sources)
        self.background = self.builder.background
        self.store = SnapshotStore(self.builder.build, stale=self.builder.stale)
        self.pipeline: Pipeline | None = None
        self._health: HealthServer | None = None
        self._prometheus_server: MetricsServer | None = None
        self.scheduler: Scheduler | None = None  # the background refresh
        self.push_scheduler: Scheduler | None = None  # the pushes, in a thread of their own
        self.watcher: CheckpointWatcher | None = None

    def healthy(self) -> bool:
        """False once one collection has run longer than the stall timeout (``/healthz``)."""
        return self.store.stalled_for() <= self.options.stall_timeout_s

    # One-shot mode ------------------------------------------------------------------------------

    def refresh_background(self) -> None:
        """Every background read at once, in this thread (``--once`` and in-process use: no scheduler)."""
        self.builder.refresh_background()

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
        cgroups = self.builder.cgroups
        cgroup_refresh = (
            [WithDeadline(cgroups.refresh, BACKGROUND_READ_WAIT_S, "otel-numa-cgroups")]
            if cgroups is not None
            else []
        )
        # Pushes have a thread of their own: a collector that hangs never freezes the container data. Each
        # refresh round is followed by a push; the push timer only matters while refreshes stop (at one
        # interval it would push again before each refresh round ends: two pushes a round).
        after_refresh: list[Callable[[], None]] = []
        if self.pipeline.pushing:
            self.push_scheduler = Scheduler(
                options.interval_s * PUSH_TIMER_INTERVALS,
                [self._push],
                name="otel-numa-push",
                min_trigger_gap_s=options.push_min_interval_s,
                first_round_at_once=False,
                trigger_restarts_timer=True,
            )
            self.push_scheduler.start()
            after_refresh.append(self.push_scheduler.trigger)
        self.scheduler = Scheduler(
            options.interval_s,
            [*self.background.tasks, *after_refresh],
            min_trigger_gap_s=options.push_min_interval_s,
            periodic_tasks=cgroup_refresh,
            closing_tasks=[self._heap.after_round] if self._heap is not None else [],
        )
        self.scheduler.start()
        # A kubelet state change runs at once: podresources and runtime refresh, then an OTLP push.
        if self.builder.kubelet is not None:
            self.watcher = CheckpointWatcher(self.builder.kubelet.watched_files, self.scheduler.trigger)
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

    def stop(self, timeout_s: float = 4.0) -> None:
        """Flush and stop within ``timeout_s``, even with a dead or hung collector."""
        deadline = time.monotonic() + timeout_s
        refresh_stuck = push_busy = False
        if self.watcher is not None:
            self.watcher.stop(timeout_s=0.2)
        if self.scheduler is not None:
            self.scheduler.stop(timeout_s=BACKGROUND_READ_WAIT_S + 0.5)
            refresh_stuck = self.scheduler.running
        if self.push_scheduler is not None:
            # a push in progress ends by its deadline: wait for it with half of what is left
            self.push_scheduler.stop(timeout_s=max(0.0, (deadline - time.monotonic()) / 2))
            push_busy = self.push_scheduler.running
        if self._prometheus_server is not None:
            self._prometheus_server.shutdown()
        if self._health is not None:
            self._health.stop()
        if self.pipeline is not None:
            # One last export with what is left of the budget, unless a push still waits on the collector.
            budget = min(self.options.export.otlp_timeout_s, deadline - time.monotonic() - 0.5)
            if push_busy:
                log.info("no final push: the last push is still waiting on the collector")
            elif budget > 0.2:
                self.pipeline.push(timeout_s=budget)
            self.pipeline.shutdown(max(0.1, deadline - time.monotonic()))
        self.store.close()
        if not refresh_stuck:  # a read still in progress keeps its files
            self.builder.close()

    def close(self) -> None:
        """Release an agent that was never started: the snapshot worker, the cgroup watch and the files
        kept open, the background sources' channels (``stop`` does this for a started one)."""
        self.store.close()
        self.builder.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _url_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
