"""Hostile collectors and resolvers against the agent as it pushes: each push ends by ``--otlp-timeout`` by
the wall clock, the container data stays fresh meanwhile, and the failure is counted and logged once.

Each agent serves a node written by :mod:`otel_numa.testing.large_node` (2 NUMA nodes x 16 CPUs, 10 pods x 2
containers, cgroup v2) with both readers and ``--otlp-timeout 1 --interval 1``, pushing to a collector
written for the attack: one that answers 200 and then sends its body, or its headers, a byte at a time; one
that takes the request and never answers; over gRPC, a server that never answers the call and a port that
never speaks HTTP/2; and a collector named by a DNS name whose resolver never answers. A real Prometheus
scrapes every agent meanwhile; what it recorded shows the pushes' durations, the failures and the age of the
cgroup data.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_numa.testing.large_node import LargeNode, LargeNodeSpec, write_large_node
from otel_numa.testing.peers import (
    AgentProcess,
    Prometheus,
    agent_command,
    run_agent,
    run_prometheus,
    run_rotel,
    wait_for,
)

pytestmark = pytest.mark.e2e

SPEC = LargeNodeSpec(numa_nodes=2, cpus_per_node=16, pods=10, containers_per_pod=2)
OTLP_TIMEOUT_S = 1.0
# what the wall clock may add to a push's deadline: the thread that noticed it, a busy 2-core machine
LATE_S = 0.5
PEAK_RSS_BYTES = 128 << 20  # the chart's memory limit
HOSTILE_S = 6.0  # how long the agents push to the hostile peers before Prometheus is asked
# A byte this often keeps every read of the exporter within its timeout (0.9 s here), so only a deadline on
# the whole push ends it; one a second does the same against the default --otlp-timeout of 3 s.
DRIP_S = 0.25


# --- hostile collectors ------------------------------------------------------------------------------


@dataclass
class HostileHttp:
    """An OTLP/HTTP collector that reads each push and then ``behaviour``s: ``body`` (200, then the body a
    byte every ``DRIP_S``), ``headers`` (the status line, then the headers a byte every ``DRIP_S``) or
    ``silent`` (no answer at all). Records, for each push, how long the agent kept the connection after
    sending it."""

    behaviour: str
    held_s: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def serve(self, connection: socket.socket) -> None:
        if not _read_request(connection):
            return
        received = time.monotonic()
        if self.behaviour == "body":
            head = (
                b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 100000\r\n\r\n"
            )
            self._drip(connection, head, b"\0" * 100_000)
        elif self.behaviour == "headers":
            self._drip(connection, b"HTTP/1.1 200 OK\r\n", b"X-Slow: " + b"a" * 100_000)
        else:
            connection.settimeout(30)
            with contextlib.suppress(OSError):
                while connection.recv(4096):
                    pass
        self.held_s.append(time.monotonic() - received)

    def _drip(self, connection: socket.socket, first: bytes, slowly: bytes) -> None:
        """Send ``first``, then ``slowly`` a byte every ``DRIP_S``, until the agent hangs up (seen at once:
        the connection turns readable with its end)."""
        try:
            connection.sendall(first)
            for index in range(len(slowly)):
                if select.select([connection], [], [], DRIP_S)[0] or self.stop.is_set():
                    return
                connection.sendall(slowly[index : index + 1])
        except OSError:
            return  # the agent hung up: what the test measures


def _read_request(connection: socket.socket) -> bool:
    """Read one HTTP request (head and body); False when the client left first."""
    connection.settimeout(10)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = connection.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            0,
        )
        while len(body) < length:
            chunk = connection.recv(65536)
            if not chunk:
                return False
            body += chunk
    except OSError:
        return False
    return True


class _Threads(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the agent hangs up in the middle: that is the point


@contextmanager
def serving_tcp(serve: Callable[[socket.socket], None]) -> Iterator[int]:
    """A TCP server on loopback calling ``serve`` with each connection in a thread of its own; its port."""

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            serve(self.request)

    server = _Threads(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


class _NeverAnswers(metrics_service_pb2_grpc.MetricsServiceServicer):
    """An OTLP/gRPC collector that takes each call and never answers it."""

    def __init__(self) -> None:
        self.calls = 0
        self.released = threading.Event()

    def Export(self, request: ExportMetricsServiceRequest, context: grpc.ServicerContext) -> Any:
        self.calls += 1
        self.released.wait(60)
        context.abort(grpc.StatusCode.UNAVAILABLE, "released")


@contextmanager
def grpc_never_answering() -> Iterator[tuple[int, _NeverAnswers]]:
    collector = _NeverAnswers()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(collector, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port, collector
    finally:
        collector.released.set()
        server.stop(0)


def silent_tcp(connection: socket.socket) -> None:
    """Accept and never say anything (not even gRPC's HTTP/2 preface)."""
    connection.settimeout(30)
    with contextlib.suppress(OSError):
        while connection.recv(4096):
            pass


# --- the agents --------------------------------------------------------------------------------------


# How each failed push is counted: "timeout" where the agent had to stop it (the exporter cannot end a
# trickled answer or a lookup by itself), "failed" where the exporter gave up by itself first
STOPPED, GAVE_UP = "timeout", "failed"


@dataclass
class Pushing:
    name: str
    error_type: str  # what its failed pushes are counted as
    agent: AgentProcess

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.agent.prometheus_port}"

    def peak_rss(self) -> int:
        status = Path(f"/proc/{self.agent.process.pid}/status").read_text()
        return int(status.split("VmHWM:")[1].split()[0]) * 1024


def agent_args(node: LargeNode, name: str, protocol: str, endpoint: str) -> list[str]:
    return [
        *node.cli_args(),
        *("--node-name", name, "--exporter", "prometheus,otlp"),
        *("--otlp-protocol", protocol, "--otlp-endpoint", endpoint),
        *("--otlp-timeout", str(OTLP_TIMEOUT_S), "--interval", "1"),
    ]


def recorded(prometheus: Prometheus, expression: str) -> dict[str, float]:
    """An instant query's values by the agent's node name."""
    return {dict(labels)["k8s_node_name"]: value for labels, value in prometheus.series(expression).items()}


def wait_for_a_scrape_after_the_first_push(prometheus: Prometheus, agents: list[Pushing]) -> None:
    """On a loaded machine an agent's first push may end after the scrapes so far: wait for one that
    saw it."""
    names = {agent.name for agent in agents}
    wait_for(
        lambda: names <= set(recorded(prometheus, "numa_agent_export_duration_seconds")),
        20,
        "a scrape of every agent after its first push",
    )


def check_pushes_bounded_and_data_fresh(prometheus: Prometheus, agents: list[Pushing]) -> None:
    """What Prometheus recorded of every agent while its pushes hung: each push ended by the deadline and
    was counted as failed, the cgroup data kept fresh, every scrape answered quickly."""
    names = {agent.name for agent in agents}
    window = "[2m]"
    longest = recorded(prometheus, f"max_over_time(numa_agent_export_duration_seconds{window})")
    failures = {
        agent.name: recorded(
            prometheus, f'numa_agent_export_failures_total{{error_type="{agent.error_type}"}}'
        ).get(agent.name, 0.0)
        for agent in agents
    }
    cgroup_age = recorded(
        prometheus, f'max_over_time(numa_agent_source_age_seconds{{numa_source="cgroup"}}{window})'
    )
    export_age = recorded(prometheus, "numa_agent_export_age_seconds")
    scrape = {
        agent.name: max(
            prometheus.series(
                f'max_over_time(scrape_duration_seconds{{instance="{agent.target}"}}{window})'
            ).values()
        )
        for agent in agents
    }
    up = {
        agent.name: min(prometheus.series(f'min_over_time(up{{instance="{agent.target}"}}{window})').values())
        for agent in agents
    }
    print({"longest push s": longest, "failures": failures, "cgroup age s": cgroup_age, "scrape s": scrape})
    assert set(longest) == names and all(s <= OTLP_TIMEOUT_S + LATE_S for s in longest.values()), longest
    assert all(count >= 3 for count in failures.values()), failures
    assert all(age < 3.0 for age in cgroup_age.values()), cgroup_age  # walked every second meanwhile
    assert all(age >= HOSTILE_S - 2 for age in export_age.values()), export_age  # nothing accepted
    assert all(s < 1.0 for s in scrape.values()) and set(up.values()) == {1.0}, (scrape, up)


def check_logged_once_and_stopped(agent: Pushing) -> None:
    """SIGTERM ends the agent within its 5 s budget; its memory stayed within the chart's limit; each kind
    of failure was logged once (a push the agent stopped by the agent, the others by the exporter)."""
    peak = agent.peak_rss()
    started = time.monotonic()
    assert agent.agent.stop(signal.SIGTERM, timeout_s=15) == 0, agent.agent.log()[-2000:]
    took = time.monotonic() - started
    log = agent.agent.log()
    print(f"{agent.name}: peak RSS {peak >> 20} MiB, SIGTERM took {took:.1f} s")
    assert took < 5.0
    assert peak < PEAK_RSS_BYTES
    assert "Traceback" not in log
    stopped = log.count("did not end within --otlp-timeout")
    if agent.error_type == STOPPED:
        assert stopped == 1, log[-3000:]
    else:
        assert stopped == 0 and 1 <= log.count("ERROR opentelemetry.exporter") <= 2, log[-3000:]


@pytest.fixture
def node(tmp_path: Path) -> LargeNode:
    return write_large_node(tmp_path / "node", SPEC)


def test_hanging_and_trickling_collectors_cost_each_push_its_deadline_only(
    node: LargeNode, tmp_path: Path
) -> None:
    """Five agents at once, each pushing to its own hostile collector, all scraped by one Prometheus."""
    http_peers = {behaviour: HostileHttp(behaviour) for behaviour in ("body", "headers", "silent")}
    with ExitStack() as stack:
        ports = {
            behaviour: stack.enter_context(serving_tcp(peer.serve)) for behaviour, peer in http_peers.items()
        }
        for peer in http_peers.values():
            stack.callback(peer.stop.set)
        grpc_port, never_answers = stack.enter_context(grpc_never_answering())
        endpoints = {  # name: protocol, port, how its failures are counted
            "http-body": ("http/protobuf", ports["body"], STOPPED),
            "http-headers": ("http/protobuf", ports["headers"], STOPPED),
            "http-silent": ("http/protobuf", ports["silent"], GAVE_UP),
            "grpc-no-answer": ("grpc", grpc_port, GAVE_UP),
            "grpc-no-http2": ("grpc", stack.enter_context(serving_tcp(silent_tcp)), GAVE_UP),
        }
        agents = [
            Pushing(
                name,
                counted,
                stack.enter_context(
                    run_agent(agent_args(node, name, protocol, f"http://127.0.0.1:{port}"), tmp_path)
                ),
            )
            for name, (protocol, port, counted) in endpoints.items()
        ]
        prometheus = stack.enter_context(run_prometheus(tmp_path, [agent.target for agent in agents]))
        time.sleep(HOSTILE_S)
        wait_for_a_scrape_after_the_first_push(prometheus, agents)
        check_pushes_bounded_and_data_fresh(prometheus, agents)
        # the collectors saw the agent hang up each push by its deadline, and try again
        for behaviour, peer in http_peers.items():
            print(f"http-{behaviour}: pushes held {[round(s, 2) for s in peer.held_s]} s")
            assert len(peer.held_s) >= 3, behaviour
            assert max(peer.held_s) < OTLP_TIMEOUT_S + LATE_S, (behaviour, peer.held_s)
        assert never_answers.calls >= 3
        for agent in agents:
            check_logged_once_and_stopped(agent)


# --- a resolver that never answers -------------------------------------------------------------------

RESOLVER = "127.0.0.77"  # a loopback address of its own, so that port 53 is free
COLLECTOR_NAME = "otlp-collector.example"


@contextmanager
def silent_resolver() -> Iterator[list[float]]:
    """A DNS server on ``RESOLVER`` port 53 (UDP and TCP) that takes every query and never answers; yields
    the times the queries came."""
    queries: list[float] = []
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp = socket.socket()
    try:
        udp.bind((RESOLVER, 53))
        tcp.bind((RESOLVER, 53))
    except OSError as exc:
        udp.close()
        tcp.close()
        pytest.skip(f"cannot serve DNS on {RESOLVER}:53 ({exc.strerror}): root is needed")
    tcp.listen(16)
    stop = threading.Event()

    def take_udp() -> None:
        udp.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                udp.recvfrom(4096)
                queries.append(time.monotonic())

    def take_tcp() -> None:
        tcp.settimeout(0.2)
        held = []
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(tcp.accept()[0])
                queries.append(time.monotonic())
        for connection in held:
            connection.close()

    threads = [threading.Thread(target=take, daemon=True) for take in (take_udp, take_tcp)]
    for thread in threads:
        thread.start()
    try:
        yield queries
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        udp.close()
        tcp.close()


def resolver_namespace_python(tmp_path: Path) -> str:
    """An interpreter that runs in a mount namespace of its own, whose /etc/resolv.conf names only
    ``RESOLVER`` (30 s a try): the agent's resolver then waits on the silent one."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("unshare and mount are needed for a private /etc/resolv.conf")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(f"nameserver {RESOLVER}\noptions timeout:30 attempts:1\n")
    script = tmp_path / "python-in-namespace"
    script.write_text(
        "#!/bin/sh\n"
        "exec unshare --mount --propagation private "
        f'sh -c \'mount --bind "$0" /etc/resolv.conf && exec "$@"\' "{resolv}" "{sys.executable}" "$@"\n'
    )
    script.chmod(0o755)
    probe = subprocess.run(
        [str(script), "-c", "import socket; print(open('/etc/resolv.conf').read())"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0 or RESOLVER not in probe.stdout.decode():
        pytest.skip(f"no private mount namespace here: {probe.stderr.decode(errors='replace')[:200]}")
    return str(script)


def test_a_resolver_that_never_answers_costs_each_push_its_deadline_only(
    node: LargeNode, tmp_path: Path
) -> None:
    python = resolver_namespace_python(tmp_path)
    with ExitStack() as stack:
        queries = stack.enter_context(silent_resolver())
        # gRPC resolves names itself and ends the lookup at its deadline; getaddrinfo (OTLP/HTTP) cannot be
        # interrupted: the agent stops the push, and later ones wait for it within their own deadline
        agents = [
            Pushing(
                name,
                counted,
                stack.enter_context(
                    run_agent(
                        agent_args(node, name, protocol, f"http://{COLLECTOR_NAME}:{port}"),
                        tmp_path,
                        python=python,
                    )
                ),
            )
            for name, protocol, port, counted in (
                ("dns-grpc", "grpc", 4317, GAVE_UP),
                ("dns-http", "http/protobuf", 4318, STOPPED),
            )
        ]
        prometheus = stack.enter_context(run_prometheus(tmp_path, [agent.target for agent in agents]))
        time.sleep(HOSTILE_S)
        assert queries, "the agents never asked the resolver"
        wait_for_a_scrape_after_the_first_push(prometheus, agents)
        check_pushes_bounded_and_data_fresh(prometheus, agents)
        for agent in agents:
            check_logged_once_and_stopped(agent)


# --- a collector that answers, and SIGTERM from the first instant -----------------------------------


def test_pushes_a_collector_accepts_are_counted_as_such(node: LargeNode, tmp_path: Path) -> None:
    with run_rotel(tmp_path) as rotel:
        args = agent_args(node, "accepted", "grpc", f"http://127.0.0.1:{rotel.grpc_port}")
        with run_agent(args, tmp_path) as agent:
            # the first push carries no duration (none has ended); one that does was sent after the agent
            # had recorded the first one accepted
            wait_for(
                lambda: rotel.latest("numa.agent.export.duration"), 20, "a push carrying the export series"
            )
            text = agent.metrics_text()
            _, failures = rotel.latest("numa.agent.export.failures") or ({}, None)
    assert failures is not None and {p.attributes["error.type"]: p.value for p in failures.points} == {
        "timeout": 0,
        "failed": 0,
    }
    labels = 'error_type="timeout",k8s_node_name="accepted",numa_exporter="otlp"'
    assert f"numa_agent_export_failures_total{{{labels}}} 0" in text
    age = [line for line in text.splitlines() if line.startswith("numa_agent_export_age_seconds{")]
    duration = [line for line in text.splitlines() if line.startswith("numa_agent_export_duration_seconds{")]
    assert len(age) == 1 and float(age[0].split()[-1]) < 3.0, age
    assert len(duration) == 1 and 0 < float(duration[0].split()[-1]) < OTLP_TIMEOUT_S, duration


def test_without_otlp_no_export_series(node: LargeNode, tmp_path: Path) -> None:
    with run_agent([*node.cli_args()], tmp_path) as agent:
        assert "numa_agent_export" not in agent.metrics_text()


# from the interpreter's first line of the agent (~0.1 s after exec on a busy machine, the interpreter's own
# start-up): while the command line reads its settings, while the daemon imports and takes its first snapshot
@pytest.mark.parametrize("after_s", [0.3, 1.0])
def test_sigterm_in_the_first_second_exits_0_after_a_final_push(
    node: LargeNode, tmp_path: Path, after_s: float
) -> None:
    """The signal waits for the handlers, then the agent pushes what it has and exits 0 (it exited 143 before
    its handlers, about a second)."""
    name = f"early-{after_s}"
    with run_rotel(tmp_path) as rotel:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NODE_NAME"))}
        args = agent_args(node, name, "grpc", f"http://127.0.0.1:{rotel.grpc_port}")
        log_path = tmp_path / f"{name}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                agent_command(*args, "--prometheus-address", "none"),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        time.sleep(after_s)
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=15)
        finally:
            if process.poll() is None:
                process.kill()
        output = log_path.read_text(errors="replace")
        assert code == 0, output
        assert "received SIGTERM, shutting down" in output
        pushed = wait_for(lambda: rotel.latest("numa.cpu.capacity"), 5, "the final push at rotel")
    resource, _capacity = pushed
    assert resource["k8s.node.name"] == name
