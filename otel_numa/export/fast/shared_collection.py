"""Patch ``shared_collection``: the page's reader also feeds the push exporters.

On the public path the page and each push exporter have a reader of their own, so the SDK keeps one
aggregation per series for each, and a push costs a collection of its own. Here one Prometheus reader
serves both: a collection made by :meth:`SharedPrometheusReader.push` goes to the exporters, one made by a
scrape to the page. It overrides the reader's private ``_receive_metrics``, the one place where a reader
hands on a collection. Only when the pushes are cumulative like the page.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from otel_numa.export.fast.patch import Patch

log = logging.getLogger(__name__)


class SharedPrometheusReader(PrometheusMetricReader):
    """The Prometheus page's reader, whose collections also feed the push exporters."""

    def __init__(self, exporters: Sequence[MetricExporter], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._exporters = list(exporters)
        self._pushing = threading.local()

    def push(self, timeout_millis: float) -> None:
        self._pushing.active = True
        try:
            self.collect(timeout_millis=timeout_millis)
        finally:
            self._pushing.active = False

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        if not getattr(self._pushing, "active", False):
            super()._receive_metrics(metrics_data, timeout_millis, **kwargs)
            return
        if metrics_data is None:
            return
        for exporter in self._exporters:
            try:
                exporter.export(metrics_data, timeout_millis=timeout_millis)
            except Exception as exc:  # an exporter's bug must not stop the page or the other exporters
                log.warning("export through %s failed: %s", type(exporter).__name__, exc)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        super().shutdown(timeout_millis, **kwargs)
        for exporter in self._exporters:
            exporter.shutdown(timeout_millis=timeout_millis)


class _Recorded(MetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.exported: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        self.exported.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def _check() -> str | None:
    """A push through a throwaway reader reaches its exporter, and a scrape still reaches the page."""
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CollectorRegistry, generate_latest

    def observe(_options: CallbackOptions) -> list[Observation]:
        return [Observation(7, {"a": "b"})]

    recorded = _Recorded()
    registry = CollectorRegistry(auto_describe=False)
    reader = SharedPrometheusReader([recorded], registry=registry)
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    try:
        provider.get_meter("otel_numa.check").create_observable_gauge("check", callbacks=[observe])
        reader.push(1000)
        if len(recorded.exported) != 1:
            return "a push did not reach the exporter"
        if b'check{a="b"' not in generate_latest(registry) or len(recorded.exported) != 1:
            return "a scrape did not reach the page alone"
        return None
    finally:
        provider.shutdown()


PATCH = Patch(
    name="shared_collection",
    replaces="a reader per push exporter beside the page's (one aggregation per series per reader)",
    private_names=("MetricReader._receive_metrics",),
    check=_check,
)
