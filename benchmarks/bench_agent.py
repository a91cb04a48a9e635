"""The agent on the largest node it is sized for.

The node: 16 NUMA nodes, 1,024 CPUs, 4 hugepage sizes, 250 pods x 4 containers in the CPU, memory and
device checkpoints, 64 devices over 4 resources (otel_numa/testing/large_node.py). Measured in one run:

- collection CPU per round (``time.process_time`` around ``SnapshotStore.refresh()``, in-process) when
  nothing changed and when every checkpoint changed, the background refresh (cgroups) the scheduler runs
  before each push, and a whole in-process Prometheus collection;
- Prometheus scrape latency and CPU per scrape of the agent process beside node_exporter (meminfo_numa and
  cpu collectors) on the same tree, interleaved; RSS; start-up to ready;
- OTLP export cost: CPU per push over gRPC and over HTTP/protobuf to a real rotel collector;
- RSS over 10,000 rounds in a fresh process (every 250th round a background refresh and a whole
  Prometheus collection, every 1,000th the checkpoints all change), at round 1,000 and round 10,000.

    .venv/bin/python -m benchmarks.bench_agent [--rounds 10000]

Targets: an unchanged round under 2 ms of CPU; RSS flat within 2 MB from round 1,000 to 10,000.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psutil
from prometheus_client import generate_latest

from benchmarks.harness import (
    compare_scrapes,
    machine_details,
    median,
    percentile,
    ratio,
    run_agent,
    run_node_exporter,
    scrape_table,
    verdict,
)
from otel_numa.cli.settings import OtlpProtocol, Settings
from otel_numa.daemon.agent import Agent
from otel_numa.daemon.heap import release_free_memory, tidy_after_round
from otel_numa.pipeline import build_pipeline
from otel_numa.testing.large_node import LargeNode, large_node_at, write_large_node
from otel_numa.testing.peers import REPO, run_rotel

UNCHANGED_TARGET_MS = 2.0
RSS_FLAT_TARGET_MB = 2.0


def cpu_ms(
    action: Callable[[], object], rounds: int, before: Callable[[int], object] | None = None
) -> list[float]:
    """CPU milliseconds of each call of ``action``; ``before(i)`` runs first, outside the measurement."""
    samples = []
    for index in range(rounds):
        if before is not None:
            before(index)
        started = time.process_time()
        action()
        samples.append((time.process_time() - started) * 1000)
    return samples


def summary(samples: list[float]) -> tuple[float, float]:
    return median(samples), percentile(samples, 0.95)


def in_process(node: LargeNode, rounds: int) -> dict[str, tuple[float, float]]:
    """Collection rounds, unchanged and with every checkpoint rewritten, and whole Prometheus collections."""
    settings = Settings(**node.settings_values(), exporters=("prometheus",))  # type: ignore[arg-type]
    agent = Agent(settings.to_options())
    results = {
        "background refresh (cgroups, ...)": summary(cpu_ms(agent.refresh_background, max(10, rounds // 10)))
    }
    agent.store.refresh()
    results |= {"unchanged round": summary(cpu_ms(agent.store.refresh, rounds))}
    results["every checkpoint changed"] = summary(
        cpu_ms(agent.store.refresh, max(20, rounds // 5), before=lambda i: node.write_checkpoints(1 - i % 2))
    )
    node.write_checkpoints(0)
    agent.store.refresh()
    pipeline = build_pipeline(settings.to_options(), agent.store, exporters=("prometheus",))
    registry = pipeline.registry
    assert registry is not None
    generate_latest(registry)
    results["whole Prometheus collection (no HTTP)"] = summary(
        cpu_ms(lambda: generate_latest(registry), max(10, rounds // 10))
    )
    pipeline.shutdown(timeout_s=1)
    return results


def otlp_export(
    node: LargeNode, grpc_port: int, http_port: int, pushes: int
) -> dict[str, tuple[float, float]]:
    """CPU per push (collection, encoding and the send, every thread of this process) to rotel."""
    results = {}
    protocols: tuple[tuple[OtlpProtocol, int], ...] = (("grpc", grpc_port), ("http/protobuf", http_port))
    for protocol, port in protocols:
        settings = Settings(
            **node.settings_values(),  # type: ignore[arg-type]
            exporters=("otlp",),
            otlp_endpoint=f"http://127.0.0.1:{port}",
            otlp_protocol=protocol,
            interval=3600,
        )
        agent = Agent(settings.to_options())
        agent.refresh_background()
        pipeline = build_pipeline(settings.to_options(), agent.store)
        pipeline.push(timeout_s=10)
        results[f"OTLP push, {protocol}"] = summary(cpu_ms(partial(pipeline.push, timeout_s=10), pushes))
        pipeline.shutdown(timeout_s=2)
    return results


# The soak runs in its own process, so that its RSS is the agent's and nothing else's.


def soak(root: Path, rounds: int) -> dict[int, float]:
    node = large_node_at(root)
    settings = Settings(**node.settings_values(), exporters=("prometheus",))  # type: ignore[arg-type]
    agent = Agent(settings.to_options())
    refresh_background = agent.refresh_background
    pipeline = build_pipeline(settings.to_options(), agent.store, exporters=("prometheus",))
    registry = pipeline.registry
    assert registry is not None
    process = psutil.Process()
    rss: dict[int, float] = {}
    for number in range(1, rounds + 1):
        if number % 1000 == 0:
            node.write_checkpoints(number // 1000 % 2)
        if number % 250 == 1:
            refresh_background()
            tidy_after_round()  # as the scheduler does at the end of each background round
        if number % 250 == 0:
            generate_latest(registry)
            release_free_memory()  # as the page's server does once a page is sent
        else:
            agent.store.refresh()
        if number == 1 or number % 1000 == 0:
            rss[number] = process.memory_info().rss / 2**20
    return rss


def run_soak(root: Path, rounds: int) -> tuple[dict[int, float], float]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_agent", "--soak", str(root), "--rounds", str(rounds)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return {int(key): value for key, value in json.loads(done.stdout).items()}, time.perf_counter() - started


def startup_times(node: LargeNode, work: Path, starts: int) -> tuple[float, float]:
    """Median start-up to ready of the agent and of node_exporter over ``starts`` cold starts each."""
    ours, theirs = [], []
    for _ in range(starts):
        with run_agent(node.cli_args(), work) as agent:
            ours.append(agent.startup_s)
        with run_node_exporter(node.sysfs_root, node.procfs_root, work) as exporter:
            theirs.append(exporter.startup_s)
    return median(ours), median(theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10_000, help="rounds of the RSS soak")
    parser.add_argument("--collections", type=int, default=300, help="in-process unchanged rounds timed")
    parser.add_argument("--scrapes", type=int, default=40, help="HTTP scrapes per target")
    parser.add_argument("--soak", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    options = parser.parse_args()
    if options.soak is not None:
        print(json.dumps(soak(options.soak, options.rounds)))
        return

    print(f"machine: {machine_details()}\n", flush=True)
    raw: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as temporary:
        work = Path(temporary)
        node = write_large_node(work / "node")
        spec = node.spec
        print(
            f"node: {spec.numa_nodes} NUMA nodes, {spec.cpus} CPUs, {len(spec.hugepage_sizes_kib)} hugepage "
            f"sizes, {spec.pods} pods x {spec.containers_per_pod} containers, {spec.devices} devices over "
            f"{len(spec.device_resources)} resources\n",
            flush=True,
        )
        soak_rss, soak_s = run_soak(node.root, options.rounds)
        collections = in_process(node, options.collections)
        with run_rotel(work) as rotel:
            collections |= otlp_export(node, rotel.grpc_port, rotel.http_port, 15)
            agent_args = [*node.cli_args(), "--exporter", "prometheus,otlp", "--interval", "5"]
            agent_args += ["--otlp-endpoint", f"http://127.0.0.1:{rotel.grpc_port}"]
            with (
                run_agent(agent_args, work) as agent,
                run_node_exporter(node.sysfs_root, node.procfs_root, work) as exporter,
            ):
                ours, theirs = compare_scrapes([agent, exporter], options.scrapes)
        startup_ours, startup_theirs = startup_times(node, work, 3)

    print("#### Collection cost, in-process (CPU ms per round)\n")
    print("| round | median | p95 | node_exporter CPU per scrape | ratio (median) |")
    print("|---|---:|---:|---:|---:|")
    for name, (mid, p95) in collections.items():
        compare = name.startswith("whole")
        exporter_cell = f"{theirs.cpu_per_scrape_ms:.2f}" if compare else ""
        ratio_cell = ratio(mid, theirs.cpu_per_scrape_ms) if compare else ""
        print(f"| {name} | {mid:.2f} | {p95:.2f} | {exporter_cell} | {ratio_cell} |")
    unchanged = collections["unchanged round"][0]
    print(
        f"\nunchanged round {unchanged:.2f} ms CPU (target < {UNCHANGED_TARGET_MS:.0f} ms: "
        f"{verdict(unchanged < UNCHANGED_TARGET_MS)})\n"
    )
    print(
        scrape_table(
            "Agent (Prometheus + OTLP gRPC to rotel) beside node_exporter, largest node", ours, theirs
        )
    )
    print(
        f"\n| start-up to ready, median of 3 cold starts (s) | {startup_ours:.3f} | {startup_theirs:.3f} | "
        f"{ratio(startup_ours, startup_theirs)} |\n"
    )
    print(f"#### RSS over {options.rounds} rounds in a fresh process ({soak_s:.0f} s)\n")
    print("| round | " + " | ".join(str(key) for key in soak_rss) + " |")
    print("|---|" + "---:|" * len(soak_rss))
    print("| RSS (MB) | " + " | ".join(f"{value:.1f}" for value in soak_rss.values()) + " |")
    first = soak_rss.get(1000, next(iter(soak_rss.values())))
    last = soak_rss[max(soak_rss)]
    growth = last - first
    print(
        f"\nRSS from round 1,000 to {max(soak_rss):,}: {growth:+.2f} MB "
        f"(target within {RSS_FLAT_TARGET_MB:.0f} MB: {verdict(abs(growth) <= RSS_FLAT_TARGET_MB)})"
    )
    raw.update(collections=collections, soak_rss=soak_rss, startup=[startup_ours, startup_theirs])
    raw.update(agent=ours.__dict__, node_exporter=theirs.__dict__)
    if options.json is not None:
        options.json.write_text(json.dumps(raw, indent=2))


if __name__ == "__main__":
    main()
