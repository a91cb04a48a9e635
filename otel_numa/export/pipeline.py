"""MeterProvider, Resource and the configured readers: the public path, with the accelerator's patches
(otel_numa.export.fast) applied to them where ``--fast-path`` chose it."""

from __future__ import annotations

import functools
import logging
import math
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry.context import Context
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, Exemplar, ExemplarReservoir, MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource
from opentelemetry.util.types import Attributes
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.metrics_core import Metric

from otel_numa import __version__
from otel_numa.export.batches import BatchingExporter
from otel_numa.export.console import console_exporter
from otel_numa.export.fast import FastPath, choose
from otel_numa.export.fast.forget_departed import DepartedSeriesJanitor
from otel_numa.export.fast.rendered_families import WSGIApp, page_app
from otel_numa.export.fast.repeated_points import repeat_points
from otel_numa.export.fast.reused_requests import reuse_requests
from otel_numa.export.fast.reused_translations import reuse_translations
from otel_numa.export.fast.shared_collection import SharedPrometheusReader
from otel_numa.export.fast.slim_series import slim_series
from otel_numa.export.otlp_deadline import (
    DeadlineExporter,
    PushRecord,
    exporter_timeout_s,
    request_aborter,
)
from otel_numa.export.rebuild import RebuildPlan
from otel_numa.export.temporality import Temporality, is_cumulative, preferred_temporality
from otel_numa.instruments import register_instruments
from otel_numa.options import AgentOptions, ExportOptions
from otel_numa.snapshot.store import SnapshotStore

log = logging.getLogger(__name__)

METER_NAME = "otel_numa"
# Resource attributes copied onto every Prometheus series, so a central Prometheus tells nodes apart.
PROMETHEUS_RESOURCE_LABELS = frozenset({"k8s.node.name"})


def _nothing() -> None:
    return None


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
    """The Prometheus page's own registry: each scrape builds one snapshot and holds it while collecting,
    and holds the pipeline while it collects (a rebuild waits)."""

    def __init__(self, store: SnapshotStore, lock: threading.RLock) -> None:
        super().__init__(auto_describe=False)
        self._store = store
        self._pipeline_lock = lock
        self.after_collection: Callable[[], None] = _nothing

    def collect(self) -> Iterator[Metric]:
        with self._pipeline_lock, self._store.pinned():
            families = list(super().collect())
        self.after_collection()
        yield from families


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


class HeldExporter(MetricExporter):
    """A push exporter as one set of readers sees it: the real exporter outlives the readers (a rebuild
    retires them, not the exporter), and a rebuilt set's first collection can be dropped (it only sets the
    delta readers' starting point)."""

    def __init__(self, exporter: MetricExporter, temporality: Temporality) -> None:
        super().__init__(preferred_temporality=temporality)
        self.exporter = exporter
        self.dropping = False

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        if self.dropping:
            return MetricExportResult.SUCCESS
        return self.exporter.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.exporter.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None  # the pipeline shuts the real exporter down, once


@dataclass
class _Readers:
    """One MeterProvider with its readers and the agent's instruments."""

    provider: MeterProvider
    pushes: list[Callable[[float], None]]
    held: list[HeldExporter]
    janitor: DepartedSeriesJanitor | None


class Pipeline:
    def __init__(
        self,
        build: Callable[[], _Readers],
        registry: PinningRegistry | None,
        store: SnapshotStore,
        fast_path: FastPath,
        exporters: list[MetricExporter],
        lock: threading.RLock,
        cardinality_limit: int,
    ) -> None:
        self._build = build
        self.registry = registry  # the Prometheus page's registry, when that reader is on
        self.store = store
        self.fast_path = fast_path
        self._exporters = exporters
        self._lock = lock
        self._readers = build()
        self._plan = RebuildPlan(cardinality_limit)
        self._rebuild_due = False  # set by the refresh thread, done by the next push (pushes have a thread)
        self.rebuilds = 0
        self.pushes: PushRecord | None = None  # what the OTLP pushes did, when that exporter is on
        # the heap policy of a long-running process (otel_numa.daemon.heap), called after a push; none by
        # default
        self.after_push: Callable[[], None] = _nothing

    @property
    def meter_provider(self) -> MeterProvider:
        return self._readers.provider

    @property
    def pushing(self) -> bool:
        """Whether any push exporter is on (OTLP, console)."""
        return bool(self._exporters)

    def page_app(self) -> WSGIApp:
        """The page's WSGI app (uncompressed; the server compresses)."""
        assert self.registry is not None
        if self.fast_path.on("rendered_families"):
            return page_app(self.registry)
        return make_wsgi_app(self.registry, disable_compression=True)

    def forget_departed(self, live_pods: frozenset[str]) -> None:
        """Drop the SDK's state for series of pods not in ``live_pods``: at once where the janitor can, or
        by a planned rebuild of the readers once enough departed pods piled up (otel_numa.export.rebuild)."""
        janitor = self._readers.janitor
        if janitor is not None and janitor.supported:
            janitor.forget(live_pods)
            return
        if self._plan.seen(live_pods):
            if self._exporters:
                self._rebuild_due = True  # a rebuild pushes: in the pushing thread, before its next push
            else:
                self.rebuild()

    def rebuild(self) -> None:
        """Replace the MeterProvider and its readers: every series starts afresh (counters with a new start
        time). The pushes first export what the old readers hold; the new delta readers are primed with a
        collection that is not sent, so no delta is lost or counted twice. Scrapes wait only for the swap,
        never for a push to the collector."""
        old = self._readers
        with self.store.pinned():
            for push in old.pushes:
                push(5_000)
        with self._lock, self.store.pinned():
            for held in old.held:
                held.dropping = True  # a push still running on the old readers sends nothing more
            old.provider.shutdown(timeout_millis=1_000)  # unregisters the old reader from the page
            new = self._build()
            for held in new.held:
                held.dropping = True
            for push in new.pushes:
                push(5_000)
            for held in new.held:
                held.dropping = False
            self._readers = new
            self.rebuilds += 1
        log.info("rebuilt the export readers (%d departed pods' series forgotten)", self._plan.departed)
        self._plan.rebuilt()

    def push(self, timeout_s: float = 5.0) -> None:
        """Export one collection to every push exporter (without holding the page: a collector that hangs
        delays no scrape); a rebuild that came due first."""
        if self._rebuild_due:
            self._rebuild_due = False
            self.rebuild()
        readers = self._readers
        if not readers.pushes:
            return
        with self.store.pinned():
            for push in readers.pushes:
                push(timeout_s * 1000)
        self.after_push()

    def shutdown(self, timeout_s: float) -> None:
        with self._lock:
            self._readers.provider.shutdown(timeout_millis=timeout_s * 1000)
            for exporter in self._exporters:
                exporter.shutdown(timeout_millis=timeout_s * 1000)


# Points per OTLP request: a larger push goes as several requests (otel_numa.export.batches). gRPC receivers
# refuse messages over 4 MiB by default (the OpenTelemetry Collector's otlp receiver, rotel); a point of a
# container series takes 200-300 bytes, so 10,000 stay under 3 MB. Only nodes of about 800 containers and
# more are split.
OTLP_BATCH_POINTS = 10_000


def _otlp_exporter(export: ExportOptions) -> MetricExporter:
    url = export.otlp_url
    temporality = preferred_temporality()
    if export.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        return GrpcExporter(
            endpoint=url,
            insecure=url.startswith("http://"),
            timeout=exporter_timeout_s(export.otlp_timeout_s),
            preferred_temporality=temporality,
        )
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

    from otel_numa.export.otlp_http import otlp_http_session

    # the collector CA of OTEL_EXPORTER_OTLP_(METRICS_)CERTIFICATE must win over REQUESTS_CA_BUNDLE
    return HttpExporter(
        endpoint=url,
        timeout=exporter_timeout_s(export.otlp_timeout_s),
        session=otlp_http_session(),
        preferred_temporality=temporality,
    )


def _collect(reader: MetricReader, timeout_millis: float) -> None:
    reader.collect(timeout_millis=timeout_millis)


def build_pipeline(
    options: AgentOptions,
    store: SnapshotStore,
    *,
    exporters: tuple[str, ...] | None = None,
    otlp_exporter_factory: Callable[[ExportOptions], MetricExporter] = _otlp_exporter,
    fast_path: FastPath | None = None,
) -> Pipeline:
    """Create the readers named by ``exporters`` (default: the options') and register the instruments;
    ``fast_path`` (default: chosen by the options' ``--fast-path``) names the patches applied to them."""
    export = options.export
    names = exporters if exporters is not None else export.exporters
    fast = fast_path if fast_path is not None else choose(export.fast_path)
    temporality = preferred_temporality()
    push_exporters: list[tuple[MetricExporter, Temporality]] = []
    push_record: PushRecord | None = None
    if "otlp" in names:
        otlp = otlp_exporter_factory(export)
        if fast.on("reused_requests"):
            reuse_requests(otlp)  # the OTLP exporters, gRPC and HTTP
        push_record = PushRecord(export.otlp_url)
        # a push ends by --otlp-timeout by the wall clock, whatever the collector or the resolver does
        deadline = DeadlineExporter(
            BatchingExporter(otlp, OTLP_BATCH_POINTS, temporality),
            export.otlp_timeout_s,
            push_record,
            temporality,
            request_aborter(export.otlp_protocol),
        )
        push_exporters.append((deadline, temporality))
    if "console" in names:
        push_exporters.append((console_exporter(), preferred_temporality({})))
    lock = threading.RLock()
    registry = PinningRegistry(store, lock) if "prometheus" in names else None
    # one reader for the page and the pushes, where they are all cumulative
    shared = registry is not None and fast.on("shared_collection")
    shared = shared and all(is_cumulative(temporality) for _, temporality in push_exporters)

    def build() -> _Readers:
        held = [HeldExporter(exporter, temporality) for exporter, temporality in push_exporters]
        readers: list[MetricReader] = []
        pushes: list[Callable[[float], None]] = []
        if registry is not None:
            page_kwargs: dict[str, Any] = {
                "registry": registry,
                "scope_info_enabled": False,
                "resource_attribute_filter": PROMETHEUS_RESOURCE_LABELS.__contains__,
            }
            page: PrometheusMetricReader
            if shared:
                page = SharedPrometheusReader(held, **page_kwargs)
                if held:
                    pushes.append(page.push)
            else:
                page = PrometheusMetricReader(**page_kwargs)
            if fast.on("reused_translations"):
                reuse_translations(page)
            readers.append(page)
        if not shared:
            for exporter in held:
                reader = PeriodicExportingMetricReader(
                    exporter,
                    export_interval_millis=math.inf,
                    export_timeout_millis=export.otlp_timeout_s * 1000,
                )
                readers.append(reader)
                pushes.append(functools.partial(_collect, reader))
        provider = MeterProvider(
            resource=build_resource(options.node_name),
            metric_readers=readers,
            # Observable instruments carry no exemplars; skipping the filter per measurement saves ~7%.
            exemplar_filter=AlwaysOffExemplarFilter(),
            # One view for all instruments: the limit is deliberate, sized for the largest nodes we support.
            views=[
                View(
                    instrument_name="*",
                    aggregation_cardinality_limit=export.cardinality_limit,
                    exemplar_reservoir_factory=_no_exemplars,
                )
            ],
            shutdown_on_exit=False,  # the agent shuts its pipeline down itself
        )
        register_instruments(
            provider.get_meter(METER_NAME, __version__),
            store,
            options.metrics,
            options.node_name,
            fast_path=bool(fast),
            pushes=push_record,
        )
        if fast.on("slim_series"):
            slim_series(provider, _NO_EXEMPLARS)  # where no exemplar is sampled
        if fast.on("repeated_points"):
            repeat_points(provider)  # only where the page's reader is the only one
        janitor = DepartedSeriesJanitor(provider) if fast.on("forget_departed") else None
        return _Readers(provider, pushes, held, janitor)

    pipeline = Pipeline(
        build,
        registry,
        store,
        fast,
        [exporter for exporter, _ in push_exporters],
        lock,
        export.cardinality_limit,
    )
    pipeline.pushes = push_record
    return pipeline
