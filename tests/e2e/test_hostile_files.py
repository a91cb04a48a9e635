"""Hostile files and signals against the agent as it serves.

Each test damages a node written by :mod:`otel_numa.testing.large_node` (2 NUMA nodes x 16 CPUs, 10 pods x 2
containers, cgroup v2) the way an attacker or a broken filesystem would, while the agent runs as a daemon
with both readers (``--exporter prometheus,otlp --otlp-protocol http/protobuf``) pushing to rotel, a real
collector. Each then shows what an operator sees: the page still answers a scraper within 1 s, pushes still
arrive, the agent's peak RSS stays bounded, and the error is counted on
``numa_agent_source_errors_total{numa_source,error_type}``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from otel_numa.model import DeviceEntry
from otel_numa.testing.checkpoints import cpu_manager_state_bytes, device_checkpoint_bytes, write_atomically
from otel_numa.testing.kubelet_scenario import series
from otel_numa.testing.large_node import LargeNode, LargeNodeSpec, write_large_node
from otel_numa.testing.peers import (
    REPO,
    AgentProcess,
    Rotel,
    agent_command,
    free_port,
    http_get,
    run_agent,
    run_prometheus,
    run_rotel,
    wait_for,
)

pytestmark = pytest.mark.e2e

SPEC = LargeNodeSpec(numa_nodes=2, cpus_per_node=16, pods=10, containers_per_pod=2)
# The agent on this node peaks at ~41 MB; the chart's memory limit is 128 Mi. Before the caps, one 1 GB
# sparse file took it to 2.1 GB and a 3.6 KB checkpoint to 1.28 GB; now most attacks add under 1 MB, and
# a hostile checkpoint at most what parsing it takes (~26 MB for the 690 KB one below).
PEAK_RSS_BYTES = 128 << 20
PEAK_RSS_GROWTH_BYTES = 48 << 20  # over the peak before the attack
SCRAPE_S = 1.0
ERRORS = "numa_agent_source_errors_total"
SLOW_READ_SITE = REPO / "otel_numa" / "testing" / "slow_read"


@dataclass
class Serving:
    node: LargeNode
    agent: AgentProcess
    rotel: Rotel
    peak_before: int = 0  # the agent's peak RSS once it served its first page

    def scrape(self) -> str:
        """One scrape, as Prometheus makes it; it must answer within :data:`SCRAPE_S`."""
        assert self.agent.prometheus_port is not None
        started = time.monotonic()
        status, body = http_get(f"http://127.0.0.1:{self.agent.prometheus_port}/metrics", timeout_s=10)
        took = time.monotonic() - started
        assert status == 200, body[:200]
        assert took < SCRAPE_S, f"a scrape took {took:.2f}s"
        return body.decode()

    def errors(self, source: str) -> dict[str, float]:
        """``numa_agent_source_errors_total`` of ``source`` by ``error_type``."""
        found = series(self.scrape(), ERRORS)
        return {
            dict(labels)["error_type"]: value
            for labels, value in found.items()
            if dict(labels)["numa_source"] == source
        }

    def wait_counted(self, source: str, error_type: str, timeout_s: float = 20) -> None:
        wait_for(
            lambda: self.errors(source).get(error_type, 0) >= 1,
            timeout_s,
            f"{ERRORS}{{numa_source={source!r},error_type={error_type!r}}} >= 1",
        )

    def received(self) -> str:
        """What rotel logged of the pushes it received."""
        return self.rotel.log_path.read_text(errors="replace")

    def pushes(self) -> int:
        return self.received().count("ResourceMetrics #")

    def peak_rss(self) -> int:
        """The agent's peak resident memory (``VmHWM``) so far."""
        status = Path(f"/proc/{self.agent.process.pid}/status").read_text()
        return int(status.split("VmHWM:")[1].split()[0]) * 1024

    def still_serving(self) -> None:
        """Three scrapes within 1 s each, a push arriving at rotel, /healthz up and the peak RSS bounded."""
        for _ in range(3):
            assert "numa_cpu_capacity" in self.scrape()
        seen = self.pushes()
        wait_for(lambda: self.pushes() > seen, 15, "a push to arrive at rotel")
        assert http_get(f"http://127.0.0.1:{self.agent.health_port}/healthz")[0] == 200
        peak = self.peak_rss()
        assert peak < PEAK_RSS_BYTES, f"peak RSS {peak >> 20} MB"
        assert peak < self.peak_before + PEAK_RSS_GROWTH_BYTES, (
            f"peak RSS {self.peak_before >> 20} -> {peak >> 20} MB"
        )

    def stop(self) -> None:
        """SIGTERM ends the agent within its 5 s budget, with a final push."""
        seen = self.pushes()
        started = time.monotonic()
        assert self.agent.stop(signal.SIGTERM, timeout_s=15) == 0, self.agent.log()[-2000:]
        assert time.monotonic() - started < 5.0
        wait_for(lambda: self.pushes() > seen, 5, "the final push")


@pytest.fixture
def node(tmp_path: Path) -> LargeNode:
    return write_large_node(tmp_path / "node", SPEC)


@contextmanager
def serving(
    node: LargeNode,
    tmp_path: Path,
    *,
    interval: str = "1",
    env: dict[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> Iterator[Serving]:
    """The agent on ``node`` with both readers; ``extra_args`` come last (a repeated flag's last wins)."""
    with run_rotel(tmp_path) as rotel:
        args = [
            *node.cli_args(),
            "--exporter",
            "prometheus,otlp",
            "--otlp-protocol",
            "http/protobuf",
            "--otlp-endpoint",
            f"http://127.0.0.1:{rotel.http_port}",
            "--interval",
            interval,
            *extra_args,
        ]
        with run_agent(args, tmp_path, env=env) as agent:
            started = Serving(node, agent, rotel)
            started.scrape()
            started.peak_before = started.peak_rss()
            yield started


def once(node: LargeNode, env: dict[str, str] | None = None, timeout_s: float = 30) -> tuple[int, str, float]:
    """``--once`` on the node: exit status, page, seconds taken."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NODE_NAME"))}
    full_env.update(env or {})
    started = time.monotonic()
    done = subprocess.run(
        agent_command(*node.cli_args(), "--once"),
        capture_output=True,
        env=full_env,
        cwd=REPO,
        timeout=timeout_s,
        check=False,
    )
    return done.returncode, done.stdout.decode(), time.monotonic() - started


def a_numa_stat(node: LargeNode) -> Path:
    """One container's ``memory.numa_stat``."""
    return next(path for path in sorted(node.cgroup_root.rglob("memory.numa_stat")) if ".scope" in str(path))


def node0_file(node: LargeNode, name: str) -> Path:
    return node.sysfs_root / "devices" / "system" / "node" / "node0" / name


def container_series(text: str) -> int:
    return len(series(text, "numa_container_memory_usage_bytes"))


def walked_container_series(agent: Serving) -> int:
    """The page's container series once the first cgroup walk is in: it runs in the background, and on a
    busy machine the first scrapes come before it."""
    wait_for(lambda: container_series(agent.scrape()) > 0, 30, "the first cgroup walk")
    return container_series(agent.scrape())


# --- names are data --------------------------------------------------------------------------------


def test_a_container_name_of_invalid_utf8_costs_nothing(node: LargeNode, tmp_path: Path) -> None:
    """A log link named with bytes that are not UTF-8 gives a valid page, a valid push and ``--once`` 0:
    each bad byte becomes U+FFFD in the names."""
    logs = node.container_logs_root
    link = sorted(logs.iterdir())[0]
    container_id = link.name.rsplit("-", 1)[1]
    os.rename(link, os.fsencode(logs) + b"/pod\xff\xferaw_ns\xc3_c\x80bad-" + container_id.encode())

    status, page, _ = once(node)
    assert status == 0
    assert 'k8s_container_name="c\ufffdbad"' in page
    assert 'k8s_pod_name="pod\ufffd\ufffdraw"' in page

    with serving(node, tmp_path) as agent:
        page = agent.scrape()
        usage = series(page, "numa_container_memory_usage_bytes")
        assert "c\ufffdbad" in {dict(labels)["k8s_container_name"] for labels in usage}
        wait_for(lambda: "c\ufffdbad" in agent.received(), 15, "the name in a push")
        with run_prometheus(tmp_path, [f"127.0.0.1:{agent.agent.prometheus_port}"]) as prometheus:
            # PromQL refuses U+FFFD in a literal (it reads it as a bad rune): matched by a pattern
            query = 'numa_container_memory_usage_bytes{k8s_container_name=~"c.bad"}'
            stored = wait_for(lambda: prometheus.series(query), 30, "Prometheus to store the series")
            assert {dict(labels)["k8s_container_name"] for labels in stored} == {"c\ufffdbad"}
            assert prometheus.targets_up()
        agent.still_serving()
        agent.stop()


# --- no read can hang the agent --------------------------------------------------------------------

FIFO_KINDS = {
    "sysfs": lambda node: node0_file(node, "meminfo"),
    "procfs": lambda node: node.procfs_root / "stat",
    "cpu_manager": lambda node: node.cpu_manager_path,
    "cgroup": a_numa_stat,
}


@pytest.mark.parametrize("source", sorted(FIFO_KINDS))
def test_a_fifo_in_place_of_a_file_is_refused(source: str, node: LargeNode, tmp_path: Path) -> None:
    """A FIFO with a writer that never writes, where a file should be: counted as ``not_regular_file``
    and never waited on, by the daemon and by ``--once``; the regular file back, the source recovers."""
    path = FIFO_KINDS[source](node)
    saved = path.read_bytes()
    with serving(node, tmp_path) as agent:
        agent.scrape()
        path.unlink()
        os.mkfifo(path)
        writer = os.open(path, os.O_RDWR)  # holds the FIFO open, writes nothing
        try:
            agent.wait_counted(source, "not_regular_file")
            agent.still_serving()
            status, page, took = once(node)
            assert status == 0 and took < 10, f"--once took {took:.1f}s"
            assert "numa_cpu_capacity" in page
        finally:
            os.close(writer)
        path.unlink()
        write_atomically(path, saved)

        def recovered() -> bool:
            ages = series(agent.scrape(), "numa_agent_source_age_seconds")
            return any(dict(labels)["numa_source"] == source and age < 3 for labels, age in ages.items())

        wait_for(recovered, 20, f"{source} to be read again")
        agent.stop()


def test_a_read_that_hangs_for_60s_holds_nothing(node: LargeNode, tmp_path: Path) -> None:
    """A read of node 0's ``meminfo`` that does not return for 60 s (a stuck filesystem; see
    ``otel_numa/testing/slow_read``): scrapes and pushes carry the last good data with its growing age,
    the stuck read is counted as ``timeout``, ``/healthz`` turns 503 after the stall timeout, SIGTERM still
    ends the agent with a final push, and ``--once`` ends with what it has."""
    marker = tmp_path / "stuck"
    env = {
        "PYTHONPATH": str(SLOW_READ_SITE),
        "OTEL_NUMA_TEST_SLOW_READ": f"{node0_file(node, 'meminfo')}:60:{marker}",
        "OTEL_NUMA_STALL_TIMEOUT": "4",
    }
    with serving(node, tmp_path, env=env) as agent:
        capacity = series(agent.scrape(), "numa_memory_capacity_bytes")
        assert len(capacity) == SPEC.numa_nodes
        marker.touch()
        wait_for(lambda: agent.errors("sysfs").get("timeout", 0) == 1, 20, "the stuck read to be counted")
        # a real scraper with a 1 s timeout keeps the target up and stores the last good data
        with run_prometheus(tmp_path, [f"127.0.0.1:{agent.agent.prometheus_port}"]) as prometheus:
            query = "numa_memory_capacity_bytes"
            wait_for(lambda: len(prometheus.series(query)) == SPEC.numa_nodes, 30, "Prometheus to scrape")
            time.sleep(3)
            (target,) = prometheus.targets()
            assert target["health"] == "up", target["lastError"]
        page = agent.scrape()
        assert series(page, "numa_memory_capacity_bytes") == capacity, "the last good data is served"
        ages = series(page, "numa_agent_source_age_seconds")
        assert any(dict(labels)["numa_source"] == "sysfs" and age >= 4 for labels, age in ages.items())
        seen = agent.pushes()
        wait_for(lambda: agent.pushes() > seen, 15, "a push while the read hangs")
        assert agent.peak_rss() < agent.peak_before + PEAK_RSS_GROWTH_BYTES
        health = f"http://127.0.0.1:{agent.agent.health_port}/healthz"
        wait_for(lambda: http_get(health)[0] == 503, 15, "/healthz to report the stall")
        for _ in range(3):
            agent.scrape()
        assert agent.errors("sysfs").get("timeout") == 1, "one stuck read is counted once"
        agent.stop()

    # --once from the start, while the read hangs: no machine data yet, but it ends and says why
    status, page, took = once(node, env=env)
    assert status == 0 and took < 20, f"--once took {took:.1f}s"
    assert 'error_type="timeout",numa_source="sysfs"' in page.replace(',k8s_node_name="large-node"', "")


def test_sigterm_ends_an_agent_whose_first_read_hangs(node: LargeNode, tmp_path: Path) -> None:
    """A read that hangs from the start: the agent still serves its health port (not ready, no snapshot
    yet) and SIGTERM ends it within the chart's 10 s grace period."""
    marker = tmp_path / "stuck"
    marker.touch()
    health = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NODE_NAME"))}
    env |= {
        "PYTHONPATH": str(SLOW_READ_SITE),
        "OTEL_NUMA_TEST_SLOW_READ": f"{node0_file(node, 'meminfo')}:60:{marker}",
    }
    args = [*node.cli_args(), "--health-address", f"127.0.0.1:{health}", "--prometheus-address", "none"]
    log_path = tmp_path / "agent.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            agent_command(*args), stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=REPO
        )
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{health}/healthz")[0] == 200, 30, "the health port")
        assert http_get(f"http://127.0.0.1:{health}/readyz")[0] == 503
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0, log_path.read_text()
        assert time.monotonic() - started < 10.0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_slow_background_read_alone_keeps_the_agent_healthy(node: LargeNode, tmp_path: Path) -> None:
    """A container's ``memory.numa_stat`` whose read hangs for 60 s stalls only the cgroup walk: it is
    counted as ``timeout`` on ``cgroup``, snapshots still finish, so ``/healthz`` stays 200 past the stall
    timeout, and pushes go on. (The containers' counters move, as on a busy node: while the kubepods
    cgroup's sums stand, no container's file is read at all.)"""
    marker = tmp_path / "stuck"
    env = {
        "PYTHONPATH": str(SLOW_READ_SITE),
        "OTEL_NUMA_TEST_SLOW_READ": f"{a_numa_stat(node)}:60:{marker}",
        "OTEL_NUMA_STALL_TIMEOUT": "2",
    }
    with serving(node, tmp_path, env=env) as agent:
        before = walked_container_series(agent)
        marker.touch()
        node.write_cgroup_usage(1)
        agent.wait_counted("cgroup", "timeout")
        time.sleep(3)  # past the stall timeout
        assert container_series(agent.scrape()) == before, "the last good walk is served"
        agent.still_serving()
        agent.stop()


# --- nothing amplifies ------------------------------------------------------------------------------


def test_a_small_checkpoint_of_huge_cpu_sets_is_refused(node: LargeNode, tmp_path: Path) -> None:
    """A valid 6 KB ``cpu_manager_state`` (right checksum) of 200 entries "0-65535": rejected whole as
    ``out_of_range`` without expanding it (it took 1.28 GB before)."""
    entries = {f"pod-{index:03d}": {"c": range(65536)} for index in range(200)}
    data = cpu_manager_state_bytes("static", range(SPEC.cpus), entries)
    assert len(data) < 8 * 1024
    with serving(node, tmp_path) as agent:
        before = series(agent.scrape(), "numa_cpu_allocated")
        assert before
        write_atomically(node.cpu_manager_path, data)
        agent.wait_counted("cpu_manager", "out_of_range")
        assert not series(agent.scrape(), "numa_cpu_allocated"), "no allocation from a rejected file"
        agent.still_serving()
        agent.stop()


def test_cpu_sets_beyond_the_machine_are_refused(node: LargeNode, tmp_path: Path) -> None:
    """A checkpoint naming CPU 100 on a 32-CPU machine is not this machine's: rejected, counted."""
    data = cpu_manager_state_bytes("static", range(SPEC.cpus), {"pod-x": {"c": [100]}})
    with serving(node, tmp_path) as agent:
        write_atomically(node.cpu_manager_path, data)
        agent.wait_counted("cpu_manager", "out_of_range")
        agent.still_serving()
        agent.stop()


def test_checkpoints_naming_numa_nodes_beyond_the_machine_are_refused(
    node: LargeNode, tmp_path: Path
) -> None:
    """A device checkpoint filing devices under NUMA nodes 0..15999 of a 2-node machine: rejected whole
    (``out_of_range``), never 16,000 series."""
    entries = [
        DeviceEntry("pod-x", "c", "example.com/gpu", {numa: (f"gpu-{numa}",) for numa in range(16000)})
    ]
    data = device_checkpoint_bytes(entries, {"example.com/gpu": [f"gpu-{numa}" for numa in range(16000)]})
    with serving(node, tmp_path) as agent:
        before = len(series(agent.scrape(), "numa_device_allocated"))
        write_atomically(node.device_checkpoint_path, data)
        agent.wait_counted("device_manager", "out_of_range")
        assert len(series(agent.scrape(), "numa_device_allocated")) <= before
        agent.still_serving()
        agent.stop()


SPARSE_KINDS = {
    "sysfs": lambda node: node0_file(node, "meminfo"),
    "procfs": lambda node: node.procfs_root / "stat",
    "cgroup": a_numa_stat,
}


@pytest.mark.parametrize("source", sorted(SPARSE_KINDS))
def test_a_1gb_sparse_file_is_refused_unread(source: str, node: LargeNode, tmp_path: Path) -> None:
    """A 1 GB sparse file where a kernel file of kilobytes should be: ``too_large`` after reading past its
    cap, with the peak RSS bounded and every scrape fast (2.1 GB and 4-8 s a scrape before)."""
    path = SPARSE_KINDS[source](node)
    with serving(node, tmp_path) as agent:
        agent.scrape()
        with open(path, "r+b") as file:
            file.truncate(1 << 30)
        agent.wait_counted(source, "too_large")
        agent.still_serving()
        agent.stop()


def test_numa_stat_naming_nodes_beyond_the_machine_is_refused(node: LargeNode, tmp_path: Path) -> None:
    """A container's ``memory.numa_stat`` naming nodes N0..N15999 on a 2-node machine: an error of that
    file (``out_of_range``), never 32,000 series."""
    path = a_numa_stat(node)
    values = " ".join(f"N{index}=4096" for index in range(16000))
    hostile = "".join(f"{kind} {4096 * 16000} {values}\n" for kind in ("anon", "file", "kernel_stack"))
    with serving(node, tmp_path) as agent:
        before = walked_container_series(agent)
        write_atomically(path, hostile.encode())
        agent.wait_counted("cgroup", "out_of_range")
        assert container_series(agent.scrape()) <= before
        agent.still_serving()
        agent.stop()


# --- logs never quote file contents; no link is followed --------------------------------------------

SECRET = "root:$6$hostile-secret-hash$:19000:0:99999:7:::"


def test_links_out_of_the_roots_are_not_followed(node: LargeNode, tmp_path: Path) -> None:
    """Node 0's ``cpulist``, the CPU manager checkpoint and a container's ``memory.numa_stat`` replaced by
    links to a file outside every root, and node 1's directory and ``device-plugins/`` by links to copies
    outside: each counted as ``symlink``, nothing of the target in the log."""
    secret = tmp_path / "shadow"
    secret.write_text(SECRET + "\n")
    links = {
        "sysfs": node0_file(node, "cpulist"),
        "cpu_manager": node.cpu_manager_path,
        "cgroup": a_numa_stat(node),
    }
    for path in links.values():
        path.unlink()
        path.symlink_to(secret)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    node1 = node.sysfs_root / "devices" / "system" / "node" / "node1"
    for directory in (node1, node.device_checkpoint_path.parent):
        moved = elsewhere / directory.name
        shutil.move(directory, moved)
        directory.symlink_to(moved)
    with serving(node, tmp_path) as agent:
        for source in (*links, "device_manager"):
            agent.wait_counted(source, "symlink")
        assert series(agent.scrape(), "numa_node_count") == {frozenset(): 1}, "node 1 is not followed"
        agent.still_serving()
        agent.stop()
    log = agent.agent.log()
    assert "symbolic link" in log
    assert "hostile-secret" not in log and "$6$" not in log


# --- signals ---------------------------------------------------------------------------------------


def logged(agent: Serving, line: str) -> Callable[[], bool]:
    return lambda: line in agent.agent.log()


def test_hup_usr1_usr2_are_logged_and_ignored(node: LargeNode, tmp_path: Path) -> None:
    """SIGHUP, SIGUSR1 and SIGUSR2 do not end the agent (their default would, silently); SIGTERM ends it
    with a final push."""
    with serving(node, tmp_path, interval="60") as agent:
        wait_for(lambda: agent.pushes() >= 1, 15, "the first push")
        for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            agent.agent.process.send_signal(sig)
            wait_for(logged(agent, f"received {sig.name}; ignored"), 5, f"{sig.name} logged")
            assert agent.agent.process.poll() is None
            agent.scrape()
        agent.stop()
