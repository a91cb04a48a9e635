"""A pinned pod whose memory is not where the kubelet put it, seen the way an operator would alert on it.

The node, written by hand: 2 NUMA nodes of 4 CPUs (node 0: CPUs 0-3, node 1: CPUs 4-7), 16 GiB each, the
static CPU policy and the Static memory manager, cgroup v2 with the systemd driver.

- trading/matcher-0, container ``engine`` (Guaranteed): exclusive CPUs 4-5 and a 2 GiB memory block on
  NUMA 1. Its cgroup's effective mems still span both nodes, and ``memory.numa_stat`` shows 300 MiB of
  its 1000 MiB of anon memory (and 30 of its 100 MiB of page cache) on NUMA 0. Resident memory is
  anon + file = 1100 MiB, 770 MiB of it on NUMA 1: locality 770 / 1100 = 0.7. Its kernel stacks
  (8 MiB, all on NUMA 0) are kernel memory and do not count.
- default/web-0, container ``app`` (Burstable): the shared pool 0-3,6-7 on both nodes, mems 0-1: not
  confined, so no locality; its 3 s of CPU time split 4:2 over the nodes: 2 s on NUMA 0, 1 s on NUMA 1.
"""

from __future__ import annotations

import json
from pathlib import Path

from otel_numa.model import MemoryBlock, MemoryTable, NumaMemoryState
from otel_numa.testing.cgroup_tree import FakeContainer, FakePod, fake_container_id, write_cgroup_tree
from otel_numa.testing.checkpoints import write_cpu_manager_state, write_memory_manager_state
from otel_numa.testing.kubelet_scenario import KubeletScenario, ScenarioPod, build_scenario, labels, series
from otel_numa.testing.peers import run_agent, run_prometheus, wait_for
from otel_numa.testing.sysfs_tree import uniform_nodes
from tests.support import REPO

MIB = 1 << 20
GIB = 1 << 30

MATCHER = "7a1e0c52-4b8d-4e3f-9a60-1c2d3e4f5a01"
WEB = "7a1e0c52-4b8d-4e3f-9a60-1c2d3e4f5a02"
ENGINE_ID = fake_container_id("engine")
APP_ID = fake_container_id("app")

ENGINE = labels(
    k8s_pod_uid=MATCHER, k8s_pod_name="matcher-0", k8s_namespace_name="trading", k8s_container_name="engine"
)
APP = labels(k8s_pod_uid=WEB, k8s_pod_name="web-0", k8s_namespace_name="default", k8s_container_name="app")

# The alert an operator would write: a container whose resident memory is less than 90% local.
ALERT_EXPR = "numa_container_memory_locality < 0.9"
DASHBOARD = REPO / "config" / "grafana" / "dashboards" / "otel-numa.json"


def _table(total: int, reserved: int) -> MemoryTable:
    return MemoryTable(total, 0, total, reserved, total - reserved)


def _node(tmp_path: Path) -> tuple[KubeletScenario, Path, Path]:
    scenario = build_scenario(
        tmp_path,
        uniform_nodes(2, 4),
        [ScenarioPod(MATCHER, "matcher-0", "trading"), ScenarioPod(WEB, "web-0")],
    )
    write_cpu_manager_state(
        scenario.cpu_manager_path, "static", {0, 1, 2, 3, 6, 7}, {MATCHER: {"engine": {4, 5}}}
    )
    write_memory_manager_state(
        scenario.memory_manager_path,
        "Static",
        {
            0: NumaMemoryState(0, (0,), {"memory": _table(16 * GIB, 0)}),
            1: NumaMemoryState(1, (1,), {"memory": _table(16 * GIB, 2 * GIB)}),
        },
        {MATCHER: {"engine": [MemoryBlock((1,), "memory", 2 * GIB)]}},
    )
    engine_memory = {
        "anon": {0: 300 * MIB, 1: 700 * MIB},
        "file": {0: 30 * MIB, 1: 70 * MIB},
        "kernel_stack": {0: 8 * MIB, 1: 0},
        "shmem": {0: 0, 1: 0},
        "active_anon": {0: 300 * MIB, 1: 700 * MIB},
        "inactive_file": {0: 30 * MIB, 1: 70 * MIB},
    }
    pods = [
        FakePod(
            MATCHER,
            "guaranteed",
            (
                FakeContainer(fake_container_id("pause-1"), {"anon": {0: 4096}}, "4-5", "0-1", 1000, True),
                FakeContainer(ENGINE_ID, engine_memory, cpus="4-5", mems="0-1", cpu_usage_usec=42_000_000),
            ),
        ),
        FakePod(
            WEB,
            "burstable",
            (FakeContainer(APP_ID, {"anon": {0: 64 * MIB, 1: 0}}, "0-3,6-7", "0-1", 3_000_000),),
        ),
    ]
    cgroup, logs = tmp_path / "cgroup", tmp_path / "containers"
    write_cgroup_tree(cgroup, "v2", "systemd", pods)
    logs.mkdir()
    for pod, namespace, container, container_id in (
        ("matcher-0", "trading", "engine", ENGINE_ID),
        ("web-0", "default", "app", APP_ID),
    ):
        (logs / f"{pod}_{namespace}_{container}-{container_id}.log").symlink_to(
            f"/var/log/pods/{namespace}_{pod}/{container}/0.log"
        )
    return scenario, cgroup, logs


def test_once_shows_the_remote_memory(tmp_path: Path) -> None:
    scenario, cgroup, logs = _node(tmp_path)
    text = scenario.run_once(
        "--cgroup-root", str(cgroup), "--container-logs-root", str(logs),
        "--container-memory-types", "anon,file,kernel_stack,shmem",
    )  # fmt: skip

    assert series(text, "numa_container_memory_locality") == {ENGINE: 0.7}
    usage = series(text, "numa_container_memory_usage_bytes")
    assert usage[ENGINE | labels(numa_node_id=0, numa_memory_type="anon")] == 300 * MIB
    assert usage[ENGINE | labels(numa_node_id=1, numa_memory_type="anon")] == 700 * MIB
    assert usage[ENGINE | labels(numa_node_id=0, numa_memory_type="kernel_stack")] == 8 * MIB
    # nodes where a container has none of a type are left out (the file lists them as 0)
    assert ENGINE | labels(numa_node_id=1, numa_memory_type="kernel_stack") not in usage
    assert not any(dict(key)["numa_memory_type"] == "shmem" for key in usage)
    # what the kubelet meant, beside it
    assert series(text, "numa_container_memory_allocated_bytes")[ENGINE | labels(numa_node_id=1)] == 2 * GIB
    info = series(text, "numa_container_cpuset_nodes")
    assert info == {
        ENGINE | labels(numa_cpu_node_ids="1", numa_memory_node_ids="0,1", numa_locality_node_ids="1"): 1,
        APP | labels(numa_cpu_node_ids="0,1", numa_memory_node_ids="0,1"): 1,
    }
    cpu = series(text, "numa_container_cpu_time_seconds_total")
    assert cpu == {
        ENGINE | labels(numa_node_id=1): 42.0,
        APP | labels(numa_node_id=0): 2.0,
        APP | labels(numa_node_id=1): 1.0,
    }


def test_prometheus_alert_expression_finds_the_container(tmp_path: Path) -> None:
    scenario, cgroup, logs = _node(tmp_path)
    args = scenario.cli_args(
        "--cgroup-root", str(cgroup), "--container-logs-root", str(logs), "--interval", "1"
    )
    with (
        run_agent(args, tmp_path) as agent,
        run_prometheus(tmp_path, [f"127.0.0.1:{agent.prometheus_port}"]) as prometheus,
    ):
        firing = wait_for(lambda: prometheus.series(ALERT_EXPR), 30, "the locality alert expression to match")
        dashboard = {expr: prometheus.series(expr) for expr in _dashboard_locality_queries()}

    (labelset,) = firing
    assert firing[labelset] == 0.7
    found = dict(labelset)
    assert {key: found[key] for key in ("k8s_pod_name", "k8s_namespace_name", "k8s_container_name")} == {
        "k8s_pod_name": "matcher-0",
        "k8s_namespace_name": "trading",
        "k8s_container_name": "engine",
    }
    assert found["k8s_node_name"] == "scenario-node" and found["job"] == "otel-numa"
    # the dashboard's locality panel and least-local table, as Grafana would send them
    assert len(dashboard) == 2
    for answer in dashboard.values():
        assert [(dict(key)["k8s_container_name"], value) for key, value in answer.items()] == [
            ("engine", 0.7)
        ]


def _dashboard_locality_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    queries = [
        target["expr"]
        for panel in panels
        for target in panel.get("targets", [])
        if "numa_container_memory_locality" in target["expr"]
    ]
    return [q.replace("$job", "otel-numa").replace("$node", "scenario-node") for q in queries]
