"""A root that holds none of what it should (a mis-mounted DaemonSet) warns once, names its flag, and
shows as numa_agent_source_success 0 instead of a healthy-looking page with nothing on it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from otel_numa.testing.fault_sweep import parse, run_once
from otel_numa.testing.peers import run_agent


def success(text: str) -> dict[str, float]:
    return {
        dict(labels)["numa_source"]: value
        for (name, labels), value in parse(text).items()
        if name == "numa_agent_source_success"
    }


def test_empty_roots_warn_once_and_fail_their_sources(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    args = [
        *("--sysfs-root", str(empty), "--kubelet-root", str(empty), "--cgroup-root", str(empty)),
        *("--podresources-socket", "none", "--node-name", "wrong"),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "otel_numa", "--once", *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if " WARNING " in line]
    assert len(warnings) == 3, done.stderr
    for flag, sources in (
        ("--sysfs-root", "sysfs"),
        ("--kubelet-root", "cpu_manager, device_manager, memory_manager"),
        ("--cgroup-root", "cgroup"),
    ):
        (line,) = [line for line in warnings if flag in line]
        assert str(empty) in line and f"success is 0 for {sources}" in line
    assert success(done.stdout) == {
        "sysfs": 0,
        "cpu_manager": 0,
        "memory_manager": 0,
        "device_manager": 0,
        "cgroup": 0,
    }


def test_a_real_tree_has_no_wrong_root(
    hwloc_root: Callable[[str], tuple[Path, Path]], tmp_path: Path
) -> None:
    sysfs, procfs = hwloc_root("16amd64-4n4c-cgroup-distance-merge")
    absent = tmp_path / "absent"  # no kubelet and no cgroups here: absent, not wrong
    status, text = run_once(
        [
            *("--sysfs-root", str(sysfs), "--procfs-root", str(procfs), "--kubelet-root", str(absent)),
            *("--cgroup-root", str(absent), "--podresources-socket", "none", "--node-name", "right"),
        ]
    )
    assert status == 0
    assert success(text) == {"sysfs": 1, "procfs": 1}


def test_a_serving_agent_keeps_reporting_the_wrong_root(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with run_agent(["--sysfs-root", str(empty), "--interval", "1"], tmp_path) as agent:
        first = success(agent.metrics_text())
        second = success(agent.metrics_text())
        log = agent.log()
    assert first["sysfs"] == second["sysfs"] == 0
    assert log.count("holds no devices/system") == 1, log
