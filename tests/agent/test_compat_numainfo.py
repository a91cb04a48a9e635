"""``--compat numainfo``: numainfo_exporter's series, with its meaning, for dashboards built on it.

numainfo_exporter reports per NUMA node (label ``numanode="node%02d"`` of the node id) its CPUs
(``type="capacity"``) and the CPUs the cpu manager handed out exclusively (``type="allocation"``), the
latter only when some CPU is exclusively allocated (its exporter sent nothing rather than a misleading 0,
including when ``cpu_manager_state`` could not be read).

The node (by hand): NUMA ids 0, 1, 3 and 12 (sparse); node 0 holds CPUs 0-5, node 1 CPUs 6-9, node 3 is
memory only, node 12 holds CPUs 10-11. Exclusive CPUs: 1-3 (node 0), 7 (node 1), 10-11 (node 12), and
CPU 4 held by a deleted pod, which counts nowhere (as for numa_cpu_allocated).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_numa.testing.checkpoints import write_cpu_manager_state
from otel_numa.testing.kubelet_scenario import (
    NODE_NAME,
    KubeletScenario,
    ScenarioPod,
    build_scenario,
    labels,
    series,
)
from otel_numa.testing.sysfs_tree import NodeSpec

POD = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c01"
OTHER = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c02"
DELETED = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c03"

GIB_KIB = 1 << 20


def core_count(numanode: str, kind: str) -> frozenset[tuple[str, str]]:
    return labels(node=NODE_NAME, numanode=numanode, type=kind)


CAPACITY = {
    core_count("node00", "capacity"): 6,
    core_count("node01", "capacity"): 4,
    core_count("node03", "capacity"): 0,
    core_count("node12", "capacity"): 2,
}
ALLOCATION = {
    core_count("node00", "allocation"): 3,
    core_count("node01", "allocation"): 1,
    core_count("node03", "allocation"): 0,
    core_count("node12", "allocation"): 2,
}


@pytest.fixture
def node(tmp_path: Path) -> KubeletScenario:
    nodes = [
        NodeSpec(0, cpus=range(6), mem_total_kib=8 * GIB_KIB, mem_free_kib=4 * GIB_KIB),
        NodeSpec(1, cpus=range(6, 10), mem_total_kib=8 * GIB_KIB, mem_free_kib=4 * GIB_KIB),
        NodeSpec(3, mem_total_kib=16 * GIB_KIB, mem_free_kib=16 * GIB_KIB),
        NodeSpec(12, cpus=(10, 11), mem_total_kib=8 * GIB_KIB, mem_free_kib=4 * GIB_KIB),
    ]
    return build_scenario(
        tmp_path, nodes, [ScenarioPod(POD), ScenarioPod(OTHER), ScenarioPod(DELETED, live=False)]
    )


def write_static_policy(node: KubeletScenario) -> None:
    entries = {POD: {"a": {1, 2, 3}, "b": {7}}, OTHER: {"c": {10, 11}}, DELETED: {"old": {4}}}
    write_cpu_manager_state(node.cpu_manager_path, "static", {0, 5, 6, 8, 9}, entries)


def test_numainfo_series_with_the_cpu_manager_state(node: KubeletScenario) -> None:
    write_static_policy(node)
    text = node.run_once("--compat", "numainfo")
    assert series(text, "numainfo_node_count") == {labels(node=NODE_NAME): 4}
    assert series(text, "numainfo_core_count") == {**CAPACITY, **ALLOCATION}
    versions = series(text, "numainfo_version")
    assert list(versions.values()) == [1]
    assert ("version", "1") in next(iter(versions))


def test_without_cpu_manager_state_there_is_no_allocation(node: KubeletScenario) -> None:
    text = node.exposition(compat="numainfo")
    assert series(text, "numainfo_core_count") == CAPACITY
    assert series(text, "numainfo_node_count") == {labels(node=NODE_NAME): 4}


def test_a_corrupted_cpu_manager_state_gives_no_allocation(node: KubeletScenario) -> None:
    write_static_policy(node)
    node.cpu_manager_path.write_bytes(node.cpu_manager_path.read_bytes().replace(b'"c":"10-11"', b'"c":"10"'))
    text = node.exposition(compat="numainfo")
    assert series(text, "numainfo_core_count") == CAPACITY


def test_the_none_policy_hands_out_no_exclusive_cpu(node: KubeletScenario) -> None:
    # numainfo_exporter sent allocation series only when its allocation map was not empty
    write_cpu_manager_state(node.cpu_manager_path, "none", range(12), {})
    text = node.exposition(compat="numainfo")
    assert series(text, "numainfo_core_count") == CAPACITY


def test_numainfo_series_only_on_request(node: KubeletScenario) -> None:
    write_static_policy(node)
    text = node.exposition()
    assert "numainfo_" not in text
    assert series(text, "numa_cpu_allocated") == {
        labels(numa_node_id=0): 3,
        labels(numa_node_id=1): 1,
        labels(numa_node_id=3): 0,
        labels(numa_node_id=12): 2,
    }
