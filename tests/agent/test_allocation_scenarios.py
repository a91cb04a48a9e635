"""Per-NUMA and per-container allocation from the kubelet's checkpoint files, as an operator scrapes it.

One node, written by hand below: 4 NUMA nodes of 4 CPUs (node n holds CPUs 4n..4n+3), 16 GiB each, 2Mi
and 1Gi hugepage pools; the kubelet runs the static CPU policy, the Static memory manager and device
plugins. Every expected value in this file was worked out by hand from that scenario.

Pods (UIDs end in 01..04):

- shop/web (01): ``app`` CPUs 2-3 (node 0), 1 GiB memory and 256 MiB of 2Mi pages on node 0, gpu0 on
  NUMA 0; ``sidecar`` CPU 4 (node 1), 512 MiB memory on node 1.
- data/db (02): ``postgres`` CPUs 6-7,9-10 (nodes 1 and 2), one 6 GiB memory block and one 2 GiB block of
  1Gi pages, both with numaAffinity [1, 2]; gpu1 on NUMA 1 and vf-3 (a NIC function) with no affinity.
- batch (03, no log directory, so no pod name): ``worker`` CPUs 12-15 (node 3), 2 GiB memory, 512 MiB of
  2Mi pages and 1 GiB of 1Gi pages on node 3; gpu3 on NUMA 3, vf-0 and vf-1 with no affinity, and fpga0,
  which the device plugin lists under NUMA 3 and NUMA 2.
- jobs/old (04): deleted (no ``<kubelet-root>/pods/`` directory, its log directory is still there); its
  stale entries hold CPU 5, 1 GiB of memory on node 1 and gpu2.

The kubelet's reserved CPUs are 0 and 8.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from otel_numa.model import DeviceEntry, MemoryBlock, MemoryTable, NumaMemoryState
from otel_numa.testing.checkpoints import (
    write_atomically,
    write_cpu_manager_state,
    write_device_checkpoint,
    write_memory_manager_state,
)
from otel_numa.testing.kubelet_scenario import (
    NODE_NAME,
    KubeletScenario,
    Labels,
    ScenarioPod,
    build_scenario,
    counted_errors,
    labels,
    series,
)
from otel_numa.testing.peers import run_agent, run_prometheus, wait_for
from otel_numa.testing.sysfs_tree import uniform_nodes

MIB = 1 << 20
GIB = 1 << 30

WEB = "5f0c2d1e-8a4b-4c6d-9e7f-0a1b2c3d4e01"
DB = "5f0c2d1e-8a4b-4c6d-9e7f-0a1b2c3d4e02"
BATCH = "5f0c2d1e-8a4b-4c6d-9e7f-0a1b2c3d4e03"
GONE = "5f0c2d1e-8a4b-4c6d-9e7f-0a1b2c3d4e04"

PODS = (
    ScenarioPod(WEB, "web", "shop"),
    ScenarioPod(DB, "db", "data"),
    ScenarioPod(BATCH),
    ScenarioPod(GONE, "old", "jobs", live=False),
)

RESERVED_CPUS = "0,8"

CPU_ENTRIES = {
    WEB: {"app": {2, 3}, "sidecar": {4}},
    DB: {"postgres": {6, 7, 9, 10}},
    BATCH: {"worker": {12, 13, 14, 15}},
    GONE: {"old": {5}},
}
DEFAULT_CPU_SET = {0, 1, 8, 11}

GPU, NIC, FPGA = "example.com/gpu", "example.com/nic", "example.com/fpga"


def _table(total: int, system_reserved: int, reserved: int) -> MemoryTable:
    allocatable = total - system_reserved
    return MemoryTable(total, system_reserved, allocatable, reserved, allocatable - reserved)


# The kubelet's own bookkeeping: the [1, 2] blocks of postgres are split 4 GiB + 2 GiB (memory) and
# 1 GiB + 1 GiB (1Gi pages) over nodes 1 and 2; the deleted pod's 1 GiB is still reserved on node 1.
MACHINE_STATE = {
    0: NumaMemoryState(
        1,
        (0,),
        {
            "memory": _table(16 * GIB, 1 * GIB, 1 * GIB),
            "hugepages-2Mi": _table(1 * GIB, 0, 256 * MIB),
            "hugepages-1Gi": _table(2 * GIB, 0, 0),
        },
    ),
    1: NumaMemoryState(
        3,
        (1, 2),
        {
            "memory": _table(16 * GIB, 512 * MIB, 512 * MIB + 4 * GIB + 1 * GIB),
            "hugepages-2Mi": _table(1 * GIB, 0, 0),
            "hugepages-1Gi": _table(2 * GIB, 0, 1 * GIB),
        },
    ),
    2: NumaMemoryState(
        1,
        (1, 2),
        {
            "memory": _table(16 * GIB, 0, 2 * GIB),
            "hugepages-2Mi": _table(1 * GIB, 0, 0),
            "hugepages-1Gi": _table(2 * GIB, 0, 1 * GIB),
        },
    ),
    3: NumaMemoryState(
        1,
        (3,),
        {
            "memory": _table(16 * GIB, 0, 2 * GIB),
            "hugepages-2Mi": _table(1 * GIB, 0, 512 * MIB),
            "hugepages-1Gi": _table(2 * GIB, 0, 1 * GIB),
        },
    ),
}

MEMORY_ENTRIES = {
    WEB: {
        "app": [MemoryBlock((0,), "memory", 1 * GIB), MemoryBlock((0,), "hugepages-2Mi", 256 * MIB)],
        "sidecar": [MemoryBlock((1,), "memory", 512 * MIB)],
    },
    DB: {
        "postgres": [MemoryBlock((1, 2), "memory", 6 * GIB), MemoryBlock((1, 2), "hugepages-1Gi", 2 * GIB)],
    },
    BATCH: {
        "worker": [
            MemoryBlock((3,), "memory", 2 * GIB),
            MemoryBlock((3,), "hugepages-2Mi", 512 * MIB),
            MemoryBlock((3,), "hugepages-1Gi", 1 * GIB),
        ],
    },
    GONE: {"old": [MemoryBlock((1,), "memory", 1 * GIB)]},
}

DEVICE_ENTRIES = [
    DeviceEntry(WEB, "app", GPU, {0: ("gpu0",)}),
    DeviceEntry(DB, "postgres", GPU, {1: ("gpu1",)}),
    DeviceEntry(DB, "postgres", NIC, {-1: ("vf-3",)}),
    DeviceEntry(BATCH, "worker", GPU, {3: ("gpu3",)}),
    DeviceEntry(BATCH, "worker", NIC, {-1: ("vf-0", "vf-1")}),
    DeviceEntry(BATCH, "worker", FPGA, {3: ("fpga0",), 2: ("fpga0",)}),
    DeviceEntry(GONE, "old", GPU, {1: ("gpu2",)}),
]
REGISTERED_DEVICES = {
    GPU: ["gpu0", "gpu1", "gpu2", "gpu3"],
    NIC: ["vf-0", "vf-1", "vf-2", "vf-3"],
    FPGA: ["fpga0"],
}

# --- what an operator must see --------------------------------------------------------------------

EXPECTED_CPU_ALLOCATABLE = {  # 4 CPUs per node, minus reserved CPU 0 (node 0) and 8 (node 2)
    labels(numa_node_id=0): 3,
    labels(numa_node_id=1): 4,
    labels(numa_node_id=2): 3,
    labels(numa_node_id=3): 4,
}
EXPECTED_CPU_ALLOCATED = {  # the deleted pod's CPU 5 is not counted
    labels(numa_node_id=0): 2,
    labels(numa_node_id=1): 3,
    labels(numa_node_id=2): 2,
    labels(numa_node_id=3): 4,
}
EXPECTED_MEMORY_ALLOCATABLE = {
    labels(numa_node_id=0): 15 * GIB,
    labels(numa_node_id=1): 15 * GIB + 512 * MIB,
    labels(numa_node_id=2): 16 * GIB,
    labels(numa_node_id=3): 16 * GIB,
}
EXPECTED_MEMORY_ALLOCATED = {  # the machine state, as the kubelet keeps it
    labels(numa_node_id=0): 1 * GIB,
    labels(numa_node_id=1): 5 * GIB + 512 * MIB,
    labels(numa_node_id=2): 2 * GIB,
    labels(numa_node_id=3): 2 * GIB,
}
EXPECTED_HUGEPAGES_ALLOCATABLE = {
    **{labels(numa_node_id=n, k8s_hugepage_size="2Mi"): 1 * GIB for n in range(4)},
    **{labels(numa_node_id=n, k8s_hugepage_size="1Gi"): 2 * GIB for n in range(4)},
}
EXPECTED_HUGEPAGES_ALLOCATED = {
    labels(numa_node_id=0, k8s_hugepage_size="2Mi"): 256 * MIB,
    labels(numa_node_id=1, k8s_hugepage_size="2Mi"): 0,
    labels(numa_node_id=2, k8s_hugepage_size="2Mi"): 0,
    labels(numa_node_id=3, k8s_hugepage_size="2Mi"): 512 * MIB,
    labels(numa_node_id=0, k8s_hugepage_size="1Gi"): 0,
    labels(numa_node_id=1, k8s_hugepage_size="1Gi"): 1 * GIB,
    labels(numa_node_id=2, k8s_hugepage_size="1Gi"): 1 * GIB,
    labels(numa_node_id=3, k8s_hugepage_size="1Gi"): 1 * GIB,
}
EXPECTED_DEVICE_ALLOCATED = {  # fpga0 once, under the lower of its two NUMA ids; gpu2 is stale
    labels(numa_node_id=0, numa_resource_name=GPU): 1,
    labels(numa_node_id=1, numa_resource_name=GPU): 1,
    labels(numa_node_id=3, numa_resource_name=GPU): 1,
    labels(numa_node_id=-1, numa_resource_name=NIC): 3,
    labels(numa_node_id=2, numa_resource_name=FPGA): 1,
}

WEB_APP = labels(k8s_pod_uid=WEB, k8s_container_name="app", k8s_pod_name="web", k8s_namespace_name="shop")
WEB_SIDECAR = labels(
    k8s_pod_uid=WEB, k8s_container_name="sidecar", k8s_pod_name="web", k8s_namespace_name="shop"
)
DB_POSTGRES = labels(
    k8s_pod_uid=DB, k8s_container_name="postgres", k8s_pod_name="db", k8s_namespace_name="data"
)
BATCH_WORKER = labels(k8s_pod_uid=BATCH, k8s_container_name="worker")  # no log directory: no name


def with_numa(container: Labels, numa: int, **extra: str) -> Labels:
    return container | labels(numa_node_id=numa, **extra)


EXPECTED_CONTAINER_CPU = {
    with_numa(WEB_APP, 0): 2,
    with_numa(WEB_SIDECAR, 1): 1,
    with_numa(DB_POSTGRES, 1): 2,
    with_numa(DB_POSTGRES, 2): 2,
    with_numa(BATCH_WORKER, 3): 4,
}
EXPECTED_CONTAINER_MEMORY = {  # postgres' [1, 2] block whole on node 1
    with_numa(WEB_APP, 0): 1 * GIB,
    with_numa(WEB_SIDECAR, 1): 512 * MIB,
    with_numa(DB_POSTGRES, 1): 6 * GIB,
    with_numa(BATCH_WORKER, 3): 2 * GIB,
}
EXPECTED_CONTAINER_HUGEPAGES = {
    with_numa(WEB_APP, 0, k8s_hugepage_size="2Mi"): 256 * MIB,
    with_numa(DB_POSTGRES, 1, k8s_hugepage_size="1Gi"): 2 * GIB,
    with_numa(BATCH_WORKER, 3, k8s_hugepage_size="2Mi"): 512 * MIB,
    with_numa(BATCH_WORKER, 3, k8s_hugepage_size="1Gi"): 1 * GIB,
}
EXPECTED_CONTAINER_DEVICES = {
    with_numa(WEB_APP, 0, numa_resource_name=GPU): 1,
    with_numa(DB_POSTGRES, 1, numa_resource_name=GPU): 1,
    with_numa(DB_POSTGRES, -1, numa_resource_name=NIC): 1,
    with_numa(BATCH_WORKER, 3, numa_resource_name=GPU): 1,
    with_numa(BATCH_WORKER, -1, numa_resource_name=NIC): 2,
    with_numa(BATCH_WORKER, 2, numa_resource_name=FPGA): 1,
}

EXPECTED = {
    "numa_cpu_allocatable": EXPECTED_CPU_ALLOCATABLE,
    "numa_cpu_allocated": EXPECTED_CPU_ALLOCATED,
    "numa_memory_allocatable_bytes": EXPECTED_MEMORY_ALLOCATABLE,
    "numa_memory_allocated_bytes": EXPECTED_MEMORY_ALLOCATED,
    "numa_hugepages_allocatable_bytes": EXPECTED_HUGEPAGES_ALLOCATABLE,
    "numa_hugepages_allocated_bytes": EXPECTED_HUGEPAGES_ALLOCATED,
    "numa_device_allocated": EXPECTED_DEVICE_ALLOCATED,
    "numa_container_cpu_allocated": EXPECTED_CONTAINER_CPU,
    "numa_container_memory_allocated_bytes": EXPECTED_CONTAINER_MEMORY,
    "numa_container_hugepages_allocated_bytes": EXPECTED_CONTAINER_HUGEPAGES,
    "numa_container_device_allocated": EXPECTED_CONTAINER_DEVICES,
}

MEMORY_SERIES = (
    "numa_memory_allocatable_bytes",
    "numa_memory_allocated_bytes",
    "numa_hugepages_allocatable_bytes",
    "numa_hugepages_allocated_bytes",
    "numa_container_memory_allocated_bytes",
    "numa_container_hugepages_allocated_bytes",
)
CPU_SERIES = ("numa_cpu_allocated", "numa_container_cpu_allocated")


def make_node(root: Path) -> KubeletScenario:
    nodes = uniform_nodes(4, 4, mem_total_kib=16 << 20, hugepages={2048: (512, 384), 1048576: (2, 1)})
    return build_scenario(root, nodes, PODS)


def write_cpu(scenario: KubeletScenario) -> bytes:
    return write_cpu_manager_state(scenario.cpu_manager_path, "static", DEFAULT_CPU_SET, CPU_ENTRIES)


def write_memory(scenario: KubeletScenario) -> None:
    write_memory_manager_state(scenario.memory_manager_path, "Static", MACHINE_STATE, MEMORY_ENTRIES)


def write_devices(scenario: KubeletScenario) -> None:
    write_device_checkpoint(scenario.device_checkpoint_path, DEVICE_ENTRIES, REGISTERED_DEVICES)


@pytest.fixture
def node(tmp_path: Path) -> KubeletScenario:
    scenario = make_node(tmp_path)
    write_cpu(scenario)
    write_memory(scenario)
    write_devices(scenario)
    return scenario


def source_errors(text: str) -> dict[Labels, float]:
    return counted_errors(text)


# --- one collection ------------------------------------------------------------------------------


def test_once_exports_every_allocation_series(node: KubeletScenario) -> None:
    text = node.run_once("--reserved-cpus", RESERVED_CPUS)
    for name, expected in EXPECTED.items():
        assert series(text, name) == expected, name
    # every series names the node, and no checkpoint was counted as an error
    assert set(series(text, "numa_cpu_allocated", keep_node_name=True)) == {
        labels(numa_node_id=n, k8s_node_name=NODE_NAME) for n in range(4)
    }
    assert source_errors(text) == {}


def test_without_reserved_cpus_allocatable_cpus_are_unknown(node: KubeletScenario) -> None:
    text = node.exposition()
    assert "numa_cpu_allocatable" not in text
    assert series(text, "numa_cpu_allocated") == EXPECTED_CPU_ALLOCATED


def test_a_deleted_pod_drops_out_and_a_recreated_directory_brings_it_back(node: KubeletScenario) -> None:
    node.remove_pod_directory(BATCH)
    text = node.exposition(reserved_cpus=RESERVED_CPUS)
    assert series(text, "numa_cpu_allocated") == {
        labels(numa_node_id=0): 2,
        labels(numa_node_id=1): 3,
        labels(numa_node_id=2): 2,
        labels(numa_node_id=3): 0,
    }
    assert series(text, "numa_device_allocated") == {
        labels(numa_node_id=0, numa_resource_name=GPU): 1,
        labels(numa_node_id=1, numa_resource_name=GPU): 1,
        labels(numa_node_id=-1, numa_resource_name=NIC): 1,
    }
    for name in ("numa_container_cpu_allocated", "numa_container_memory_allocated_bytes"):
        assert not [key for key in series(text, name) if ("k8s_pod_uid", BATCH) in key], name
    # the memory manager's machine state is authoritative for the per-NUMA totals, stale or not
    assert series(text, "numa_memory_allocated_bytes") == EXPECTED_MEMORY_ALLOCATED

    node.add_pod(ScenarioPod(GONE))
    text = node.exposition(reserved_cpus=RESERVED_CPUS)
    assert series(text, "numa_cpu_allocated")[labels(numa_node_id=1)] == 4
    old = labels(k8s_pod_uid=GONE, k8s_container_name="old", k8s_pod_name="old", k8s_namespace_name="jobs")
    assert series(text, "numa_container_memory_allocated_bytes")[with_numa(old, 1)] == 1 * GIB


def test_memory_manager_policy_none_exports_no_memory_allocation(node: KubeletScenario) -> None:
    # what a kubelet with --memory-manager-policy=None writes: no machine state, no entries
    write_memory_manager_state(node.memory_manager_path, "None", {}, {})
    text = node.exposition(reserved_cpus=RESERVED_CPUS)
    for name in MEMORY_SERIES:
        assert name not in text, name
    assert series(text, "numa_cpu_allocated") == EXPECTED_CPU_ALLOCATED
    assert series(text, "numa_device_allocated") == EXPECTED_DEVICE_ALLOCATED
    assert source_errors(text) == {}


def test_without_any_checkpoint_there_is_no_allocation_series(tmp_path: Path) -> None:
    scenario = make_node(tmp_path)
    text = scenario.exposition()
    for name in EXPECTED:
        assert name not in text, name
    assert "numa_cpu_capacity" in text
    assert source_errors(text) == {}  # a missing checkpoint is a normal state, not an error


def change_a_cpu_set_under_its_checksum(data: bytes) -> bytes:
    return data.replace(b'"postgres":"6-7,9-10"', b'"postgres":"6-7,9-11"')


def truncate(data: bytes) -> bytes:  # a torn write
    return data[: len(data) // 2]


@pytest.mark.parametrize(
    ("corrupt", "error_type"),
    [(change_a_cpu_set_under_its_checksum, "checksum_mismatch"), (truncate, "parse_error")],
)
def test_a_corrupted_cpu_checkpoint_exports_nothing_from_that_file(
    node: KubeletScenario, corrupt: Callable[[bytes], bytes], error_type: str
) -> None:
    valid = node.cpu_manager_path.read_bytes()
    damaged = corrupt(valid)
    assert damaged != valid
    node.cpu_manager_path.write_bytes(damaged)

    text = node.run_once("--reserved-cpus", RESERVED_CPUS)
    for name in CPU_SERIES:
        assert name not in text, name
    assert source_errors(text) == {labels(numa_source="cpu_manager", error_type=error_type): 1}
    # the other files, and what does not come from the cpu manager, are still there
    for name, expected in EXPECTED.items():
        if name not in CPU_SERIES:
            assert series(text, name) == expected, name


# --- a long-running agent ------------------------------------------------------------------------


@pytest.mark.e2e
def test_series_come_back_when_the_kubelet_replaces_a_corrupted_checkpoint(
    node: KubeletScenario, tmp_path: Path
) -> None:
    valid = node.cpu_manager_path.read_bytes()
    corrupted = valid.replace(b'"app":"2-3"', b'"app":"2-4"')
    assert corrupted != valid
    write_atomically(node.cpu_manager_path, corrupted)

    args = node.cli_args("--reserved-cpus", RESERVED_CPUS, "--interval", "1")
    with run_agent(args, tmp_path) as agent:
        text = agent.metrics_text()
        for name in CPU_SERIES:
            assert name not in text, name
        assert series(text, "numa_memory_allocated_bytes") == EXPECTED_MEMORY_ALLOCATED
        errors = source_errors(text)
        assert set(errors) == {labels(numa_source="cpu_manager", error_type="checksum_mismatch")}

        # a later scrape tries the file again and counts the failure again
        again = source_errors(agent.metrics_text())
        assert again[labels(numa_source="cpu_manager", error_type="checksum_mismatch")] > max(errors.values())

        write_cpu(node)  # the kubelet's pattern: a temporary file renamed over the old one
        text = agent.metrics_text()
        assert series(text, "numa_cpu_allocated") == EXPECTED_CPU_ALLOCATED
        assert series(text, "numa_container_cpu_allocated") == EXPECTED_CONTAINER_CPU
        ages = series(text, "numa_agent_source_age_seconds")
        assert 0 <= ages[labels(numa_source="cpu_manager")] < 5

        # the kubelet hands CPU 11 to a new pod: the next scrape shows it
        entries = {**CPU_ENTRIES, WEB: {"app": {2, 3}, "sidecar": {4}, "batch": {11}}}
        write_cpu_manager_state(node.cpu_manager_path, "static", {0, 1, 8}, entries)
        assert series(agent.metrics_text(), "numa_cpu_allocated")[labels(numa_node_id=2)] == 3

        assert agent.stop(signal.SIGTERM) == 0
    assert "Traceback" not in agent.log()


# --- through a real Prometheus -------------------------------------------------------------------


@pytest.mark.e2e
def test_prometheus_scrapes_the_allocation(node: KubeletScenario, tmp_path: Path) -> None:
    args = node.cli_args("--reserved-cpus", RESERVED_CPUS)
    with (
        run_agent(args, tmp_path) as agent,
        run_prometheus(tmp_path, [f"127.0.0.1:{agent.prometheus_port}"]) as prom,
    ):
        wait_for(lambda: prom.query("numa_container_device_allocated"), 30, "the first scrape")
        for name, expected in EXPECTED.items():
            found = {
                frozenset(kv for kv in key if kv[0] not in ("instance", "job", "k8s_node_name")): value
                for key, value in prom.series(name).items()
            }
            assert found == expected, name
        # what an operator asks: exclusive CPUs still free per NUMA node, and devices summed over nodes
        free = prom.series("numa_cpu_allocatable - numa_cpu_allocated")
        assert sorted((dict(key)["numa_node_id"], value) for key, value in free.items()) == [
            ("0", 1),
            ("1", 1),
            ("2", 1),
            ("3", 0),
        ]
        by_resource = prom.series("sum by (numa_resource_name) (numa_device_allocated)")
        assert {dict(key)["numa_resource_name"]: value for key, value in by_resource.items()} == {
            GPU: 3,
            NIC: 3,
            FPGA: 1,
        }
