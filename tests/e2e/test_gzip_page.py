"""The gzip page as real clients read it.

On the accelerated path a long family's text is kept between scrapes as a deflate segment and goes out as
it is inside one gzip member (``otel_numa.gzip_stream``). Debian's prometheus (Go's gzip reader, which
checks the CRC and length) and curl ``--compressed`` (which reads no further than a first member) must read
the page the agent serves uncompressed, while container counters move and a pod is replaced between
scrapes: families kept, families with new values, families with new series.
"""

from __future__ import annotations

import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from otel_numa.export.fast.rendered_families import COMPRESSED_FROM_BYTES
from otel_numa.testing.large_node import LargeNode, LargeNodeSpec, write_large_node
from otel_numa.testing.peers import (
    AgentProcess,
    Prometheus,
    http_get,
    require_binary,
    run_agent,
    run_prometheus,
    wait_for,
)

pytestmark = pytest.mark.e2e

SPEC = LargeNodeSpec(numa_nodes=2, cpus_per_node=8, pods=30, containers_per_pod=2, exclusive_pod_every=5)
OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"

Values = dict[tuple[str, frozenset[tuple[str, str]]], float]


def steady(name: str) -> bool:
    """Series that change only when the node's files do (the agent's own series change every scrape)."""
    return name.startswith("numa_") and not name.startswith("numa_agent_") and not name.endswith("_created")


def page_values(text: str, openmetrics: bool = False) -> Values:
    parse = openmetrics_families if openmetrics else text_string_to_metric_families
    # Prometheus keeps no label whose value is empty
    return {
        (sample.name, frozenset(item for item in sample.labels.items() if item[1])): sample.value
        for family in parse(text)
        for sample in family.samples
        if steady(sample.name)
    }


def plain_page(agent: AgentProcess) -> str:
    status, body = http_get(f"http://127.0.0.1:{agent.prometheus_port}/metrics")  # no Accept-Encoding
    assert status == 200
    return body.decode()


def prometheus_values(prom: Prometheus) -> Values:
    values: Values = {}
    for item in prom.query('{__name__=~"numa_.+", __name__!~"numa_agent_.+|.+_created"}'):
        labels = {k: v for k, v in item["metric"].items() if k not in ("job", "instance")}
        values[(labels.pop("__name__"), frozenset(labels.items()))] = float(item["value"][1])
    return values


def scraped_as_served(prom: Prometheus, agent: AgentProcess) -> bool:
    """Whether Prometheus' latest values are the page's; a failed scrape fails with Prometheus' reason."""
    errors = [target["lastError"] for target in prom.targets() if target["lastError"]]
    assert not errors, errors
    return prometheus_values(prom) == page_values(plain_page(agent))


def curl_page(agent: AgentProcess, accept: str) -> str:
    curl = require_binary("curl")
    url = f"http://127.0.0.1:{agent.prometheus_port}/metrics"
    answer = subprocess.run(
        [curl, "-sS", "--fail", "--compressed", "-H", f"Accept: {accept}", "-D", "-", url],
        capture_output=True,
        timeout=10,
        check=True,
    )
    head, _, body = answer.stdout.decode().partition("\r\n\r\n")
    assert "content-encoding: gzip" in head.lower()
    return body


def steady_lines(text: str) -> set[str]:
    return {line for line in text.splitlines() if steady(line.partition("{")[0].partition(" ")[0])}


def longest_family(text: str) -> int:
    sizes: dict[str, int] = defaultdict(int)
    for line in text.splitlines(keepends=True):
        sizes[line.partition("{")[0].partition(" ")[0]] += len(line)
    return max(sizes.values())


def test_prometheus_and_curl_read_the_gzip_page_whole(tmp_path: Path) -> None:
    node: LargeNode = write_large_node(tmp_path / "node", SPEC)
    shared_pod = next(index for index in range(SPEC.pods) if not SPEC.exclusive(index))
    with (
        run_agent([*node.cli_args(), "--interval", "1"], tmp_path) as agent,
        run_prometheus(tmp_path, [f"127.0.0.1:{agent.prometheus_port}"], scrape_interval="1s") as prom,
    ):
        first = plain_page(agent)
        assert longest_family(first) > 4 * COMPRESSED_FROM_BYTES  # families kept as segments
        wait_for(lambda: scraped_as_served(prom, agent), 30, "the first scrapes")
        for generation in (1, 2, 3):
            before = page_values(plain_page(agent))
            node.write_cgroup_usage(generation)
            if generation == 2:
                node.replace_pod(shared_pod, serial=1, generation=generation)
            wait_for(lambda: page_values(plain_page(agent)) != before, 20, "the agent to read the new files")  # noqa: B023
            wait_for(
                lambda: scraped_as_served(prom, agent), 20, f"Prometheus to scrape generation {generation}"
            )
            plain = plain_page(agent)
            assert steady_lines(curl_page(agent, "")) == steady_lines(plain)
            unpacked = curl_page(agent, OPENMETRICS)
            assert unpacked.endswith("# EOF\n")
            assert page_values(unpacked, openmetrics=True) == page_values(plain)
        health = prom.targets()
        assert [target["health"] for target in health] == ["up"] and health[0]["lastError"] == ""
        assert len(prometheus_values(prom)) > 500
        assert list(prom.series("numa_agent_fast_path").values()) == [1]  # the accelerated page
