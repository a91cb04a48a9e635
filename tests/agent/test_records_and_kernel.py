"""Records and reality: what the allocators recorded (checkpoints, podresources, CDI) beside what the kernel
enforces (cgroup cpusets), on the nodes of otel_numa.testing.records_node.

Machine: 2 NUMA nodes of 8 CPUs (node 0: CPUs 0-7, node 1: CPUs 8-15). Every expected number below is worked
out from the node's description in records_node: db holds CPUs 2-5 (4 on node 0) and 1 GiB on node 0, cache
CPUs 8-9 (2 on node 1) and 1 GiB on node 1; the two web pods share the pool; pause sandboxes run anywhere
and have no name, so they are never counted.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from otel_numa.testing.dra_drivers import write_cpu_spec
from otel_numa.testing.kubelet_scenario import Labels, counted_errors, labels, series
from otel_numa.testing.peers import run_agent, run_prometheus, wait_for
from otel_numa.testing.podresources_server import PodResourcesServer, short_socket_dir
from otel_numa.testing.records_node import (
    INFER_CLAIM,
    TRAINER_CLAIM,
    DeviceMode,
    RecordsNode,
    dra_node,
    static_node,
)
from tests.support import REPO

GIB = 1 << 30
MIB = 1 << 20
RULES = REPO / "config" / "prometheus" / "otel-numa.rules.yaml"


def container(node: RecordsNode, pod: str, **more: str | int) -> Labels:
    return frozenset(node.containers[pod].labels().items()) | labels(**more)


def per_numa(text: str, name: str) -> dict[int, float]:
    return {int(dict(key)["numa_node_id"]): value for key, value in series(text, name).items()}


def mismatches(text: str) -> dict[tuple[str, str], float]:
    """(container, kind) -> numa_container_allocation_mismatch."""
    return {
        (dict(key)["k8s_pod_name"], dict(key)["numa_resource_kind"]): value
        for key, value in series(text, "numa_container_allocation_mismatch").items()
    }


def page(node: RecordsNode, socket: str = "none") -> str:
    return node.scenario.exposition(**node.settings_values(socket))


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    directory = short_socket_dir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


# --- a static CPU manager node, four ways ------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "driver"), [("v2", "systemd"), ("v2", "cgroupfs"), ("v1", "cgroupfs"), ("v1", "systemd")]
)
def test_records_and_kernel_agree(tmp_path: Path, layout: str, driver: str) -> None:
    node = static_node(tmp_path, "agree", layout=layout, driver=driver)  # type: ignore[arg-type]
    text = page(node)

    assert per_numa(text, "numa_cpu_allocated") == {0: 4, 1: 2}
    assert per_numa(text, "numa_cpu_pinned") == {0: 4, 1: 2}
    # every recorded container agrees, on both kinds; the shared pool has no record and no series
    assert mismatches(text) == {
        ("db-0", "cpu"): 0,
        ("db-0", "memory"): 0,
        ("cache-0", "cpu"): 0,
        ("cache-0", "memory"): 0,
    }
    assert counted_errors(text) == {}


def test_a_widened_cpuset_mismatches_and_pinned_drops(tmp_path: Path) -> None:
    text = page(static_node(tmp_path, "widened"))

    assert per_numa(text, "numa_cpu_allocated") == {0: 4, 1: 2}  # the records did not change
    assert per_numa(text, "numa_cpu_pinned") == {0: 0, 1: 2}  # CPUs 2-5 are no longer db's alone
    assert mismatches(text) == {
        ("db-0", "cpu"): 1,
        ("db-0", "memory"): 1,
        ("cache-0", "cpu"): 0,
        ("cache-0", "memory"): 0,
    }


def test_a_kubelet_restarted_with_an_empty_state_file(tmp_path: Path) -> None:
    text = page(static_node(tmp_path, "restarted"))

    assert per_numa(text, "numa_cpu_allocated") == {0: 0, 1: 0}
    assert per_numa(text, "numa_cpu_pinned") == {0: 4, 1: 2}  # the containers kept their cpusets
    # no CPU record to compare any more; the memory manager's records still agree
    assert mismatches(text) == {("db-0", "memory"): 0, ("cache-0", "memory"): 0}
    assert series(text, "numa_container_cpu_allocated") == {}


def test_an_nri_pinned_container_without_a_record(tmp_path: Path) -> None:
    node = static_node(tmp_path, "nri")
    text = page(node)

    assert per_numa(text, "numa_cpu_allocated") == {0: 4, 1: 2}
    assert per_numa(text, "numa_cpu_pinned") == {0: 4, 1: 4}  # CPUs 12-13 are nri-0's alone
    assert not any(pod == "nri-0" for pod, _kind in mismatches(text))
    assert not any(
        dict(key)["k8s_pod_name"] == "nri-0" for key in series(text, "numa_container_cpu_allocated")
    )
    # the kernel's view of it is there
    nodes = series(text, "numa_container_cpuset_nodes")
    assert any(key >= container(node, "nri-0", numa_cpu_node_ids="1") for key in nodes)


# --- DRA CPU and memory drivers -----------------------------------------------------------------------

DEVICE_MODES = ["individual", "grouped"]


@pytest.mark.parametrize("mode", DEVICE_MODES)
def test_dra_cpu_claims_count_as_cpus_on_their_numa_nodes(
    tmp_path: Path, socket_dir: Path, mode: DeviceMode
) -> None:
    node = dra_node(tmp_path, mode)
    with PodResourcesServer(socket_dir / "kubelet.sock") as server:
        server.state.pods = node.podresources
        text = page(node, str(server.socket_path))

    # trainer's claim names CPUs 2-5; infer's is dynamic: its cgroup's CPUs 9-11
    assert per_numa(text, "numa_cpu_allocated") == {0: 4, 1: 3}
    assert per_numa(text, "numa_cpu_pinned") == {0: 4, 1: 3}
    assert series(text, "numa_container_cpu_allocated") == {
        container(node, "trainer-0", numa_node_id=0): 4,
        container(node, "infer-0", numa_node_id=1): 3,
    }
    # CPUs and memory are no devices: only the GPUs are
    devices = series(text, "numa_device_allocated")
    assert devices == {labels(numa_node_id=0, numa_resource_name="gpu.example.com"): 2}
    assert all(
        dict(key)["numa_resource_name"] == "gpu.example.com"
        for key in series(text, "numa_container_device_allocated")
    )
    # the memory claim: 1 GiB and 512 MiB of 2 MiB pages on node 0
    assert per_numa(text, "numa_memory_allocated_bytes") == {0: GIB, 1: 0}
    assert series(text, "numa_container_memory_allocated_bytes") == {
        container(node, "trainer-0", numa_node_id=0): GIB
    }
    assert series(text, "numa_container_hugepages_allocated_bytes") == {
        container(node, "trainer-0", numa_node_id=0, k8s_hugepage_size="2Mi"): 512 * MIB
    }
    # trainer's record agrees with its cgroup; infer's CPUs are its cgroup's, so nothing to compare
    assert mismatches(text) == {("trainer-0", "cpu"): 0, ("trainer-0", "memory"): 0}
    # trainer: CPUs, memory and GPU on node 0; infer: CPUs on node 1, GPU on node 0
    assert series(text, "numa_container_aligned") == {
        container(node, "trainer-0"): 1,
        container(node, "infer-0"): 0,
    }
    assert counted_errors(text) == {}


def test_dra_claims_from_the_checkpoint_alone(tmp_path: Path) -> None:
    """Without podresources the checkpoint names pods, not containers: per-NUMA totals only, and a dynamic
    claim's CPUs cannot be told (no container to read a cgroup of)."""
    node = dra_node(tmp_path, "individual")
    text = page(node)
    assert series(text, "numa_cpu_allocated") == {}
    assert per_numa(text, "numa_memory_allocated_bytes") == {0: GIB, 1: 0}
    assert series(text, "numa_container_cpu_allocated") == {}
    assert per_numa(text, "numa_cpu_pinned") == {0: 4, 1: 3}

    write_cpu_spec(node.cdi_root, INFER_CLAIM, "9-11")  # the claim names its cpuset after all
    text = page(node)
    assert per_numa(text, "numa_cpu_allocated") == {0: 4, 1: 3}


@pytest.mark.parametrize(
    ("value", "error_type"), [("2-5,abc", "invalid_spec"), ("2-5,99", "out_of_range"), ("", "invalid_spec")]
)
def test_a_dra_cpuset_that_is_not_a_cpuset_is_never_trusted(
    tmp_path: Path, socket_dir: Path, value: str, error_type: str
) -> None:
    node = dra_node(tmp_path, "individual")
    write_cpu_spec(node.cdi_root, TRAINER_CLAIM, value)
    node.set_cpuset("trainer-0", "2-6")  # the kernel's set, which then counts
    with PodResourcesServer(socket_dir / "kubelet.sock") as server:
        server.state.pods = node.podresources
        text = page(node, str(server.socket_path))

    assert per_numa(text, "numa_cpu_allocated") == {0: 5, 1: 3}
    assert series(text, "numa_container_cpu_allocated")[container(node, "trainer-0", numa_node_id=0)] == 5
    assert ("trainer-0", "cpu") not in mismatches(text)  # its CPUs are the kernel's: nothing to compare
    assert counted_errors(text) == {labels(numa_source="cdi", error_type=error_type): 1}


# --- bad cpuset files --------------------------------------------------------------------------------

BAD_CPUSETS = {  # what the file holds, and how it is counted
    "empty": ("", "corrupt"),
    "garbage": ("two-five\n", "corrupt"),
    "CPUs the machine lacks": ("2-5,64\n", "out_of_range"),
    "changing while being read": ("2-", "corrupt"),  # a rewrite caught half-way: no whole line
}


@pytest.mark.parametrize(("content", "error_type"), BAD_CPUSETS.values(), ids=BAD_CPUSETS.keys())
def test_a_bad_cpuset_costs_only_its_containers_kernel_view_for_that_round(
    tmp_path: Path, content: str, error_type: str
) -> None:
    node = static_node(tmp_path, "agree")
    agent = node.scenario.agent(**node.settings_values())
    good = agent.exposition_once().decode()
    assert per_numa(good, "numa_cpu_pinned") == {0: 4, 1: 2}

    node.cpuset_file("db-0").write_text(content)
    text = agent.exposition_once().decode()
    # db's cpusets are unknown this round: no comparison for it, and its CPUs are pinned by nobody known
    assert mismatches(text) == {("cache-0", "cpu"): 0, ("cache-0", "memory"): 0}
    assert per_numa(text, "numa_cpu_pinned") == {0: 0, 1: 2}
    # everything else of db stays: its records and its memory
    assert per_numa(text, "numa_cpu_allocated") == {0: 4, 1: 2}
    memory = series(text, "numa_container_memory_usage_bytes")
    assert memory[container(node, "db-0", numa_node_id=0, numa_memory_type="anon")] == 64 * MIB
    assert counted_errors(text) == {labels(numa_source="cgroup", error_type=error_type): 1}

    node.set_cpuset("db-0", "2-5")  # the next round reads it whole again
    text = agent.exposition_once().decode()
    assert per_numa(text, "numa_cpu_pinned") == {0: 4, 1: 2}
    assert mismatches(text)[("db-0", "cpu")] == 0


# --- a real Prometheus ---------------------------------------------------------------------------------


def test_prometheus_sees_the_drift_and_the_alert_fires(tmp_path: Path) -> None:
    """The shipped rule, with its 5 minutes cut to 2 seconds so that a test can wait for it."""
    node = static_node(tmp_path, "widened")
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "OtelNumaAllocationMismatch":
                rule["for"] = "2s"
    rule_file = tmp_path / "rules.yaml"
    rule_file.write_text(yaml.safe_dump(rules))
    with (
        run_agent(node.cli_args("--interval", "1"), tmp_path) as agent,
        run_prometheus(tmp_path, [f"127.0.0.1:{agent.prometheus_port}"], rule_files=[rule_file]) as prom,
    ):
        firing = wait_for(
            lambda: prom.series('ALERTS{alertname="OtelNumaAllocationMismatch",alertstate="firing"}'),
            60,
            "the mismatch alert to fire",
        )
        pinned = prom.series("numa_cpu_pinned")
        allocated = prom.series("numa_cpu_allocated")

    fired = {(dict(key)["k8s_pod_name"], dict(key)["numa_resource_kind"]) for key in firing}
    assert fired == {("db-0", "cpu"), ("db-0", "memory")}
    (one,) = [dict(key) for key in firing if dict(key)["numa_resource_kind"] == "cpu"]
    assert one["severity"] == "warning" and one["k8s_node_name"] == "scenario-node"
    assert one["k8s_container_name"] == "db" and one["k8s_namespace_name"] == "shop"
    assert {dict(key)["numa_node_id"]: value for key, value in pinned.items()} == {"0": 0, "1": 2}
    assert {dict(key)["numa_node_id"]: value for key, value in allocated.items()} == {"0": 4, "1": 2}
