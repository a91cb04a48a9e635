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

from otel_numa.proto import podresources_v1_pb2 as pb
from otel_numa.testing.peers import Prometheus, http_get, run_agent, run_prometheus, wait_for
from otel_numa.testing.podresources_server import PodResourcesServer, PodResourcesState
from tests.paths import REPO

pytestmark = pytest.mark.e2e

DEMO = REPO / "config" / "demo"
DASHBOARD = REPO / "config" / "grafana" / "dashboards" / "otel-numa.json"
NODE = "dashboard-node"
RATE_WINDOW = "15s"

# The demo's pods (config/demo/generate.py) as the kubelet's podresources API would list them.
GIB, MIB = 1024**3, 1024**2
Device = tuple[str, str, list[int]]  # resource, device id, NUMA ids
Memory = tuple[str, int, list[int]]  # type, bytes, NUMA ids
Container = tuple[str, list[int], list[Device], list[Memory]]  # name, exclusive CPUs, devices, memory
DEMO_PODS: list[tuple[str, str, list[Container]]] = [
    ("default", "web-0", [("app", [], [("intel.com/qat", "qat-0000:3d:00.1", [])], [])]),
    (
        "trading",
        "matcher-0",
        [
            (
                "engine",
                [4, 5, 6, 7],
                [("example.com/sriov-vf", "0000:5e:02.3", [1])],
                [("memory", 2 * GIB, [1]), ("hugepages-2Mi", 256 * MIB, [1])],
            )
        ],
    ),
    (
        "ml",
        "trainer-0",
        [
            (
                "train",
                [10, 11, 12, 13],
                [("nvidia.com/gpu", "GPU-4f5e6d7c", [2])],
                [("memory", 4 * GIB, [2, 3])],
            )
        ],
    ),
    (
        "db",
        "postgres-0",
        [
            (
                "postgres",
                [2, 3],
                [("example.com/sriov-vf", "0000:5e:02.4", [1])],
                [("memory", 1 * GIB, [0])],
            )
        ],
    ),
]
# Pod-level exclusive resources (namespace, pod) -> (CPUs, memory): postgres-0's container takes them all.
POD_LEVEL: dict[tuple[str, str], tuple[list[int], list[Memory]]] = {
    ("db", "postgres-0"): ([2, 3], [("memory", 1 * GIB, [0])]),
}
ALLOCATABLE_DEVICES: list[Device] = [
    ("intel.com/qat", "qat-0000:3d:00.1", []),
    ("intel.com/qat", "qat-0000:3d:00.2", []),
    ("example.com/sriov-vf", "0000:5e:02.3", [1]),
    ("example.com/sriov-vf", "0000:5e:02.4", [1]),
    ("nvidia.com/gpu", "GPU-4f5e6d7c", [2]),
    ("nvidia.com/gpu", "GPU-8a9b0c1d", [3]),
]


def _devices(resource: str, device: str, numa: list[int]) -> pb.ContainerDevices:
    topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in numa]) if numa else None
    return pb.ContainerDevices(resource_name=resource, device_ids=[device], topology=topology)


def _memory(memory: list[Memory]) -> list[pb.ContainerMemory]:
    return [
        pb.ContainerMemory(
            memory_type=kind, size=size, topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in numa])
        )
        for kind, size, numa in memory
    ]


def demo_podresources_state() -> PodResourcesState:
    pods = [
        pb.PodResources(
            name=name,
            namespace=namespace,
            cpu_ids=POD_LEVEL.get((namespace, name), ([], []))[0],
            memory=_memory(POD_LEVEL.get((namespace, name), ([], []))[1]),
            containers=[
                pb.ContainerResources(
                    name=container,
                    cpu_ids=cpus,
                    devices=[_devices(*d) for d in devices],
                    memory=_memory(memory),
                )
                for container, cpus, devices, memory in containers
            ],
        )
        for namespace, name, containers in DEMO_PODS
    ]
    allocatable = pb.AllocatableResourcesResponse(
        cpu_ids=list(range(2, 16)), devices=[_devices(*d) for d in ALLOCATABLE_DEVICES]
    )
    return PodResourcesState(pods=pods, allocatable=allocatable)


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
        ]  # fmt: skip
        with (
            run_agent(args, tmp_path) as agent,
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
