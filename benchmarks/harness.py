"""Measuring the agent beside Debian's prometheus-node-exporter, both as real processes on loopback.

CPU is the process's own user+system time (psutil, every thread counted), so the client doing the
scraping is never billed to the target. Scrapes alternate between the two targets, so a noisy neighbour
on a small machine slows both alike and the ratios stay meaningful.
"""

from __future__ import annotations

import http.client
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from otel_numa.testing.peers import REPO, free_port

NODE_EXPORTER = "prometheus-node-exporter"
# The two collectors that cover what the agent reads from sysfs/procfs.
NODE_EXPORTER_FLAGS = ("--collector.disable-defaults", "--collector.meminfo_numa", "--collector.cpu")


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (p95 of 100 values is the 95th smallest)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.4999)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def http_status(port: int, path: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def count_series(page: bytes) -> int:
    """Samples on a Prometheus text page: every line that is neither blank nor a comment."""
    return sum(1 for line in page.splitlines() if line and not line.startswith(b"#"))


@dataclass
class Target:
    """A process serving a Prometheus page on ``port``."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    startup_s: float  # process start until it answered its readiness URL

    @property
    def ps(self) -> psutil.Process:
        return psutil.Process(self.process.pid)

    def cpu_s(self) -> float:
        times = self.ps.cpu_times()
        return float(times.user + times.system)

    def rss_bytes(self) -> int:
        return int(self.ps.memory_info().rss)

    def scrape(self) -> tuple[float, bytes]:
        """One scrape on a fresh connection, as Prometheus does by default: (seconds, body)."""
        started = time.perf_counter()
        status, body = http_status(self.port, "/metrics", timeout_s=30)
        elapsed = time.perf_counter() - started
        if status != 200:
            raise RuntimeError(f"{self.name}: /metrics answered {status}")
        return elapsed, body


def _wait_ready(process: subprocess.Popen[bytes], port: int, path: str, what: str, timeout_s: float) -> float:
    started = time.perf_counter()
    deadline = started + timeout_s
    while time.perf_counter() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before it was ready")
        try:
            if http_status(port, path, timeout_s=1)[0] == 200:
                return time.perf_counter() - started
        except OSError:
            pass
        time.sleep(0.005)
    raise RuntimeError(f"{what} was not ready within {timeout_s} s")


@contextmanager
def _running(command: Sequence[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(list(command), stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextmanager
def run_agent(agent_args: Sequence[str], work: Path, name: str = "otel-numa") -> Iterator[Target]:
    """``python -m otel_numa`` serving on free loopback ports; start-up ends at /readyz 200."""
    port, health = free_port(), free_port()
    command = [
        sys.executable,
        "-m",
        "otel_numa",
        *agent_args,
        "--prometheus-address",
        f"127.0.0.1:{port}",
        "--health-address",
        f"127.0.0.1:{health}",
        "--log-level",
        "warning",
    ]
    with _running(command, work / f"{name}-{port}.log") as process:
        startup = _wait_ready(process, health, "/readyz", name, 60)
        yield Target(name, process, port, startup)


def node_exporter_binary() -> str:
    path = shutil.which(NODE_EXPORTER)
    if path is None:
        raise SystemExit(
            f"{NODE_EXPORTER} is not installed (Debian: apt-get install prometheus-node-exporter)"
        )
    return path


@contextmanager
def run_node_exporter(sysfs_root: Path, procfs_root: Path, work: Path) -> Iterator[Target]:
    """node_exporter with the meminfo_numa and cpu collectors; start-up ends at its first 200 on /metrics."""
    port = free_port()
    command = [
        node_exporter_binary(),
        *NODE_EXPORTER_FLAGS,
        f"--path.sysfs={sysfs_root}",
        f"--path.procfs={procfs_root}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with _running(command, work / f"node-exporter-{port}.log") as process:
        startup = _wait_ready(process, port, "/metrics", NODE_EXPORTER, 30)
        yield Target("node_exporter", process, port, startup)


@dataclass(frozen=True)
class ScrapeStats:
    name: str
    scrapes: int
    latency_median_ms: float
    latency_p95_ms: float
    cpu_per_scrape_ms: float  # the target's CPU during the scrapes, less its idle rate, per scrape
    idle_cpu_ms_per_s: float  # background work (e.g. OTLP pushes), measured before the scrapes
    series: int
    rss_mb: float
    uss_mb: float  # memory of this process alone (shared libraries' pages not counted)
    startup_s: float

    @property
    def cpu_per_series_us(self) -> float:
        return self.cpu_per_scrape_ms * 1000 / self.series if self.series else float("nan")


def compare_scrapes(targets: Sequence[Target], scrapes: int, idle_s: float = 2.0) -> list[ScrapeStats]:
    """Warm up, measure each target's idle CPU rate, then ``scrapes`` rounds of one scrape per target."""
    bodies = {}
    for target in targets:
        for _ in range(3):
            bodies[target.name] = target.scrape()[1]
    idle_start = {target.name: target.cpu_s() for target in targets}
    time.sleep(idle_s)
    idle_rate = {target.name: (target.cpu_s() - idle_start[target.name]) / idle_s for target in targets}

    latencies: dict[str, list[float]] = {target.name: [] for target in targets}
    cpu_before = {target.name: target.cpu_s() for target in targets}
    started = time.perf_counter()
    for _ in range(scrapes):
        for target in targets:
            elapsed, bodies[target.name] = target.scrape()
            latencies[target.name].append(elapsed)
    duration = time.perf_counter() - started

    results = []
    for target in targets:
        spent = target.cpu_s() - cpu_before[target.name] - idle_rate[target.name] * duration
        results.append(
            ScrapeStats(
                name=target.name,
                scrapes=scrapes,
                latency_median_ms=median(latencies[target.name]) * 1000,
                latency_p95_ms=percentile(latencies[target.name], 0.95) * 1000,
                cpu_per_scrape_ms=max(spent, 0.0) / scrapes * 1000,
                idle_cpu_ms_per_s=idle_rate[target.name] * 1000,
                series=count_series(bodies[target.name]),
                rss_mb=target.rss_bytes() / 2**20,
                uss_mb=target.ps.memory_full_info().uss / 2**20,
                startup_s=target.startup_s,
            )
        )
    return results


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if theirs > 0 else "n/a"


def scrape_table(title: str, agent: ScrapeStats, exporter: ScrapeStats) -> str:
    """A markdown table: the agent, node_exporter and agent/node_exporter ratios."""
    rows = [
        ("scrape latency median (ms)", agent.latency_median_ms, exporter.latency_median_ms, "{:.2f}"),
        ("scrape latency p95 (ms)", agent.latency_p95_ms, exporter.latency_p95_ms, "{:.2f}"),
        ("CPU per scrape (ms)", agent.cpu_per_scrape_ms, exporter.cpu_per_scrape_ms, "{:.2f}"),
        ("series exposed", agent.series, exporter.series, "{:.0f}"),
        ("CPU per series (µs)", agent.cpu_per_series_us, exporter.cpu_per_series_us, "{:.2f}"),
        ("RSS (MB)", agent.rss_mb, exporter.rss_mb, "{:.1f}"),
        ("USS, private memory (MB)", agent.uss_mb, exporter.uss_mb, "{:.1f}"),
        ("idle CPU (ms/s)", agent.idle_cpu_ms_per_s, exporter.idle_cpu_ms_per_s, "{:.2f}"),
        ("start-up to ready (s)", agent.startup_s, exporter.startup_s, "{:.3f}"),
    ]
    lines = [
        f"#### {title} ({agent.scrapes} scrapes each, interleaved)",
        "",
        "| measure | otel-numa | node_exporter | ratio |",
        "|---|---:|---:|---:|",
    ]
    for label, ours, theirs, form in rows:
        lines.append(f"| {label} | {form.format(ours)} | {form.format(theirs)} | {ratio(ours, theirs)} |")
    return "\n".join(lines)


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def machine_details() -> str:
    """nproc, CPU model and Python version, for the results table."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{value:.2f}" for value in psutil.getloadavg())
    return (
        f"nproc {psutil.cpu_count()}, CPU {model}, Python {sys.version.split()[0]}, "
        f"memory {psutil.virtual_memory().total / 2**30:.1f} GiB, load average {load}"
    )
