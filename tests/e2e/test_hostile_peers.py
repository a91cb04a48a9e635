"""Hostile clients against the agent as it serves: slow and silent connections on every port, descriptor
exhaustion, hundreds of concurrent scrapes, connection resets and clients that ask and never read. After
each, a normal scraper still gets the page and the probes their answer, quickly."""

from __future__ import annotations

import contextlib
import http.client
import re
import select
import selectors
import signal
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from otel_numa.endpoints.serving import HEAD_TIMEOUT_S, MAX_CONNECTIONS, MAX_WORKERS
from otel_numa.testing.certs import Issued, issue, make_ca
from otel_numa.testing.large_node import LargeNodeSpec, write_large_node
from otel_numa.testing.peers import run_agent, run_prometheus, wait_for

pytestmark = pytest.mark.e2e

SNAPSHOT = "16amd64-4n4c-cgroup-distance-merge"
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: agent\r\nAccept-Encoding: gzip\r\n\r\n"
ATTACKERS = MAX_CONNECTIONS + 16  # more than a port holds: the cap, not only the workers, is tried


def machine_args(tmp_path: Path, hwloc_root: Callable[[str], tuple[Path, Path]]) -> list[str]:
    sysfs, procfs = hwloc_root(SNAPSHOT)
    return [
        *("--sysfs-root", str(sysfs), "--procfs-root", str(procfs), "--node-name", "hostile"),
        *("--kubelet-root", str(tmp_path / "no-kubelet"), "--podresources-socket", "none"),
    ]


class Scraper:
    """A normal client of one port: plain HTTP, or TLS with a client certificate."""

    def __init__(self, port: int, path: str, tls: ssl.SSLContext | None = None) -> None:
        self.port, self.path, self.tls = port, path, tls

    def get(self, timeout_s: float) -> tuple[int, bytes, float]:
        """Status, body and seconds taken."""
        began = time.monotonic()
        if self.tls is None:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        else:
            connection = http.client.HTTPSConnection(
                "127.0.0.1", self.port, timeout=timeout_s, context=self.tls
            )
        try:
            connection.request("GET", self.path)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        return response.status, body, time.monotonic() - began

    def answers_within(self, seconds: float, probes: int) -> list[float]:
        """Times of ``probes`` requests one after another; fails unless each got 200 within ``seconds``."""
        times = []
        for _ in range(probes):
            status, _body, took = self.get(timeout_s=seconds)
            assert status == 200 and took < seconds, (status, took)
            times.append(took)
        return times


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


class SlowLoris:
    """Connections that send a request head one byte at a time, ``interval_s`` apart, never finishing it."""

    def __init__(self, connections: list[socket.socket], interval_s: float = 0.3) -> None:
        self._connections = connections
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drip, daemon=True)

    def _drip(self) -> None:
        head = b"GET /metrics HTTP/1.1\r\nHost: agent\r\nX-Slow: " + b"a" * 10_000
        position = 0
        while not self._stop.wait(self._interval_s):
            for connection in self._connections:
                with contextlib.suppress(OSError):  # the agent closed it: that is the point
                    connection.send(head[position : position + 1])
            position += 1

    def __enter__(self) -> SlowLoris:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for connection in self._connections:
            connection.close()


@contextmanager
def attacked(port: int, tls: ssl.SSLContext | None = None) -> Iterator[None]:
    """``ATTACKERS`` silent connections and as many slowloris ones (over TLS when ``tls`` is given)."""
    silent = [connect(port) for _ in range(ATTACKERS)]
    slow = [connect(port) for _ in range(ATTACKERS)]
    if tls is not None:
        slow = [tls.wrap_socket(connection, server_hostname="127.0.0.1") for connection in slow]
    try:
        with SlowLoris(slow):
            yield
    finally:
        for connection in silent:
            connection.close()


@pytest.fixture
def pki(tmp_path: Path) -> tuple[Issued, Issued, Issued]:
    ca = make_ca(tmp_path / "ca")
    return (
        ca,
        issue(ca, tmp_path / "pki", "server"),
        issue(ca, tmp_path / "pki", "scraper", client=True),
    )


def mtls_args(pki: tuple[Issued, Issued, Issued]) -> tuple[list[str], ssl.SSLContext]:
    ca, server, client = pki
    context = ssl.create_default_context(cafile=str(ca.cert_file))
    context.load_cert_chain(client.cert_file, client.key_file)
    args = [
        *("--tls-cert-file", str(server.cert_file), "--tls-key-file", str(server.key_file)),
        *("--tls-client-ca-file", str(ca.cert_file)),
    ]
    return args, context


@pytest.mark.parametrize("tls", [False, True], ids=["plain-page", "mtls-page"])
def test_slow_and_silent_clients_starve_no_port(
    tmp_path: Path,
    hwloc_root: Callable[[str], tuple[Path, Path]],
    pki: tuple[Issued, Issued, Issued],
    tls: bool,
) -> None:
    tls_args, context = mtls_args(pki) if tls else ([], None)
    with run_agent([*machine_args(tmp_path, hwloc_root), *tls_args], tmp_path) as agent:
        assert agent.prometheus_port is not None and agent.health_port is not None
        page = Scraper(agent.prometheus_port, "/metrics", context)
        health = Scraper(agent.health_port, "/healthz")
        page.answers_within(5, 1)  # the page is rendered once before the clock matters
        began = time.monotonic()
        with attacked(agent.prometheus_port, context), attacked(agent.health_port):
            assert ATTACKERS * 2 > MAX_WORKERS * 2  # each port's every worker could be held
            time.sleep(1.2)  # the attackers are settled and have sent a few bytes each
            page.answers_within(1.0, 6)
            health.answers_within(1.0, 5)
            assert time.monotonic() - began < HEAD_TIMEOUT_S  # answered while the attack was still held
        # the attackers' connections were closed by the agent or by us: the log says so once per kind
        page.answers_within(1.0, 2)
        log = agent.log()
        assert "Traceback" not in log
        firsts = re.findall(r"(\S+): client connection failed \(([^)]*)\)", log)
        assert len(firsts) == len(set(firsts)), log  # once per server and kind


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def test_running_out_of_descriptors_backs_off_and_recovers(
    tmp_path: Path, hwloc_root: Callable[[str], tuple[Path, Path]]
) -> None:
    args = machine_args(tmp_path, hwloc_root)
    with ExitStack() as stack:
        agent = stack.enter_context(run_agent(args, tmp_path, open_files=128))
        assert agent.prometheus_port is not None and agent.health_port is not None
        process = psutil.Process(agent.process.pid)
        assert process.rlimit(psutil.RLIMIT_NOFILE)[0] == 128
        # more idle connections than the agent has descriptors left, on both ports
        idle = [connect(port) for port in (agent.prometheus_port, agent.health_port) for _ in range(150)]
        try:
            wait_for(lambda: "out of file descriptors" in agent.log(), 10, "the agent to run out")
            before, began = cpu_seconds(process), time.monotonic()
            time.sleep(2.0)
            busy = (cpu_seconds(process) - before) / (time.monotonic() - began)
            assert busy < 0.25, f"the agent used {busy:.0%} of a core while out of descriptors"
        finally:
            for connection in idle:
                connection.close()
        page = Scraper(agent.prometheus_port, "/metrics")
        wait_for(lambda: page.get(timeout_s=2)[0] == 200, 15, "the page to answer again")
        page.answers_within(1.0, 3)
        assert agent.log().count("client connection failed (out of file descriptors)") <= 2  # once per port


def test_five_hundred_concurrent_scrapes_are_all_answered(
    tmp_path: Path, hwloc_root: Callable[[str], tuple[Path, Path]]
) -> None:
    with run_agent(machine_args(tmp_path, hwloc_root), tmp_path) as agent:
        assert agent.prometheus_port is not None
        address = ("127.0.0.1", agent.prometheus_port)
        answers: dict[socket.socket, bytearray] = {}
        with selectors.DefaultSelector() as selector:
            for _ in range(500):  # all connect before any is answered: the listen queue must hold them
                connection = socket.socket()
                connection.setblocking(False)
                connection.connect_ex(address)
                selector.register(connection, selectors.EVENT_WRITE, connection)
                answers[connection] = bytearray()
            deadline = time.monotonic() + 120
            open_count = len(answers)
            while open_count and time.monotonic() < deadline:
                for key, events in selector.select(timeout=1):
                    connection = key.data
                    if events & selectors.EVENT_WRITE:
                        connection.sendall(REQUEST)
                        selector.modify(connection, selectors.EVENT_READ, connection)
                        continue
                    try:
                        chunk = connection.recv(65536)
                    except ConnectionError:
                        chunk = b""
                    answers[connection] += chunk
                    if not chunk:
                        selector.unregister(connection)
                        connection.close()
                        open_count -= 1
        statuses = [bytes(answer[:12]) for answer in answers.values()]
        assert statuses.count(b"HTTP/1.0 200") == 500, {s: statuses.count(s) for s in set(statuses)}


def reset(port: int) -> None:
    """Connect, send half a request head and close with a reset (SO_LINGER 0) instead of a FIN."""
    connection = connect(port)
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    connection.sendall(REQUEST[:20])
    connection.close()


def test_connection_resets_are_logged_once_with_a_count(
    tmp_path: Path, hwloc_root: Callable[[str], tuple[Path, Path]]
) -> None:
    with run_agent(machine_args(tmp_path, hwloc_root), tmp_path) as agent:
        assert agent.prometheus_port is not None
        for _ in range(400):
            reset(agent.prometheus_port)
        Scraper(agent.prometheus_port, "/metrics").answers_within(1.0, 3)
        assert agent.stop(signal.SIGTERM) == 0
        log = agent.log()
    assert "Traceback" not in log
    assert log.count("client connection failed (connection reset)") == 1
    more = re.findall(r"metrics-http: (\d+) more client connection failures: connection reset x(\d+)", log)
    assert more == [("399", "399")], log
    assert len(log.splitlines()) < 40


# --- clients that ask and never read, on a 2,000-container node --------------------------------------

# 2,000 containers on 8 NUMA nodes x 48 CPUs: a 6.6 MB page (about 300 KB gzipped)
LARGE = LargeNodeSpec(numa_nodes=8, cpus_per_node=48, pods=500, containers_per_pod=4, exclusive_pod_every=6)
NON_READERS = 32
# Each non-reader the agent drops asks again at once, so the agent renders the page for them without a
# pause (~0.3 s each here); a scrape waits for the render in progress, then its own (Prometheus' scrape
# timeout is 10 s by default)
LARGE_SCRAPE_S = 3.0
ATTACKER_ADDRESS = "127.0.0.2"  # a peer of their own, as a hostile pod would be; Prometheus is 127.0.0.1


class NonReaders:
    """``count`` clients that each ask for the page (uncompressed: the most to hold) and never read it,
    asking again as soon as the agent drops them."""

    def __init__(self, port: int, count: int) -> None:
        self._port = port
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._ask, daemon=True) for _ in range(count)]
        self.asked = 0

    def _ask(self) -> None:
        while not self._stop.is_set():
            try:
                connection = socket.create_connection(
                    ("127.0.0.1", self._port), timeout=10, source_address=(ATTACKER_ADDRESS, 0)
                )
            except OSError:
                self._stop.wait(0.05)
                continue
            with connection, contextlib.suppress(OSError):
                connection.sendall(b"GET /metrics HTTP/1.1\r\nHost: agent\r\n\r\n")
                self.asked += 1
                hung_up = select.poll()
                hung_up.register(connection, select.POLLRDHUP)
                while not self._stop.is_set() and not hung_up.poll(100):
                    pass  # never read: wait until the agent drops the answer

    def __enter__(self) -> NonReaders:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def peak_rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) * 1024


def test_clients_that_never_read_hold_no_worker_and_bounded_memory(tmp_path: Path) -> None:
    """32 clients ask for the 6.6 MB page and never read it (the agent held a worker 10 s for each, and
    scrapes timed out); a real Prometheus and a scraper keep getting theirs."""
    node = write_large_node(tmp_path / "node", LARGE)
    with run_agent(node.cli_args(), tmp_path) as agent:
        assert agent.prometheus_port is not None
        page = Scraper(agent.prometheus_port, "/metrics")
        wait_for(lambda: len(page.get(timeout_s=10)[1]) > 5_000_000, 30, "the first cgroup walk")
        peak_before = peak_rss_bytes(agent.process.pid)
        target = f"127.0.0.1:{agent.prometheus_port}"
        with run_prometheus(tmp_path, [target], scrape_interval=f"{LARGE_SCRAPE_S:g}s") as prometheus:
            wait_for(prometheus.targets_up, 30, "Prometheus' first scrape")
            with NonReaders(agent.prometheus_port, NON_READERS) as attackers:
                began = time.monotonic()
                times = []
                while time.monotonic() - began < 10:
                    times.append(page.answers_within(LARGE_SCRAPE_S, 1)[0])
                window = f"[{int(time.monotonic() - began)}s]"
                scrapes = prometheus.series(f'count_over_time(up{{instance="{target}"}}{window})')
                up = prometheus.series(f'min_over_time(up{{instance="{target}"}}{window})')
                slowest = prometheus.series(
                    f'max_over_time(scrape_duration_seconds{{instance="{target}"}}{window})'
                )
        peak = peak_rss_bytes(agent.process.pid)
        log = agent.log()
    print(
        f"scrapes under attack: {len(times)}, slowest {max(times):.2f} s; Prometheus: {scrapes}, slowest "
        f"{slowest}; non-readers asked {attackers.asked} times; "
        f"peak RSS {peak_before >> 20} -> {peak >> 20} MiB"
    )
    assert set(up.values()) == {1.0} and min(scrapes.values()) >= 2, (up, scrapes)
    assert max(slowest.values()) < LARGE_SCRAPE_S, slowest
    assert peak < peak_before + (64 << 20), f"peak RSS {peak_before >> 20} -> {peak >> 20} MiB"
    assert log.count("client connection failed (answer not taken in time)") == 1, log[-2000:]
    assert "Traceback" not in log


def test_head_is_answered_with_the_headers_of_get_and_no_body(
    tmp_path: Path, hwloc_root: Callable[[str], tuple[Path, Path]]
) -> None:
    with run_agent(machine_args(tmp_path, hwloc_root), tmp_path) as agent:
        assert agent.prometheus_port is not None and agent.health_port is not None
        for port, path in (
            (agent.prometheus_port, "/metrics"),
            (agent.health_port, "/healthz"),
            (agent.health_port, "/readyz"),
        ):
            for encoding in ("", "gzip"):
                head, get = (answer(port, method, path, encoding) for method in ("HEAD", "GET"))
                assert head.status == get.status == 200, (path, head, get)
                assert head.headers == get.headers, (path, encoding)  # but the length of a page
                assert head.body == b"" and get.body, path
                assert int(head.length) > 0 and int(get.length) == len(get.body)
                if path != "/metrics":  # a page's length moves with its values
                    assert head.length == get.length


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # Content-Type and Content-Encoding
    length: str
    body: bytes


def answer(port: int, method: str, path: str, encoding: str) -> Answer:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, headers={"Accept-Encoding": encoding} if encoding else {})
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    shown = {name: response.getheader(name, "") for name in ("Content-Type", "Content-Encoding")}
    return Answer(response.status, shown, response.getheader("Content-Length", ""), body)
