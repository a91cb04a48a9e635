"""Real peers for end-to-end tests, on loopback: Debian's prometheus, rotel's OTLP collector, the agent."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Tests run side by side: a port found free may be taken by another program before the server started on it
# binds it. The server then exits, and another program answers on its port; it is started again on other
# ports, at most this many times.
PORT_TRIES = 3
_LISTEN = "0A"  # a socket's state in /proc/net/tcp: listening


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` itself listens on (its sockets' inodes among the kernel's listeners)."""
    inodes = set()
    with suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with suppress(OSError), open(table) as lines:
            next(lines)  # the header
            for line in lines:
                fields = line.split()
                if fields[3] == _LISTEN and fields[9] in inodes:
                    ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports


def start_on_free_ports(
    start: Callable[[tuple[int, ...]], subprocess.Popen[bytes]],
    count: int,
    what: str,
    ready: Callable[[tuple[int, ...]], bool] | None = None,
    timeout_s: float = 30,
) -> tuple[subprocess.Popen[bytes], tuple[int, ...]]:
    """``start`` a server on ``count`` free ports, waiting until it listens on all of them itself and
    ``ready`` (when given) says so; started again on other ports when it exited because another program
    took one (see :data:`PORT_TRIES`). A server that exited for another reason is handed back as it is,
    for its caller to report."""
    for _ in range(PORT_TRIES):
        ports = tuple(free_port() for _ in range(count))
        process = start(ports)

        def listening(process: subprocess.Popen[bytes] = process, ports: tuple[int, ...] = ports) -> bool:
            return process.poll() is not None or (
                set(ports) <= listening_ports(process.pid) and (ready is None or ready(ports))
            )

        try:
            wait_for(listening, timeout_s, what)
        except BaseException:
            stop_process(process)
            raise
        taken = process.poll() is not None and any(_listened(port) for port in ports)
        if not taken:
            return process, ports
    raise AssertionError(f"{what}: another program took its free ports {PORT_TRIES} times")


def _listened(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


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


def voluntary_switches(native_id: int) -> int:
    """How often a thread of this process has gone to sleep and been woken (each wakeup costs CPU)."""
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


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

    def metrics_text(self, timeout_s: float = 5.0) -> str:
        assert self.prometheus_port is not None
        status, body = http_get(f"http://127.0.0.1:{self.prometheus_port}/metrics", timeout_s)
        assert status == 200, body
        return body.decode()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int:
        """Send ``sig`` and wait for the exit status; an agent still running after ``timeout_s`` is made
        to print every thread's stack (faulthandler, on SIGABRT) and fails the test with its log."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
            raise AssertionError(
                f"the agent had not stopped {timeout_s:g} s after signal {sig}; its log ends:\n"
                + self.log()[-8000:]
            ) from None


def agent_command(*args: str, python: str = sys.executable) -> list[str]:
    return [python, "-m", "otel_numa", *args]


@contextmanager
def run_agent(
    args: Sequence[str],
    tmp_path: Path,
    env: dict[str, str] | None = None,
    prometheus: bool = True,
    python: str = sys.executable,
    open_files: int | None = None,
) -> Iterator[AgentProcess]:
    """The agent in a subprocess of ``python`` (an interpreter with the agent installed), ready;
    ``open_files``: its soft limit of descriptors (this process keeps its own)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NODE_NAME"))}
    full_env["PYTHONFAULTHANDLER"] = "1"  # an agent that hangs prints its threads' stacks on SIGABRT
    full_env.update(env or {})

    def start(ports: tuple[int, ...]) -> subprocess.Popen[bytes]:
        command = agent_command(*args, "--health-address", f"127.0.0.1:{ports[0]}", python=python)
        if prometheus:
            command += ["--prometheus-address", f"127.0.0.1:{ports[1]}"]
        with open(tmp_path / f"agent-{ports[0]}.log", "wb") as log_file:
            return subprocess.Popen(
                command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=REPO,
                preexec_fn=(lambda: _limit_open_files(open_files)) if open_files is not None else None,
            )

    def ready(ports: tuple[int, ...]) -> bool:
        return http_get(f"http://127.0.0.1:{ports[0]}/readyz")[0] == 200

    try:
        process, ports = start_on_free_ports(start, 2 if prometheus else 1, "the agent to be ready", ready)
    except AssertionError as error:
        logs = "\n".join(path.read_text(errors="replace") for path in sorted(tmp_path.glob("agent-*.log")))
        raise AssertionError(f"agent did not start ({error}); logs:\n{logs[-4000:]}") from None
    health_port, prometheus_port = ports[0], ports[1] if prometheus else None
    agent = AgentProcess(process, prometheus_port, health_port, tmp_path / f"agent-{health_port}.log")
    try:
        if process.poll() is not None:
            raise AssertionError(f"agent did not start; exit={process.poll()} log:\n{agent.log()}")
        yield agent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _limit_open_files(limit: int) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


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
        targets = self.targets()
        return bool(targets) and all(t["health"] == "up" for t in targets)

    def targets(self) -> list[dict[str, Any]]:
        """The active targets as the API gives them (``health``, ``lastError``, ``scrapePool``, ...)."""
        _, body = http_get(f"http://127.0.0.1:{self.port}/api/v1/targets")
        targets: list[dict[str, Any]] = json.loads(body)["data"]["activeTargets"]
        return targets


@dataclass(frozen=True)
class ScrapeJob:
    name: str
    targets: Sequence[str]
    # given: scrape over https with this tls_config (ca_file, cert_file, key_file, server_name, ...)
    tls_config: Mapping[str, str] | None = None
    # keep the job/instance labels the target itself sets (a collector's Prometheus exporter)
    honor_labels: bool = False

    def yaml(self) -> str:
        lines = [f"  - job_name: {self.name}"]
        if self.honor_labels:
            lines.append("    honor_labels: true")
        if self.tls_config is not None:
            lines += ["    scheme: https", "    tls_config:"]
            lines += [f"      {key}: {json.dumps(value)}" for key, value in self.tls_config.items()]
        lines += ["    static_configs:", f"      - targets: [{', '.join(repr(t) for t in self.targets)}]"]
        return "\n".join(lines) + "\n"


@contextmanager
def run_prometheus(
    tmp_path: Path,
    targets: Sequence[str],
    scrape_interval: str = "1s",
    tls_config: Mapping[str, str] | None = None,
    extra_jobs: Sequence[ScrapeJob] = (),
    rule_files: Sequence[Path] = (),
    name: str = "prometheus",
) -> Iterator[Prometheus]:
    """Debian's prometheus scraping ``targets`` as job otel-numa (none: only ``extra_jobs``), evaluating
    ``rule_files`` at the scrape interval; ``name`` keeps the files of two servers in one directory apart."""
    binary = require_binary("prometheus")
    config = tmp_path / f"{name}.yml"
    jobs = [ScrapeJob("otel-numa", targets, tls_config)] if targets else []
    jobs += extra_jobs
    rules = "".join(f"  - {json.dumps(str(path))}\n" for path in rule_files)
    config.write_text(
        "global:\n"
        f"  scrape_interval: {scrape_interval}\n"
        f"  scrape_timeout: {scrape_interval}\n"
        f"  evaluation_interval: {scrape_interval}\n"
        + (f"rule_files:\n{rules}" if rules else "")
        + "scrape_configs:\n"
        + "".join(job.yaml() for job in jobs)
    )
    data = tmp_path / f"{name}-data"
    log_path = tmp_path / f"{name}.log"

    def start(ports: tuple[int, ...]) -> subprocess.Popen[bytes]:
        with open(log_path, "wb") as log_file:
            return subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={data}",
                    f"--web.listen-address=127.0.0.1:{ports[0]}",
                    "--log.level=warn",
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )

    def ready(ports: tuple[int, ...]) -> bool:
        return http_get(f"http://127.0.0.1:{ports[0]}/-/ready")[0] == 200

    process, (port,) = start_on_free_ports(start, 1, "prometheus to be ready", ready)
    prom = Prometheus(port, process)
    try:
        if process.poll() is not None:
            raise AssertionError(f"prometheus exited ({process.poll()}): {log_path.read_text()[-2000:]}")
        yield prom
    finally:
        stop_process(process)


# rotel: a real OTLP collector -----------------------------------------------------------------


@dataclass
class DataPoint:
    attributes: dict[str, Any]
    value: float
    start_ns: int | None = None  # StartTimestamp
    time_ns: int | None = None  # Timestamp


@dataclass
class ReceivedMetric:
    name: str
    unit: str
    data_type: str
    monotonic: bool | None
    points: list[DataPoint] = field(default_factory=list)
    temporality: str | None = None  # "DELTA" or "CUMULATIVE" for a Sum


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
        elif stripped.startswith("StartTimestamp:") and point is not None:
            point.start_ns = int(stripped.split(":", 1)[1])
        elif stripped.startswith("Timestamp:") and point is not None:
            point.time_ns = int(stripped.split(":", 1)[1])
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
                elif key == "AggregationTemporality":
                    metric.temporality = value.removeprefix("AGGREGATION_TEMPORALITY_")
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


def start_rotel(
    tmp_path: Path, ports: tuple[int, ...], flags: Sequence[str], output: str
) -> subprocess.Popen[bytes]:
    """rotel with its OTLP receivers on ``ports`` (gRPC, HTTP) of the loopback and ``flags``; what it prints
    goes to ``rotel-<gRPC port><output>``, its own log file is ``rotel-<gRPC port>.agent.log``."""
    grpc_port, http_port = ports
    command = [
        str(rotel_binary()),
        "start",
        f"--otlp-grpc-endpoint=127.0.0.1:{grpc_port}",
        f"--otlp-http-endpoint=127.0.0.1:{http_port}",
        f"--pid-file={tmp_path / f'rotel-{grpc_port}.pid'}",
        f"--log-file={tmp_path / f'rotel-{grpc_port}.agent.log'}",
        *flags,
    ]
    with open(tmp_path / f"rotel-{grpc_port}{output}", "wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


@contextmanager
def run_rotel(tmp_path: Path, verbosity: str = "detailed") -> Iterator[Rotel]:
    """rotel logging what it receives: ``detailed`` (every data point) or ``basic`` (one line per batch)."""

    def start(ports: tuple[int, ...]) -> subprocess.Popen[bytes]:
        flags = ("--exporter=blackhole", "--debug-log=metrics", f"--debug-log-verbosity={verbosity}")
        return start_rotel(tmp_path, ports, (*flags, "--metrics-batch-timeout=10ms"), ".log")

    process, (grpc_port, http_port) = start_on_free_ports(start, 2, "rotel to listen", timeout_s=20)
    log_path = tmp_path / f"rotel-{grpc_port}.log"
    rotel = Rotel(grpc_port, http_port, log_path, process)
    try:
        if process.poll() is not None:
            raise AssertionError(f"rotel exited ({process.poll()}): {log_path.read_text()[-2000:]}")
        yield rotel
    finally:
        stop_process(process)


# nginx: a real TLS terminator in front of rotel ------------------------------------------------


def nginx_binary() -> str:
    # Debian puts it in /usr/sbin, which a non-login shell's PATH may lack.
    return shutil.which("nginx") or require_binary("/usr/sbin/nginx")


@dataclass(frozen=True)
class ProxiedRequest:
    """One line of the terminator's access log."""

    port: int
    status: int
    uri: str
    content_encoding: str  # HTTP body compression ("gzip"), "" when none
    grpc_encoding: str  # gRPC message compression ("gzip"), "" when none
    client_subject: str  # the verified client certificate's subject, "" when none


# Tab-separated; nginx writes "-" for an empty variable.
_ACCESS_LOG_FIELDS = (
    "$server_port",
    "$status",
    "$request_uri",
    "$http_content_encoding",
    "$http_grpc_encoding",
    "$ssl_client_s_dn",
)


@dataclass
class OtlpTlsProxy:
    grpc_port: int
    http_port: int
    directory: Path
    process: subprocess.Popen[bytes]

    def requests(self) -> list[ProxiedRequest]:
        path = self.directory / "access.log"
        if not path.exists():
            return []
        result = []
        for line in path.read_text(errors="replace").splitlines():
            fields = [("" if value == "-" else value) for value in line.split("\t")]
            if len(fields) == len(_ACCESS_LOG_FIELDS):
                port, status, uri, content_encoding, grpc_encoding, subject = fields
                result.append(
                    ProxiedRequest(int(port), int(status), uri, content_encoding, grpc_encoding, subject)
                )
        return result

    def error_log(self) -> str:
        path = self.directory / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _nginx_config(
    directory: Path,
    grpc_port: int,
    http_port: int,
    rotel: Rotel,
    tls: Sequence[str],
    header_check: str,
) -> str:
    tls_lines = "\n        ".join(tls)
    temp_paths = "\n    ".join(
        f"{kind}_temp_path {directory / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    log_format = "\\t".join(_ACCESS_LOG_FIELDS)  # nginx turns the escape into a tab
    return f"""daemon off;
worker_processes 1;
pid {directory / "nginx.pid"};
error_log {directory / "error.log"} info;
events {{ worker_connections 64; }}
http {{
    {temp_paths}
    log_format otlp "{log_format}";
    access_log {directory / "access.log"} otlp;
    server {{
        listen 127.0.0.1:{grpc_port} ssl http2;
        {tls_lines}
        location / {{
            {header_check}
            grpc_pass grpc://127.0.0.1:{rotel.grpc_port};
        }}
    }}
    server {{
        listen 127.0.0.1:{http_port} ssl;
        {tls_lines}
        location / {{
            {header_check}
            proxy_pass http://127.0.0.1:{rotel.http_port};
        }}
    }}
}}
"""


@contextmanager
def run_otlp_tls_proxy(
    tmp_path: Path,
    rotel: Rotel,
    cert_file: Path,
    key_file: Path,
    *,
    required_header: tuple[str, str],
    client_ca_file: Path | None = None,
) -> Iterator[OtlpTlsProxy]:
    """nginx terminating TLS for rotel: gRPC (HTTP/2, grpc_pass) and OTLP/HTTP (proxy_pass) on two ports.

    A request without ``required_header`` (name, exact value) is answered 401; with ``client_ca_file``,
    a client without a certificate signed by that CA is refused too.
    """
    directory = tmp_path / f"nginx-{rotel.grpc_port}"
    directory.mkdir()
    grpc_port, http_port = free_port(), free_port()
    tls = [f"ssl_certificate {cert_file};", f"ssl_certificate_key {key_file};"]
    if client_ca_file is not None:
        tls += [f"ssl_client_certificate {client_ca_file};", "ssl_verify_client on;"]
    variable = "$http_" + required_header[0].lower().replace("-", "_")
    header_check = f"if ({variable} != {json.dumps(required_header[1])}) {{ return 401; }}"
    (directory / "nginx.conf").write_text(
        _nginx_config(directory, grpc_port, http_port, rotel, tls, header_check)
    )
    output_path = directory / "nginx.out"
    with open(output_path, "wb") as output:
        process = subprocess.Popen(
            [nginx_binary(), "-p", str(directory), "-e", str(directory / "error.log"), "-c", "nginx.conf"],
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=directory,
        )
    proxy = OtlpTlsProxy(grpc_port, http_port, directory, process)
    try:

        def listening() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"nginx exited: {output_path.read_text()}{proxy.error_log()}")
            for port in (grpc_port, http_port):
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    pass
            return True

        wait_for(listening, 20, "nginx to listen")
        yield proxy
    finally:
        stop_process(process)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
