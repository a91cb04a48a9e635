"""Machine-only nodes beside node_exporter: every hwloc snapshot of the fixtures and generated machines.

A node without Kubernetes state (no checkpoints, pods or cgroups) exports only the machine's series, the
ones node_exporter's ``meminfo_numa`` and ``cpu`` collectors cover; its cost per series is the agent's
fixed cost of a scrape, with the fewest series to spread it over. Trees: each snapshot of
``tests/fixtures/hwloc`` (real machines' sysfs and procfs) and two generated machines of 128 and 256 CPUs
(:func:`otel_numa.testing.large_node.machine_only`). On each, the agent (both readers, ``--interval 3600``:
no push falls into the measurement) and node_exporter are scraped alternately, each on a fresh connection:

- unchanged: nothing is written between scrapes;
- fresh: ``/proc/stat`` is rewritten before every pair of scrapes (every CPU's user and system ticks grow),
  as a real machine's always is; the first page of each target is checked to have followed.

The figure is CPU per series of the agent over node_exporter's (each target's own cgroup clock, less its
idle rate), the target at most 2x.

    .venv/bin/python -m benchmarks.bench_machines [--scrapes 60] [--trees all|hwloc|generated|NAME,...]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from benchmarks.bench_cost import LONG_INTERVAL_S, ProcStat, common_args, git_head, progress, sample_value
from benchmarks.harness import (
    Target,
    compare_scrapes,
    count_series,
    idle_rates,
    machine_details,
    median,
    run_agent,
    run_node_exporter,
)
from otel_numa.testing.hwloc import extract_snapshot, snapshot_names
from otel_numa.testing.large_node import machine_only, write_large_node
from otel_numa.testing.peers import REPO, run_rotel

RATIO_TARGET = 2.0
GENERATED = {"machine-128": (2, 64), "machine-256": (4, 64)}  # NUMA nodes x CPUs per node


@dataclass(frozen=True)
class MachineTree:
    name: str
    sysfs_root: Path
    procfs_root: Path
    cpus: int


@dataclass(frozen=True)
class MachineResult:
    tree: MachineTree
    series: tuple[int, int]  # the agent's, node_exporter's
    unchanged: list[float]  # ratio of CPU per series, one per round
    fresh: list[float]
    cpu_ms: tuple[float, float, float, float]  # per scrape, unchanged and fresh: the agent's, node_exporter's
    fresh_pages: int  # agent pages that showed the rewritten /proc/stat
    fresh_scrapes: int


def trees(selection: str, work: Path) -> Iterator[MachineTree]:
    names = snapshot_names() if selection in ("all", "hwloc") else []
    generated = list(GENERATED) if selection in ("all", "generated") else []
    if selection not in ("all", "hwloc", "generated"):
        wanted = [name.strip() for name in selection.split(",") if name.strip()]
        names = [name for name in wanted if name in snapshot_names()]
        generated = [name for name in wanted if name in GENERATED]
    for name in names:
        top = extract_snapshot(name, work / "hwloc")
        if not (top / "proc" / "stat").is_file():
            progress(f"{name}: no /proc/stat in the snapshot, left out")
            continue
        cpus = sum(1 for line in (top / "proc" / "stat").read_text().splitlines() if line[:3] == "cpu") - 1
        yield MachineTree(name, top / "sys", top / "proc", cpus)
    for name in generated:
        nodes, per_node = GENERATED[name]
        node = write_large_node(work / name, machine_only(nodes, per_node))
        yield MachineTree(name, node.sysfs_root, node.procfs_root, nodes * per_node)


def agent_args(tree: MachineTree, work: Path, endpoint: str) -> list[str]:
    return [
        *("--sysfs-root", str(tree.sysfs_root), "--procfs-root", str(tree.procfs_root)),
        *("--kubelet-root", str(work / "no-kubelet"), "--pod-logs-root", str(work / "no-pod-logs")),
        *("--cgroup-root", str(work / "no-cgroups"), "--podresources-socket", "none"),
        *common_args(endpoint, LONG_INTERVAL_S),
    ]


def fresh_scrapes(
    targets: Sequence[Target], proc_stat: ProcStat, scrapes: int, idle: dict[str, float], first: int
) -> tuple[dict[str, float], int]:
    """CPU per scrape (ms) of each target with /proc/stat rewritten before each pair of scrapes, and how many
    of the agent's pages showed user time that grew."""
    spent = {target.name: 0.0 for target in targets}
    followed, previous = 0, None
    for generation in range(first, first + scrapes):
        proc_stat.write(generation)
        for target in targets:
            before = target.cpu_s()
            elapsed, page = target.scrape_page()
            spent[target.name] += target.cpu_s() - before - idle[target.name] * elapsed
            if target is targets[0]:
                value = sample_value(page.body, (b"numa_cpu_time_seconds_total{", b'cpu_mode="user"'))
                followed += value is not None and previous is not None and value > previous
                previous = value
    return {name: max(0.0, total) / scrapes * 1000 for name, total in spent.items()}, followed


def measure(tree: MachineTree, work: Path, endpoint: str, scrapes: int, rounds: int) -> MachineResult:
    unchanged: list[float] = []
    fresh: list[float] = []
    followed = 0
    per_scrape_ms: list[tuple[float, float, float, float]] = []
    with ExitStack() as stack:
        exporter = stack.enter_context(run_node_exporter(tree.sysfs_root, tree.procfs_root, work))
        agent = stack.enter_context(run_agent(agent_args(tree, work, endpoint), work, name="otel-numa"))
        targets = [agent, exporter]
        idle = idle_rates(targets, 2.0)
        proc_stat = ProcStat(tree.procfs_root)
        series = (count_series(agent.scrape()[1]), count_series(exporter.scrape()[1]))
        for number in range(rounds):
            stats = {s.name: s for s in compare_scrapes(targets, scrapes, idle_rate=idle)}
            unchanged.append(stats[agent.name].cpu_per_series_us / stats[exporter.name].cpu_per_series_us)
            per_scrape, pages = fresh_scrapes(targets, proc_stat, scrapes, idle, 1 + number * scrapes)
            followed += pages
            per_scrape_ms.append(
                (
                    stats[agent.name].cpu_per_scrape_ms,
                    stats[exporter.name].cpu_per_scrape_ms,
                    per_scrape[agent.name],
                    per_scrape[exporter.name],
                )
            )
            fresh.append(
                (per_scrape[agent.name] / series[0]) / (per_scrape[exporter.name] / series[1])
                if per_scrape[exporter.name]
                else float("nan")
            )
        proc_stat.write(0)
    cpu_ms = tuple(median([row[column] for row in per_scrape_ms]) for column in range(4))
    # the first page of a round has nothing to follow
    return MachineResult(
        tree,
        series,
        unchanged,
        fresh,
        (cpu_ms[0], cpu_ms[1], cpu_ms[2], cpu_ms[3]),
        followed,
        rounds * (scrapes - 1),
    )


def table(results: Sequence[MachineResult]) -> str:
    lines = [
        "| tree | CPUs | series (agent / node_exporter) | unchanged, CPU per series vs node_exporter "
        f"≤ {RATIO_TARGET:g}x | fresh /proc/stat | CPU per scrape (ms), unchanged / fresh: agent, "
        "node_exporter | pages that followed |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        unchanged, fresh = median(result.unchanged), median(result.fresh)
        mark = "" if max(unchanged, fresh) <= RATIO_TARGET else " (above)"
        agent, exporter, agent_fresh, exporter_fresh = result.cpu_ms
        lines.append(
            f"| {result.tree.name} | {result.tree.cpus} | {result.series[0]} / {result.series[1]} | "
            f"{unchanged:.2f}x ({' '.join(f'{r:.2f}' for r in result.unchanged)}) | "
            f"{fresh:.2f}x ({' '.join(f'{r:.2f}' for r in result.fresh)}){mark} | "
            f"{agent:.2f} / {agent_fresh:.2f}, {exporter:.2f} / {exporter_fresh:.2f} | "
            f"{result.fresh_pages}/{result.fresh_scrapes} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default="all", help="all, hwloc, generated, or a comma list of names")
    parser.add_argument("--scrapes", type=int, default=60, help="scrapes per target, phase and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    options = parser.parse_args()
    started = time.perf_counter()
    header = f"{time.strftime('%Y-%m-%d')}, {git_head()}; machine: {machine_details()}"
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-machines-") as temporary:
        work = Path(temporary)
        with run_rotel(work, verbosity="basic") as rotel:
            endpoint = f"http://127.0.0.1:{rotel.grpc_port}"
            for tree in trees(options.trees, work):
                progress(f"{tree.name}: {options.rounds} rounds of {options.scrapes} scrapes")
                results.append(measure(tree, work, endpoint, options.scrapes, options.rounds))
                print(table(results[-1:]).splitlines()[-1], flush=True)
    text = "\n".join(
        [
            header,
            "",
            table(results),
            "",
            f"medians of the rounds (each round); {time.perf_counter() - started:.0f} s",
        ]
    )
    print("\n" + text)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "machines.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
