"""The agent's peak memory and scrape latency on nodes of thousands of containers, for the chart's sizing.

The serving agent (both readers, OTLP to a real rotel collector, podresources answering for the plan) on
the crowded nodes of otel_numa/testing/large_node.py (8 NUMA x 320 CPUs, every other pod Guaranteed with
exclusive CPUs, memory and hugepage blocks) of 1,000, 2,000 and 5,000 containers: the first scrape's
latency, the median of the next ones, the series on the page, and the peak RSS (``VmHWM``) after
``--seconds`` of scrapes every second and a background round and push every 5 s (the pushes of 2,000
containers pass 4 MiB, a gRPC collector's default limit: they are made and refused, which the peak includes).
With ``--agent-tree``
the agent of another source tree runs too, each size interleaved (this tree's, then the other's).

    .venv/bin/python -m benchmarks.bench_containers [--sizes 1000,2000,5000] [--agent-tree DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from benchmarks.bench_cost import common_args, node_args, podresources_server
from benchmarks.harness import count_series, median, run_agent
from otel_numa.testing.large_node import LargeNode, crowded, write_large_node
from otel_numa.testing.peers import run_rotel

INTERVAL_S = 5.0


@dataclasses.dataclass(frozen=True)
class Run:
    tree: str
    containers: int
    first_scrape_s: float
    scrape_s: float
    series: int
    peak_mb: float


def peak_rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


def measure(node: LargeNode, seconds: float, work: Path, tree: str, agent_tree: Path | None) -> Run:
    containers = node.spec.containers
    with run_rotel(work, "basic") as rotel, podresources_server(node, work, f"{tree}-{containers}") as socket:
        args = [*node_args(node), *socket, *common_args(f"http://127.0.0.1:{rotel.grpc_port}", INTERVAL_S)]
        with run_agent(args, work, f"{tree}-{containers}", agent_tree) as agent:
            first, page = agent.scrape()
            times = []
            ends = time.monotonic() + seconds
            while time.monotonic() < ends:
                took, page = agent.scrape()
                times.append(took)
                time.sleep(max(0.0, 1.0 - took))
            return Run(
                tree, containers, first, median(times), count_series(page), peak_rss_mb(agent.process.pid)
            )


def table(runs: list[Run]) -> str:
    lines = [
        "| agent | containers | series | first scrape | scrape (median) | peak RSS |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {run.tree} | {run.containers:,} | {run.series:,} | {run.first_scrape_s:.2f} s | "
        f"{run.scrape_s * 1000:.0f} ms | {run.peak_mb:.0f} MB |"
        for run in runs
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,2000,5000", help="containers per node, comma list")
    parser.add_argument("--seconds", type=float, default=30.0, help="scrapes after the first, per run")
    parser.add_argument("--agent-tree", type=Path, help="also run the agent of this source tree")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-containers-"))
    runs = []
    for size in (int(text) for text in args.sizes.split(",")):
        node = write_large_node(work / f"node-{size}", crowded(size))
        runs.append(measure(node, args.seconds, work, "this", None))
        if args.agent_tree is not None:
            runs.append(measure(node, args.seconds, work, "other", args.agent_tree))
        print(table(runs[-2:] if args.agent_tree else runs[-1:]), flush=True)
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "containers.md").write_text(table(runs) + "\n")
    print(table(runs))


if __name__ == "__main__":
    main()
