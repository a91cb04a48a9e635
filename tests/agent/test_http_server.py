"""The Prometheus page's HTTP server: what a scraper that asks for gzip gets."""

from __future__ import annotations

import gzip
import logging
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Gauge

from otel_numa.endpoints.connection_failures import ConnectionFailures, kind_of
from otel_numa.endpoints.metrics_page import MetricsServer
from otel_numa.endpoints.serving import MAX_WORKERS
from otel_numa.gzip_stream import GZIP_LEVEL
from otel_numa.testing.peers import voluntary_switches

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    registry = CollectorRegistry()
    gauge = Gauge("numa_test_value", "A value per node.", ["numa_node_id"], registry=registry)
    for node in range(200):
        gauge.labels(str(node)).set(node * 1.5)
    metrics = MetricsServer("127.0.0.1", 0, registry)
    yield metrics
    metrics.shutdown()


def get(server: MetricsServer, path: str = "/metrics", **headers: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.status, dict(response.headers), response.read()


def test_a_scraper_asking_for_gzip_gets_the_same_page_compressed(server: MetricsServer) -> None:
    for accept in ("text/plain", PROMETHEUS_ACCEPT):
        _, plain_headers, plain = get(server, Accept=accept)
        status, headers, body = get(server, Accept=accept, **{"Accept-Encoding": "gzip"})
        assert status == 200 and headers["Content-Encoding"] == "gzip"
        assert headers["Content-Type"] == plain_headers["Content-Type"]
        assert "Content-Encoding" not in plain_headers
        assert gzip.decompress(body) == plain and b'numa_test_value{numa_node_id="199"} 298.5' in plain
        # at the agent's level, not prometheus_client's level 9 (gzip output length is deterministic)
        assert len(body) == len(gzip.compress(plain, compresslevel=GZIP_LEVEL))
    assert get(server, Accept=PROMETHEUS_ACCEPT)[1]["Content-Type"].startswith("application/openmetrics-text")


def test_other_answers_are_prometheus_clients_own(server: MetricsServer) -> None:
    status, headers, body = get(server, "/favicon.ico", **{"Accept-Encoding": "gzip"})
    assert (status, body) == (200, b"") and "Content-Encoding" not in headers
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/metrics", method="POST", data=b"")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 405


def _switches(thread: threading.Thread) -> int:
    assert thread.native_id is not None
    return voluntary_switches(thread.native_id)


def _serving_threads() -> list[threading.Thread]:
    """The accepting thread and the workers (named after it) alive now."""
    return [thread for thread in threading.enumerate() if thread.name.startswith("metrics-http")]


def test_an_idle_server_sleeps_and_keeps_its_workers(server: MetricsServer) -> None:
    for _ in range(5):
        assert get(server)[0] == 200
    time.sleep(0.2)  # the last worker has gone back to waiting
    threads = _serving_threads()
    assert 2 <= len(threads) <= 1 + MAX_WORKERS  # the accepting thread and the workers it kept
    before = {thread: _switches(thread) for thread in threads}
    time.sleep(1.5)
    # serve_forever's poll would wake the accepting thread 3 times; nothing wakes an idle worker
    assert {thread: _switches(thread) - count for thread, count in before.items()} == dict.fromkeys(
        threads, 0
    )
    for _ in range(20):
        assert get(server)[0] == 200
    after = _serving_threads()
    assert set(threads) <= set(after)  # workers are kept between requests
    assert len(after) <= 1 + MAX_WORKERS  # and bounded, not one per request


def test_silent_connections_do_not_hold_up_a_scrape(server: MetricsServer) -> None:
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(MAX_WORKERS - 1)]
    try:
        status, _headers, body = get(server)
        assert status == 200 and b"numa_test_value" in body
    finally:
        for connection in silent:
            connection.close()


def test_shutdown_is_prompt_and_closes_the_port(server: MetricsServer) -> None:
    port = server.port
    began = time.monotonic()
    server.shutdown()
    assert time.monotonic() - began < 0.5
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert not [thread for thread in _serving_threads() if thread.name == "metrics-http"]
    server.shutdown()  # a second shutdown (the fixture's) is harmless


def test_an_ipv6_address_is_served() -> None:
    registry = CollectorRegistry()
    Gauge("numa_test_value", "A value.", registry=registry).set(1)
    try:
        metrics = MetricsServer("::1", 0, registry)
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    try:
        with urllib.request.urlopen(f"http://[::1]:{metrics.port}/metrics", timeout=5) as response:
            assert b"numa_test_value 1.0" in response.read()
    finally:
        metrics.shutdown()


EXIT_WITH_A_SILENT_CLIENT = """
import socket, sys, time
from prometheus_client import CollectorRegistry
from otel_numa.endpoints.metrics_page import MetricsServer
server = MetricsServer("127.0.0.1", 0, CollectorRegistry())
silent = socket.create_connection(("127.0.0.1", server.port))
time.sleep(0.3)  # a worker has taken the connection and waits for its request
server.shutdown()
print("shut down", flush=True)
"""


def test_a_silent_client_does_not_hold_up_the_process_exit() -> None:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", EXIT_WITH_A_SILENT_CLIENT], capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"shut down\n"
    assert time.monotonic() - began < 10  # not the 30 s the worker would wait for the request


def test_an_over_long_request_head_gets_431(server: MetricsServer) -> None:
    for size in (70_000, 1_000_000):
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/metrics", headers={"X-Big": "a" * size}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 431
    assert get(server)[0] == 200


def test_connection_failures_are_logged_once_per_kind_then_summed(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    failures = ConnectionFailures("metrics-http", summary_interval_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="otel_numa.endpoints.connection_failures"):
        for _ in range(100):
            failures.count(kind_of(ConnectionResetError()), ("10.0.0.7", 51000))
        failures.count(kind_of(TimeoutError()))
        assert [record.getMessage() for record in caplog.records] == [
            "metrics-http: client connection failed (connection reset) from 10.0.0.7:51000; "
            "further failures of this kind are counted",
            "metrics-http: client connection failed (timeout) from an unknown peer; "
            "further failures of this kind are counted",
        ]
        now[0] = 61.0
        failures.count(kind_of(BrokenPipeError()))  # a first of its kind, and the summary is due
        failures.flush()  # nothing new since: no line
    assert [record.getMessage() for record in caplog.records[2:]] == [
        "metrics-http: client connection failed (broken pipe) from an unknown peer; "
        "further failures of this kind are counted",
        "metrics-http: 99 more client connection failures: connection reset x99",
    ]
    assert failures.totals == {"connection reset": 100, "timeout": 1, "broken pipe": 1}
