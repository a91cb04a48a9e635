"""Scrape cost of the agent beside node_exporter on the same trees.

Two trees: the largest hwloc snapshot (by CPU count) and a generated 8-node, 384-CPU machine. On each,
the agent runs with both readers on (Prometheus, and OTLP over gRPC pushing every second to a real rotel
collector) next to ``prometheus-node-exporter --collector.disable-defaults --collector.meminfo_numa
--collector.cpu`` on the same ``--path.sysfs``/``--path.procfs``, and the two are scraped alternately.

    .venv/bin/python -m benchmarks.bench_scrape [--scrapes 200]

Targets: scrape CPU per series exposed at most 2x node_exporter's; agent RSS under 50 MB.
"""

from __future__ import annotations

import argparse
import json
import tarfile
import tempfile
from dataclasses import asdict
from pathlib import Path

from benchmarks.harness import (
    ScrapeStats,
    compare_scrapes,
    machine_details,
    run_agent,
    run_node_exporter,
    scrape_table,
    verdict,
)
from otel_numa.testing.hwloc import SNAPSHOT_DIR, extract_snapshot, snapshot_names
from otel_numa.testing.large_node import machine_only, write_large_node
from otel_numa.testing.peers import run_rotel

RSS_TARGET_MB = 50.0
CPU_PER_SERIES_TARGET = 2.0


def largest_snapshot() -> tuple[str, int]:
    """The hwloc snapshot with the most ``cpuN`` directories, and that count."""

    def cpu_count(name: str) -> int:
        with tarfile.open(SNAPSHOT_DIR / f"{name}.tar.bz2") as archive:
            return sum(
                1
                for member in archive.getmembers()
                if member.isdir()
                and member.name.rstrip("/").rpartition("/")[2][3:].isdigit()
                and "/devices/system/cpu/cpu" in member.name
            )

    counts = {name: cpu_count(name) for name in snapshot_names()}
    name = max(counts, key=lambda key: (counts[key], key))
    return name, counts[name]


def measure_tree(
    sysfs_root: Path, procfs_root: Path, otlp_endpoint: str, work: Path, scrapes: int
) -> tuple[ScrapeStats, ScrapeStats]:
    agent_args = [
        "--sysfs-root",
        str(sysfs_root),
        "--procfs-root",
        str(procfs_root),
        "--kubelet-root",
        str(work / "no-kubelet"),
        "--pod-logs-root",
        str(work / "no-pod-logs"),
        "--podresources-socket",
        "none",
        "--node-name",
        "bench",
        "--exporter",
        "prometheus,otlp",
        "--otlp-endpoint",
        otlp_endpoint,
        "--interval",
        "1",
    ]
    with (
        run_agent(agent_args, work) as agent,
        run_node_exporter(sysfs_root, procfs_root, work) as exporter,
    ):
        ours, theirs = compare_scrapes([agent, exporter], scrapes)
    return ours, theirs


def targets_line(ours: ScrapeStats, theirs: ScrapeStats) -> str:
    per_series = ours.cpu_per_series_us / theirs.cpu_per_series_us
    return (
        f"CPU per series {per_series:.2f}x node_exporter's (target <= {CPU_PER_SERIES_TARGET:.0f}x: "
        f"{verdict(per_series <= CPU_PER_SERIES_TARGET)}); "
        f"RSS {ours.rss_mb:.1f} MB (target < {RSS_TARGET_MB:.0f} MB: {verdict(ours.rss_mb < RSS_TARGET_MB)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=200, help="scrapes per target and tree")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    options = parser.parse_args()

    print(f"machine: {machine_details()}\n")
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scrape-") as temporary:
        work = Path(temporary)
        snapshot, cpus = largest_snapshot()
        fixture = extract_snapshot(snapshot, work / "fixture")
        generated = write_large_node(work / "generated", machine_only(8, 48))
        trees = [
            (f"hwloc snapshot {snapshot} ({cpus} CPUs)", fixture / "sys", fixture / "proc"),
            ("generated 8 NUMA nodes x 48 CPUs (384 CPUs)", generated.sysfs_root, generated.procfs_root),
        ]
        with run_rotel(work) as rotel:
            endpoint = f"http://127.0.0.1:{rotel.grpc_port}"
            for title, sysfs_root, procfs_root in trees:
                ours, theirs = measure_tree(sysfs_root, procfs_root, endpoint, work, options.scrapes)
                print(scrape_table(title, ours, theirs))
                print(f"\n{targets_line(ours, theirs)}\n", flush=True)
                results[title] = {"agent": asdict(ours), "node_exporter": asdict(theirs)}
            received = rotel.log_path.read_text(errors="replace").count("numa.cpu.capacity")
            print(f"rotel received {received} OTLP batches holding numa.cpu.capacity during the run")
            if received == 0:
                raise SystemExit(
                    "the agent's OTLP reader delivered nothing to rotel: the RSS figure is not valid"
                )
    if options.json is not None:
        options.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
