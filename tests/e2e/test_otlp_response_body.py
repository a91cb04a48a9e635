"""A collector that answers each OTLP/HTTP push with a huge body: the agent reads a few kilobytes of it, its
memory stays where it was, and every push still counts as delivered."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
import requests
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsPartialSuccess,
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from otel_numa.otlp_http import MAX_RESPONSE_BYTES, keep_head_of_body, otlp_http_session
from otel_numa.testing.peers import run_agent, wait_for

SNAPSHOT = "16amd64-4n4c-cgroup-distance-merge"
ANSWER_BYTES = 300 * 1024 * 1024
CHUNK = b"\0" * (1024 * 1024)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the agent closes connections in the middle of answers: that is expected


class BigAnswerCollector:
    """Accepts OTLP/HTTP pushes on /v1/metrics, keeps the metric names of each, and answers 200 with a body
    of ``answer_bytes`` zeros (plain, or gzip-encoded: a small body that decompresses to all of it)."""

    def __init__(self, answer_bytes: int, gzipped: bool = False) -> None:
        self.pushes: list[set[str]] = []
        self.answer_bytes = answer_bytes
        self.gzipped_answer = gzip.compress(b"\0" * answer_bytes, compresslevel=9) if gzipped else None
        collector = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                request = ExportMetricsServiceRequest.FromString(
                    self.rfile.read(int(self.headers["Content-Length"]))
                )
                collector.pushes.append(
                    {
                        metric.name
                        for resource in request.resource_metrics
                        for scope in resource.scope_metrics
                        for metric in scope.metrics
                    }
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                body = collector.gzipped_answer
                if body is not None:
                    self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(collector.answer_bytes if body is None else len(body)))
                self.end_headers()
                try:
                    if body is not None:
                        self.wfile.write(body)
                    else:
                        for _ in range(collector.answer_bytes // len(CHUNK)):
                            self.wfile.write(CHUNK)
                except OSError:
                    self.close_connection = True  # the agent stopped reading: as it should

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


def peak_rss_kib(pid: int) -> int:
    """The most memory the process has held resident since it started (the kernel's high-water mark)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/PID/status")


@contextmanager
def big_answer_collector(answer_bytes: int, gzipped: bool = False) -> Iterator[BigAnswerCollector]:
    collector = BigAnswerCollector(answer_bytes, gzipped)
    thread = threading.Thread(target=collector.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield collector
    finally:
        collector.server.shutdown()
        collector.server.server_close()


def test_the_session_keeps_only_the_head_of_a_huge_answer() -> None:
    with big_answer_collector(64 * 1024 * 1024) as collector:
        session = otlp_http_session({})
        assert session is not None
        response = session.post(
            f"{collector.url}/v1/metrics", data=ExportMetricsServiceRequest().SerializeToString()
        )
        assert response.status_code == 200
        assert response.content == b"\0" * MAX_RESPONSE_BYTES
        # a short answer is kept whole, and its connection is reused
        short = session.post(f"{collector.url}/v1/metrics", data=b"")
        assert short.ok


def test_a_gzip_bomb_answer_is_cut_after_decompression() -> None:
    with big_answer_collector(32 * 1024 * 1024, gzipped=True) as collector:
        response = requests.post(f"{collector.url}/v1/metrics", data=b"", stream=True, timeout=10)
        assert len(keep_head_of_body(response, limit=1000).content) == 1000


@pytest.mark.e2e
def test_huge_collector_answers_leave_memory_bounded_and_pushes_delivered(
    tmp_path: Path, hwloc_root: Callable[[str], tuple[Path, Path]]
) -> None:
    sysfs, procfs = hwloc_root(SNAPSHOT)
    with big_answer_collector(ANSWER_BYTES) as collector:
        args = [
            *("--sysfs-root", str(sysfs), "--procfs-root", str(procfs), "--node-name", "big-answers"),
            *("--kubelet-root", str(tmp_path / "no-kubelet"), "--podresources-socket", "none"),
            *("--exporter", "prometheus,otlp", "--otlp-protocol", "http/protobuf"),
            *("--otlp-endpoint", collector.url, "--interval", "1"),
        ]
        with run_agent(args, tmp_path) as agent:
            wait_for(lambda: len(collector.pushes) >= 4, 30, "four pushes answered with 300 MB each")
            peak_mib = peak_rss_kib(agent.process.pid) / 1024
            assert agent.metrics_text()  # the page still answers
            log = agent.log()
    print(f"agent peak RSS {peak_mib:.0f} MiB")
    assert peak_mib < 150, f"peak RSS {peak_mib:.0f} MiB with answers of {ANSWER_BYTES // 2**20} MiB"
    assert all("numa.cpu.capacity" in names for names in collector.pushes)
    assert "Failed to export" not in log  # a 200 is a delivered push, however long its body


class _BigPartialSuccess(metrics_service_pb2_grpc.MetricsServiceServicer):
    """An OTLP/gRPC collector whose every answer carries a partial-success message of ``answer_bytes``."""

    def __init__(self, answer_bytes: int) -> None:
        self.pushes = 0
        self._answer = ExportMetricsServiceResponse(
            partial_success=ExportMetricsPartialSuccess(error_message="x" * answer_bytes)
        )

    def Export(self, request: ExportMetricsServiceRequest, context: grpc.ServicerContext) -> Any:
        self.pushes += 1
        return self._answer


@pytest.mark.e2e
def test_huge_grpc_answers_are_refused_by_the_channel_and_leave_memory_bounded(
    tmp_path: Path, hwloc_root: Callable[[str], tuple[Path, Path]]
) -> None:
    sysfs, procfs = hwloc_root(SNAPSHOT)
    collector = _BigPartialSuccess(100 * 1024 * 1024)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(collector, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        args = [
            *("--sysfs-root", str(sysfs), "--procfs-root", str(procfs), "--node-name", "big-answers"),
            *("--kubelet-root", str(tmp_path / "no-kubelet"), "--podresources-socket", "none"),
            *("--exporter", "prometheus,otlp", "--otlp-protocol", "grpc"),
            *("--otlp-endpoint", f"http://127.0.0.1:{port}", "--interval", "1"),
        ]
        with run_agent(args, tmp_path) as agent:
            wait_for(lambda: collector.pushes >= 3, 60, "three pushes answered with 100 MB each")
            peak_mib = peak_rss_kib(agent.process.pid) / 1024
            assert agent.metrics_text()
            log = agent.log()
    finally:
        server.stop(0)
    # gRPC's 4 MiB default receive limit refuses the answer before it is held (the push counts as failed)
    assert peak_mib < 150, f"peak RSS {peak_mib:.0f} MiB with 100 MiB answers"
    assert "RESOURCE_EXHAUSTED" in log
