"""Two paths, one output: for the same inputs, the accelerated path and the public path serve the same page
(plain text and OpenMetrics, gzipped as the server sends them) and push the same OTLP requests (decoded,
times set to zero: each path reads its own clock), across machines, changing values and pod churn. An
installed SDK of another shape, or another release, serves the public path with one warning."""

from __future__ import annotations

import http.server
import logging
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

from otel_numa.cli.settings import Settings
from otel_numa.daemon.agent import Agent
from otel_numa.endpoints.metrics_page import compressing
from otel_numa.export import fast
from otel_numa.export.fast import PUBLIC, choose
from otel_numa.export.fast.reused_requests import _HttpExport, _ReusedRequests
from otel_numa.export.pipeline import Pipeline, build_pipeline
from otel_numa.instruments.catalogue import MetricGroup
from otel_numa.proto import podresources_v1_pb2 as pb
from otel_numa.testing.kubelet_scenario import build_scenario, series
from otel_numa.testing.large_node import LargeNodeSpec, write_large_node
from otel_numa.testing.peers import http_get
from otel_numa.testing.podresources_server import PodResourcesServer
from otel_numa.testing.sysfs_tree import uniform_nodes
from otel_numa.testing.wsgi import call_wsgi
from tests.support import InProcessExporter, generations

FORMATS = ("", "application/openmetrics-text; version=1.0.0")  # the default is the plain text format


class Recorder(InProcessExporter):
    """Keeps every push as the OTLP exporters encode it."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[ExportMetricsServiceRequest] = []

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.requests.append(encode_metrics(metrics_data))
        return MetricExportResult.SUCCESS


class GrpcCollector(metrics_service_pb2_grpc.MetricsServiceServicer):
    """A real OTLP/gRPC endpoint in the test process that keeps every request as it arrived: the agent's
    gRPC exporter pushes to it over a socket."""

    def __init__(self, batch_points: int | None = None) -> None:
        """``batch_points``: the exporters' max_export_batch_size (a push goes as requests of that many)."""
        self.batch_points = batch_points
        self.requests: list[ExportMetricsServiceRequest] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self.server)  # type: ignore[no-untyped-call]
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.exporters: list[OTLPMetricExporter] = []

    def Export(self, request: ExportMetricsServiceRequest, context: grpc.ServicerContext) -> Any:
        self.requests.append(request)
        return ExportMetricsServiceResponse()

    def exporter(self) -> OTLPMetricExporter:
        exporter = OTLPMetricExporter(
            endpoint=f"http://127.0.0.1:{self.port}",
            insecure=True,
            timeout=5,
            max_export_batch_size=self.batch_points,
        )
        self.exporters.append(exporter)
        return exporter

    def reused(self) -> int:
        """How many requests the patched exporters made by writing new numbers into a kept one."""
        found = [vars(exporter).get("_translate_data") for exporter in self.exporters]
        return sum(each.reused for each in found if isinstance(each, _ReusedRequests))

    def spliced(self) -> int:
        """How many requests the patched exporters put together from a kept one's points and new ones."""
        found = [vars(exporter).get("_translate_data") for exporter in self.exporters]
        return sum(each.spliced for each in found if isinstance(each, _ReusedRequests))

    def close(self) -> None:
        self.server.stop(None)


class HttpCollector:
    """An OTLP/HTTP endpoint in the test process that keeps every request body as it arrived: the agent's
    HTTP exporter posts to it over a socket."""

    def __init__(self, batch_points: int | None = None) -> None:
        """``batch_points``: the exporters' max_export_batch_size (a push goes as requests of that many)."""
        self.batch_points = batch_points
        bodies = self.bodies = []  # type: list[bytes]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.exporters: list[HttpMetricExporter] = []

    @property
    def requests(self) -> list[ExportMetricsServiceRequest]:
        return [ExportMetricsServiceRequest.FromString(body) for body in self.bodies]

    def exporter(self) -> HttpMetricExporter:
        exporter = HttpMetricExporter(
            endpoint=f"{self.url}/v1/metrics", timeout=5, max_export_batch_size=self.batch_points
        )
        self.exporters.append(exporter)
        return exporter

    def _requests_made(self) -> list[_ReusedRequests]:
        found = [vars(exporter).get("export") for exporter in self.exporters]
        return [each.requests for each in found if isinstance(each, _HttpExport)]

    def reused(self) -> int:
        """How many requests the patched exporters made by writing new numbers into a kept one."""
        return sum(each.reused for each in self._requests_made())

    def spliced(self) -> int:
        """How many requests the patched exporters put together from a kept one's points and new ones."""
        return sum(each.spliced for each in self._requests_made())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


Collector = GrpcCollector | HttpCollector


def timeless(request: ExportMetricsServiceRequest) -> ExportMetricsServiceRequest:
    """A copy of ``request`` with every point's time and start time set to zero."""
    copy = ExportMetricsServiceRequest()
    copy.CopyFrom(request)
    for point in points_of(copy):
        point.time_unix_nano = 0
        point.start_time_unix_nano = 0
    return copy


def points_of(request: ExportMetricsServiceRequest) -> Iterator[Any]:
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                data = getattr(metric, metric.WhichOneof("data") or "gauge")
                yield from data.data_points


class Both:
    """The two paths side by side over one agent's snapshots, each with a page and an OTLP push."""

    def __init__(
        self,
        agent: Agent,
        over: str = "encoded",
        batch_points: int | None = None,
        exporter_splits: bool = True,
    ) -> None:
        """``over``: ``grpc`` or ``http``, each path pushes through that OTLP exporter to a collector of
        its own (in requests of ``batch_points``: split by the exporter, or by the agent when not
        ``exporter_splits``); ``encoded``, the requests are the exporters' encoding of each push."""
        self.agent = agent
        self.batch_points = batch_points
        given = batch_points if exporter_splits else None  # the exporters' max_export_batch_size
        collectors: dict[str, Callable[[int | None], Collector]] = {
            "grpc": GrpcCollector,
            "http": HttpCollector,
        }
        collector = collectors.get(over)
        self.recorders: tuple[Recorder | Collector, ...] = (
            (collector(given), collector(given)) if collector is not None else (Recorder(), Recorder())
        )
        self.pipelines: list[Pipeline] = []
        for path, recorder in zip((choose("auto"), PUBLIC), self.recorders, strict=True):
            exporter = recorder if isinstance(recorder, Recorder) else recorder.exporter()
            self.pipelines.append(
                build_pipeline(
                    agent.options,
                    agent.store,
                    exporters=("prometheus", "otlp"),
                    otlp_exporter_factory=lambda _export, exporter=exporter: exporter,  # type: ignore[misc]
                    fast_path=path,
                )
            )
        assert self.pipelines[0].fast_path and not self.pipelines[1].fast_path
        # one page app per format, kept: the fast path reuses the text of its last scrape in that format
        self.apps = [{accept: compressing(p.page_app()) for accept in FORMATS} for p in self.pipelines]

    def compare(self, label: object) -> bytes:
        """Scrape both paths in both formats, gzipped and not, and push once: all equal. The plain page."""
        plain = b""
        for accept in FORMATS:
            for encoding in ("", "gzip"):
                fast_page, public_page = (
                    call_wsgi(apps[accept], accept=accept, accept_encoding=encoding) for apps in self.apps
                )
                assert fast_page == public_page, (label, accept, encoding)
                plain = plain or fast_page[2]
        # a push in batches: each of its requests; else the last one (a public path that rebuilds its
        # readers sends the old readers' last request too)
        before = [len(recorder.requests) if self.batch_points else -1 for recorder in self.recorders]
        for pipeline in self.pipelines:
            pipeline.push()
        fast_requests, public_requests = (
            [timeless(request) for request in recorder.requests[start:]]
            for recorder, start in zip(self.recorders, before, strict=True)
        )
        assert fast_requests == public_requests, label
        assert sum(len(list(points_of(request))) for request in fast_requests) > 10
        self.last_push_requests = len(fast_requests)
        return plain

    def forget_departed(self) -> None:
        live = self.agent.background.live_pods()
        for pipeline in self.pipelines:
            pipeline.forget_departed(live)

    def close(self) -> None:
        for pipeline in self.pipelines:
            pipeline.shutdown(timeout_s=1)
        for recorder in self.recorders:
            if not isinstance(recorder, Recorder):
                recorder.close()

    def reused_requests(self) -> int:
        fast = self.recorders[0]
        return 0 if isinstance(fast, Recorder) else fast.reused()

    def spliced_requests(self) -> int:
        fast = self.recorders[0]
        return 0 if isinstance(fast, Recorder) else fast.spliced()


@pytest.mark.parametrize(("split_by", "over"), [("agent", "grpc"), ("exporter", "grpc"), ("agent", "http")])
def test_a_push_split_in_batches_reuses_each_batchs_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split_by: str, over: str
) -> None:
    """A push of more points than a request may hold goes as several requests, split by the agent (as its
    pushes are: otel_numa.export.batches) or by an exporter given max_export_batch_size: on the fast path
    each batch's request is written anew from its own kept one, the same as the public path's. A pod
    replaced moves the later batches' first series: each is put together from the kept request of the
    batch in its place, none encoded whole again."""
    from otel_numa.export import pipeline

    monkeypatch.setattr(pipeline, "OTLP_BATCH_POINTS", 50 if split_by == "agent" else 10_000)
    spec = LargeNodeSpec(
        numa_nodes=2,
        cpus_per_node=8,
        pods=6,
        containers_per_pod=2,
        devices_per_resource=2,
        exclusive_pod_every=3,
    )
    node = write_large_node(tmp_path, spec)
    agent = Agent(Settings(**node.settings_values(), disable="health").to_options())  # type: ignore[arg-type]
    both = Both(agent, over, batch_points=50, exporter_splits=split_by == "exporter")
    try:
        agent.refresh_background()
        both.compare("first")
        batches = both.last_push_requests
        for push in range(3):
            both.compare(("unchanged", push))
        reused = both.reused_requests()
        requests = 0
        shared = min(index for index in range(spec.pods) if not spec.exclusive(index))
        for replaced in (1, 2):
            node.replace_pod(shared, replaced)
            agent.refresh_background()
            both.compare(("replaced", replaced))
            requests += both.last_push_requests
            both.forget_departed()
            both.compare(("forgotten", replaced))
            requests += both.last_push_requests
        made_again = both.reused_requests() + both.spliced_requests() - reused
    finally:
        both.close()
        agent.close()
    assert batches >= 4
    assert reused == 3 * batches
    assert made_again == requests


@pytest.mark.parametrize("over", ["encoded", "grpc", "http"])
def test_changing_values_and_a_departed_pod_give_the_same_pages_and_requests(
    tmp_path: Path, over: str
) -> None:
    spec = LargeNodeSpec(numa_nodes=2, cpus_per_node=8, pods=6, containers_per_pod=2, devices_per_resource=2)
    node = write_large_node(tmp_path, spec)
    # no health series: their ages move between the two paths' collections
    agent = Agent(Settings(**node.settings_values(), disable="health").to_options())  # type: ignore[arg-type]
    both = Both(agent, over)
    pages = []
    try:
        for generation in generations(node, agent):
            pages.append(both.compare(generation))
            both.forget_departed()
            both.compare((generation, "after forgetting"))
        reused = both.reused_requests()
    finally:
        both.close()
    # over OTLP the fast path wrote new numbers into its last request wherever the series stayed
    assert reused >= 6 if over != "encoded" else reused == 0
    assert b"numa_container_memory_usage_bytes{" in pages[0]
    assert pages[0] == pages[1] != pages[2] != pages[3] != pages[4]


@pytest.mark.parametrize("over", ["grpc", "http"])
def test_a_pod_replaced_gives_the_same_pages_and_requests_put_together_from_the_last_ones(
    tmp_path: Path, over: str
) -> None:
    """One pod replaced at a time, on a quiet and on a busy node: the fast path's request is the kept
    one's points, runs of them whole, around the new pod's, and its page the kept lines around the new
    pod's; both equal the public path's."""
    spec = LargeNodeSpec(
        numa_nodes=2,
        cpus_per_node=8,
        pods=8,
        containers_per_pod=2,
        devices_per_resource=2,
        exclusive_pod_every=3,
    )
    node = write_large_node(tmp_path, spec)
    agent = Agent(Settings(**node.settings_values(), disable="health").to_options())  # type: ignore[arg-type]
    both = Both(agent, over)
    try:
        agent.refresh_background()
        both.compare("first")
        for replaced, index in enumerate((1, 4, 7, 1), start=1):
            node.replace_pod(index, replaced, generation=replaced % 2)
            if replaced % 2:  # a busy node: the other containers' usage moves as well
                node.write_cgroup_usage(replaced)
            agent.refresh_background()
            both.compare(("replaced", index))
            both.forget_departed()
        assert both.spliced_requests() >= 4
    finally:
        both.close()
        agent.close()


@pytest.mark.parametrize("machine", ["16amd64-4n4c-cgroup-distance-merge", "16amd64-8n2c"])
def test_real_machines_give_the_same_pages_and_requests(
    machine: str, hwloc_root: Callable[[str], tuple[Path, Path]]
) -> None:
    sysfs, procfs = hwloc_root(machine)
    settings = Settings(
        sysfs_root=sysfs,
        procfs_root=procfs,
        podresources_socket="none",
        disable=frozenset({MetricGroup.HEALTH}),
        node_name="n",
    )
    both = Both(Agent(settings.to_options()))
    try:
        page = both.compare(machine)
        both.compare((machine, "again"))
    finally:
        both.close()
    assert b"numa_memory_capacity_bytes{" in page


@pytest.fixture
def server(podresources_server: PodResourcesServer) -> PodResourcesServer:
    return podresources_server


def churn_uid(index: int) -> str:
    return f"c0ffee00-0000-4000-8000-{index:012d}"


@pytest.mark.parametrize("over", ["encoded", "grpc", "http"])
def test_pod_churn_gives_the_same_pages_and_requests(
    tmp_path: Path, server: PodResourcesServer, over: str
) -> None:
    """Batches of pods replace each other through a real podresources server: the fast path forgets
    departed pods in place, the public path rebuilds its readers (every third batch here: once as many
    pods departed as live)."""
    node = build_scenario(tmp_path, uniform_nodes(2, 4))
    settings = node.settings(
        podresources_socket=str(server.socket_path), disable="health", cardinality_limit=1_000
    )
    agent = Agent(settings.to_options())
    both = Both(agent, over)
    batch = 60
    try:
        for round_ in range(6):
            for entry in node.pod_logs_root.iterdir():
                entry.rmdir()
            indices = range(round_ * batch, (round_ + 1) * batch)
            for index in indices:
                (node.pod_logs_root / f"churn_job-{index}_{churn_uid(index)}").mkdir()
            server.state.pods = [
                pb.PodResources(
                    name=f"job-{index}",
                    namespace="churn",
                    containers=[pb.ContainerResources(name="main", cpu_ids=[index % 8])],
                )
                for index in indices
            ]
            agent.refresh_background()
            both.compare(round_)
            both.forget_departed()
            page = both.compare((round_, "after forgetting")).decode()
            pods = {dict(key)["k8s_pod_uid"] for key in series(page, "numa_container_cpu_allocated")}
            assert pods == {churn_uid(index) for index in indices}
            assert "otel_metric_overflow" not in page
        assert both.pipelines[1].rebuilds == 2 and both.pipelines[0].rebuilds == 0
        if over != "encoded":
            assert both.reused_requests() >= 6  # after forgetting, the series of the push before
    finally:
        both.close()


@pytest.mark.parametrize("over", ["encoded", "grpc", "http"])
def test_delta_pushes_add_up_to_the_same_totals_on_both_paths(
    tmp_path: Path, server: PodResourcesServer, monkeypatch: pytest.MonkeyPatch, over: str
) -> None:
    """With delta temporality, the public path's rebuilds neither lose nor repeat a delta: per series, the
    deltas pushed add up to what the fast path's add up to."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
    spec = LargeNodeSpec(numa_nodes=2, cpus_per_node=8, pods=6, containers_per_pod=2, devices_per_resource=2)
    node = write_large_node(tmp_path, spec)
    agent = Agent(Settings(**node.settings_values(), disable="health").to_options())  # type: ignore[arg-type]
    both = Both(agent, over)
    try:
        for generation in range(6):
            node.write_cgroup_usage(generation)
            if generation == 3:
                shutil.rmtree(next((node.root / "pod-logs").iterdir()))
            agent.refresh_background()
            for pipeline in both.pipelines:
                pipeline.push()
            both.forget_departed()
            if generation == 3:
                both.pipelines[1].rebuild()  # as it would once enough pods departed
        assert both.reused_requests() >= 3 if over != "encoded" else True
    finally:
        both.close()
    fast_totals, public_totals = (delta_totals(recorder.requests) for recorder in both.recorders)
    assert fast_totals == public_totals
    assert any(name == "numa.container.cpu.time" and total > 0 for (name, _), total in fast_totals.items())


def delta_totals(requests: list[ExportMetricsServiceRequest]) -> dict[tuple[str, str], float]:
    """Per monotonic sum's series, what its delta points add up to."""
    totals: dict[tuple[str, str], float] = {}
    for request in requests:
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.WhichOneof("data") != "sum" or not metric.sum.is_monotonic:
                        continue
                    assert metric.sum.aggregation_temporality == 1  # delta
                    for point in metric.sum.data_points:
                        key = (metric.name, str(sorted((a.key, str(a.value)) for a in point.attributes)))
                        value = point.as_double if point.HasField("as_double") else point.as_int
                        totals[key] = totals.get(key, 0) + value
    return totals


# Another shape or release: the public path, one warning ------------------------------------------------


@pytest.fixture
def fresh_choice(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The start-up check runs again for the test, and again for the tests after it (with the release
    check in force, even in the upgrade check's trial)."""
    monkeypatch.delenv(fast.UNPROVEN_ENV, raising=False)
    fast.shape_problem.cache_clear()
    yield
    fast.shape_problem.cache_clear()


def serve_and_scrape(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> tuple[str, list[str]]:
    """Start an agent with a page (and build a second pipeline in the process); its page and the fast
    path's warnings."""
    node = build_scenario(tmp_path, uniform_nodes(2, 4))
    agent = node.agent(prometheus_address="127.0.0.1:0", exporters="prometheus")
    with caplog.at_level(logging.WARNING):
        agent.start()
        try:
            assert agent._prometheus_server is not None
            status, page = http_get(f"http://127.0.0.1:{agent._prometheus_server.port}/metrics")
            assert status == 200
            node.exposition()  # another pipeline in the same process: no second warning
        finally:
            agent.stop(timeout_s=2)
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and "fast path" in r.getMessage()
    ]
    return page.decode(), warnings


@pytest.mark.usefixtures("fresh_choice")
def test_an_sdk_of_another_private_shape_serves_the_public_path_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Simulated: the SDK's measurement consumer keeps its reader storages in a read-only mapping instead
    of a dict (the SDK itself only reads it after start), which the janitor's check refuses."""
    import types

    from opentelemetry.sdk.metrics._internal import measurement_consumer

    consumer = measurement_consumer.SynchronousMeasurementConsumer
    original = consumer.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._reader_storages = types.MappingProxyType(dict(self._reader_storages))

    monkeypatch.setattr(consumer, "__init__", init)
    page, warnings = serve_and_scrape(tmp_path, caplog)
    assert len(warnings) == 1 and "forget_departed" in warnings[0], warnings
    assert series(page, "numa_agent_fast_path") == {frozenset(): 0.0}
    assert series(page, "numa_cpu_capacity")


@pytest.mark.usefixtures("fresh_choice")
def test_another_release_serves_the_public_path_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(fast.PROVEN_RELEASES, "opentelemetry-sdk", "1.44.0")  # hypothetically proven
    page, warnings = serve_and_scrape(tmp_path, caplog)
    installed = version("opentelemetry-sdk")
    assert len(warnings) == 1 and f"opentelemetry-sdk {installed} is installed" in warnings[0], warnings
    assert series(page, "numa_agent_fast_path") == {frozenset(): 0.0}


@pytest.mark.usefixtures("fresh_choice")
def test_the_proven_releases_serve_the_fast_path_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    page, warnings = serve_and_scrape(tmp_path, caplog)
    assert warnings == []
    assert series(page, "numa_agent_fast_path") == {frozenset(): 1.0}


def test_the_command_line_chooses_the_path(tmp_path: Path) -> None:
    node = build_scenario(tmp_path, uniform_nodes(2, 4))
    assert series(node.run_once("--fast-path", "off"), "numa_agent_fast_path") == {frozenset(): 0.0}
    assert series(node.run_once(), "numa_agent_fast_path") == {frozenset(): 1.0}
    assert series(node.exposition(fast_path="off"), "numa_agent_fast_path") == {frozenset(): 0.0}


def test_the_console_and_otlp_http_exporters_give_the_same_data_on_both_paths(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The console exporter writes the SDK's JSON and the OTLP/HTTP exporter posts the same protobuf on
    both paths, through pod churn (the page and gRPC are compared by the tests above)."""
    spec = LargeNodeSpec(numa_nodes=2, cpus_per_node=8, pods=6, containers_per_pod=2, devices_per_resource=2)
    node = write_large_node(tmp_path, spec)
    collectors = (HttpCollector(), HttpCollector())
    agent = Agent(
        Settings(
            **node.settings_values(),  # type: ignore[arg-type]
            disable="health",  # type: ignore[arg-type]
            otlp_protocol="http/protobuf",
        ).to_options()
    )
    pipelines = []
    for path, collector in zip((choose("auto"), PUBLIC), collectors, strict=True):
        # each path pushes to its own collector
        export = replace(agent.options.export, otlp_url=f"{collector.url}/v1/metrics")
        options = replace(agent.options, export=export)
        pipelines.append(build_pipeline(options, agent.store, exporters=("otlp", "console"), fast_path=path))
    assert pipelines[0].fast_path and not pipelines[1].fast_path
    capfd.readouterr()
    try:
        for generation in generations(node, agent):
            outputs = []
            for pipeline in pipelines:
                pipeline.push()
                outputs.append(re.sub(r'"(start_)?time_unix_nano": \d+', "", capfd.readouterr().out))
            assert outputs[0] == outputs[1], generation
            assert '"numa.cpu.allocated"' in outputs[0] and '"k8s.pod.uid"' in outputs[0]
            fast, public = (
                timeless(ExportMetricsServiceRequest.FromString(collector.bodies[-1]))
                for collector in collectors
            )
            assert fast == public, generation
            assert len(list(points_of(fast))) > 10
        # the fast path's HTTP exporter (the agent's own) wrote its requests from the ones it kept
        assert requests_written(pipelines[0]) >= 3
    finally:
        for pipeline in pipelines:
            pipeline.shutdown(timeout_s=1)
        for collector in collectors:
            collector.close()


def requests_written(pipeline: Pipeline) -> int:
    """How many of ``pipeline``'s OTLP/HTTP requests its exporter wrote from a kept one."""
    written = 0
    for held in pipeline._exporters:
        exporter: object = held
        while exporter is not None:  # through the agent's wrappers to the library's exporter
            export = vars(exporter).get("export")
            if isinstance(export, _HttpExport):
                written += export.requests.reused + export.requests.spliced
            exporter = getattr(exporter, "exporter", None)
    return written
