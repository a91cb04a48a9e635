"""MeterProvider, Resource and the configured readers."""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.context import Context
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, Exemplar, ExemplarReservoir, MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource
from opentelemetry.util.types import Attributes
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from otel_numa import __version__
from otel_numa.daemon.heap import freeze_long_lived_objects, release_free_memory
from otel_numa.instruments import register_instruments
from otel_numa.options import AgentOptions, ExportOptions
from otel_numa.sdk_private import (
    FAST_PATHS,
    DepartedSeriesJanitor,
    install_family_rendering,
    reuse_otlp_requests,
    speed_up_prometheus_reader,
)
from otel_numa.snapshot.store import SnapshotStore

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

    # unchanged families' text is reused (otel_numa.sdk_private.RenderedFamilies)
    renders_by_family = True

    def __init__(self, store: SnapshotStore) -> None:
        super().__init__(auto_describe=False)
        self._store = store

    def collect(self) -> Iterator[Metric]:
        with self._store.pinned():
            families = list(super().collect())
        freeze_long_lived_objects()
        yield from families


@dataclass
class Pipeline:
    meter_provider: MeterProvider
    registry: CollectorRegistry | None  # the Prometheus page's registry, when that reader is on
    # Pushes (OTLP, console) have no timer of their own: the agent's scheduler pins a snapshot and pushes,
    # periodically and when the kubelet's state changes. Each entry exports one collection: the Prometheus
    # reader's (SharedPrometheusReader.push), or a reader of their own when there is no page.
    pushes: list[Callable[[float], None]] = field(default_factory=list)
    store: SnapshotStore | None = None
    janitor: DepartedSeriesJanitor | None = None

    @property
    def forgetting_supported(self) -> bool:
        return self.janitor is not None and self.janitor.supported

    def forget_departed(self, live_pods: frozenset[str]) -> None:
        """Drop the SDK's state for series of pods not in ``live_pods`` (see otel_numa.sdk_private)."""
        if self.janitor is not None:
            self.janitor.forget(live_pods)

    def push(self, timeout_s: float = 5.0) -> None:
        """Export one collection to every push exporter."""
        if not self.pushes or self.store is None:
            return
        with self.store.pinned():
            for push in self.pushes:
                push(timeout_s * 1000)
        freeze_long_lived_objects()
        release_free_memory()  # once per push interval: what the encoding left behind

    def shutdown(self, timeout_s: float) -> None:
        self.meter_provider.shutdown(timeout_millis=timeout_s * 1000)


class SharedPrometheusReader(PrometheusMetricReader):
    """The Prometheus page's reader, whose collections also feed the push exporters: the SDK keeps one
    aggregation per series for both paths instead of one per reader, and a push costs one collection.

    A collection made by :meth:`push` goes to the exporters; one made by a scrape goes to the page.
    """

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


def _collect(reader: MetricReader, timeout_millis: float) -> None:
    reader.collect(timeout_millis=timeout_millis)


def _delta_preferred() -> bool:
    """Whether the standard variable asks the OTLP exporter for delta temporality: the page is
    cumulative, so such a push needs a reader of its own."""
    preference = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "cumulative")
    return preference.strip().lower() in ("delta", "lowmemory")


class NoExemplars(ExemplarReservoir):
    """Observable instruments carry no exemplars: one stateless reservoir shared by every series, instead
    of a reservoir with its own storage and lock per series (memory per series, and work per collection)."""

    def offer(self, value: float, time_unix_nano: int, attributes: Attributes, context: Context) -> None:
        return None

    def collect(self, point_attributes: Attributes) -> list[Exemplar]:
        return []


_NO_EXEMPLARS = NoExemplars()


def _no_exemplars(_aggregation: type) -> Callable[..., ExemplarReservoir]:
    return lambda **_kwargs: _NO_EXEMPLARS


def _otlp_exporter(export: ExportOptions) -> MetricExporter:
    url = export.otlp_url
    exporter: MetricExporter
    if export.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        exporter = GrpcExporter(
            endpoint=url, insecure=url.startswith("http://"), timeout=export.otlp_timeout_s
        )
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

        from otel_numa.otlp_http import otlp_http_session

        # the collector CA of OTEL_EXPORTER_OTLP_(METRICS_)CERTIFICATE must win over REQUESTS_CA_BUNDLE
        exporter = HttpExporter(endpoint=url, timeout=export.otlp_timeout_s, session=otlp_http_session())
    reuse_otlp_requests(export.otlp_protocol)  # the exporter's module is imported now
    return exporter


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
    FAST_PATHS.install(own_meter=METER_NAME, stateless_reservoir=_NO_EXEMPLARS)
    push_exporters: list[MetricExporter] = []
    if "otlp" in names:
        push_exporters.append(otlp_exporter_factory(export))
    if "console" in names:
        push_exporters.append(ConsoleMetricExporter())
    readers: list[MetricReader] = []
    pushes: list[Callable[[float], None]] = []
    registry: CollectorRegistry | None = None
    shared = "prometheus" in names and not _delta_preferred()
    if "prometheus" in names:
        registry = PinningRegistry(store)
        prometheus_reader = SharedPrometheusReader(
            push_exporters if shared else [],
            registry=registry,
            scope_info_enabled=False,
            resource_attribute_filter=PROMETHEUS_RESOURCE_LABELS.__contains__,
        )
        speed_up_prometheus_reader(prometheus_reader)
        install_family_rendering()
        readers.append(prometheus_reader)
        if shared and push_exporters:
            pushes.append(prometheus_reader.push)
    if not shared:
        for exporter in push_exporters:
            reader = PeriodicExportingMetricReader(
                exporter, export_interval_millis=math.inf, export_timeout_millis=export.otlp_timeout_s * 1000
            )
            readers.append(reader)
            pushes.append(functools.partial(_collect, reader))
    provider = MeterProvider(
        resource=build_resource(options.node_name),
        metric_readers=readers,
        # Observable instruments carry no exemplars; skipping the filter per measurement saves ~7% per point.
        exemplar_filter=AlwaysOffExemplarFilter(),
        # One view for all instruments: the limit is deliberate, sized for the largest nodes we support.
        views=[
            View(
                instrument_name="*",
                aggregation_cardinality_limit=export.cardinality_limit,
                exemplar_reservoir_factory=_no_exemplars,
            )
        ],
    )
    register_instruments(
        provider.get_meter(METER_NAME, __version__), store, options.metrics, options.node_name
    )
    return Pipeline(provider, registry, pushes, store, DepartedSeriesJanitor(provider))
