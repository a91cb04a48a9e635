"""Real peers for end-to-end tests, on loopback: Debian's prometheus, rotel's OTLP collector, the agent."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = condition()
            if result:
                return result
        except Exception as exc:  # retried until the deadline
            last_error = exc
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last error: {last_error!r}")


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise AssertionError(f"{name} is not installed: run scripts/setup.sh --test (Debian package)")
    return path


# The agent --------------------------------------------------------------------------------------


@dataclass
class AgentProcess:
    process: subprocess.Popen[bytes]
    prometheus_port: int | None
    health_port: int | None
    log_path: Path

    def metrics_text(self) -> str:
        assert self.prometheus_port is not None
        status, body = http_get(f"http://127.0.0.1:{self.prometheus_port}/metrics")
        assert status == 200, body
        return body.decode()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=timeout_s)


def agent_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "otel_numa", *args]


@contextmanager
def run_agent(
    args: Sequence[str], tmp_path: Path, env: dict[str, str] | None = None, prometheus: bool = True
) -> Iterator[AgentProcess]:
    prometheus_port = free_port() if prometheus else None
    health_port = free_port()
    command = agent_command(*args, "--health-address", f"127.0.0.1:{health_port}")
    if prometheus_port is not None:
        command += ["--prometheus-address", f"127.0.0.1:{prometheus_port}"]
    log_path = tmp_path / f"agent-{health_port}.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NODE_NAME"))}
    full_env.update(env or {})
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)
    agent = AgentProcess(process, prometheus_port, health_port, log_path)
    try:
        try:
            wait_for(
                lambda: (
                    process.poll() is None and http_get(f"http://127.0.0.1:{health_port}/readyz")[0] == 200
                ),
                30,
                "the agent to be ready",
            )
        except AssertionError:
            raise AssertionError(f"agent did not start; exit={process.poll()} log:\n{agent.log()}") from None
        yield agent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# Prometheus -------------------------------------------------------------------------------------


@dataclass
class Prometheus:
    port: int
    process: subprocess.Popen[bytes]

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        status, body = http_get(url)
        payload = json.loads(body)
        assert status == 200 and payload["status"] == "success", payload
        result: list[dict[str, Any]] = payload["data"]["result"]
        return result

    def series(self, expr: str) -> dict[frozenset[tuple[str, str]], float]:
        """Instant vector -> {labels without __name__: value}."""
        return {
            frozenset((k, v) for k, v in item["metric"].items() if k != "__name__"): float(item["value"][1])
            for item in self.query(expr)
        }

    def targets_up(self) -> bool:
        _, body = http_get(f"http://127.0.0.1:{self.port}/api/v1/targets")
        targets = json.loads(body)["data"]["activeTargets"]
        return bool(targets) and all(t["health"] == "up" for t in targets)


@contextmanager
def run_prometheus(
    tmp_path: Path, targets: Sequence[str], scrape_interval: str = "1s"
) -> Iterator[Prometheus]:
    binary = require_binary("prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n"
        f"  scrape_interval: {scrape_interval}\n"
        f"  scrape_timeout: {scrape_interval}\n"
        "scrape_configs:\n"
        "  - job_name: otel-numa\n"
        "    static_configs:\n"
        f"      - targets: [{', '.join(repr(t) for t in targets)}]\n"
    )
    data = tmp_path / "prometheus-data"
    log_path = tmp_path / "prometheus.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    prom = Prometheus(port, process)
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/-/ready")[0] == 200, 30, "prometheus to be ready")
        yield prom
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# rotel: a real OTLP collector -----------------------------------------------------------------


@dataclass
class DataPoint:
    attributes: dict[str, Any]
    value: float


@dataclass
class ReceivedMetric:
    name: str
    unit: str
    data_type: str
    monotonic: bool | None
    points: list[DataPoint] = field(default_factory=list)


@dataclass
class ReceivedBatch:
    resource: dict[str, Any]
    metrics: list[ReceivedMetric]


_ATTRIBUTE = re.compile(r"^\s*-> (?P<key>[^:]+): (?P<type>\w+)\((?P<value>.*)\)\s*$")


def _typed(kind: str, text: str) -> Any:
    if kind == "Int":
        return int(text)
    if kind == "Double":
        return float(text)
    if kind == "Bool":
        return text == "true"
    return text


def parse_rotel_debug_log(text: str) -> list[ReceivedBatch]:
    """Parse rotel's ``--debug-log metrics --debug-log-verbosity detailed`` output."""
    batches: list[ReceivedBatch] = []
    section = ""
    metric: ReceivedMetric | None = None
    point: DataPoint | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("ResourceMetrics #"):
            batches.append(ReceivedBatch({}, []))
            section, metric, point = "resource", None, None
        elif stripped == "Resource attributes:":
            section = "resource"
        elif stripped.startswith("Metric #"):
            metric = ReceivedMetric("", "", "", None)
            batches[-1].metrics.append(metric)
            section, point = "descriptor", None
        elif stripped.startswith("NumberDataPoints #") and metric is not None:
            point = DataPoint({}, float("nan"))
            metric.points.append(point)
            section = "point"
        elif stripped.startswith("Value:") and point is not None:
            point.value = float(stripped.split(":", 1)[1])
        elif stripped.startswith("-> ") and batches:
            match = _ATTRIBUTE.match(line)
            if section == "descriptor" and metric is not None:
                key, _, value = stripped[3:].partition(": ")
                if key == "Name":
                    metric.name = value
                elif key == "Unit":
                    metric.unit = value
                elif key == "DataType":
                    metric.data_type = value
                elif key == "IsMonotonic":
                    metric.monotonic = value == "true"
            elif match and section == "resource":
                batches[-1].resource[match["key"]] = _typed(match["type"], match["value"])
            elif match and section == "point" and point is not None:
                point.attributes[match["key"]] = _typed(match["type"], match["value"])
    return batches


@dataclass
class Rotel:
    grpc_port: int
    http_port: int
    log_path: Path
    process: subprocess.Popen[bytes]

    def batches(self) -> list[ReceivedBatch]:
        return parse_rotel_debug_log(self.log_path.read_text(errors="replace"))

    def latest(self, name: str) -> tuple[dict[str, Any], ReceivedMetric] | None:
        """The most recent batch's copy of a metric, with its resource attributes."""
        for batch in reversed(self.batches()):
            for metric in batch.metrics:
                if metric.name == name:
                    return batch.resource, metric
        return None


def rotel_binary() -> Path:
    import rotel

    return Path(rotel.__file__).parent / "rotel-agent"


@contextmanager
def run_rotel(tmp_path: Path) -> Iterator[Rotel]:
    grpc_port, http_port = free_port(), free_port()
    log_path = tmp_path / f"rotel-{grpc_port}.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [
                str(rotel_binary()),
                "start",
                "--exporter",
                "blackhole",
                "--debug-log",
                "metrics",
                "--debug-log-verbosity",
                "detailed",
                "--otlp-grpc-endpoint",
                f"127.0.0.1:{grpc_port}",
                "--otlp-http-endpoint",
                f"127.0.0.1:{http_port}",
                "--metrics-batch-timeout",
                "10ms",
                "--pid-file",
                str(tmp_path / f"rotel-{grpc_port}.pid"),
                "--log-file",
                str(tmp_path / f"rotel-{grpc_port}.agent.log"),
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    rotel = Rotel(grpc_port, http_port, log_path, process)
    try:

        def listening() -> bool:
            with socket.create_connection(("127.0.0.1", grpc_port), timeout=0.5):
                pass
            with socket.create_connection(("127.0.0.1", http_port), timeout=0.5):
                return True

        wait_for(listening, 20, "rotel to listen")
        yield rotel
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
