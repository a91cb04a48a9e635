"""An operator's mistakes, made on the command line, in the environment and in the YAML file the way a
DaemonSet or a shell gets them: each one exits 2 with one line that names the setting as it was written and
the fix (the nearest flag, variable or metric), or, where the agent can still run as asked, is warned once
with the nearest name. Run as a user runs the agent: `python -m otel_numa`, no OTEL_* of the test's own."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from otel_numa.testing.peers import agent_command, free_port
from tests.support import REPO, run_cli

MACHINE = "16amd64-4n4c-cgroup-distance-merge"  # hwloc's snapshot: CPUs 0-15 on 4 NUMA nodes


def refused(*args: str, env: dict[str, str] | None = None) -> str:
    """The one line a bad setting gets, after checking the exit status and that nothing was printed."""
    done = run_cli(*args, "--once", env=env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture
def machine(hwloc_root: Callable[[str], tuple[Path, Path]]) -> list[str]:
    sysfs, procfs = hwloc_root(MACHINE)
    return ["--sysfs-root", str(sysfs), "--procfs-root", str(procfs), "--podresources-socket", "none"]


# ---------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--exporters", "otlp"], "otel-numa: unknown flag --exporters; did you mean --exporter?"),
        (
            ["--sysfs_root", "/host/sys"],
            "otel-numa: unknown flag --sysfs_root; did you mean --sysfs-root? (flags are written with",
        ),
        (
            ["--Interval=30"],
            "otel-numa: unknown flag --Interval; did you mean --interval? (flags are written",
        ),
        (["once"], "otel-numa: unknown argument once; did you mean --once?"),
        (["--frobnicate"], "otel-numa: unknown flag --frobnicate; otel-numa --help lists the flags"),
    ],
)
def test_an_unknown_flag_names_the_nearest(args: list[str], line: str) -> None:
    assert refused(*args).startswith(line)


# ---------------------------------------------------------------- the environment


def test_a_misspelt_variable_is_warned_with_the_nearest(machine: list[str]) -> None:
    env = {
        "OTEL_NUMA_EXPORTER": "otlp",  # the setting is OTEL_NUMA_EXPORTERS
        "OTEL_NUMA_INTERVALL": "30",
        "OTEL_NUMA_STACK_AGENT_PORT": "9464",  # scripts/stack.sh's, not the agent's
    }
    done = run_cli(*machine, "--once", env=env)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if " WARNING " in line and "not a setting" in line]
    assert [line.split(": ", 1)[1] for line in warnings] == [
        "OTEL_NUMA_EXPORTER is not a setting of otel-numa and is ignored; did you mean OTEL_NUMA_EXPORTERS?",
        "OTEL_NUMA_INTERVALL is not a setting of otel-numa and is ignored; did you mean OTEL_NUMA_INTERVAL?",
    ], done.stderr


def test_known_variables_are_not_warned(machine: list[str]) -> None:
    env = {"OTEL_NUMA_EXPORTERS": "prometheus", "OTEL_NUMA_INTERVAL": "30", "OTEL_NUMA_ENGINE": "podman"}
    done = run_cli(*machine, "--once", env=env)
    assert done.returncode == 0, done.stderr
    assert "not a setting" not in done.stderr


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        ([], {"OTEL_NUMA_INTERVAL": "x"}, "invalid setting interval (OTEL_NUMA_INTERVAL='x'): "),
        (["--interval", "x"], {}, "invalid setting interval (--interval): "),
        ([], {"OTEL_EXPORTER_OTLP_PROTOCOL": "udp"}, "otlp_protocol (OTEL_EXPORTER_OTLP_PROTOCOL='udp'): "),
    ],
)
def test_a_bad_value_names_where_it_was_written(args: list[str], env: dict[str, str], named: str) -> None:
    assert named in refused(*args, env=env)


def test_a_bad_value_in_the_file_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("interval: x\n")
    assert f"invalid setting interval (in {config}): " in refused("--config", str(config))


# ---------------------------------------------------------------- settings that cannot be right


def test_an_exclusion_that_matches_no_metric_is_refused(machine: list[str]) -> None:
    line = refused(*machine, "--metrics-exclude", "numa_container_*,numa_cpu_alocated")
    assert line == (
        "otel-numa: invalid setting metrics_exclude (--metrics-exclude): 'numa_cpu_alocated' matches no "
        "metric; did you mean numa_cpu_allocated?"
    )
    line = refused(*machine, env={"OTEL_NUMA_METRICS_EXCLUDE": "nothing_like_it"})
    assert "(OTEL_NUMA_METRICS_EXCLUDE='nothing_like_it'): 'nothing_like_it' matches no metric;" in line
    assert "otel-numa --list-metrics lists the names" in line
    done = run_cli(*machine, "--metrics-exclude", "numa_container_*,numa.node.distance", "--once")
    assert done.returncode == 0, done.stderr
    assert "numa_node_distance" not in done.stdout and "numa_container_" not in done.stdout


def test_reserved_cpus_the_machine_lacks_are_refused(machine: list[str]) -> None:
    line = refused(*machine, "--reserved-cpus", "0-1,16-31")
    sysfs = machine[1]
    assert line == (
        "otel-numa: invalid setting reserved_cpus (--reserved-cpus): CPUs 16-31 are not on this machine (it "
        f"has 0-15, {sysfs}/devices/system/cpu/present): give the kubelet's reservedSystemCPUs of this node"
    )
    done = run_cli(*machine, "--reserved-cpus", "0-1", "--once")
    assert done.returncode == 0, done.stderr
    assert "numa_cpu_allocatable{" in done.stdout


@pytest.mark.parametrize(
    ("page", "health"),
    [("0.0.0.0:9464", "127.0.0.1:9464"), ("127.0.0.1:9500", "127.0.0.1:9500"), (":9464", "[::]:9464")],
)
def test_one_port_for_both_servers_is_refused(page: str, health: str) -> None:
    line = refused("--prometheus-address", page, "--health-address", health)
    assert line == (
        f"otel-numa: invalid setting health_address (--health-address): {health} is where prometheus_address "
        f"({page}) serves the page: give /healthz a port of its own (--health-address, 9465 by default)"
    )


# ---------------------------------------------------------------- addresses the agent cannot bind


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NODE_NAME"))}
    return subprocess.run(
        agent_command(*args), capture_output=True, text=True, timeout=60, cwd=REPO, env=env
    )  # fmt: skip


def test_an_address_of_another_machine_is_named_as_such() -> None:
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): never an address of this machine
    done = serve("--prometheus-address", "192.0.2.1:9464", "--health-address", f"127.0.0.1:{free_port()}")
    assert done.returncode == 2, done.stderr
    (error,) = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert error.endswith(
        "cannot listen on 192.0.2.1:9464 (prometheus_address): cannot assign requested address; 192.0.2.1 "
        "is not an address of this machine: give --prometheus-address one of its addresses, or 0.0.0.0:9464 "
        "for all of them"
    ), error


def test_a_taken_port_names_another_process() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        done = serve("--health-address", address, "--prometheus-address", f"127.0.0.1:{free_port()}")
    assert done.returncode == 2, done.stderr
    (error,) = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert error.endswith(
        f"cannot listen on {address} (health_address): address already in use; another process (a second "
        "agent?) listens there: stop it or choose another --health-address"
    ), error
