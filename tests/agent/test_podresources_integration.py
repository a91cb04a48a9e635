"""The agent with the kubelet's podresources API: a real gRPC server on a unix socket (otel_numa/testing),
a synthetic node (2 NUMA nodes: CPUs 0-3 and 4-7), checkpoints written as the kubelet writes them."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_numa.daemon.agent import Agent
from otel_numa.proto import podresources_v1_pb2 as pb
from otel_numa.snapshot.collectors.podresources import ALLOCATABLE_MAX_AGE_S, PodResourcesRefresher
from otel_numa.snapshot.source_status import SourceRegistry
from otel_numa.testing.checkpoints import write_atomically, write_cpu_manager_state
from otel_numa.testing.kubelet_scenario import (
    KubeletScenario,
    ScenarioPod,
    build_scenario,
    counted_errors,
    labels,
    series,
)
from otel_numa.testing.peers import free_port, http_get, run_prometheus, wait_for
from otel_numa.testing.podresources_server import PodResourcesServer, short_socket_dir
from otel_numa.testing.sysfs_tree import uniform_nodes

WEB_UID = "0c8d7f4e-1b2a-4c3d-9e8f-7a6b5c4d3e2f"
DB_UID = "5e4d3c2b-1a09-4f8e-8d7c-6b5a4f3e2d1c"
GiB = 1 << 30


def topology(*numa_ids: int) -> pb.TopologyInfo:
    return pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa_id) for numa_id in numa_ids])


def pod(name: str, namespace: str, *containers: pb.ContainerResources) -> pb.PodResources:
    return pb.PodResources(name=name, namespace=namespace, containers=list(containers))


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    directory = short_socket_dir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def node(tmp_path: Path) -> KubeletScenario:
    return build_scenario(
        tmp_path,
        uniform_nodes(2, 4),
        [ScenarioPod(WEB_UID, "web-0", "shop"), ScenarioPod(DB_UID, "db-0", "data")],
    )


def two_pods() -> list[pb.PodResources]:
    return [
        pod("web-0", "shop", pb.ContainerResources(name="app", cpu_ids=[4, 5])),
        pod("db-0", "data", pb.ContainerResources(name="postgres", cpu_ids=[1])),
    ]


def one_shot(agent: Agent) -> str:
    return agent.exposition_once().decode()


def test_socket_absent_capacity_still_exported(node: KubeletScenario, socket_dir: Path) -> None:
    agent = node.agent(podresources_socket=str(socket_dir / "kubelet.sock"), reserved_cpus="0")
    text = one_shot(agent)
    assert series(text, "numa_cpu_capacity") == {labels(numa_node_id=0): 4, labels(numa_node_id=1): 4}
    # without the API, allocatable comes from the reserved CPUs setting
    assert series(text, "numa_cpu_allocatable") == {labels(numa_node_id=0): 3, labels(numa_node_id=1): 4}
    assert series(text, "numa_container_cpu_allocated") == {}
    assert series(text, "numa_device_capacity") == {}


def test_allocatable_cpus_devices_and_memory_from_the_api(node: KubeletScenario, socket_dir: Path) -> None:
    with PodResourcesServer(socket_dir / "kubelet.sock") as server:
        server.state.allocatable = pb.AllocatableResourcesResponse(
            cpu_ids=[2, 3, 4, 5, 6, 7],
            devices=[
                pb.ContainerDevices(
                    resource_name="nvidia.com/gpu", device_ids=["gpu0"], topology=topology(0)
                ),
                # listed under two NUMA nodes: counted once, under node 0
                pb.ContainerDevices(
                    resource_name="nvidia.com/gpu", device_ids=["gpu1"], topology=topology(1, 0)
                ),
                pb.ContainerDevices(resource_name="example.com/nic", device_ids=["vf0", "vf1"]),
            ],
            memory=[
                pb.ContainerMemory(memory_type="memory", size=6 * GiB, topology=topology(0)),
                pb.ContainerMemory(memory_type="memory", size=7 * GiB, topology=topology(1)),
                pb.ContainerMemory(memory_type="hugepages-2Mi", size=GiB, topology=topology(1)),
            ],
        )
        text = one_shot(node.agent(podresources_socket=str(server.socket_path)))
    assert series(text, "numa_cpu_allocatable") == {labels(numa_node_id=0): 2, labels(numa_node_id=1): 4}
    assert series(text, "numa_device_capacity") == {
        labels(numa_node_id=0, numa_resource_name="nvidia.com/gpu"): 2,
        labels(numa_node_id=-1, numa_resource_name="example.com/nic"): 2,
    }
    # no memory manager checkpoint: allocatable memory and hugepages come from the API
    assert series(text, "numa_memory_allocatable_bytes") == {
        labels(numa_node_id=0): 6 * GiB,
        labels(numa_node_id=1): 7 * GiB,
    }
    assert series(text, "numa_hugepages_allocatable_bytes") == {
        labels(numa_node_id=1, k8s_hugepage_size="2Mi"): GiB
    }


def test_containers_named_through_the_pod_log_directories(node: KubeletScenario, socket_dir: Path) -> None:
    with PodResourcesServer(socket_dir / "kubelet.sock") as server:
        server.state.pods = [
            *two_pods(),
            # no log directory: cannot be joined to a UID, but its CPU still counts per NUMA node
            pod("orphan-0", "shop", pb.ContainerResources(name="app", cpu_ids=[6])),
        ]
        text = one_shot(node.agent(podresources_socket=str(server.socket_path)))
    web = {"k8s_pod_uid": WEB_UID, "k8s_pod_name": "web-0", "k8s_namespace_name": "shop"}
    db = {"k8s_pod_uid": DB_UID, "k8s_pod_name": "db-0", "k8s_namespace_name": "data"}
    assert series(text, "numa_container_cpu_allocated") == {
        labels(**web, k8s_container_name="app", numa_node_id=1): 2,
        labels(**db, k8s_container_name="postgres", numa_node_id=0): 1,
    }
    assert series(text, "numa_cpu_allocated") == {labels(numa_node_id=0): 1, labels(numa_node_id=1): 3}


def test_disagreement_with_the_checkpoint_api_wins_and_is_counted_once(
    node: KubeletScenario, socket_dir: Path
) -> None:
    # the checkpoint gives web-0/app CPUs 2,3 (node 0); the API says 4,5 (node 1)
    write_cpu_manager_state(
        node.cpu_manager_path, "static", {0, 6, 7}, {WEB_UID: {"app": {2, 3}}, DB_UID: {"postgres": {1}}}
    )
    with PodResourcesServer(socket_dir / "kubelet.sock") as server:
        server.state.pods = two_pods()
        agent = node.agent(podresources_socket=str(server.socket_path))
        first = one_shot(agent)
        second = one_shot(agent)  # a second refresh and collection: still one disagreement
    web_app = {"k8s_pod_uid": WEB_UID, "k8s_pod_name": "web-0", "k8s_namespace_name": "shop"}
    for text in (first, second):
        assert (
            series(text, "numa_container_cpu_allocated")[
                labels(**web_app, k8s_container_name="app", numa_node_id=1)
            ]
            == 2
        )
        assert labels(**web_app, k8s_container_name="app", numa_node_id=0) not in series(
            text, "numa_container_cpu_allocated"
        )
        assert series(text, "numa_cpu_allocated") == {labels(numa_node_id=0): 1, labels(numa_node_id=1): 2}
        errors = counted_errors(text)
        assert errors[labels(numa_source="podresources", error_type="disagreement")] == 1


def test_removed_pods_series_disappear_even_with_stale_checkpoint_entries(
    node: KubeletScenario, socket_dir: Path
) -> None:
    write_cpu_manager_state(
        node.cpu_manager_path,
        "static",
        {0, 2, 3, 6, 7},
        {WEB_UID: {"app": {4, 5}}, DB_UID: {"postgres": {1}}},
    )
    with PodResourcesServer(socket_dir / "kubelet.sock") as server:
        server.state.pods = two_pods()
        agent = node.agent(podresources_socket=str(server.socket_path))
        before = series(one_shot(agent), "numa_container_cpu_allocated")
        # db-0 is deleted: the kubelet no longer lists it, its checkpoint entry stays (stale) and so does
        # its directory under pods/ for a while: the API's live pod set decides
        server.state.pods = two_pods()[:1]
        after_text = one_shot(agent)
    after = series(after_text, "numa_container_cpu_allocated")
    assert {dict(key)["k8s_pod_uid"] for key in before} == {WEB_UID, DB_UID}
    assert {dict(key)["k8s_pod_uid"] for key in after} == {WEB_UID}
    assert DB_UID not in after_text
    assert series(after_text, "numa_cpu_allocated") == {labels(numa_node_id=0): 0, labels(numa_node_id=1): 2}


def test_a_thousand_pods_in_one_list_answer(tmp_path: Path, socket_dir: Path) -> None:
    uids = [f"00000000-0000-4000-8000-{index:012d}" for index in range(1000)]
    node = build_scenario(
        tmp_path, uniform_nodes(8, 128), [ScenarioPod(uid, f"job-{i}", "batch") for i, uid in enumerate(uids)]
    )
    with PodResourcesServer(socket_dir / "kubelet.sock") as server:
        server.state.pods = [
            pod(f"job-{i}", "batch", pb.ContainerResources(name="worker", cpu_ids=[i])) for i in range(1000)
        ]
        text = one_shot(node.agent(podresources_socket=str(server.socket_path)))
    per_container = series(text, "numa_container_cpu_allocated")
    assert len(per_container) == 1000
    assert (
        per_container[
            labels(
                k8s_pod_uid=uids[999],
                k8s_pod_name="job-999",
                k8s_namespace_name="batch",
                k8s_container_name="worker",
                numa_node_id=7,
            )
        ]
        == 1
    )
    assert series(text, "numa_cpu_allocated") == {labels(numa_node_id=n): 128 for n in range(8)} | {
        labels(numa_node_id=7): 1000 - 7 * 128
    }


def _wait_for_pod_name(port: int, name: str, timeout_s: float) -> float:
    started = time.monotonic()
    wait_for(
        lambda: f'k8s_pod_name="{name}"' in http_get(f"http://127.0.0.1:{port}/metrics")[1].decode(),
        timeout_s,
        name,
        0.05,
    )
    return time.monotonic() - started


def test_socket_that_appears_later_is_used_within_one_interval(
    node: KubeletScenario, socket_dir: Path
) -> None:
    port = free_port()
    agent = node.agent(
        podresources_socket=str(socket_dir / "kubelet.sock"),
        interval=1.0,
        prometheus_address=f"127.0.0.1:{port}",
    )
    agent.start()
    try:
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and b"numa_cpu_capacity" in body and b"k8s_pod_name" not in body
        time.sleep(2.5)  # the refresher has backed off a few times meanwhile
        with PodResourcesServer(socket_dir / "kubelet.sock") as server:
            server.state.pods = two_pods()
            assert _wait_for_pod_name(port, "web-0", timeout_s=3.0) <= 1.0 + 0.5
    finally:
        agent.stop(timeout_s=2)


def test_slow_kubelet_never_slows_prometheus_scrapes_end_to_end(
    node: KubeletScenario, socket_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    with PodResourcesServer(socket_dir / "kubelet.sock") as server:
        server.state.pods = two_pods()
        agent = node.agent(
            podresources_socket=str(server.socket_path), interval=1.0, prometheus_address=f"127.0.0.1:{port}"
        )
        agent.start()
        try:
            with run_prometheus(tmp_path, [f"127.0.0.1:{port}"], scrape_interval="1s") as prometheus:
                query = 'numa_container_cpu_allocated{k8s_pod_name="web-0"}'
                found = wait_for(lambda: prometheus.series(query), 20, "per-container series in Prometheus")
                # end to end: pod name, namespace and NUMA id as Prometheus stores them
                assert found == {
                    frozenset(
                        {
                            ("job", "otel-numa"),
                            ("instance", f"127.0.0.1:{port}"),
                            ("k8s_node_name", "scenario-node"),
                            ("k8s_pod_uid", WEB_UID),
                            ("k8s_pod_name", "web-0"),
                            ("k8s_namespace_name", "shop"),
                            ("k8s_container_name", "app"),
                            ("numa_node_id", "1"),
                        }
                    ): 2.0
                }
                # now the kubelet takes 10 s per call; the refresher's calls give up after 5 s
                server.state.delay_s = 10.0
                slow_from = time.monotonic()
                durations = []
                while time.monotonic() - slow_from < 6.0:
                    started = time.monotonic()
                    status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout_s=5)
                    durations.append(time.monotonic() - started)
                    assert status == 200 and b'k8s_pod_name="web-0"' in body  # the last good view is kept
                    time.sleep(0.3)
                assert max(durations) < 1.0, durations
                # Prometheus' own measure of its scrapes over the slow period
                wait_for(lambda: server.calls["List"] >= 2, 10, "the refresher to call the slow kubelet")
                scrape = prometheus.series("max_over_time(scrape_duration_seconds[6s])")
                assert scrape and all(value < 1.0 for value in scrape.values()), scrape
                assert all(value == 1.0 for value in prometheus.series("min_over_time(up[6s])").values())
        finally:
            server.state.delay_s = 0
            agent.stop(timeout_s=2)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def settled(path: Path) -> None:
    """As if the directory last changed a minute ago (a change within a second is not trusted)."""
    past = time.time() - 60
    os.utime(path, (past, past))


def gpus(count: int) -> pb.AllocatableResourcesResponse:
    return pb.AllocatableResourcesResponse(
        devices=[
            pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[f"gpu{i}"], topology=topology(0))
            for i in range(count)
        ]
    )


def test_allocatable_is_asked_again_when_the_kubelet_or_a_device_plugin_changes(
    tmp_path: Path, socket_dir: Path
) -> None:
    """GetAllocatableResources changes only when a device plugin registers, leaves or reports other devices
    (the kubelet rewrites its device checkpoint) or the kubelet restarts: List is asked every round, it only
    then, and at least every ALLOCATABLE_MAX_AGE_S."""
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    settled(plugins)
    clock = Clock()
    with PodResourcesServer(socket_dir / "kubelet.sock") as server:
        server.state.allocatable = gpus(1)
        refresher = PodResourcesRefresher(
            server.socket_path, SourceRegistry(), 15.0, clock=clock, device_plugins=plugins
        )

        def allocated_gpus() -> int:
            refresher.refresh()
            assert refresher.latest is not None and refresher.latest.allocatable is not None
            return len(refresher.latest.allocatable.devices)

        assert [allocated_gpus() for _ in range(3)] == [1, 1, 1]
        assert server.calls["List"] == 3 and server.calls["GetAllocatableResources"] == 1
        # a plugin registers (its socket in the directory) and reports a second GPU
        server.state.allocatable = gpus(2)
        (plugins / "nvidia-gpu.sock").touch()
        assert allocated_gpus() == 2  # changed within the last second: asked
        settled(plugins)
        assert allocated_gpus() == 2
        calls = server.calls["GetAllocatableResources"]
        assert allocated_gpus() == 2 and server.calls["GetAllocatableResources"] == calls
        # a device turns unhealthy: the kubelet replaces its checkpoint
        server.state.allocatable = gpus(1)
        write_atomically(plugins / "kubelet_internal_checkpoint", b"{}")
        settled(plugins / "kubelet_internal_checkpoint")
        settled(plugins)
        assert allocated_gpus() == 1
        # no sign at all: still asked once its answer is ALLOCATABLE_MAX_AGE_S old
        server.state.allocatable = gpus(3)
        assert allocated_gpus() == 1
        clock.now += ALLOCATABLE_MAX_AGE_S
        assert allocated_gpus() == 3
        refresher.close()
    # the kubelet restarts: a new socket
    with PodResourcesServer(socket_dir / "kubelet.sock") as restarted:
        restarted.state.allocatable = gpus(4)
        assert allocated_gpus() == 4
        refresher.close()
