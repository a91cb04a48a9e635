"""Cost of per-container NUMA usage on a node with 250 pods x 4 containers.

Two machines from :mod:`otel_numa.testing.large_node`, both with 1,000 containers in a cgroup v2 tree (systemd
driver) and their ``/var/log/containers`` links: 2 NUMA nodes x 512 CPUs (512 GiB each), and the
largest node the agent is sized for (16 NUMA nodes x 64 CPUs); the generator gives every container one
exclusive CPU and a memory block on its node. Each container is pinned to one node; its ``memory.numa_stat``
lists every node, as the kernel does, with 90% of its anon memory and all other types on its own node and
10% of its anon memory on the next node.

Measured in this process:

- the background refresh (list the tree, read 4 files per container, read the container names): CPU and
  wall time per round;
- the join with the allocation (once per refresh, in the first collection after it);
- a Prometheus scrape (``generate_latest`` on the agent's registry, snapshot included), with the cgroup
  series and with ``--disable container_usage``, and the series each exposes.

    .venv/bin/python -m benchmarks.bench_cgroups [--rounds 20]

Files are on the local disk here, not in cgroupfs: the kernel's own cost to produce ``memory.numa_stat``
(a walk of the memory cgroup per node) is not included.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from benchmarks.harness import count_series, machine_details, median, percentile
from otel_numa.cli.settings import Settings
from otel_numa.daemon.agent import Agent
from otel_numa.instruments.catalogue import MetricGroup
from otel_numa.model import Allocation
from otel_numa.pipeline import build_pipeline
from otel_numa.snapshot.collectors.cgroups import CgroupCollector, ContainerLogNames
from otel_numa.snapshot.source_status import SourceRegistry
from otel_numa.sources.cgroups import PAGE_SIZE
from otel_numa.testing.cgroup_tree import V2_TYPES, render_numa_stat_v2
from otel_numa.testing.large_node import LargeNode, LargeNodeSpec, write_large_node

ANON_PAGES = 25_600  # 100 MiB of 4 KiB pages per container


def realistic_numa_stat(node: LargeNode) -> None:
    """Rewrite every container's memory.numa_stat: its memory on its own node, 10% of anon on the next."""
    nodes = list(range(node.spec.numa_nodes))
    for mems_file in node.cgroup_root.rglob("*.scope/cpuset.mems.effective"):
        home = int(mems_file.read_text())
        remote = (home + 1) % len(nodes)
        memory = {name: {home: PAGE_SIZE * 256} for name in V2_TYPES}
        memory["anon"] = {home: PAGE_SIZE * ANON_PAGES * 9 // 10, remote: PAGE_SIZE * ANON_PAGES // 10}
        (mems_file.parent / "memory.numa_stat").write_text(render_numa_stat_v2(memory, nodes))


def timed(action: Callable[[], object], rounds: int) -> tuple[list[float], list[float]]:
    """(CPU seconds, wall seconds) of each of ``rounds`` calls."""
    cpu: list[float] = []
    wall: list[float] = []
    for _ in range(rounds):
        cpu_start, wall_start = time.process_time(), time.perf_counter()
        action()
        cpu.append(time.process_time() - cpu_start)
        wall.append(time.perf_counter() - wall_start)
    return cpu, wall


def ms(values: list[float]) -> str:
    return f"{median(values) * 1000:.1f} / {percentile(values, 0.95) * 1000:.1f}"


def measure(spec: LargeNodeSpec, rounds: int, work: Path) -> list[str]:
    node = write_large_node(work, spec)
    realistic_numa_stat(node)
    values: dict[str, Any] = {
        **node.settings_values(),
        "prometheus_address": "none",
        "health_address": "none",
    }

    collector = CgroupCollector(
        node.cgroup_root, ContainerLogNames(node.container_logs_root), SourceRegistry()
    )
    refresh_cpu, refresh_wall = timed(collector.refresh, rounds)
    assert collector.view is not None and len(collector.view.usages) == spec.pods * spec.containers_per_pod

    rows: list[str] = []
    scrape: dict[str, tuple[list[float], int]] = {}
    switches: tuple[tuple[str, frozenset[MetricGroup]], ...] = (
        ("with container usage", frozenset()),
        ("--disable container_usage", frozenset({MetricGroup.CONTAINER_USAGE})),
    )
    for label, disable in switches:
        settings = Settings(**values, disable=disable)
        agent = Agent(settings.to_options())
        agent.exposition_once()  # one refresh of the cgroups, as --once does
        pipeline = build_pipeline(settings.to_options(), agent.store, exporters=("prometheus",))
        assert pipeline.registry is not None
        registry = pipeline.registry
        page = generate_latest(registry)
        cpu, _wall = timed(lambda: generate_latest(registry), rounds)  # noqa: B023 (called in the loop)
        scrape[label] = (cpu, count_series(page))
        pipeline.shutdown(timeout_s=1)

    machine = Agent(Settings(**values).to_options()).store.refresh().machine

    def join_again() -> None:
        collector.containers(Allocation(), machine)  # a new allocation object forces the join

    join_cpu, _ = timed(join_again, rounds)
    joined = collector.containers(Allocation(), machine)
    locality = sorted({round(c.locality, 3) for c in joined if c.locality is not None})

    with_cpu, with_series = scrape["with container usage"]
    without_cpu, without_series = scrape["--disable container_usage"]
    rows.append(
        f"| {spec.numa_nodes} x {spec.cpus_per_node} CPUs | {ms(refresh_cpu)} | {ms(refresh_wall)} | "
        f"{ms(join_cpu)} | {ms(with_cpu)} | {ms(without_cpu)} | {with_series} | {without_series} | "
        f"{', '.join(map(str, locality))} |"
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(machine_details())
    print()
    print(
        "| machine (250 pods x 4 containers) | refresh CPU ms (median / p95) | refresh wall ms | "
        "join CPU ms | scrape CPU ms | scrape CPU ms, container usage off | series | series, off | "
        "localities |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for spec in (LargeNodeSpec(numa_nodes=2, cpus_per_node=512, mem_per_node_kib=512 << 20), LargeNodeSpec()):
        with tempfile.TemporaryDirectory(prefix="bench-cgroups-") as work:
            for row in measure(spec, args.rounds, Path(work)):
                print(row, flush=True)


if __name__ == "__main__":
    main()
