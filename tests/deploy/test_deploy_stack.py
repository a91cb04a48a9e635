"""The README's local-stack commands, run as written, with podman's default store (no Docker engine and no
registry here): a series is read back through Prometheus's HTTP API, and the stop command leaves nothing.

The stack runs under a project name and loopback ports of its own (the stack script's documented
variables), so that it cannot meet a stack someone else started on this machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
from typing import Any
from urllib.parse import quote

import pytest

from otel_numa.testing.peers import http_get, wait_for
from tests.support import REPO

README = REPO / "README.md"
DEMO_MEMORY_MANAGER = REPO / "config" / "demo" / "kubelet" / "memory_manager_state"
DEMO_NODES = REPO / "config" / "demo" / "sysfs" / "devices" / "system" / "node"
OPTIONAL_SERVICES = ("otel-collector", "prometheus", "grafana")
PORT_VARIABLES = ("AGENT", "HEALTH", "PROMETHEUS", "GRAFANA", "COLLECTOR", "OTLP_GRPC", "OTLP_HTTP")


def readme_stack_commands() -> list[str]:
    """The shell lines of the first ```sh block of the README's section "The local stack"."""
    text = README.read_text()
    start = re.search(r"^### The local stack$", text, flags=re.MULTILINE)
    assert start, "README.md has no section 'The local stack'"
    block = re.search(r"^```sh\n(.*?)^```", text[start.end() :], flags=re.MULTILINE | re.DOTALL)
    assert block, "no ```sh block in the local stack section"
    return [line for line in block.group(1).splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def demo_memory_allocated() -> dict[str, float]:
    """numa.memory.allocated of the demo kubelet state: the memory manager's reserved memory per node."""
    state = json.loads(DEMO_MEMORY_MANAGER.read_text())
    if "data" in state:
        state = json.loads(state["data"])
    return {
        numa: float(node["memoryMap"]["memory"]["reserved"]) for numa, node in state["machineState"].items()
    }


@pytest.fixture(scope="module")
def environment() -> dict[str, str]:
    """The caller's environment with podman's default configuration and store, and a project and ports
    of its own."""
    if shutil.which("docker") is None and shutil.which("podman") is None:
        raise AssertionError("neither docker nor podman is installed: run bash scripts/setup.sh --test")
    env = {k: v for k, v in os.environ.items() if k not in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF")}
    env["OTEL_NUMA_STACK_PROJECT"] = f"otel-numa-stack-test-{os.getpid()}"
    for name in PORT_VARIABLES:
        env[f"OTEL_NUMA_STACK_{name}_PORT"] = str(free_port())
    return env


def run_line(line: str, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", line], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def project_containers(engine: str, env: dict[str, str]) -> list[str]:
    label = "io.podman.compose.project" if engine == "podman" else "com.docker.compose.project"
    listed = subprocess.run(
        [engine, "ps", "--all", "--quiet", "--filter", f"label={label}={env['OTEL_NUMA_STACK_PROJECT']}"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return listed.stdout.split()


def test_readme_names_up_status_and_down() -> None:
    commands = readme_stack_commands()
    verbs = [line.split("#")[0].split()[-1] for line in commands]
    assert verbs == ["up", "status", "down"], commands


@pytest.mark.timeout(900)
def test_the_readme_commands_bring_the_stack_up_and_down(environment: dict[str, str]) -> None:
    up, status, down = readme_stack_commands()
    engine = ""
    try:
        started = run_line(up, environment, 600)
        assert started.returncode == 0, started.stdout + started.stderr
        said = started.stderr
        engine_said = re.search(r"started on (docker|podman): ", said)
        assert engine_said, said
        engine = engine_said.group(1)
        # every optional service is either started or skipped with its reason; Prometheus's fallback is said
        for service in OPTIONAL_SERVICES:
            assert re.search(rf"started on \w+: .*\b{service}\b", said) or re.search(
                rf"skipped {service}: the image \S+ cannot be had \(.+\)", said
            ), f"{service} is neither started nor skipped with a reason:\n{said}"
        if "prometheus: the image" in said:
            assert "FALLBACK: running Debian's prometheus package" in said
        prometheus_port = environment["OTEL_NUMA_STACK_PROMETHEUS_PORT"]
        assert f"http://127.0.0.1:{prometheus_port}/" in said, "the URL to open"
        assert f"http://127.0.0.1:{environment['OTEL_NUMA_STACK_AGENT_PORT']}/metrics" in said

        shown = run_line(status, environment, 120)
        assert shown.returncode == 0 and f"http://127.0.0.1:{prometheus_port}/" in shown.stderr, shown.stderr

        def query(expr: str) -> list[dict[str, Any]]:
            url = f"http://127.0.0.1:{prometheus_port}/api/v1/query?query={quote(expr)}"
            code, body = http_get(url, 2)
            payload = json.loads(body)
            assert code == 200 and payload["status"] == "success", payload
            return list(payload["data"]["result"])

        # Prometheus scrapes every 15 s: the first scrape of the agent comes within one interval
        node_count = wait_for(
            lambda: query('numa_node_count{job="otel-numa"}'), 60, "a scrape of the agent", interval_s=1
        )
        [sample] = node_count
        assert sample["metric"]["instance"] == "agent:9464", "scraped by the service's name"
        assert sample["metric"]["k8s_node_name"] == "demo-node"
        assert float(sample["value"][1]) == len(list(DEMO_NODES.glob("node[0-9]*"))) == 4
        allocated = {
            item["metric"]["numa_node_id"]: float(item["value"][1])
            for item in query('numa_memory_allocated_bytes{job="otel-numa"}')
        }
        assert allocated == demo_memory_allocated(), "the demo kubelet state on the demo's own NUMA nodes"
    finally:
        stopped = run_line(down, environment, 180)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "no container of" in stopped.stderr
    assert engine and project_containers(engine, environment) == [], "the stop command left containers"
    code = None
    with contextlib.suppress(OSError):
        code, _ = http_get(f"http://127.0.0.1:{environment['OTEL_NUMA_STACK_PROMETHEUS_PORT']}/-/ready", 1)
    assert code is None, "something still answers on Prometheus's port"
