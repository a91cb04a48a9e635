"""Every query of the Grafana dashboard, with its variables filled in, returns data from a real Prometheus
scraping the agent on fixture data: a real machine's sysfs (16amd64-4n4c) with the demo's PCI functions,
the demo kubelet state of config/demo (checkpoints, pod and container names, cgroups) and a podresources
test server that knows the demo's pods, their pod-level resources and devices. Also: the committed demo
state is what config/demo/generate.py writes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_numa.testing.demo import DEMO, demo_podresources_state
from otel_numa.testing.peers import Prometheus, http_get, run_agent, run_prometheus, run_rotel, wait_for
from otel_numa.testing.podresources_server import PodResourcesServer
from tests.support import REPO

pytestmark = pytest.mark.e2e

DASHBOARD = REPO / "config" / "grafana" / "dashboards" / "otel-numa.json"
NODE = "dashboard-node"
RATE_WINDOW = "15s"


def dashboard_queries() -> tuple[list[str], list[tuple[str, str | None]]]:
    """(variable queries, [(panel expr, repeat variable)])."""
    dashboard = json.loads(DASHBOARD.read_text())
    variables = [v["query"] for v in dashboard["templating"]["list"] if v.get("type") == "query"]
    targets: list[tuple[str, str | None]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                targets.append((target["expr"], panel.get("repeat")))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    return [str(v) if isinstance(v, str) else str(v["query"]) for v in variables], targets


def fill(expr: str, values: dict[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        return values[match.group(1) or match.group(2)]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", substitute, expr)


@pytest.fixture
def demo_copy(tmp_path: Path) -> Iterator[Path]:
    """The demo state, plus one unreadable sysfs file so the error panel has something to count."""
    copy = tmp_path / "demo"
    shutil.copytree(DEMO, copy, symlinks=True)
    yield copy


def test_every_dashboard_query_returns_data(
    tmp_path: Path, demo_copy: Path, hwloc_root: Callable[[str], tuple[Path, Path]]
) -> None:
    sysfs, procfs = hwloc_root("16amd64-4n4c-cgroup-distance-merge")
    # the snapshot has no PCI bus: the demo's PCI functions, written for this machine's layout
    shutil.copytree(demo_copy / "sysfs" / "bus", sysfs / "bus", symlinks=True, dirs_exist_ok=True)
    # an unreadable per-node file: counted under numa_agent_source_errors_total, the rest keeps flowing
    numastat = sysfs / "devices/system/node/node3/numastat"
    numastat.unlink()
    numastat.mkdir()
    with PodResourcesServer(state=demo_podresources_state()) as server:
        args = [
            "--sysfs-root", str(sysfs), "--procfs-root", str(procfs), "--node-name", NODE,
            "--kubelet-root", str(demo_copy / "kubelet"), "--pod-logs-root", str(demo_copy / "pod-logs"),
            "--container-logs-root", str(demo_copy / "container-logs"),
            "--cgroup-root", str(demo_copy / "cgroup"),
            "--podresources-socket", str(server.socket_path), "--interval", "1", "--reserved-cpus", "0-1",
            "--exporter", "prometheus,otlp",  # pushing, for the push panels
        ]  # fmt: skip
        with (
            run_rotel(tmp_path) as rotel,
            run_agent([*args, "--otlp-endpoint", f"http://127.0.0.1:{rotel.grpc_port}"], tmp_path) as agent,
            run_prometheus(tmp_path, [f"127.0.0.1:{agent.prometheus_port}"]) as prom,
        ):
            wait_for(lambda: prom.query("numa_container_memory_locality"), 40, "container series")
            wait_for(lambda: prom.query("rate(numa_cpu_time_seconds_total[15s])"), 30, "two scrapes")
            check_queries(prom)


def check_queries(prom: Prometheus) -> None:
    variables, targets = dashboard_queries()
    values = {"job": "otel-numa", "node": NODE, "datasource": "prometheus", "__rate_interval": RATE_WINDOW}
    for query in variables:
        match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", fill(query, {**values, "hugepage_size": ".*"}))
        assert match, query
        status, body = http_get(
            f"http://127.0.0.1:{prom.port}/api/v1/label/{match.group(2)}/values?match[]="
            + _quote(match.group(1))
        )
        assert status == 200 and json.loads(body)["data"], f"variable query returned nothing: {query}"
    repeats = {
        "hugepage_size": ["2Mi"],
        "resource": ["intel.com/qat", "example.com/sriov-vf", "nvidia.com/gpu"],
    }
    empty = []
    for expr, repeat in targets:
        for value in repeats.get(repeat or "", [""]):
            filled = fill(expr, {**values, "hugepage_size": value, "resource": value})
            if not prom.query(filled):
                empty.append(filled)
    assert not empty, "queries without data:\n" + "\n".join(empty)


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def tree(root: Path) -> dict[str, str | bytes]:
    """Relative path -> file bytes, or the target of a symbolic link."""
    found: dict[str, str | bytes] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            found[name] = str(path.readlink())
        elif path.is_file():
            found[name] = path.read_bytes()
    return found


def test_demo_state_is_what_generate_writes(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(DEMO / "generate.py"), str(tmp_path)], check=True, cwd=REPO, timeout=60
    )
    for name in ("kubelet", "pod-logs", "container-logs", "cgroup"):
        assert tree(tmp_path / name) == tree(DEMO / name), name


def test_device_variable_has_values_without_podresources(
    tmp_path: Path, demo_copy: Path, hwloc_root: Callable[[str], tuple[Path, Path]]
) -> None:
    """On a node without podresources the device checkpoint still names the resources."""
    sysfs, procfs = hwloc_root("16amd64-4n4c-cgroup-distance-merge")
    args = [
        "--sysfs-root", str(sysfs), "--procfs-root", str(procfs), "--node-name", NODE,
        "--kubelet-root", str(demo_copy / "kubelet"), "--pod-logs-root", str(demo_copy / "pod-logs"),
        "--podresources-socket", "none", "--interval", "1",
    ]  # fmt: skip
    variables = json.loads(DASHBOARD.read_text())["templating"]["list"]
    (query,) = [v["query"] for v in variables if v["name"] == "resource"]
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", fill(query, {"job": "otel-numa", "node": NODE}))
    assert match, query
    with (
        run_agent(args, tmp_path) as agent,
        run_prometheus(tmp_path, [f"127.0.0.1:{agent.prometheus_port}"]) as prom,
    ):
        wait_for(lambda: prom.query("numa_device_allocated"), 40, "device series")
        assert not prom.query("numa_device_capacity")  # podresources is the only source of capacity
        status, body = http_get(
            f"http://127.0.0.1:{prom.port}/api/v1/label/{match.group(2)}/values?match[]="
            + _quote(match.group(1))
        )
    assert status == 200
    assert set(json.loads(body)["data"]) >= {"nvidia.com/gpu", "example.com/sriov-vf"}
