"""Latency from a kubelet checkpoint rename to its receipt by an OTLP collector, and the exports of a burst.

Starts rotel (a real OTLP collector, debug log on) and the agent (OTLP only, periodic export every 60 s, so
every export seen here was caused by a change) on a synthetic two-node machine, then rewrites the CPU
manager checkpoint the way the kubelet does (temporary file, fsync, rename), ``--changes`` times, each change
naming a new container. The receipt time is when the new container name appears in rotel's debug log,
which is read as it grows (every millisecond). Percentiles are nearest-rank.

Run from the repository root::

    .venv/bin/python benchmarks/bench_push_latency.py [--changes 50] [--protocol grpc|http/protobuf]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from otel_numa.testing.checkpoints import write_cpu_manager_state  # noqa: E402
from otel_numa.testing.peers import Rotel, run_agent, run_rotel, wait_for  # noqa: E402
from otel_numa.testing.sysfs_tree import NodeSpec, write_machine  # noqa: E402

POD = "0f1e2d3c-aaaa-bbbb-cccc-000000000002"
ALL_CPUS = frozenset(range(8))
PUSH_MIN_INTERVAL_S = 0.2  # the agent's default
WATCH_BATCH_S = 0.12  # the watcher reports a change at most this late during a burst


class LogTail:
    """Reads rotel's debug log as it grows and tells when a text first appears in it."""

    def __init__(self, path: Path) -> None:
        self._handle = open(path, "rb")  # noqa: SIM115 (closed in close())
        self._text = b""

    def wait_for(self, marker: str, timeout_s: float) -> float:
        needle = marker.encode()
        start = max(0, len(self._text) - len(needle))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            chunk = self._handle.read()
            if chunk:
                self._text += chunk
                if self._text.find(needle, start) >= 0:
                    return time.monotonic()
            time.sleep(0.001)
        raise TimeoutError(f"{marker!r} not received within {timeout_s} s")

    def count(self, text: str) -> int:
        self._text += self._handle.read()
        return self._text.count(text.encode())

    def close(self) -> None:
        self._handle.close()


def rewrite(path: Path, container: str, cpu: int) -> float:
    write_cpu_manager_state(path, "static", ALL_CPUS - {cpu}, {POD: {container: {cpu}}})
    return time.monotonic()


def marker(container: str) -> str:
    return f"k8s.container.name: Str({container})"


def nearest_rank(values: list[float], percent: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(percent / 100 * len(ordered)) - 1)]


def measure(rotel: Rotel, checkpoint: Path, changes: int, pause_s: float) -> list[float]:
    tail = LogTail(rotel.log_path)
    latencies: list[float] = []
    try:
        for index in range(changes):
            container = f"bench-{index}"
            renamed = rewrite(checkpoint, container, 4 + index % 4)
            latencies.append(tail.wait_for(marker(container), 10) - renamed)
            time.sleep(pause_s)  # let the rate limit lapse: each change is measured on its own
    finally:
        tail.close()
    return latencies


def burst(rotel: Rotel, checkpoint: Path, renames: int, over_s: float) -> tuple[int, float, float]:
    """``renames`` renames spread over ``over_s``: (exports received, burst duration, last-value latency)."""
    tail = LogTail(rotel.log_path)
    try:
        exports_before = tail.count("ResourceMetrics #")
        began = time.monotonic()
        renamed = began
        for index in range(renames):
            renamed = rewrite(checkpoint, f"burst-{index}", index % 4)
            time.sleep(max(0.0, began + (index + 1) * over_s / renames - time.monotonic()))
        duration = renamed - began
        last_received = tail.wait_for(marker(f"burst-{renames - 1}"), 10)
        time.sleep(1.0)  # any export still to come
        exports = tail.count("ResourceMetrics #") - exports_before
    finally:
        tail.close()
    return exports, duration, last_received - renamed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--protocol", choices=("grpc", "http/protobuf"), default="grpc")
    parser.add_argument("--pause", type=float, default=0.3, help="seconds between two measured changes")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-push-") as scratch:
        tmp_path = Path(scratch)
        nodes = [
            NodeSpec(0, cpus=range(4), mem_total_kib=4 << 20, mem_free_kib=2 << 20),
            NodeSpec(1, cpus=range(4, 8), mem_total_kib=4 << 20, mem_free_kib=3 << 20),
        ]
        sysfs, procfs = write_machine(tmp_path / "machine", nodes)
        kubelet = tmp_path / "kubelet"
        kubelet.mkdir()
        checkpoint = kubelet / "cpu_manager_state"
        write_cpu_manager_state(checkpoint, "static", ALL_CPUS, {})
        missing = str(tmp_path / "absent")
        agent_args = [
            *("--sysfs-root", str(sysfs), "--procfs-root", str(procfs), "--kubelet-root", str(kubelet)),
            *("--podresources-socket", "none", "--pod-logs-root", missing, "--cgroup-root", missing),
            *("--container-logs-root", missing, "--exporter", "otlp", "--interval", "60"),
            *("--otlp-protocol", args.protocol),
        ]
        with run_rotel(tmp_path) as rotel:
            port = rotel.grpc_port if args.protocol == "grpc" else rotel.http_port
            env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
            with run_agent(agent_args, tmp_path, env=env, prometheus=False):
                wait_for(lambda: rotel.latest("numa.cpu.allocated"), 20, "the first export")
                latencies = [s * 1000 for s in measure(rotel, checkpoint, args.changes, args.pause)]
                exports, duration, last_latency = burst(rotel, checkpoint, 100, 1.0)

    command = f".venv/bin/python benchmarks/bench_push_latency.py --changes {args.changes}"
    if args.protocol != "grpc":
        command += f" --protocol {args.protocol}"
    p95 = nearest_rank(latencies, 95)
    print(f"Command: `{command}`  ")
    print(
        f"Machine: {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, Python "
        f"{platform.python_version()}; OTLP {args.protocol} to rotel on loopback; push_min_interval "
        f"{PUSH_MIN_INTERVAL_S} s\n"
    )
    print("| changes | p50 (ms) | p95 (ms) | max (ms) | mean (ms) | target p95 |")
    print("|---:|---:|---:|---:|---:|---|")
    print(
        f"| {len(latencies)} | {nearest_rank(latencies, 50):.0f} | {p95:.0f} | {max(latencies):.0f} "
        f"| {statistics.fmean(latencies):.0f} | < 250 ms: {'met' if p95 < 250 else 'NOT met'} |"
    )
    bound = math.floor((duration + WATCH_BATCH_S) / PUSH_MIN_INTERVAL_S) + 2
    print("\n| burst | duration (s) | exports received | bound | last value received after (ms) |")
    print("|---|---:|---:|---:|---:|")
    print(f"| 100 renames | {duration:.2f} | {exports} | {bound} | {last_latency * 1000:.0f} |")
    return 0 if p95 < 250 and exports <= bound else 1


if __name__ == "__main__":
    raise SystemExit(main())
