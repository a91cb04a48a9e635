"""Cost per exported number: the agent beside node_exporter on three trees, interleaved, in one run.

Trees: the hwloc snapshot 48amd64-4pa2n6c-sparse (machine only); a 2 NUMA x 32 CPU node with 110 pods x 2
containers; an 8 NUMA x 48 CPU node with 250 pods x 4 containers. The two nodes come from
:mod:`otel_numa.testing.large_node`: cgroup v2 tree, every 5th pod Guaranteed with exclusive CPUs, memory
manager blocks and hugepages, GPUs with NUMA affinity and a license resource without, pod and container log
names, and a podresources server (:mod:`otel_numa.testing.podresources_server`) answering for the same plan.
On each tree the agent (``otel-numa --exporter prometheus,otlp``, OTLP over gRPC to a real rotel) runs beside
``prometheus-node-exporter --collector.disable-defaults --collector.meminfo_numa --collector.cpu`` on the
same sysfs/procfs, and the two are scraped alternately.

    .venv/bin/python -m benchmarks.bench_cost [--quick] [--trees hwloc,2x32,8x48] [--agent-tree DIR]

Tables go to stdout and to ``benchmarks/out/<name>.md`` (raw figures: ``<name>.json``). The method is in
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import psutil

from benchmarks.harness import (
    PROMETHEUS_SCRAPE_HEADERS,
    ScrapeStats,
    Target,
    compare_scrapes,
    count_series,
    idle_rates,
    machine_details,
    median,
    percentile,
    ratio,
    run_agent,
    run_node_exporter,
    verdict,
)
from otel_numa.export.pipeline import OTLP_BATCH_POINTS
from otel_numa.testing.hwloc import extract_snapshot
from otel_numa.testing.large_node import LargeNode, LargeNodeSpec, write_large_node
from otel_numa.testing.peers import REPO, Rotel, run_rotel, wait_for
from otel_numa.testing.podresources_server import short_socket_dir

HWLOC_SNAPSHOT = "48amd64-4pa2n6c-sparse"
GPU_RESOURCES = ("nvidia.com/gpu", "example.com/license")  # the last one has no NUMA affinity
NODE_2X32 = LargeNodeSpec(
    numa_nodes=2,
    cpus_per_node=32,
    mem_per_node_kib=128 << 20,
    hugepage_sizes_kib=(2048, 1048576),
    pods=110,
    containers_per_pod=2,
    device_resources=GPU_RESOURCES,
    devices_per_resource=2,
    exclusive_pod_every=5,
)
NODE_8X48 = dataclasses.replace(
    NODE_2X32,
    numa_nodes=8,
    cpus_per_node=48,
    mem_per_node_kib=64 << 20,
    pods=250,
    containers_per_pod=4,
    devices_per_resource=8,
)

LONG_INTERVAL_S = 3600  # no background round during the scrape phases
SETTLE_S = 0.05  # after a push arrives, before the scrape: the agent finishes the export
PAIRED_SCRAPES = 20  # the age, in scrapes, at which each agent of a memory pair is measured
SCRAPES_PER_MINUTE = 4  # a 15 s scrape interval
PUSHES_PER_MINUTE = 4  # --interval 15

# Targets (benchmarks, not tests)
UNCHANGED_RATIO_TARGET = 2.0
FRESH_RATIO_TARGET = 3.0
CORE_SHARE_TARGET_PERCENT = 0.6
P95_TARGET_MS = 200.0
RSS_LARGE_TARGET_MB = 100.0
RSS_SMALL_TARGET_MB = 60.0
MEMORY_PER_SERIES_TARGET_KB = 1.0


@dataclass(frozen=True)
class Budget:
    """Seconds each phase may take; the number of scrapes follows from the warm-up latency."""

    scrapes_s: float
    cycles_s: float
    idle_s: float
    min_scrapes: int
    max_scrapes: int
    min_cycles: int
    max_cycles: int
    memory_pairs: int = 3  # pairs of agents for memory per series (trees with an empty-kubelet floor)


# idle CPU counts for a whole minute in the share of a core, so it gets a window long enough that one
# stray timer does not move it
FULL = Budget(
    scrapes_s=14, cycles_s=40, idle_s=10, min_scrapes=12, max_scrapes=200, min_cycles=6, max_cycles=40
)
QUICK = Budget(
    scrapes_s=0,
    cycles_s=0,
    idle_s=0.5,
    min_scrapes=3,
    max_scrapes=3,
    min_cycles=2,
    max_cycles=2,
    memory_pairs=1,
)


_STARTED = time.perf_counter()


def progress(message: str) -> None:
    """One line on stderr, so a long run shows where it is without disturbing the tables."""
    print(f"[{time.perf_counter() - _STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


# Fresh inputs -----------------------------------------------------------------------------------


class ProcStat:
    """Rewrites ``/proc/stat`` with every CPU's user and system ticks grown by the generation."""

    def __init__(self, procfs_root: Path) -> None:
        self.path = procfs_root / "stat"
        self.base = self.path.read_text().splitlines()

    def write(self, generation: int) -> None:
        lines = []
        for line in self.base:
            fields = line.split()
            if fields and fields[0].startswith("cpu") and len(fields) > 3:
                fields[1] = str(int(fields[1]) + generation)  # user
                fields[3] = str(int(fields[3]) + generation)  # system
                line = " ".join(fields)
            lines.append(line)
        temporary = self.path.with_name(".stat.new")
        temporary.write_text("\n".join(lines) + "\n")
        os.replace(temporary, self.path)


def sample_value(page: bytes, needles: Sequence[bytes]) -> float | None:
    """The value of the first sample line holding every needle."""
    for line in page.splitlines():
        if line and not line.startswith(b"#") and all(needle in line for needle in needles):
            return float(line.rsplit(b" ", 1)[1])
    return None


@dataclass
class Tree:
    key: str
    title: str
    sysfs_root: Path
    procfs_root: Path
    agent_args: list[str]
    node: LargeNode | None = None
    floor: LargeNode | None = None  # the same machine with an empty kubelet: the memory floor

    def rewrite(self, generation: int, proc_stat: ProcStat) -> None:
        """Fresh inputs: /proc/stat and, on a node, every container's cgroup usage files."""
        proc_stat.write(generation)
        if self.node is not None:
            self.node.write_cgroup_usage(generation)

    def fresh(self, page: bytes, generation: int, previous: float | None) -> tuple[bool, float | None]:
        """Whether ``page`` shows ``generation``'s inputs: on a node, the first container's anon memory
        as written; on a bare machine, user CPU time that grew."""
        if self.node is None:
            value = sample_value(page, (b"numa_cpu_time_seconds_total{", b'cpu_mode="user"'))
            return value is not None and (previous is None or value > previous), value
        pod = self.node.cgroup_pods(generation)[0]
        container = pod.containers[0]
        home, expected = next((n, v) for n, v in container.memory_bytes["anon"].items() if v)
        needles = (
            b"numa_container_memory_usage_bytes{",
            f'k8s_pod_uid="{pod.uid}"'.encode(),
            b'k8s_container_name="app-0"',
            b'numa_memory_type="anon"',
            f'numa_node_id="{home}"'.encode(),
        )
        value = sample_value(page, needles)
        return value == expected, value


def common_args(otlp_endpoint: str, interval_s: float) -> list[str]:
    return [
        "--node-name",
        "bench",
        "--exporter",
        "prometheus,otlp",
        "--otlp-endpoint",
        otlp_endpoint,
        "--interval",
        f"{interval_s:g}",
    ]


def node_tree(key: str, title: str, spec: LargeNodeSpec, work: Path) -> Tree:
    node = write_large_node(work / key, spec)
    # the same machine with an empty kubelet: its checkpoints and kubepods cgroups, with no pod in them
    floor = write_large_node(work / f"{key}-floor", dataclasses.replace(spec, pods=0))
    floor.write_checkpoints(0)
    return Tree(key, title, node.sysfs_root, node.procfs_root, node_args(node), node, floor)


def node_args(node: LargeNode) -> list[str]:
    """The node's flags without ``--podresources-socket none`` and ``--node-name`` (given per run)."""
    args = node.cli_args()
    for flag in ("--podresources-socket", "--node-name"):
        index = args.index(flag)
        del args[index : index + 2]
    return args


def build_trees(keys: Sequence[str], work: Path) -> list[Tree]:
    trees = []
    for key in keys:
        if key == "hwloc":
            top = extract_snapshot(HWLOC_SNAPSHOT, work / "hwloc")
            args = [
                "--sysfs-root",
                str(top / "sys"),
                "--procfs-root",
                str(top / "proc"),
                "--kubelet-root",
                str(work / "no-kubelet"),
                "--pod-logs-root",
                str(work / "no-pod-logs"),
                "--podresources-socket",
                "none",
            ]
            title = f"hwloc snapshot {HWLOC_SNAPSHOT}, machine only"
            trees.append(Tree(key, title, top / "sys", top / "proc", args))
        elif key == "2x32":
            trees.append(node_tree(key, "2 NUMA x 32 CPUs, 110 pods x 2 containers", NODE_2X32, work))
        elif key == "8x48":
            trees.append(node_tree(key, "8 NUMA x 48 CPUs, 250 pods x 4 containers", NODE_8X48, work))
        else:
            raise SystemExit(f"unknown tree {key!r}: hwloc, 2x32, 8x48")
    return trees


# Peers ------------------------------------------------------------------------------------------


@contextmanager
def podresources_server(node: LargeNode | None, work: Path, name: str) -> Iterator[list[str]]:
    """A podresources server answering for ``node``'s plan in its own process; yields the agent's flag."""
    if node is None:
        yield []
        return
    state = work / f"{name}-podresources.json"
    state.write_text(json.dumps(node.podresources_state()))
    socket_dir = short_socket_dir()
    socket = socket_dir / "kubelet.sock"
    command = [sys.executable, "-m", "otel_numa.testing.podresources_server", "--socket", str(socket)]
    with open(work / f"{name}-podresources.log", "wb") as log:
        process = subprocess.Popen([*command, "--state", str(state)], stdout=log, stderr=log, cwd=REPO)
    try:
        wait_for(socket.exists, 30, "the podresources server to listen")
        yield ["--podresources-socket", str(socket)]
    finally:
        process.terminate()
        process.wait(timeout=10)
        socket.unlink(missing_ok=True)
        socket_dir.rmdir()


_ANSI_ESCAPES = re.compile(rb"\x1b\[[0-9;]*m")
_RECEIVED_POINTS = re.compile(rb"Received metrics\..*\bmetrics=(\d+)")


class Receipts:
    """OTLP pushes rotel has received. At basic verbosity rotel logs one ``Received metrics`` line per
    request, with its points; a push of more than :data:`OTLP_BATCH_POINTS` points goes as several
    requests, every one full but the last (the 8x48 node's 14,452 points as 10,000 and 4,452): a request
    of exactly that many points is a push that goes on, so that a cycle never scrapes or writes the next
    inputs while the rest of its push is still being sent."""

    def __init__(self, rotel: Rotel) -> None:
        self._path = rotel.log_path
        self._read = 0  # bytes of the log read so far
        self._unfinished = b""  # the start of a line not yet ended
        self._pushes = 0

    def count(self) -> int:
        with open(self._path, "rb") as log:
            log.seek(self._read)
            data = log.read()
        self._read += len(data)
        *lines, self._unfinished = (self._unfinished + data).split(b"\n")
        for line in lines:
            if b"Received metrics" in line:
                points = _RECEIVED_POINTS.search(_ANSI_ESCAPES.sub(b"", line))
                if points is None or int(points[1]) != OTLP_BATCH_POINTS:
                    self._pushes += 1
        return self._pushes

    def wait_beyond(self, seen: int, timeout_s: float) -> int:
        """Wait until more than ``seen`` exports arrived; the new count."""

        def arrived() -> int:
            count = self.count()
            return count if count > seen else 0

        return int(wait_for(arrived, timeout_s, "an OTLP export", interval_s=0.005))


# Measurements -----------------------------------------------------------------------------------


@dataclass
class FreshStats:
    cycles: int
    interval_s: float
    fresh_pages: int
    cycle_s: float
    cpu_per_scrape_ms: dict[str, float]
    latency_median_ms: dict[str, float]
    latency_p95_ms: dict[str, float]
    cpu_per_cycle_ms: dict[str, float]
    series: dict[str, int]
    rss_mb: dict[str, float]
    uss_mb: dict[str, float]


def fresh_cycles(
    tree: Tree,
    agent: Target,
    exporter: Target,
    receipts: Receipts,
    interval_s: float,
    cycles: int,
    idle: dict[str, float],
    receipts_before: int,
) -> FreshStats:
    """Cycles of: new inputs written; the agent's background round (cgroups read, OTLP push) arrives at
    rotel; both targets scraped. The round starts ``interval_s`` after the previous one ended, the
    inputs are written right after the scrapes, so every round reads the new inputs and every scrape
    follows its round; each agent page is checked for the generation it should show. The first inputs
    are written once the agent's start-up round has pushed (rotel had ``receipts_before`` exports before
    the agent started): written while it read them, they gave it a mix of old and new files, whose
    series then changed in the first measured cycle."""
    proc_stat = ProcStat(tree.procfs_root)
    targets = (agent, exporter)
    seen = receipts.wait_beyond(receipts_before, 60)  # the round at start-up
    generation = 1
    tree.rewrite(generation, proc_stat)
    spent: dict[str, list[float]] = {target.name: [] for target in targets}
    latencies: dict[str, list[float]] = {target.name: [] for target in targets}
    bodies: dict[str, bytes] = {}
    fresh_pages, previous = 0, None
    window_cpu: dict[str, float] = {}
    window_start = 0.0
    for cycle in range(cycles + 1):  # cycle 0 opens the window of whole cycles
        seen = receipts.wait_beyond(seen, 3 * interval_s + 60)
        time.sleep(SETTLE_S)
        for target in targets:
            before = target.cpu_s()
            elapsed, page = target.scrape_page()
            cost = target.cpu_s() - before - idle[target.name] * elapsed
            bodies[target.name] = page.body
            if cycle:
                spent[target.name].append(cost)
                latencies[target.name].append(elapsed)
        is_fresh, previous = tree.fresh(bodies[agent.name], generation, previous)
        fresh_pages += bool(is_fresh) and cycle > 0
        if cycle == 0:
            window_cpu = {target.name: target.cpu_s() for target in targets}
            window_start = time.perf_counter()
        generation += 1
        tree.rewrite(generation, proc_stat)
    duration = time.perf_counter() - window_start
    return FreshStats(
        cycles=cycles,
        interval_s=interval_s,
        fresh_pages=fresh_pages,
        cycle_s=duration / cycles,
        cpu_per_scrape_ms={name: max(0.0, sum(v) / len(v) * 1000) for name, v in spent.items()},
        latency_median_ms={name: median(v) * 1000 for name, v in latencies.items()},
        latency_p95_ms={name: percentile(v, 0.95) * 1000 for name, v in latencies.items()},
        cpu_per_cycle_ms={t.name: (t.cpu_s() - window_cpu[t.name]) / cycles * 1000 for t in targets},
        series={name: count_series(body) for name, body in bodies.items()},
        rss_mb={t.name: t.rss_bytes() / 2**20 for t in targets},
        uss_mb={t.name: t.uss_bytes() / 2**20 for t in targets},
    )


def core_share_percent(cpu_per_cycle_ms: float, cycle_s: float, idle_ms_per_s: float) -> float:
    """Share of one core at a 15 s scrape and a 15 s push: the compressed cycle's work less its idle
    part, 4 times a minute, plus a whole minute of idle work."""
    work_ms = max(0.0, cpu_per_cycle_ms - idle_ms_per_s * cycle_s)
    per_minute_ms = SCRAPES_PER_MINUTE * work_ms + 60 * idle_ms_per_s
    return per_minute_ms / 60_000 * 100


@dataclass
class TreeResult:
    key: str
    title: str
    load_before: float
    load_after: float
    plain: tuple[ScrapeStats, ScrapeStats]
    gzip: tuple[ScrapeStats, ScrapeStats]
    wire_kb: tuple[float, float, float, float]  # agent plain, agent gzip, node_exporter plain, gzip
    formats: tuple[str, str]  # Content-Type answered to Prometheus' Accept header
    fresh: FreshStats
    floor_rss_mb: float | None
    floor_series: int | None
    clock: str
    # KB per series of each pair of agents at equal age, one with the empty kubelet and one with the pods
    paired_kb: tuple[float, ...] = ()

    @property
    def memory_per_series_kb(self) -> float | None:
        if self.floor_rss_mb is None or self.floor_series is None:
            return None
        agent = self.plain[0]
        return (agent.rss_mb - self.floor_rss_mb) * 1024 / max(1, agent.series - self.floor_series)

    @property
    def paired_memory_per_series_kb(self) -> float | None:
        return median(self.paired_kb) if self.paired_kb else None

    def core_share(self, name: str) -> float:
        stats = self.plain[0] if name == "otel-numa" else self.plain[1]
        f = self.fresh
        return core_share_percent(f.cpu_per_cycle_ms[stats.name], f.cycle_s, stats.idle_cpu_ms_per_s)


def warm_latency(targets: Sequence[Target], scrapes: int = 3) -> float:
    """Seconds one interleaved round of scrapes takes (median of ``scrapes``)."""
    rounds = []
    for _ in range(scrapes):
        started = time.perf_counter()
        for target in targets:
            target.scrape_page()
        rounds.append(time.perf_counter() - started)
    return median(rounds)


def bounded(value: float, low: int, high: int) -> int:
    return max(low, min(high, int(value)))


def measure_floor(
    tree: Tree, endpoint: str, receipts: Receipts, work: Path, agent_tree: Path | None
) -> tuple[float, int]:
    """RSS and series of the agent on the same machine with an empty kubelet, after 3 plain scrapes."""
    assert tree.floor is not None
    label = f"{tree.key}-floor"
    return agent_memory(tree.floor, label, endpoint, receipts, work, agent_tree, scrapes=3, gzip=False)


def agent_memory(
    node: LargeNode,
    label: str,
    endpoint: str,
    receipts: Receipts,
    work: Path,
    agent_tree: Path | None,
    scrapes: int = PAIRED_SCRAPES,
    gzip: bool = True,
) -> tuple[float, int]:
    """RSS (MB) and series of a fresh agent on ``node`` after its start-up push and ``scrapes`` scrapes,
    with ``gzip`` every second one with Prometheus' gzip and OpenMetrics headers."""
    with podresources_server(node, work, label) as socket_args:
        args = [*node_args(node), *socket_args, *common_args(endpoint, LONG_INTERVAL_S)]
        seen = receipts.count()
        with run_agent(args, work, agent_tree=agent_tree) as agent:
            receipts.wait_beyond(seen, 60)
            body = b""
            for number in range(scrapes):
                if gzip and number % 2:
                    agent.scrape_page(PROMETHEUS_SCRAPE_HEADERS)
                else:
                    body = agent.scrape()[1]
            return agent.rss_bytes() / 2**20, count_series(body)


@dataclass(frozen=True)
class MemoryPair:
    """Two agents at equal age on one tree: with an empty kubelet (the floor), then with the pods."""

    floor_rss_mb: float
    rss_mb: float
    per_series_kb: float  # the RSS difference over the difference in series


def memory_pair(
    tree: Tree, label: str, endpoint: str, receipts: Receipts, work: Path, agent_tree: Path | None
) -> MemoryPair:
    assert tree.floor is not None and tree.node is not None
    floor_rss, floor_series = agent_memory(tree.floor, f"{label}-floor", endpoint, receipts, work, agent_tree)
    rss, series = agent_memory(tree.node, label, endpoint, receipts, work, agent_tree)
    return MemoryPair(floor_rss, rss, (rss - floor_rss) * 1024 / max(1, series - floor_series))


def paired_memory(
    tree: Tree, endpoint: str, receipts: Receipts, work: Path, agent_tree: Path | None, pairs: int
) -> tuple[float, ...]:
    """KB per series of ``pairs`` pairs of agents at equal age, the empty kubelet's and the pods', run
    alternately: one RSS reading of a threaded process moves by up to a megabyte from run to run, so
    the target is judged on their median."""
    return tuple(
        memory_pair(tree, f"{tree.key}-pair{pair}", endpoint, receipts, work, agent_tree).per_series_kb
        for pair in range(pairs)
    )


def measure_tree(tree: Tree, rotel: Rotel, work: Path, budget: Budget, agent_tree: Path | None) -> TreeResult:
    receipts = Receipts(rotel)
    endpoint = f"http://127.0.0.1:{rotel.grpc_port}"
    load_before = psutil.getloadavg()[0]
    floor_rss, floor_series = (None, None)
    if tree.floor is not None:
        progress(f"{tree.key}: the same machine with an empty kubelet")
        floor_rss, floor_series = measure_floor(tree, endpoint, receipts, work, agent_tree)
    with ExitStack() as stack:
        socket_args = stack.enter_context(podresources_server(tree.node, work, tree.key))
        exporter = stack.enter_context(run_node_exporter(tree.sysfs_root, tree.procfs_root, work))
        args = [*tree.agent_args, *socket_args]
        seen = receipts.count()
        with run_agent(
            [*args, *common_args(endpoint, LONG_INTERVAL_S)], work, agent_tree=agent_tree
        ) as agent:
            receipts.wait_beyond(seen, 60)  # the start-up round is over: what follows is idle
            targets = [agent, exporter]
            round_s = warm_latency(targets)
            idle = idle_rates(targets, budget.idle_s)
            scrapes = bounded(budget.scrapes_s / round_s, budget.min_scrapes, budget.max_scrapes)
            progress(f"{tree.key}: {scrapes} unchanged and {scrapes} gzip scrapes per target")
            plain = compare_scrapes(targets, scrapes, idle_rate=idle, warm_up=0)
            gzipped = compare_scrapes(
                targets, scrapes, headers=PROMETHEUS_SCRAPE_HEADERS, idle_rate=idle, warm_up=1
            )
            clock = agent.clock.kind
            wire = []
            formats = []
            for target in targets:
                wire.append(target.scrape_page()[1].wire_bytes / 1024)
                page = target.scrape_page(PROMETHEUS_SCRAPE_HEADERS)[1]
                wire.append(page.wire_bytes / 1024)
                formats.append(page.content_type.split(";")[0])
        # The fresh cycles: a short interval, so the agent's background round runs once per cycle.
        rewrites = []
        for generation in (0, 0):  # the faster of two: a busy machine may stall one
            rewrite_started = time.perf_counter()
            tree.rewrite(generation, ProcStat(tree.procfs_root))
            rewrites.append(time.perf_counter() - rewrite_started)
        rewrite_s = min(rewrites)
        p95 = plain[0].latency_p95_ms / 1000 + plain[1].latency_p95_ms / 1000
        interval_s = round(max(1.0, 1.5 * p95 + 2 * rewrite_s + 0.5), 1)
        estimate = interval_s + 2 * plain[0].latency_median_ms / 1000 + rewrite_s + SETTLE_S
        cycles = bounded(budget.cycles_s / estimate, budget.min_cycles, budget.max_cycles)
        progress(f"{tree.key}: {cycles} fresh cycles at --interval {interval_s:g}")
        seen = receipts.count()
        with run_agent([*args, *common_args(endpoint, interval_s)], work, agent_tree=agent_tree) as agent:
            fresh = fresh_cycles(tree, agent, exporter, receipts, interval_s, cycles, idle, seen)
    paired_kb: tuple[float, ...] = ()
    if tree.floor is not None and budget.memory_pairs:
        progress(f"{tree.key}: {budget.memory_pairs} pairs of agents at equal age, without and with the pods")
        paired_kb = paired_memory(tree, endpoint, receipts, work, agent_tree, budget.memory_pairs)
    return TreeResult(
        key=tree.key,
        title=tree.title,
        load_before=load_before,
        load_after=psutil.getloadavg()[0],
        plain=(plain[0], plain[1]),
        gzip=(gzipped[0], gzipped[1]),
        wire_kb=(wire[0], wire[1], wire[2], wire[3]),
        formats=(formats[0], formats[1]),
        fresh=fresh,
        floor_rss_mb=floor_rss,
        floor_series=floor_series,
        clock=clock,
        paired_kb=paired_kb,
    )


# Tables -----------------------------------------------------------------------------------------


def per_series(cpu_ms: float, series: int) -> float:
    """µs per series."""
    return cpu_ms * 1000 / series if series else float("nan")


def tree_table(result: TreeResult) -> str:
    ours, theirs = result.plain
    gz_ours, gz_theirs = result.gzip
    f = result.fresh
    a, n = ours.name, theirs.name

    def row(label: str, mine: float | None, other: float | None, form: str) -> str:
        left = form.format(mine) if mine is not None else "n/a"
        right = form.format(other) if other is not None else "n/a"
        share = ratio(mine, other) if mine is not None and other is not None else ""
        return f"| {label} | {left} | {right} | {share} |"

    mem = result.memory_per_series_kb
    rows = [
        row("series exposed", ours.series, theirs.series, "{:.0f}"),
        row(
            "CPU per scrape, unchanged inputs (ms)",
            ours.cpu_per_scrape_ms,
            theirs.cpu_per_scrape_ms,
            "{:.2f}",
        ),
        row(
            "**CPU per series, unchanged inputs (µs)**",
            ours.cpu_per_series_us,
            theirs.cpu_per_series_us,
            "{:.2f}",
        ),
        row(
            "CPU per series, gzip + OpenMetrics Accept (µs)",
            gz_ours.cpu_per_series_us,
            gz_theirs.cpu_per_series_us,
            "{:.2f}",
        ),
        row(
            "**CPU per series, fresh inputs every scrape (µs)**",
            per_series(f.cpu_per_scrape_ms[a], f.series[a]),
            per_series(f.cpu_per_scrape_ms[n], f.series[n]),
            "{:.2f}",
        ),
        row("scrape latency p50, unchanged (ms)", ours.latency_median_ms, theirs.latency_median_ms, "{:.2f}"),
        row("scrape latency p95, unchanged (ms)", ours.latency_p95_ms, theirs.latency_p95_ms, "{:.2f}"),
        row("scrape latency p95, gzip (ms)", gz_ours.latency_p95_ms, gz_theirs.latency_p95_ms, "{:.2f}"),
        row("scrape latency p50, fresh (ms)", f.latency_median_ms[a], f.latency_median_ms[n], "{:.2f}"),
        row("scrape latency p95, fresh (ms)", f.latency_p95_ms[a], f.latency_p95_ms[n], "{:.2f}"),
        row("page size, plain (KiB)", result.wire_kb[0], result.wire_kb[2], "{:.1f}"),
        row("page size, gzip (KiB)", result.wire_kb[1], result.wire_kb[3], "{:.1f}"),
        row(
            "CPU per cycle: refresh + OTLP push + scrape, fresh (ms)",
            f.cpu_per_cycle_ms[a],
            f.cpu_per_cycle_ms[n],
            "{:.2f}",
        ),
        row(
            "**share of one core, 15 s scrape + 15 s push (%)**",
            result.core_share(a),
            result.core_share(n),
            "{:.3f}",
        ),
        row("idle CPU (ms/s)", ours.idle_cpu_ms_per_s, theirs.idle_cpu_ms_per_s, "{:.2f}"),
        row("**RSS (MB)**", ours.rss_mb, theirs.rss_mb, "{:.1f}"),
        row("RSS after the fresh cycles (MB)", f.rss_mb[a], f.rss_mb[n], "{:.1f}"),
        row("USS, private memory (MB)", ours.uss_mb, theirs.uss_mb, "{:.1f}"),
        row("RSS, same machine with an empty kubelet (MB)", result.floor_rss_mb, None, "{:.1f}"),
        row("memory per series above that, one reading each (KB)", mem, None, "{:.2f}"),
        row(
            "**memory per series, pairs of agents at equal age, median (KB)**",
            result.paired_memory_per_series_kb,
            None,
            "{:.2f}",
        ),
        row("start-up to ready (s)", ours.startup_s, theirs.startup_s, "{:.3f}"),
    ]

    fresh_note = (
        f"{ours.scrapes} unchanged and {gz_ours.scrapes} gzip scrapes per target; {f.cycles} fresh cycles at "
        f"--interval {f.interval_s:g} s ({f.cycle_s:.2f} s each), {f.fresh_pages}/{f.cycles} agent pages "
        f"showed their cycle's inputs; answer to Prometheus' Accept header: {result.formats[0]} / "
        f"{result.formats[1]}; load average {result.load_before:.2f} before, {result.load_after:.2f} after"
    )
    header = ["| measure | otel-numa | node_exporter | ratio |", "|---|---:|---:|---:|"]
    return "\n".join([f"#### {result.title}", "", *header, *rows, "", fresh_note])


# label, value, its format, whether it meets the target
SummaryRow = tuple[str, float | None, str, bool | None]


def summary_table(results: dict[str, TreeResult]) -> str:
    lines = ["| target | today | met |", "|---|---:|---|"]
    for label, value, form, met in summary_rows(results):
        shown = form.format(value) if value is not None else "not measured"
        lines.append(f"| {label} | {shown} | {verdict(met) if met is not None else 'n/a'} |")
    return "\n".join(lines)


def summary_rows(results: dict[str, TreeResult]) -> list[SummaryRow]:
    rows: list[SummaryRow] = []

    def add(label: str, value: float | None, form: str, met: bool | None) -> None:
        rows.append((label, value, form, met))

    for key, name in (
        ("hwloc", "machine only (hwloc 48 CPUs)"),
        ("2x32", "2x32 node"),
        ("8x48", "8x48 node"),
    ):
        result = results.get(key)
        if result is None:
            continue
        ours, theirs = result.plain
        unchanged = ours.cpu_per_series_us / theirs.cpu_per_series_us
        limit = f" ≤ {UNCHANGED_RATIO_TARGET:g}x" if key != "8x48" else " (no target)"
        add(
            f"CPU per series vs node_exporter, unchanged, {name}{limit}",
            unchanged,
            "{:.2f}x",
            unchanged <= UNCHANGED_RATIO_TARGET if key != "8x48" else None,
        )
        ours_gzip, theirs_gzip = result.gzip
        add(
            f"CPU per series vs node_exporter, unchanged, as Prometheus asks (gzip), {name} (no target)",
            ours_gzip.cpu_per_series_us / theirs_gzip.cpu_per_series_us,
            "{:.2f}x",
            None,
        )
        f = result.fresh
        fresh = (f.cpu_per_scrape_ms[ours.name] / f.series[ours.name]) / (
            f.cpu_per_scrape_ms[theirs.name] / f.series[theirs.name]
        )
        limit = f" ≤ {FRESH_RATIO_TARGET:g}x" if key != "8x48" else " (no target)"
        add(
            f"CPU per series vs node_exporter, fresh inputs, {name}{limit}",
            fresh,
            "{:.2f}x",
            fresh <= FRESH_RATIO_TARGET if key != "8x48" else None,
        )
    small, large = results.get("2x32"), results.get("8x48")
    if small is not None:
        share = small.core_share("otel-numa")
        add(
            f"2x32: share of one core, 15 s scrape + 15 s push ≤ {CORE_SHARE_TARGET_PERCENT}%",
            share,
            "{:.2f}%",
            share <= CORE_SHARE_TARGET_PERCENT,
        )
        rss = max(small.plain[0].rss_mb, small.fresh.rss_mb["otel-numa"])
        add(
            f"2x32: RSS with both readers ≤ {RSS_SMALL_TARGET_MB:g} MB",
            rss,
            "{:.1f} MB",
            rss <= RSS_SMALL_TARGET_MB,
        )
        per_series = small.paired_memory_per_series_kb
        if per_series is None:
            per_series = small.memory_per_series_kb
        add(
            f"2x32: memory per series ≤ {MEMORY_PER_SERIES_TARGET_KB:g} KB (median of pairs at equal age)",
            per_series,
            "{:.2f} KB",
            per_series is not None and per_series <= MEMORY_PER_SERIES_TARGET_KB,
        )
    if large is not None:
        p95 = max(large.plain[0].latency_p95_ms, large.fresh.latency_p95_ms["otel-numa"])
        add(
            f"8x48: scrape p95 < {P95_TARGET_MS:g} ms (worse of unchanged and fresh)",
            p95,
            "{:.0f} ms",
            p95 < P95_TARGET_MS,
        )
        rss = max(large.plain[0].rss_mb, large.fresh.rss_mb["otel-numa"])
        add(f"8x48: RSS < {RSS_LARGE_TARGET_MB:g} MB", rss, "{:.1f} MB", rss < RSS_LARGE_TARGET_MB)
    return rows


def exporter_memory_per_series(results: dict[str, TreeResult]) -> str:
    """node_exporter's RSS growth per series between the trees with the fewest and the most of its series."""
    if len(results) < 2:
        return ""
    ordered = sorted(results.values(), key=lambda r: r.plain[1].series)
    low, high = ordered[0].plain[1], ordered[-1].plain[1]
    if high.series == low.series:
        return ""
    kb = (high.rss_mb - low.rss_mb) * 1024 / (high.series - low.series)
    return f"node_exporter's RSS grows {kb:.2f} KB per series from {low.series} to {high.series} series."


def git_head() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 scrapes and 2 cycles per tree")
    parser.add_argument("--trees", default="hwloc,2x32,8x48", help="comma list of hwloc, 2x32, 8x48")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out", help="where tables go")
    parser.add_argument(
        "--agent-tree",
        type=Path,
        help="run the agent from this source tree (e.g. an export of another commit)",
    )
    parser.add_argument("--name", default="", help="the tables' file name in --out (default: cost)")
    options = parser.parse_args()
    budget = QUICK if options.quick else FULL
    agent_tree = options.agent_tree.resolve() if options.agent_tree else None
    started = time.perf_counter()
    label = f"{date.today().isoformat()}, {git_head()}" + (f", agent from {agent_tree}" if agent_tree else "")
    header = f"{label}; machine: {machine_details()}"
    print(header + "\n", flush=True)
    results: dict[str, TreeResult] = {}
    sections = [header, ""]
    with tempfile.TemporaryDirectory(prefix="bench-cost-") as temporary:
        work = Path(temporary)
        progress("writing the trees")
        trees = build_trees([key.strip() for key in options.trees.split(",") if key.strip()], work)
        with run_rotel(work, verbosity="basic") as rotel:
            for tree in trees:
                result = measure_tree(tree, rotel, work, budget, agent_tree)
                results[tree.key] = result
                table = tree_table(result)
                print(table + "\n", flush=True)
                sections += [table, ""]
    summary = summary_table(results)
    extra = exporter_memory_per_series(results)
    elapsed = time.perf_counter() - started
    clocks = ", ".join(sorted({result.clock for result in results.values()}))
    closing = f"CPU clock: {clocks}; whole run {elapsed:.0f} s"
    print(summary, extra, closing, sep="\n\n")
    sections += ["#### Targets", "", summary, "", extra, "", closing]
    options.out.mkdir(parents=True, exist_ok=True)
    name = options.name or ("cost-quick" if options.quick else "cost")
    (options.out / f"{name}.md").write_text("\n".join(sections) + "\n")
    raw: dict[str, Any] = {key: dataclasses.asdict(result) for key, result in results.items()}
    summary_data = summary_rows(results)
    (options.out / f"{name}.json").write_text(
        json.dumps({"label": label, "results": raw, "summary": summary_data}, indent=2)
    )


if __name__ == "__main__":
    main()
