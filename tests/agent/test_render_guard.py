"""A series that prometheus_client cannot write costs only itself: the page still answers 200 with every
other series, and the series left out are counted."""

from __future__ import annotations

import gzip
import urllib.request
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from otel_numa.endpoints.metrics_page import MetricsServer

# A lone surrogate: what a file name of invalid UTF-8 becomes when decoded with surrogateescape. The agent
# replaces such characters where it reads names; this stands for anything that still slips through.
UNWRITABLE = "pod\udcff"


class Families:
    def collect(self) -> Iterator[Metric]:
        good = GaugeMetricFamily("numa_cpu_capacity", "CPUs", labels=["numa_node_id"])
        good.add_metric(["0"], 16)
        mixed = GaugeMetricFamily("numa_container_cpu_allocated", "CPUs", labels=["k8s_pod_name"])
        mixed.add_metric(["web-0"], 2)
        mixed.add_metric([UNWRITABLE], 4)
        yield good
        yield mixed


def test_the_page_answers_without_the_series_it_cannot_write() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families())
    server = MetricsServer("127.0.0.1", 0, registry)
    try:
        for headers in ({}, {"Accept-Encoding": "gzip"}):
            request = urllib.request.Request(f"http://127.0.0.1:{server.port}/metrics", headers=headers)
            with urllib.request.urlopen(request, timeout=5) as answer:
                assert answer.status == 200
                body = answer.read()
                if headers:
                    body = gzip.decompress(body)
            page = body.decode()
            assert 'numa_cpu_capacity{numa_node_id="0"} 16.0' in page
            assert 'numa_container_cpu_allocated{k8s_pod_name="web-0"} 2.0' in page
            assert "4.0" not in page
        assert server.render_guard.dropped == 2  # one series, left out of two pages
    finally:
        server.shutdown()
