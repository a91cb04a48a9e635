"""The chart's gateway on this machine: rotel receives and batches the agents' OTLP, and a stand-in for the
Collector's ``prometheus`` exporter serves what it forwards as a Prometheus page.

The OpenTelemetry Collector (contrib) cannot be installed here from PyPI, npm or Debian, so the gateway's
two stages are:

- **rotel** (PyPI, a real OTLP collector): the OTLP receiver and the batching, with its defaults, which are
  the Collector's ``batch`` processor defaults (8,192 items, 200 ms). It has no memory limiter, no
  ``transform`` processor and no Prometheus exporter; it forwards OTLP/HTTP (gzip) to the stand-in.
- **the stand-in** (this module, written from the OpenTelemetry specification's Prometheus compatibility
  rules, the Collector's ``prometheus`` exporter README and its translator's documented cases): applies the
  gateway's ``transform/prometheus_names`` statements when asked, then translates every gauge and sum into
  a Prometheus series the way the exporter does: name from the OTel name (non-alphanumerics to ``_``), the
  unit's suffix (``By`` -> ``_bytes``, ``s`` -> ``_seconds``, ``{...}`` dropped, ``1`` -> ``_ratio`` on
  gauges only), ``_total`` on monotonic sums; attributes as labels with ``.`` -> ``_``; ``otel_scope_name``
  and ``otel_scope_version`` labels; ``job`` from ``service.namespace/service.name`` and ``instance`` from
  ``service.instance.id``; the resource in one ``target_info`` series per job and instance, or on every
  series with ``resource_to_telemetry_conversion``; a series not updated for ``metric_expiration`` (5 min)
  is dropped. Histograms, summaries, delta sums and exemplars are not handled: the agent sends none.

Run it beside rotel with :func:`run_gateway`, or alone::

    python -m otel_numa.testing.gateway --port 9000 [--no-resource-to-telemetry] [--no-prometheus-names]

It prints ``ready`` once it listens: POST ``/v1/metrics`` (OTLP/HTTP protobuf, gzip or not), GET
``/metrics`` (the page).
"""

from __future__ import annotations

import argparse
import gzip
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

from otel_numa.testing.peers import http_get, start_on_free_ports, start_rotel, stop_process

# The agent's service.name: the gateway's statements touch its metrics only.
AGENT_SERVICE = "otel-numa"

# UCUM units to Prometheus words (the translator's table, the units the agent uses and their neighbours)
UNIT_WORDS = {
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "%": "percent",
    "Hz": "hertz",
}

_NOT_ALPHANUMERIC = re.compile(r"[^a-zA-Z0-9]+")
_NOT_LABEL = re.compile(r"[^a-zA-Z0-9_]")
_ANNOTATION = re.compile(r"\{[^}]*\}")


@dataclass(frozen=True)
class GatewaySettings:
    """The gateway configuration measured: the chart's, by default."""

    resource_to_telemetry_conversion: bool = True  # exporters.prometheus.resource_to_telemetry_conversion
    prometheus_names: bool = True  # processors.transform/prometheus_names in the metrics pipeline
    metric_expiration_s: float = 300.0  # exporters.prometheus.metric_expiration (default 5m)

    def flags(self) -> list[str]:
        flags = [f"--metric-expiration={self.metric_expiration_s}"]
        if not self.resource_to_telemetry_conversion:
            flags.append("--no-resource-to-telemetry")
        if not self.prometheus_names:
            flags.append("--no-prometheus-names")
        return flags


# Translation ----------------------------------------------------------------------------------------


def unit_suffix(unit: str, *, gauge: bool) -> list[str]:
    """The words a unit adds to a metric name: ``By`` -> bytes, ``By/s`` -> bytes_per_second, ``{cpu}`` ->
    nothing, ``1`` -> ratio for a gauge only."""
    if unit == "1":
        return ["ratio"] if gauge else []
    unit = _ANNOTATION.sub("", unit).strip()
    if not unit:
        return []
    main, _, per = unit.partition("/")
    words = [w for w in _NOT_ALPHANUMERIC.split(UNIT_WORDS.get(main, main)) if w]
    if per:
        per_word = {"s": "second", "m": "minute", "h": "hour", "d": "day"}.get(per, UNIT_WORDS.get(per, per))
        words += ["per", *[w for w in _NOT_ALPHANUMERIC.split(per_word) if w]]
    return words


def prometheus_metric_name(name: str, unit: str, *, gauge: bool, monotonic: bool) -> str:
    """The Collector's name for an OTel metric, with suffixes (UnderscoreEscapingWithSuffixes)."""
    words = [w for w in _NOT_ALPHANUMERIC.split(name) if w]
    for word in unit_suffix(unit, gauge=gauge):
        if word not in words:
            words.append(word)
    if monotonic and "total" not in words:
        words.append("total")
    joined = "_".join(words)
    return f"_{joined}" if joined[:1].isdigit() else joined


def prometheus_label_name(key: str) -> str:
    label = _NOT_LABEL.sub("_", key)
    if label[:1].isdigit():
        return f"key_{label}"
    if label.startswith("_") and not label.startswith("__"):
        return f"key{label}"
    return label


def any_value_text(value: common_pb2.AnyValue) -> str:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "int_value":
        return str(value.int_value)
    if kind == "double_value":
        return repr(value.double_value)
    return ""


def attributes_text(attributes: Any) -> dict[str, str]:
    return {kv.key: any_value_text(kv.value) for kv in attributes}


def apply_prometheus_names(request: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
    """The gateway's ``transform/prometheus_names`` statements, on the agent's metrics only:
    ``set(metric.unit, "") where metric.unit == "1"`` and
    ``set(datapoint.attributes["k8s.node.name"], resource.attributes["k8s.node.name"])``."""
    for resource_metrics in request.resource_metrics:
        resource = attributes_text(resource_metrics.resource.attributes)
        if resource.get("service.name") != AGENT_SERVICE:
            continue
        node = resource.get("k8s.node.name")
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.unit == "1":
                    metric.unit = ""
                if node is None:
                    continue
                kind = metric.WhichOneof("data")
                points = getattr(metric, kind).data_points if kind in ("gauge", "sum") else ()
                for point in points:
                    _put(point.attributes, "k8s.node.name", node)


def _put(attributes: Any, key: str, text: str) -> None:
    for kv in attributes:
        if kv.key == key:
            kv.value.string_value = text
            return
    attributes.add(key=key, value=common_pb2.AnyValue(string_value=text))


@dataclass
class _Series:
    kind: str  # "gauge" or "counter"
    help: str
    value: float
    seen: float


class PrometheusPage:
    """What the exporter holds: the last point of every series, rendered on request."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._series: dict[str, dict[tuple[tuple[str, str], ...], _Series]] = {}
        self.requests = 0
        self.request_bytes = 0

    def consume(self, request: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        if self.settings.prometheus_names:
            apply_prometheus_names(request)
        now = time.monotonic()
        with self._lock:
            for resource_metrics in request.resource_metrics:
                self._consume_resource(resource_metrics, now)

    def _consume_resource(self, resource_metrics: metrics_pb2.ResourceMetrics, now: float) -> None:
        resource = attributes_text(resource_metrics.resource.attributes)
        identity = _job_and_instance(resource)
        extra = resource if self.settings.resource_to_telemetry_conversion else {}
        kept = {k: v for k, v in resource.items() if k not in _IDENTIFYING}
        if kept:
            labels = {prometheus_label_name(k): v for k, v in kept.items()} | identity
            self._store("target_info", "gauge", "Target metadata", labels, 1.0, now)
        for scope_metrics in resource_metrics.scope_metrics:
            scope = {
                "otel_scope_name": scope_metrics.scope.name,
                "otel_scope_version": scope_metrics.scope.version,
            }
            for metric in scope_metrics.metrics:
                kind_name = metric.WhichOneof("data")
                if kind_name == "gauge":
                    points, gauge, monotonic = metric.gauge.data_points, True, False
                elif kind_name == "sum" and metric.sum.aggregation_temporality == 2:  # cumulative
                    points, gauge, monotonic = metric.sum.data_points, False, metric.sum.is_monotonic
                else:
                    continue
                name = prometheus_metric_name(metric.name, metric.unit, gauge=gauge, monotonic=monotonic)
                kind = "counter" if monotonic else "gauge"
                for point in points:
                    attributes = (
                        attributes_text(point.attributes) | extra
                    )  # the resource's value wins, as there
                    labels = {prometheus_label_name(k): v for k, v in attributes.items()}
                    labels |= scope | identity
                    value = point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
                    self._store(name, kind, metric.description, labels, float(value), now)

    def _store(
        self, name: str, kind: str, help_text: str, labels: Mapping[str, str], value: float, now: float
    ) -> None:
        key = tuple(sorted((k, v) for k, v in labels.items() if v != ""))
        family = self._series.setdefault(name, {})
        family[key] = _Series(kind, help_text, value, now)

    def render(self) -> bytes:
        cutoff = time.monotonic() - self.settings.metric_expiration_s
        lines: list[str] = []
        with self._lock:
            for name in sorted(self._series):
                family = self._series[name]
                for key in [k for k, s in family.items() if s.seen < cutoff]:
                    del family[key]
                if not family:
                    continue
                first = next(iter(family.values()))
                lines.append(f"# HELP {name} {_escape_help(first.help)}")
                lines.append(f"# TYPE {name} {first.kind}")
                for key, series in family.items():
                    rendered = ",".join(f'{k}="{_escape_value(v)}"' for k, v in key)
                    lines.append(f"{name}{{{rendered}}} {series.value!r}")
        return ("\n".join(lines) + "\n").encode()

    def series_count(self) -> int:
        with self._lock:
            return sum(len(family) for family in self._series.values())


_IDENTIFYING = ("service.name", "service.namespace", "service.instance.id")


def _job_and_instance(resource: Mapping[str, str]) -> dict[str, str]:
    identity: dict[str, str] = {}
    name = resource.get("service.name")
    if name:
        namespace = resource.get("service.namespace")
        identity["job"] = f"{namespace}/{name}" if namespace else name
    instance = resource.get("service.instance.id")
    if instance:
        identity["instance"] = instance
    return identity


def _escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


# Serving --------------------------------------------------------------------------------------------

MAX_REQUEST_BYTES = 64 << 20


def serve(page: PrometheusPage, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if self.path != "/v1/metrics" or not 0 < length <= MAX_REQUEST_BYTES:
                self._answer(400, b"")
                return
            body = self.rfile.read(length)
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
            page.consume(request)
            page.requests += 1
            page.request_bytes += length
            answer = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
            self._answer(200, answer, "application/x-protobuf")

        def do_GET(self) -> None:
            if self.path != "/metrics":
                self._answer(404, b"")
                return
            self._answer(200, page.render(), "text/plain; version=0.0.4; charset=utf-8")

        def _answer(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="gateway-page", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--no-resource-to-telemetry", action="store_true")
    parser.add_argument("--no-prometheus-names", action="store_true")
    parser.add_argument("--metric-expiration", type=float, default=300.0)
    args = parser.parse_args(argv)
    settings = GatewaySettings(
        resource_to_telemetry_conversion=not args.no_resource_to_telemetry,
        prometheus_names=not args.no_prometheus_names,
        metric_expiration_s=args.metric_expiration,
    )
    serve(PrometheusPage(settings), args.port)
    print("ready", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return


# The gateway: rotel in front of the stand-in -----------------------------------------------------------


@dataclass
class Gateway:
    grpc_port: int  # where agents push OTLP/gRPC (rotel)
    http_port: int  # OTLP/HTTP (rotel)
    page_port: int  # the Prometheus page (the stand-in)
    rotel: subprocess.Popen[bytes]
    exporter: subprocess.Popen[bytes]

    @property
    def page_target(self) -> str:
        return f"127.0.0.1:{self.page_port}"


@contextmanager
def run_gateway(tmp_path: Path, settings: GatewaySettings | None = None) -> Iterator[Gateway]:
    """rotel (OTLP receiver, batching with the Collector's batch defaults) forwarding to the stand-in."""
    settings = settings or GatewaySettings()

    def start_exporter(ports: tuple[int, ...]) -> subprocess.Popen[bytes]:
        with open(tmp_path / f"gateway-{ports[0]}.log", "wb") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "otel_numa.testing.gateway", f"--port={ports[0]}", *settings.flags()],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def page_ready(ports: tuple[int, ...]) -> bool:
        return http_get(f"http://127.0.0.1:{ports[0]}/metrics")[0] == 200

    exporter, (page_port,) = start_on_free_ports(start_exporter, 1, "the gateway page", page_ready)
    try:

        def start(ports: tuple[int, ...]) -> subprocess.Popen[bytes]:
            flags = (
                "--exporter=otlp",
                f"--otlp-exporter-endpoint=http://127.0.0.1:{page_port}",
                "--otlp-exporter-protocol=http",
                # the agents' largest pushes (an 8-NUMA node with 500 containers) exceed gRPC's 4 MiB
                "--otlp-grpc-max-recv-msg-size-mib=64",
            )
            return start_rotel(tmp_path, ports, flags, ".out")

        rotel, (grpc_port, http_port) = start_on_free_ports(start, 2, "rotel to listen")
        try:
            if exporter.poll() is not None or rotel.poll() is not None:
                raise AssertionError(f"the gateway exited: {exporter.poll()}, rotel {rotel.poll()}")
            yield Gateway(grpc_port, http_port, page_port, rotel, exporter)
        finally:
            stop_process(rotel)
    finally:
        stop_process(exporter)


if __name__ == "__main__":
    main()
