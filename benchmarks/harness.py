"""Measuring the agent beside Debian's prometheus-node-exporter, both as real processes on loopback.

CPU is the target's own time, every thread and child process counted, so the client doing the scraping is
never billed to the target. Where a writable cgroup v2 hierarchy exists (as root: ``/sys/fs/cgroup`` or the
hybrid ``/sys/fs/cgroup/unified``) each target starts in a cgroup of its own and its CPU is that cgroup's
``cpu.stat`` ``usage_usec``: microsecond resolution, short-lived threads included. Elsewhere it is psutil's
user+system time of the process tree, in clock ticks (10 ms), good only over many scrapes. Scrapes
alternate between the two targets, so a noisy neighbour on a small machine slows both alike and the ratios
stay meaningful.
"""

from __future__ import annotations

import gzip
import http.client
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
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


# What Prometheus sends when it scrapes (OpenMetrics first), and the compression it accepts.
PROMETHEUS_SCRAPE_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


@dataclass(frozen=True)
class Page:
    """One scrape's answer: the body as sent (maybe gzip) and as text."""

    status: int
    content_type: str
    wire_bytes: int
    body: bytes  # decompressed


def http_page(port: int, path: str, timeout_s: float = 2.0, headers: Mapping[str, str] | None = None) -> Page:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        connection.request("GET", path, headers=dict(headers or {}))
        response = connection.getresponse()
        raw = response.read()
        body = gzip.decompress(raw) if response.getheader("Content-Encoding") == "gzip" else raw
        return Page(response.status, response.getheader("Content-Type", ""), len(raw), body)
    finally:
        connection.close()


def http_status(port: int, path: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    page = http_page(port, path, timeout_s)
    return page.status, page.body


def count_series(page: bytes) -> int:
    """Samples on a Prometheus text page: every line that is neither blank nor a comment."""
    return sum(1 for line in page.splitlines() if line and not line.startswith(b"#"))


def _cgroup2_root() -> Path | None:
    """Where a cgroup v2 hierarchy is mounted writable (pure v2 or the hybrid ``unified`` mount)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup2" and "rw" in fields[3].split(","):
            return Path(fields[1])
    return None


_cgroup_serial = itertools.count()


class CpuClock:
    """CPU seconds of one target: its own cgroup's ``usage_usec`` where possible, else psutil (ticks)."""

    def __init__(self, name: str) -> None:
        self.cgroup: Path | None = None
        root = _cgroup2_root()
        if root is not None and os.geteuid() == 0:
            candidate = root / f"otel-numa-bench-{os.getpid()}-{next(_cgroup_serial)}-{name}"
            try:
                candidate.mkdir()
                if os.access(candidate / "cgroup.procs", os.W_OK) and (candidate / "cpu.stat").exists():
                    self.cgroup = candidate
                else:
                    candidate.rmdir()
            except OSError:
                pass

    @property
    def kind(self) -> str:
        return "cgroup v2 cpu.stat (µs)" if self.cgroup is not None else "psutil process times (10 ms ticks)"

    def enter(self) -> None:
        """Runs in the child between fork and exec: the target starts inside the cgroup."""
        if self.cgroup is not None:
            (self.cgroup / "cgroup.procs").write_text(str(os.getpid()))

    def seconds(self, process: psutil.Process) -> float:
        if self.cgroup is not None:
            for line in (self.cgroup / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        total = 0.0
        for member in _tree(process):
            try:
                times = member.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                pass
        return total

    def close(self) -> None:
        if self.cgroup is not None:
            with suppress(OSError):  # a process still inside (killed late): an empty cgroup is harmless
                self.cgroup.rmdir()


def _tree(process: psutil.Process) -> list[psutil.Process]:
    try:
        return [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@dataclass
class Target:
    """A process serving a Prometheus page on ``port``."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    startup_s: float  # process start until it answered its readiness URL
    clock: CpuClock = field(default_factory=lambda: CpuClock("unused"))

    @property
    def ps(self) -> psutil.Process:
        return psutil.Process(self.process.pid)

    def cpu_s(self) -> float:
        return self.clock.seconds(self.ps)

    def rss_bytes(self) -> int:
        """Resident memory of the process and its children (a launcher that forks counts whole)."""
        return sum(int(member.memory_info().rss) for member in _tree(self.ps))

    def uss_bytes(self) -> int:
        """Memory of the process tree alone (shared library pages not counted)."""
        return sum(int(member.memory_full_info().uss) for member in _tree(self.ps))

    def scrape(self) -> tuple[float, bytes]:
        """One scrape on a fresh connection, as Prometheus does by default: (seconds, body)."""
        elapsed, page = self.scrape_page()
        return elapsed, page.body

    def scrape_page(self, headers: Mapping[str, str] | None = None) -> tuple[float, Page]:
        """One scrape on a fresh connection with ``headers``: (seconds, page)."""
        started = time.perf_counter()
        page = http_page(self.port, "/metrics", timeout_s=60, headers=headers)
        elapsed = time.perf_counter() - started
        if page.status != 200:
            raise RuntimeError(f"{self.name}: /metrics answered {page.status}")
        return elapsed, page


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
def _running(
    command: Sequence[str],
    log_path: Path,
    clock: CpuClock | None = None,
    cwd: Path = REPO,
    env: Mapping[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            list(command),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=None if env is None else dict(env),
            preexec_fn=clock.enter if clock is not None and clock.cgroup is not None else None,
        )
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


def agent_command(agent_tree: Path | None = None) -> tuple[list[str], Path, dict[str, str] | None]:
    """(command, cwd, environment) that start the agent: the checkout's ``otel-numa`` console script, or
    ``python -m otel_numa`` from another source tree (e.g. ``git archive HEAD otel_numa``) to compare."""
    if agent_tree is not None:
        env = dict(os.environ, PYTHONPATH=str(agent_tree))
        return [sys.executable, "-m", "otel_numa"], agent_tree, env
    script = Path(sys.executable).parent / "otel-numa"
    return ([str(script)] if script.exists() else [sys.executable, "-m", "otel_numa"]), REPO, None


@contextmanager
def run_agent(
    agent_args: Sequence[str], work: Path, name: str = "otel-numa", agent_tree: Path | None = None
) -> Iterator[Target]:
    """The agent serving on free loopback ports, in a CPU clock of its own; start-up ends at /readyz 200."""
    port, health = free_port(), free_port()
    start, cwd, env = agent_command(agent_tree)
    command = [
        *start,
        *agent_args,
        "--prometheus-address",
        f"127.0.0.1:{port}",
        "--health-address",
        f"127.0.0.1:{health}",
        "--log-level",
        "warning",
    ]
    clock = CpuClock(name)
    try:
        with _running(command, work / f"{name}-{port}.log", clock, cwd, env) as process:
            startup = _wait_ready(process, health, "/readyz", name, 60)
            yield Target(name, process, port, startup, clock)
    finally:
        clock.close()


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
    clock = CpuClock("node-exporter")
    try:
        with _running(command, work / f"node-exporter-{port}.log", clock) as process:
            startup = _wait_ready(process, port, "/metrics", NODE_EXPORTER, 30)
            yield Target("node_exporter", process, port, startup, clock)
    finally:
        clock.close()


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


def idle_rates(targets: Sequence[Target], idle_s: float) -> dict[str, float]:
    """Each target's CPU seconds per second while nobody scrapes it (timers, background rounds)."""
    idle_start = {target.name: target.cpu_s() for target in targets}
    time.sleep(idle_s)
    return {target.name: (target.cpu_s() - idle_start[target.name]) / idle_s for target in targets}


def compare_scrapes(
    targets: Sequence[Target],
    scrapes: int,
    idle_s: float = 2.0,
    headers: Mapping[str, str] | None = None,
    idle_rate: Mapping[str, float] | None = None,
    warm_up: int = 3,
) -> list[ScrapeStats]:
    """Warm up, measure each target's idle CPU rate (unless given), then ``scrapes`` rounds of one scrape
    per target, each with ``headers``."""
    bodies = {}
    for target in targets:
        for _ in range(warm_up):
            bodies[target.name] = target.scrape_page(headers)[1].body
    rates = dict(idle_rate) if idle_rate is not None else idle_rates(targets, idle_s)

    latencies: dict[str, list[float]] = {target.name: [] for target in targets}
    cpu_before = {target.name: target.cpu_s() for target in targets}
    started = time.perf_counter()
    for _ in range(scrapes):
        for target in targets:
            elapsed, page = target.scrape_page(headers)
            bodies[target.name] = page.body
            latencies[target.name].append(elapsed)
    duration = time.perf_counter() - started

    results = []
    for target in targets:
        spent = target.cpu_s() - cpu_before[target.name] - rates[target.name] * duration
        results.append(
            ScrapeStats(
                name=target.name,
                scrapes=scrapes,
                latency_median_ms=median(latencies[target.name]) * 1000,
                latency_p95_ms=percentile(latencies[target.name], 0.95) * 1000,
                cpu_per_scrape_ms=max(spent, 0.0) / scrapes * 1000,
                idle_cpu_ms_per_s=rates[target.name] * 1000,
                series=count_series(bodies[target.name]),
                rss_mb=target.rss_bytes() / 2**20,
                uss_mb=target.uss_bytes() / 2**20,
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
