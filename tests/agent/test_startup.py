"""Starting the agent as an operator meets it: a taken port exits 2 naming the setting and the address, and
the start-up log says where everything is served and which sources were found or missed."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from otel_numa.testing.peers import agent_command, free_port, run_agent, wait_for
from tests.support import REPO


@pytest.mark.parametrize(
    ("flag", "setting"),
    [("--prometheus-address", "prometheus_address"), ("--health-address", "health_address")],
)
def test_a_taken_port_exits_2_naming_setting_and_address(flag: str, setting: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        others = {
            option: f"127.0.0.1:{free_port()}" for option in ("--prometheus-address", "--health-address")
        }
        others[flag] = address
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NODE_NAME"))}
        done = subprocess.run(
            agent_command(*(item for pair in others.items() for item in pair)),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env=env,
        )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, done.stderr
    assert f"cannot listen on {address} ({setting}): address already in use" in errors[0]
    assert f"choose another {flag}" in errors[0]


def test_start_up_log_names_every_address_and_source(tmp_path: Path) -> None:
    empty = tmp_path / "kubelet"
    empty.mkdir()
    collector = f"http://127.0.0.1:{free_port()}"
    args = [
        *("--kubelet-root", str(empty), "--exporter", "prometheus,otlp", "--otlp-endpoint", collector),
        *("--interval", "60", "--podresources-socket", "none"),
    ]
    with run_agent(args, tmp_path) as agent:
        # the lines follow readiness: the last of them, "sources found", ends the start-up
        wait_for(lambda: "sources found:" in agent.log(), 30, "the start-up log")
        log = agent.log()
    assert f"Prometheus page: http://127.0.0.1:{agent.prometheus_port}/metrics" in log
    assert f"health: http://127.0.0.1:{agent.health_port}/healthz and " in log
    assert f"OTLP push: {collector} (grpc) every 60s" in log
    (sources,) = [line for line in log.splitlines() if "sources found:" in line]
    found, missed = sources.split("sources found: ")[1].split("; missed: ")
    assert {"sysfs", "procfs"} <= set(found.split(", "))
    # the empty kubelet directory: its checkpoints are reported missed
    assert {"cpu_manager", "memory_manager", "device_manager"} <= set(missed.split(", "))
