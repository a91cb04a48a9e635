"""The README's local-stack commands, run as written, with podman's default store (no Docker engine and no
registry here): the first query after `up` answers, Prometheus has loaded the alert rules, every query of the
dashboard has data, the documented one-off `podman run ... --once` works, `down` leaves no container and
says which images it keeps, and `down --images` removes them.

The stack runs under a project name and loopback ports of its own (the stack script's documented
variables), so that it cannot meet a stack someone else started on this machine.

A fresh machine (no compose tool, no virtualenv, no base image, an empty podman store) takes minutes more
(debootstrap, two image builds without cache): `test_a_fresh_machine` runs only with OTEL_NUMA_TEST_FRESH=1,
the slower target the README's Tests section names.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from otel_numa.testing.kubelet_scenario import series
from otel_numa.testing.peers import http_get, wait_for
from tests.e2e.test_dashboard_live import dashboard_queries, fill
from tests.support import REPO

README = REPO / "README.md"
DEPLOYMENT = REPO / "docs" / "decisions" / "deployment.md"
RULES = REPO / "config" / "prometheus" / "otel-numa.rules.yaml"
DEMO_MEMORY_MANAGER = REPO / "config" / "demo" / "kubelet" / "memory_manager_state"
DEMO_NODES = REPO / "config" / "demo" / "sysfs" / "devices" / "system" / "node"
OPTIONAL_SERVICES = ("otel-collector", "prometheus", "grafana")
PORT_VARIABLES = ("AGENT", "HEALTH", "PROMETHEUS", "GRAFANA", "COLLECTOR", "OTLP_GRPC", "OTLP_HTTP")
FRESH = os.environ.get("OTEL_NUMA_TEST_FRESH") == "1"


def readme_stack_commands() -> list[str]:
    """The shell lines of the first ```sh block of the README's section "The local stack"."""
    text = README.read_text()
    start = re.search(r"^### The local stack$", text, flags=re.MULTILINE)
    assert start, "README.md has no section 'The local stack'"
    block = re.search(r"^```sh\n(.*?)^```", text[start.end() :], flags=re.MULTILINE | re.DOTALL)
    assert block, "no ```sh block in the local stack section"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def documented_run() -> str:
    """The one-off `podman run ... --once` of docs/decisions/deployment.md."""
    blocks = re.findall(r"^```sh\n(.*?)^```", DEPLOYMENT.read_text(), flags=re.MULTILINE | re.DOTALL)
    runs = [line for block in blocks for line in block.splitlines() if line.startswith("podman run")]
    assert len(runs) == 1, runs
    return str(runs[0])


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


def stack_environment(base: dict[str, str]) -> dict[str, str]:
    """A project and loopback ports of its own."""
    env = dict(base)
    env["OTEL_NUMA_STACK_PROJECT"] = f"otel-numa-stack-test-{os.getpid()}-{time.monotonic_ns() % 100000}"
    for name in PORT_VARIABLES:
        env[f"OTEL_NUMA_STACK_{name}_PORT"] = str(free_port())
    return env


@pytest.fixture(scope="module")
def environment() -> dict[str, str]:
    """The caller's environment with podman's default configuration and store."""
    if shutil.which("docker") is None and shutil.which("podman") is None:
        raise AssertionError("neither docker nor podman is installed: run bash scripts/setup.sh --test")
    drop = ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF")
    return stack_environment({k: v for k, v in os.environ.items() if k not in drop})


def run_line(
    line: str, env: dict[str, str], timeout_s: float, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def project_containers(engine: str, env: dict[str, str]) -> list[str]:
    label = "io.podman.compose.project" if engine == "podman" else "com.docker.compose.project"
    listed = subprocess.run(
        [engine, "ps", "--all", "--quiet", "--filter", f"label={label}={env['OTEL_NUMA_STACK_PROJECT']}"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return listed.stdout.split()


def image_exists(engine: str, image: str, env: dict[str, str]) -> bool:
    done = subprocess.run([engine, "image", "inspect", image], env=env, capture_output=True, timeout=60)
    return done.returncode == 0


class StackPrometheus:
    def __init__(self, port: str) -> None:
        self.port = port

    def query(self, expr: str) -> list[dict[str, Any]]:
        code, body = http_get(f"http://127.0.0.1:{self.port}/api/v1/query?query={quote(expr)}", 5)
        payload = json.loads(body)
        assert code == 200 and payload["status"] == "success", payload
        return list(payload["data"]["result"])

    def get(self, path: str) -> Any:
        code, body = http_get(f"http://127.0.0.1:{self.port}{path}", 5)
        assert code == 200, body
        return json.loads(body)["data"]


def started_services(said: str) -> tuple[str, list[str]]:
    engine_said = re.search(r"started on (docker|podman): (.*)", said)
    assert engine_said, said
    return engine_said.group(1), engine_said.group(2).split()


def check_up_output(said: str, env: dict[str, str]) -> None:
    # every optional service is either started or skipped with its reason; Prometheus's fallback is said
    _, started = started_services(said)
    assert {"agent", "podresources"} <= set(started), said
    for service in OPTIONAL_SERVICES:
        assert service in started or re.search(
            rf"skipped {service}: the image \S+ cannot be had \(.+\)", said
        ), f"{service} is neither started nor skipped with a reason:\n{said}"
    if "prometheus: the image" in said:
        assert "FALLBACK: running Debian's prometheus package" in said
    assert "waiting for Prometheus' first scrape of the agent" in said
    assert (
        f"http://127.0.0.1:{env['OTEL_NUMA_STACK_PROMETHEUS_PORT']}/graph?g0.expr=numa_cpu_allocated" in said
    )
    assert f"http://127.0.0.1:{env['OTEL_NUMA_STACK_AGENT_PORT']}/metrics" in said
    # the URLs come last, after the waits
    assert said.rstrip().endswith("stop it with: bash scripts/stack.sh down"), said


def check_demo(prometheus: StackPrometheus, *, pushing: bool) -> None:
    """What the demo shows: the first query answers at once, the rules are loaded, every panel has data
    (the OTLP push panels only where the agent pushes: without a collector it serves its page alone, and
    they must then be empty)."""
    assert prometheus.query("numa_cpu_allocated"), "the first query after up is empty"
    [sample] = prometheus.query('numa_node_count{job="otel-numa"}')
    assert sample["metric"]["instance"] == "agent:9464", "scraped by the service's name"
    assert sample["metric"]["k8s_node_name"] == "demo-node"
    assert float(sample["value"][1]) == len(list(DEMO_NODES.glob("node[0-9]*"))) == 4
    allocated = {
        item["metric"]["numa_node_id"]: float(item["value"][1])
        for item in prometheus.query('numa_memory_allocated_bytes{job="otel-numa"}')
    }
    assert allocated == demo_memory_allocated(), "the demo kubelet state on the demo's own NUMA nodes"

    groups = prometheus.get("/api/v1/rules")["groups"]
    loaded = {rule["name"] for group in groups for rule in group["rules"]}
    shipped = {
        rule.get("alert") or rule["record"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
    }
    assert loaded == shipped, "Prometheus loaded the rule file as shipped"

    # rate() panels need two scrapes
    wait_for(lambda: prometheus.query("rate(numa_cpu_time_seconds_total[1m])"), 60, "two scrapes", 1)
    variables, targets = dashboard_queries()
    values = {"job": "otel-numa", "node": "demo-node", "datasource": "prometheus", "__rate_interval": "1m"}
    for variable in variables:
        match = re.fullmatch(
            r"label_values\((.*),\s*(\w+)\)", fill(variable, values | {"hugepage_size": ".*"})
        )
        assert match, variable
        label_values = prometheus.get(
            f"/api/v1/label/{match.group(2)}/values?match[]={quote(match.group(1))}"
        )
        assert label_values, f"the dashboard variable {variable} has no values"
    resources = sorted({i["metric"]["numa_resource_name"] for i in prometheus.query("numa_device_capacity")})
    assert resources, "device capacity: from the podresources test server"
    empty, pushes = [], []
    for expr, repeat in targets:
        repeated = {"hugepage_size": ["2Mi"], "resource": resources}.get(repeat or "", [""])
        for value in repeated:
            filled = fill(expr, values | {"hugepage_size": value, "resource": value})
            answered = prometheus.query(filled)
            if "numa_agent_export_" in expr and not pushing:
                pushes.extend([filled] if answered else [])
            elif not answered:
                empty.append(filled)
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)
    assert not pushes, "push panels with data from an agent that does not push:\n" + "\n".join(pushes)


def check_documented_run(engine: str, env: dict[str, str]) -> None:
    """The one-off run of docs/decisions/deployment.md, with podman's default configuration."""
    line = documented_run()
    if engine == "docker":
        line = "docker " + line.removeprefix("podman ")
    done = run_line(line, env, 120)
    assert done.returncode == 0, done.stderr
    assert series(done.stdout, "numa_node_count"), done.stdout[:2000]


def test_readme_names_up_status_down_and_down_images() -> None:
    commands = readme_stack_commands()
    assert [shlex.split(line)[2:] for line in commands] == [
        ["up"],
        ["status"],
        ["down"],
        ["down", "--images"],
    ]


@pytest.mark.timeout(900)
def test_the_readme_commands_bring_the_stack_up_and_down(environment: dict[str, str]) -> None:
    up, status, down, down_images = readme_stack_commands()
    engine = ""
    try:
        started = run_line(up, environment, 600)
        assert started.returncode == 0, started.stdout + started.stderr
        check_up_output(started.stderr, environment)
        engine, services = started_services(started.stderr)
        shown = run_line(status, environment, 120)
        prometheus_port = environment["OTEL_NUMA_STACK_PROMETHEUS_PORT"]
        assert shown.returncode == 0 and f"http://127.0.0.1:{prometheus_port}/" in shown.stderr, shown.stderr
        check_demo(StackPrometheus(prometheus_port), pushing="otel-collector" in services)
        check_documented_run(engine, environment)
    finally:
        stopped = run_line(down, environment, 180)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "no container of" in stopped.stderr
    assert engine and project_containers(engine, environment) == [], "the stop command left containers"
    code = None
    with contextlib.suppress(OSError):
        code, _ = http_get(f"http://127.0.0.1:{environment['OTEL_NUMA_STACK_PROMETHEUS_PORT']}/-/ready", 1)
    assert code is None, "something still answers on Prometheus's port"
    kept = re.search(r"kept for the next up: the (\d+) images up made \((\d+) MB\)", stopped.stderr)
    assert kept and int(kept.group(1)) >= 1, stopped.stderr

    removed = run_line(down_images, environment, 180)
    assert removed.returncode == 0, removed.stderr
    said = re.search(r"removed the (\d+) images up made \(\d+ MB\): (.*)", removed.stderr)
    assert said and said.group(1) == kept.group(1), removed.stderr
    for image in said.group(2).split():
        assert not image_exists(engine, image, environment), f"{image} is still there"


# ---------------------------------------------------------------- a fresh machine


def checkout_copy(destination: Path) -> Path:
    """The checkout's files as a clone has them (tracked, and new ones not ignored): no .venv."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True, timeout=60,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listed.split("\0")):
        source, target = REPO / name, destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():  # the demo's log names and PCI links
            target.symlink_to(source.readlink())
        elif source.is_file():
            shutil.copy2(source, target)
    return destination


@pytest.mark.skipif(not FRESH, reason="minutes (debootstrap, builds without cache): OTEL_NUMA_TEST_FRESH=1")
@pytest.mark.timeout(1800)
def test_a_fresh_machine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`up` on a machine with podman and nothing else of the stack's: no .venv (so no podman-compose), no
    base image in podman's store or the setup's, then `down --images` leaves the store as it found it."""
    if os.geteuid() != 0:
        pytest.skip("debootstrap needs root")
    checkout = checkout_copy(tmp_path / "checkout")
    store = tmp_path / "store"
    storage_conf = tmp_path / "storage.conf"
    storage_conf.write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{store}/graph"\nrunroot = "{store}/run"\n'
    )
    path = ":".join(entry for entry in os.environ["PATH"].split(":") if ".venv" not in entry)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OTEL_NUMA_", "CONTAINERS_", "VIRTUAL_ENV"))
    }
    env |= {
        "PATH": path,
        "CONTAINERS_STORAGE_CONF": str(storage_conf),
        "OTEL_NUMA_PODMAN_HOME": str(tmp_path / "setup"),
        "OTEL_NUMA_PODMAN_RUN": str(tmp_path / "setup-run"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "OTEL_NUMA_ENGINE": "podman",
    }
    env = stack_environment(env)
    assert shutil.which("podman-compose", path=path) is None, (
        "a podman-compose on the PATH: not a fresh machine"
    )
    up, _, _, down_images = readme_stack_commands()
    started_at = time.monotonic()
    try:
        started = run_line(up, env, 1500, cwd=checkout)
        up_s = time.monotonic() - started_at
        assert started.returncode == 0, started.stderr
        said = started.stderr
        for step in (
            "stack: creating the project's virtualenv .venv",
            "stack: installing podman-compose>=1.4 into .venv",
            "making the Debian base image localhost/otel-numa-base:bookworm-1 with debootstrap",
            "copying localhost/otel-numa-base:bookworm-1",
        ):
            assert step in said, f"{step!r} not said:\n{said}"
        assert (checkout / ".venv" / "bin" / "podman-compose").exists()
        check_up_output(said, env)
        _, services = started_services(said)
        check_demo(
            StackPrometheus(env["OTEL_NUMA_STACK_PROMETHEUS_PORT"]), pushing="otel-collector" in services
        )
    finally:
        removed = run_line(down_images, env, 300, cwd=checkout)
    assert removed.returncode == 0, removed.stderr
    assert "removed the" in removed.stderr, removed.stderr
    left = subprocess.run(
        ["podman", "images", "--all", "--quiet"], env=env, capture_output=True, text=True, timeout=60
    ).stdout.split()
    setup_env = env | {"CONTAINERS_STORAGE_CONF": str(tmp_path / "setup" / "storage.conf")}
    setup_left = subprocess.run(
        ["podman", "images", "--all", "--quiet"], env=setup_env, capture_output=True, text=True, timeout=60
    ).stdout.split()
    with capsys.disabled():
        print(f"\nfresh machine: up took {up_s:.0f} s; {removed.stderr.strip().splitlines()[-1]}")
    assert left == [] and setup_left == [], (left, setup_left, removed.stderr)
