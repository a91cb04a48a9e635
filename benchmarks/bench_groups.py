"""What a switched-off metric group saves: CPU per scrape (one collection and its exposition, in process)
on the 2 x 32 CPU node with 110 pods, with every group on and with everything but topology switched off.

    .venv/bin/python -m benchmarks.bench_groups [--scrapes 140]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from prometheus_client import generate_latest

from benchmarks.bench_cost import NODE_2X32
from otel_numa.cli.settings import Settings
from otel_numa.daemon.agent import Agent
from otel_numa.pipeline import build_pipeline
from otel_numa.testing.large_node import write_large_node

SWITCHES = {
    "every group": "",
    "topology only": "distances,usage,allocation,containers,container_usage,health",
}


def cpu_per_scrape(values: dict[str, object], scrapes: int) -> tuple[int, float]:
    agent = Agent(Settings(**values).to_options())  # type: ignore[arg-type]
    agent.refresh_background()
    pipeline = build_pipeline(agent.options, agent.store, exporters=("prometheus",))
    assert pipeline.registry is not None
    page = generate_latest(pipeline.registry)
    series = sum(1 for line in page.decode().splitlines() if line and not line.startswith("#"))
    batches = []
    for _ in range(7):
        start = time.process_time()
        for _ in range(scrapes // 7):
            generate_latest(pipeline.registry)
        batches.append((time.process_time() - start) / (scrapes // 7))
    pipeline.shutdown(timeout_s=1)
    return series, statistics.median(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=140)
    args = parser.parse_args()
    node = write_large_node(Path(tempfile.mkdtemp(prefix="bench-groups-")), NODE_2X32)
    print("| groups | series | CPU per scrape (ms) |\n|---|---:|---:|")
    for label, disable in SWITCHES.items():
        series, seconds = cpu_per_scrape({**node.settings_values(), "disable": disable}, args.scrapes)
        print(f"| {label} | {series} | {seconds * 1000:.2f} |")


if __name__ == "__main__":
    main()
