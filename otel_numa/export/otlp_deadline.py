"""OTLP pushes that end by ``--otlp-timeout`` by the wall clock, whatever the collector or the resolver does.

The OTLP exporters bound each network wait, not the push: a collector that answers one byte a second, a TLS
handshake dripped the same way or a resolver that never answers (``getaddrinfo`` cannot be interrupted) holds
a push far past its timeout. So :class:`DeadlineExporter` runs the exporter's ``export`` in a thread of its
own and waits for it at most the deadline; at the deadline it calls ``abort`` (the OTLP/HTTP session then
shuts the sockets of the request down, :mod:`otel_numa.export.otlp_http`; gRPC keeps deadlines of its own)
and reports the push failed. A call that still has not returned when the next push comes (a resolver that
takes its own time) is not joined by a second one: that push waits for it within its own deadline, then
fails, so a hung peer never costs more than one thread.

The exporter itself gets :func:`exporter_timeout_s`, a little less than the deadline, so that it reports the
failures it can see by itself (refused, unreachable, an error answer, no answer in its time) before the
agent has to stop it: ``error.type`` is ``failed`` for those and ``timeout`` only for a push the agent
stopped, whichever way the race between two timers of one length would have gone.

:class:`PushRecord` keeps what the pushes did for the export health series (``numa.agent.export.*``) and
logs each kind of push the agent had to stop once, until a push is accepted again (the exporter logs its
own failures).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from otel_numa.export.temporality import Temporality

log = logging.getLogger(__name__)

# error.type of numa.agent.export.failures
TIMEOUT = "timeout"  # the agent stopped the push at its deadline (or an earlier one still has not returned)
FAILED = "failed"  # the exporter gave up: refused, unreachable, an error answer, no answer in its time
ERROR_TYPES = (TIMEOUT, FAILED)
EXPORTER_SHARE = 0.9  # of the push's deadline, the exporter's own timeout
# what is left of the deadline at least, after the exporter's own timeout, for it to report its failure
# and return: on a busy node its thread may wait that long for the CPU, and the agent would then stop a
# push the exporter had seen fail (a tenth of a 1 s deadline was too little on two loaded cores)
REPORT_MARGIN_S = 0.25


def exporter_timeout_s(deadline_s: float) -> float:
    """The timeout to give the exporter of pushes that end by ``deadline_s``: nine tenths of it, less where
    that leaves under :data:`REPORT_MARGIN_S`, half of it at the least."""
    return max(deadline_s / 2, min(deadline_s * EXPORTER_SHARE, deadline_s - REPORT_MARGIN_S))


def _nothing(_thread_id: int) -> None:
    return None


def request_aborter(protocol: str) -> Callable[[int], object]:
    """What ends a push's requests made by a thread, for the exporter of ``protocol``: the OTLP/HTTP
    session's sockets are shut down; gRPC ends its calls at deadlines of its own."""
    if protocol == "grpc":
        return _nothing
    from otel_numa.export.otlp_http import abort_requests

    return abort_requests


class PushRecord:
    """What the OTLP pushes did: failures by ``error.type``, the last push's duration and when the collector
    last accepted one; thread-safe."""

    def __init__(self, endpoint: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._endpoint = endpoint
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = dict.fromkeys(ERROR_TYPES, 0)  # from 0, so rate() works from the first scrape
        self._failing_since_accepted = 0
        self._logged: set[str] = set()  # the kinds of failure logged since the last accepted push
        self._last_accepted = clock()  # before any: since the exporter was made
        self.last_duration_s: float | None = None
        self.generation = object()  # another after each push: the series' callbacks reuse theirs till then

    def failures(self) -> Mapping[str, int]:
        with self._lock:
            return dict(self._failures)

    def age_s(self) -> float:
        """Seconds since the collector last accepted a push (since start before the first)."""
        return self._clock() - self._last_accepted

    def accepted(self, duration_s: float) -> None:
        with self._lock:
            self.last_duration_s = duration_s
            self.generation = object()
            self._last_accepted = self._clock()
            failed, self._failing_since_accepted = self._failing_since_accepted, 0
            self._logged.clear()
        if failed:
            log.info("OTLP push to %s accepted again after %d failed pushes", self._endpoint, failed)

    def failed(self, error_type: str, duration_s: float, kind: str = "", message: str = "") -> None:
        """Count a failed push; ``message`` is logged the first time ``kind`` happens since the last
        accepted push (none: the exporter logged it)."""
        with self._lock:
            self.last_duration_s = duration_s
            self.generation = object()
            self._failures[error_type] += 1
            self._failing_since_accepted += 1
            first = bool(message) and kind not in self._logged
            self._logged.add(kind)
        if first:
            log.warning(
                "OTLP push to %s: %s; further failures of this kind are counted "
                "(numa_agent_export_failures_total{error_type=%r})",
                self._endpoint,
                message,
                error_type,
            )


def _left(deadline_s: float, began: float) -> float:
    return max(0.0, deadline_s - (time.monotonic() - began))


class _Call:
    """One export running in the caller's worker thread."""

    def __init__(self, metrics_data: MetricsData, timeout_millis: float) -> None:
        self.metrics_data = metrics_data
        self.timeout_millis = timeout_millis
        self.done = threading.Event()
        self.result: Any = MetricExportResult.FAILURE


class DeadlineExporter(MetricExporter):
    """``exporter`` (an OTLP exporter preferring ``temporality``) with every export ended by ``timeout_s``
    (or the smaller timeout the caller passes) by the wall clock, its outcome kept in ``record``. ``abort``
    is called with the exporting thread's id when an export runs past its deadline: it should end the
    requests that thread makes (:func:`request_aborter`)."""

    def __init__(
        self,
        exporter: MetricExporter,
        timeout_s: float,
        record: PushRecord,
        temporality: Temporality,
        abort: Callable[[int], object] = _nothing,
    ) -> None:
        super().__init__(preferred_temporality=temporality)
        self.exporter = exporter
        self.record = record
        self._timeout_s = timeout_s
        self._abort = abort
        self._one_at_a_time = threading.Lock()  # the periodic push, a rebuild's and the final one
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._running: _Call | None = None  # the call the worker is in, if any
        self._worker: threading.Thread | None = None

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        deadline_s = max(0.0, min(self._timeout_s, timeout_millis / 1000))
        began = time.monotonic()
        if not self._one_at_a_time.acquire(timeout=deadline_s):
            self.record.failed(
                TIMEOUT, time.monotonic() - began, TIMEOUT, "another push held the exporter past the deadline"
            )
            return MetricExportResult.FAILURE
        try:
            return self._export(metrics_data, deadline_s, began)
        finally:
            self._one_at_a_time.release()

    def _export(self, metrics_data: MetricsData, deadline_s: float, began: float) -> Any:
        running = self._running
        if running is not None and not running.done.wait(_left(deadline_s, began)):
            self.record.failed(
                TIMEOUT,
                time.monotonic() - began,
                "stuck",
                "an earlier push has still not returned (a resolver or a TLS handshake that keeps no "
                "deadline); later pushes fail until it does",
            )
            return MetricExportResult.FAILURE
        call = _Call(metrics_data, deadline_s * 1000)
        self._running = call
        worker = self._ensure_worker()
        self._calls.put(call)
        if not call.done.wait(_left(deadline_s, began)):
            if worker.ident is not None:
                self._abort(worker.ident)
            self.record.failed(
                TIMEOUT,
                time.monotonic() - began,
                TIMEOUT,
                f"the push did not end within --otlp-timeout ({deadline_s:g} s); it was stopped",
            )
            return MetricExportResult.FAILURE
        took = time.monotonic() - began
        if call.result == MetricExportResult.SUCCESS:
            self.record.accepted(took)
        else:
            self.record.failed(FAILED, took)
        return call.result

    def _ensure_worker(self) -> threading.Thread:
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="otel-numa-otlp-call", daemon=True)
            self._worker.start()
        return self._worker

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            try:
                call.result = self.exporter.export(call.metrics_data, timeout_millis=call.timeout_millis)
            except Exception as exc:  # the exporter's bug: this push failed, the next one is tried
                log.warning("OTLP export raised %r", exc)
            finally:
                call.metrics_data = None  # type: ignore[assignment]  # not held until the next push
                self._running = None
                call.done.set()

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.exporter.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._calls.put(None)
        self.exporter.shutdown(timeout_millis=timeout_millis, **kwargs)
