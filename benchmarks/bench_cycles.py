"""What a node pays per interval, for this checkout's agent and other source trees' in one session.

Each agent runs as the daemon it is (``otel-numa --exporter prometheus,otlp --interval 1``, OTLP over gRPC
to a real rotel, a podresources server in another process) on a node of bench_cost, in its own cgroup for
its CPU clock. A cycle is what one second brings: the background round (cgroup walk, podresources), the
OTLP push that follows it, and one scrape 50 ms after rotel logged the push. Before each cycle's round the
change of the phase is written:

- ``unchanged``: nothing (no file changes: CPU per cycle is the agent's CPU per second with nothing
  changing, scrape included);
- ``fresh``: every counter: each container's ``memory.numa_stat`` and ``cpu.stat``, and ``/proc/stat``;
- ``pod``: one shared-pool pod replaced by a new one (its cgroups, ``pods/`` directory, log links and the
  podresources answer); nothing else.

The agents take turns, each on a node written afresh, for ``--rounds`` rounds; each figure is the median of
its rounds, and a ratio the median of the rounds' ratios. RSS is read after the cycles.

    .venv/bin/python -m benchmarks.bench_cycles --other c829128=DIR [--other NAME=DIR ...] [--node 2x32]

``DIR`` holds another commit's package (``git archive <commit> otel_numa | tar -x -C DIR``). The table goes
to stdout and ``benchmarks/out/cycles-<node>.md``.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.bench_cost import SETTLE_S, Receipts, common_args, git_head, node_args, progress
from benchmarks.bench_rounds import NODES, Changes, podresources_server
from benchmarks.harness import Target, machine_details, median, percentile, run_agent
from otel_numa.testing.large_node import LargeNodeSpec, write_large_node
from otel_numa.testing.peers import REPO, run_rotel

PHASES = ("unchanged", "fresh", "pod")
INTERVAL_S = 1.0
WARM_UP_CYCLES = 3  # not measured: the heap policy's first rounds (otel_numa.daemon.heap) settle
THIS = "this"


@dataclass
class AgentFigures:
    """One agent's figures, one entry per round."""

    cpu_ms: dict[str, list[float]] = field(default_factory=lambda: {phase: [] for phase in PHASES})
    p95_ms: dict[str, list[float]] = field(default_factory=lambda: {phase: [] for phase in PHASES})
    rss_mb: list[float] = field(default_factory=list)


def cycles(
    agent: Target, receipts: Receipts, seen: int, change: Callable[[], None], count: int
) -> tuple[float, float]:
    """CPU per cycle (ms) and the scrapes' p95 (ms) over ``count`` cycles of: a push arrives, a scrape,
    the change written for the next round. The window starts after a first such cycle."""
    latencies: list[float] = []
    start_cpu = 0.0
    for cycle in range(count + 1):
        seen = receipts.wait_beyond(seen, 30)
        time.sleep(SETTLE_S)
        elapsed, _page = agent.scrape_page()
        if cycle == 0:
            start_cpu = agent.cpu_s()
        else:
            latencies.append(elapsed)
        change()
    return (agent.cpu_s() - start_cpu) / count * 1000, percentile(latencies, 0.95) * 1000


def run_one(
    name: str,
    tree: Path | None,
    spec: LargeNodeSpec,
    count: int,
    work: Path,
    endpoint: str,
    receipts: Receipts,
) -> tuple[dict[str, tuple[float, float]], float]:
    node = write_large_node(work / f"node-{name}-{time.monotonic_ns()}", spec)
    figures: dict[str, tuple[float, float]] = {}
    with podresources_server(node, work) as (socket, state):
        socket_args = ["--podresources-socket", str(socket)]
        args = [*node_args(node), *socket_args, *common_args(endpoint, INTERVAL_S)]
        seen = receipts.count()
        with run_agent(args, work, name=name, agent_tree=tree) as agent:
            receipts.wait_beyond(seen, 60)  # the start-up round
            changes = Changes(node, state)
            cycles(agent, receipts, receipts.count(), lambda: None, WARM_UP_CYCLES)
            for phase in PHASES:
                change = functools.partial(changes.write, phase)
                figures[phase] = cycles(agent, receipts, receipts.count(), change, count)
            rss = agent.rss_bytes() / 2**20
    return figures, rss


def table(node: str, agents: dict[str, AgentFigures]) -> str:
    names = list(agents)
    head = "| measure | " + " | ".join(names) + " | " + " | ".join(f"{THIS} / {n}" for n in names[1:]) + " |"
    lines = [head, "|---|" + "---:|" * (2 * len(names) - 1)]

    def row(label: str, values: Callable[[AgentFigures], list[float]], form: str) -> None:
        mine = values(agents[THIS])
        cells = [f"{median(values(agents[n])):{form}}" for n in names]
        ratios = []
        for other in names[1:]:
            theirs = values(agents[other])
            each = [a / b for a, b in zip(mine, theirs, strict=False) if b]
            ratios.append(f"{median(each):.2f} ({' '.join(f'{r:.2f}' for r in each)})" if each else "n/a")
        lines.append(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")

    row(
        f"{node}: CPU per cycle, nothing changing (ms, = ms/s at --interval 1)",
        lambda a: a.cpu_ms["unchanged"],
        ".1f",
    )
    row(f"{node}: CPU per cycle, every counter fresh (ms)", lambda a: a.cpu_ms["fresh"], ".1f")
    row(f"{node}: CPU per cycle, one pod replaced (ms)", lambda a: a.cpu_ms["pod"], ".1f")
    row(
        f"{node}: a pod change, relative to a fresh cycle",
        lambda a: [p / f for p, f in zip(a.cpu_ms["pod"], a.cpu_ms["fresh"], strict=True) if f],
        ".2f",
    )
    row(f"{node}: scrape p95, one pod replaced per cycle (ms)", lambda a: a.p95_ms["pod"], ".1f")
    row(f"{node}: RSS, both readers (MB)", lambda a: a.rss_mb, ".1f")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", action="append", default=[], help="NAME=DIR: another tree's agent")
    parser.add_argument("--node", default="2x32", choices=sorted(NODES))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cycles", type=int, default=10, help="cycles per phase, agent and round")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    options = parser.parse_args()
    trees: dict[str, Path | None] = {THIS: None}
    for other in options.other:
        name, _, directory = other.partition("=")
        trees[name] = Path(directory).resolve()
    header = f"{time.strftime('%Y-%m-%d')}, {git_head()}; machine: {machine_details()}"
    agents = {name: AgentFigures() for name in trees}
    with tempfile.TemporaryDirectory(prefix="bench-cycles-") as temporary:
        work = Path(temporary)
        with run_rotel(work, verbosity="basic") as rotel:
            receipts = Receipts(rotel)
            endpoint = f"http://127.0.0.1:{rotel.grpc_port}"
            for number in range(options.rounds):
                for name, tree in trees.items():
                    progress(f"{options.node}: round {number + 1} of {options.rounds}, {name}")
                    figures, rss = run_one(
                        name, tree, NODES[options.node], options.cycles, work, endpoint, receipts
                    )
                    for phase, (cpu, p95) in figures.items():
                        agents[name].cpu_ms[phase].append(cpu)
                        agents[name].p95_ms[phase].append(p95)
                    agents[name].rss_mb.append(rss)
    where = ", ".join(f"{name}: {tree or 'this checkout'}" for name, tree in trees.items())
    text = "\n".join(
        [
            header,
            "",
            table(options.node, agents),
            "",
            f"{options.rounds} rounds of {options.cycles} cycles a phase at --interval 1 s; agents: {where}",
        ]
    )
    print(text)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / f"cycles-{options.node}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
