"""MeterProvider, Resource and the configured readers."""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from otel_numa import __version__
from otel_numa.instruments import register_instruments
from otel_numa.options import AgentOptions, ExportOptions
from otel_numa.sdk_private import DepartedSeriesJanitor
from otel_numa.snapshot import SnapshotStore

log = logging.getLogger(__name__)

METER_NAME = "otel_numa"
# Resource attributes copied onto every Prometheus series, so a central Prometheus tells nodes apart.
PROMETHEUS_RESOURCE_LABELS = frozenset({"k8s.node.name"})


def build_resource(node_name: str) -> Resource:
    return Resource.create(
        {
            "service.name": "otel-numa",
            "service.version": __version__,
            "service.instance.id": node_name,
            "host.name": socket.gethostname(),
            "k8s.node.name": node_name,
        }
    )


class PinningRegistry(CollectorRegistry):
    """The Prometheus page's own registry: each scrape builds one snapshot and holds it while collecting."""

    def __init__(self, store: SnapshotStore) -> None:
        super().__init__(auto_describe=False)
        self._store = store

    def collect(self) -> Iterator[Metric]:
        with self._store.pinned():
            families = list(super().collect())
        yield from families


@dataclass
class Pipeline:
    meter_provider: MeterProvider
    registry: CollectorRegistry | None  # the Prometheus page's registry, when that reader is on
    otlp_reader: MetricReader | None
    # Push readers (OTLP, console) have no timer of their own: the agent's scheduler pins a snapshot and
    # collects them, periodically and when the kubelet's state changes.
    push_readers: list[MetricReader] = field(default_factory=list)
    store: SnapshotStore | None = None
    janitor: DepartedSeriesJanitor | None = None

    @property
    def forgetting_supported(self) -> bool:
        return self.janitor is not None and self.janitor.supported

    def forget_departed(self, live_pods: frozenset[str]) -> None:
        """Drop the SDK's state for series of pods not in ``live_pods`` (see otel_numa.sdk_private)."""
        if self.janitor is not None:
            self.janitor.forget(live_pods.__contains__)

    def push(self, readers: list[MetricReader] | None = None, timeout_s: float = 5.0) -> None:
        """Export one collection through the push readers (all of them, or those given)."""
        targets = self.push_readers if readers is None else readers
        if not targets or self.store is None:
            return
        with self.store.pinned():
            for reader in targets:
                reader.collect(timeout_millis=timeout_s * 1000)

    def shutdown(self, timeout_s: float) -> None:
        self.meter_provider.shutdown(timeout_millis=timeout_s * 1000)


def _otlp_exporter(export: ExportOptions) -> MetricExporter:
    url = export.otlp_url
    if export.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        return GrpcExporter(endpoint=url, insecure=url.startswith("http://"), timeout=export.otlp_timeout_s)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

    from otel_numa.otlp_http import otlp_http_session

    # the collector CA of OTEL_EXPORTER_OTLP_(METRICS_)CERTIFICATE must win over REQUESTS_CA_BUNDLE
    return HttpExporter(endpoint=url, timeout=export.otlp_timeout_s, session=otlp_http_session())


def build_pipeline(
    options: AgentOptions,
    store: SnapshotStore,
    *,
    exporters: tuple[str, ...] | None = None,
    otlp_exporter_factory: Callable[[ExportOptions], MetricExporter] = _otlp_exporter,
) -> Pipeline:
    """Create the readers named by ``exporters`` (default: the options') and register the instruments."""
    export = options.export
    names = exporters if exporters is not None else export.exporters
    readers: list[MetricReader] = []
    push_readers: list[MetricReader] = []
    registry: CollectorRegistry | None = None
    otlp_reader: MetricReader | None = None
    if "prometheus" in names:
        registry = PinningRegistry(store)
        readers.append(
            PrometheusMetricReader(
                registry=registry,
                scope_info_enabled=False,
                resource_attribute_filter=PROMETHEUS_RESOURCE_LABELS.__contains__,
            )
        )
    if "otlp" in names:
        otlp_reader = PeriodicExportingMetricReader(
            otlp_exporter_factory(export),
            export_interval_millis=math.inf,
            export_timeout_millis=export.otlp_timeout_s * 1000,
        )
        push_readers.append(otlp_reader)
    if "console" in names:
        push_readers.append(
            PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=math.inf)
        )
    provider = MeterProvider(
        resource=build_resource(options.node_name),
        metric_readers=readers + push_readers,
        # Observable instruments carry no exemplars; skipping the filter per measurement saves ~7% per point.
        exemplar_filter=AlwaysOffExemplarFilter(),
        # One view for all instruments: the limit is deliberate, sized for the largest nodes we support.
        views=[View(instrument_name="*", aggregation_cardinality_limit=export.cardinality_limit)],
    )
    register_instruments(
        provider.get_meter(METER_NAME, __version__), store, options.metrics, options.node_name
    )
    return Pipeline(provider, registry, otlp_reader, push_readers, store, DepartedSeriesJanitor(provider))
