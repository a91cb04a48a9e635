"""Head to head: this checkout's agent and another source tree's, beside node_exporter, in one session.

Two bench_cost runs on a shared machine see node_exporter's CPU per series move by a third from one run
to the next, which is more than the difference between two versions of the agent. This runs both agents
in the same session against the same node_exporter: the unchanged scrapes interleaved (this agent, the
other, node_exporter, round after round), the fresh cycles and the memory pairs in alternating blocks.
Each figure is the median of ``--rounds`` rounds, and the ratio the median of the rounds' ratios; the
CPU figures are per series and relative to node_exporter's in the same round, as in bench_cost.

    .venv/bin/python -m benchmarks.bench_versus --other DIR [--trees hwloc,2x32] [--rounds 3]

``DIR`` holds another commit's package: ``git archive <commit> otel_numa | tar -x -C DIR``. The table goes
to stdout and to ``benchmarks/out/versus.md``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.bench_cost import (
    LONG_INTERVAL_S,
    Receipts,
    Tree,
    build_trees,
    common_args,
    fresh_cycles,
    git_head,
    memory_pair,
    podresources_server,
    progress,
)
from benchmarks.harness import (
    PROMETHEUS_SCRAPE_HEADERS,
    compare_scrapes,
    idle_rates,
    machine_details,
    median,
    run_agent,
    run_node_exporter,
)
from otel_numa.testing.peers import REPO, Rotel, run_rotel

THIS, OTHER, EXPORTER = "this", "other", "node_exporter"


@dataclass
class Figures:
    """Each round's figure for this agent and the other."""

    this: list[float] = field(default_factory=list)
    other: list[float] = field(default_factory=list)

    def add(self, this: float, other: float) -> None:
        self.this.append(this)
        self.other.append(other)

    def row(self, label: str, form: str) -> str:
        mine, theirs = median(self.this), median(self.other)
        # the rounds are pairs measured side by side: the ratio is the median of theirs
        ratios = [a / b for a, b in zip(self.this, self.other, strict=True) if b]
        rounds = " ".join(f"{ratio:.2f}" for ratio in ratios)
        both = f"{median(ratios):.2f}" if ratios else "n/a"
        return f"| {label} | {mine:{form}} | {theirs:{form}} | {both} ({rounds}) |"


def unchanged_rounds(
    tree: Tree, rotel: Rotel, receipts: Receipts, work: Path, other: Path, rounds: int, scrapes: int
) -> tuple[Figures, Figures]:
    """CPU per series relative to node_exporter, plain and with Prometheus' gzip/OpenMetrics headers."""
    plain, gzipped = Figures(), Figures()
    endpoint = f"http://127.0.0.1:{rotel.grpc_port}"
    with ExitStack() as stack:
        socket_args = stack.enter_context(podresources_server(tree.node, work, f"{tree.key}-versus"))
        exporter = stack.enter_context(run_node_exporter(tree.sysfs_root, tree.procfs_root, work))
        args = [*tree.agent_args, *socket_args, *common_args(endpoint, LONG_INTERVAL_S)]
        seen = receipts.count()
        this = stack.enter_context(run_agent(args, work, name=THIS))
        receipts.wait_beyond(seen, 60)
        seen = receipts.count()
        that = stack.enter_context(run_agent(args, work, name=OTHER, agent_tree=other))
        receipts.wait_beyond(seen, 60)
        targets = [this, that, exporter]
        idle = idle_rates(targets, 5)
        for number in range(rounds):
            progress(f"{tree.key}: unchanged round {number + 1} of {rounds}")
            for headers, figures in ((None, plain), (PROMETHEUS_SCRAPE_HEADERS, gzipped)):
                stats = {
                    s.name: s for s in compare_scrapes(targets, scrapes, headers=headers, idle_rate=idle)
                }
                theirs = stats[EXPORTER].cpu_per_series_us
                figures.add(stats[THIS].cpu_per_series_us / theirs, stats[OTHER].cpu_per_series_us / theirs)
    return plain, gzipped


def fresh_rounds(
    tree: Tree, rotel: Rotel, receipts: Receipts, work: Path, other: Path, rounds: int, cycles: int
) -> Figures:
    """CPU per series relative to node_exporter when every counter changes between scrapes, each agent in
    its own block of cycles (the background round pushes once a cycle), blocks alternating."""
    figures = Figures()
    endpoint = f"http://127.0.0.1:{rotel.grpc_port}"
    with ExitStack() as stack:
        socket_args = stack.enter_context(podresources_server(tree.node, work, f"{tree.key}-fresh"))
        exporter = stack.enter_context(run_node_exporter(tree.sysfs_root, tree.procfs_root, work))
        idle = idle_rates([exporter], 2)
        # long enough for a background round and a scrape of each agent, as bench_cost chooses it
        interval_s = {"8x48": 3.0}.get(tree.key, 1.0)
        args = [*tree.agent_args, *socket_args, *common_args(endpoint, interval_s)]
        for number in range(rounds):
            progress(f"{tree.key}: fresh round {number + 1} of {rounds}")
            ratios = {}
            for name, agent_tree in ((THIS, None), (OTHER, other)):
                seen = receipts.count()
                with run_agent(args, work, name=name, agent_tree=agent_tree) as agent:
                    rates = {**idle, **idle_rates([agent], 0.5)}
                    stats = fresh_cycles(tree, agent, exporter, receipts, interval_s, cycles, rates, seen)
                mine = stats.cpu_per_scrape_ms[name] / stats.series[name]
                theirs = stats.cpu_per_scrape_ms[EXPORTER] / stats.series[EXPORTER]
                ratios[name] = mine / theirs
            figures.add(ratios[THIS], ratios[OTHER])
    return figures


@dataclass
class MemoryFigures:
    per_series_kb: Figures = field(default_factory=Figures)
    rss_mb: Figures = field(default_factory=Figures)  # with the pods
    floor_rss_mb: Figures = field(default_factory=Figures)  # the same machine with an empty kubelet


def memory_rounds(
    tree: Tree, rotel: Rotel, receipts: Receipts, work: Path, other: Path, rounds: int
) -> MemoryFigures:
    """Pairs of agents at equal age (empty kubelet, then the pods), this checkout's and the other's in
    turn: KB per series, and the RSS of each agent of the pair."""
    figures = MemoryFigures()
    endpoint = f"http://127.0.0.1:{rotel.grpc_port}"
    for number in range(rounds):
        progress(f"{tree.key}: memory round {number + 1} of {rounds}")
        label = f"{tree.key}-round{number}"
        this = memory_pair(tree, label, endpoint, receipts, work, None)
        that = memory_pair(tree, label, endpoint, receipts, work, other)
        figures.per_series_kb.add(this.per_series_kb, that.per_series_kb)
        figures.rss_mb.add(this.rss_mb, that.rss_mb)
        figures.floor_rss_mb.add(this.floor_rss_mb, that.floor_rss_mb)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", type=Path, required=True, help="source tree of the agent to compare with")
    parser.add_argument("--trees", default="hwloc,2x32", help="comma list of hwloc, 2x32, 8x48")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scrapes", type=int, default=200, help="unchanged scrapes per target and round")
    parser.add_argument("--cycles", type=int, default=15, help="fresh cycles per agent and round")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    options = parser.parse_args()
    other = options.other.resolve()
    header = f"{time.strftime('%Y-%m-%d')}, {git_head()} against {other}; machine: {machine_details()}"
    lines = [
        header,
        "",
        "| measure | this | other | this / other, median of the rounds (each round) |",
        "|---|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-versus-") as temporary:
        work = Path(temporary)
        trees = build_trees([key.strip() for key in options.trees.split(",") if key.strip()], work)
        with run_rotel(work, verbosity="basic") as rotel:
            receipts = Receipts(rotel)
            for tree in trees:
                plain, gzipped = unchanged_rounds(
                    tree, rotel, receipts, work, other, options.rounds, options.scrapes
                )
                fresh = fresh_rounds(tree, rotel, receipts, work, other, options.rounds, options.cycles)
                lines += [
                    plain.row(f"{tree.key}: CPU per series vs node_exporter, unchanged", ".2f"),
                    gzipped.row(f"{tree.key}: CPU per series vs node_exporter, unchanged, gzip", ".2f"),
                    fresh.row(f"{tree.key}: CPU per series vs node_exporter, fresh inputs", ".2f"),
                ]
                if tree.floor is not None:
                    memory = memory_rounds(tree, rotel, receipts, work, other, options.rounds)
                    lines += [
                        memory.per_series_kb.row(
                            f"{tree.key}: memory per series (KB), pairs at equal age", ".2f"
                        ),
                        memory.rss_mb.row(f"{tree.key}: RSS of those agents with the pods (MB)", ".1f"),
                        memory.floor_rss_mb.row(f"{tree.key}: RSS with an empty kubelet (MB)", ".1f"),
                    ]
                print("\n".join(lines[-6:]), flush=True)
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "versus.md").write_text(text)


if __name__ == "__main__":
    main()
