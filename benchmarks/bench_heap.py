"""The agent's RSS over a long run of scrapes, with its background rounds running.

The serving agent (both readers, OTLP to a real rotel collector) on the 2x32 node with 110 pods
(benchmarks/bench_cost.py), a background round every ``--interval`` seconds, scraped back to back, every
second scrape with Prometheus' gzip and OpenMetrics headers; its RSS after 10 scrapes and then every
``--every`` scrapes. What grows here without growing the series is the heap's own bookkeeping (free lists,
partly used pages), which an operator sees as a slow creep after each deployment.

    .venv/bin/python -m benchmarks.bench_heap [--scrapes 1000] [--agent-tree DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

from benchmarks.bench_cost import (
    NODE_2X32,
    Receipts,
    common_args,
    node_args,
    podresources_server,
)
from benchmarks.harness import PROMETHEUS_SCRAPE_HEADERS, run_agent
from otel_numa.testing.large_node import write_large_node
from otel_numa.testing.peers import run_rotel


def rss_over_scrapes(
    scrapes: int, every: int, interval_s: float, pods: int, agent_tree: Path | None
) -> list[tuple[int, float]]:
    work = Path(tempfile.mkdtemp(prefix="bench-heap-"))
    node = write_large_node(work / "node", dataclasses.replace(NODE_2X32, pods=pods, cgroups=pods > 0))
    marks: list[tuple[int, float]] = []
    with run_rotel(work, "basic") as rotel, podresources_server(node, work, "node") as socket_args:
        receipts = Receipts(rotel)
        endpoint = f"http://127.0.0.1:{rotel.grpc_port}"
        args = [*node_args(node), *socket_args, *common_args(endpoint, interval_s)]
        seen = receipts.count()
        with run_agent(args, work, agent_tree=agent_tree) as agent:
            receipts.wait_beyond(seen, 60)
            for number in range(1, scrapes + 1):
                if number % 2:
                    agent.scrape()
                else:
                    agent.scrape_page(PROMETHEUS_SCRAPE_HEADERS)
                if number == 10 or number % every == 0:
                    marks.append((number, agent.rss_bytes() / 2**20))
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--interval", type=float, default=5.0, help="background round and push interval (s)")
    parser.add_argument("--pods", type=int, default=110)
    parser.add_argument("--agent-tree", type=Path, help="run the agent from this source tree instead")
    options = parser.parse_args()
    marks = rss_over_scrapes(
        options.scrapes, options.every, options.interval, options.pods, options.agent_tree
    )
    print("| scrapes | " + " | ".join(str(number) for number, _ in marks) + " |")
    print("|---|" + "---:|" * len(marks))
    print("| RSS (MB) | " + " | ".join(f"{rss:.2f}" for _, rss in marks) + " |")
    print(f"growth from scrape 10 to {marks[-1][0]}: {marks[-1][1] - marks[0][1]:+.2f} MB")


if __name__ == "__main__":
    main()
