"""The Prometheus page's HTTP server: what a scraper that asks for gzip gets."""

from __future__ import annotations

import gzip
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Gauge

from otel_numa.http_server import GZIP_LEVEL, MetricsServer

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
