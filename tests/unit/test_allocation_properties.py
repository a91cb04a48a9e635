"""Damaged checkpoints never crash the agent and never leak allocation from a file that does not verify.

One agent runs for the whole module over a small node: 2 NUMA nodes (CPUs 0-3 and 4-7), one live pod with
containers ``a`` and ``b`` and one deleted pod, with valid cpu, memory and device checkpoints. Each example
replaces one of the three files (as the kubelet does, by rename) with a damaged copy and collects once.

The property: a single damage either leaves what the file means unchanged (a member name in another case,
a byte of the untrusted copy beside a v4 ``data``, ...) and the file's series are exactly the hand-written
ones below, or the file is rejected: none of its series this round, one more error counted for its
source. The other two files' series are unaffected. The agent itself never raises.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from otel_numa.model import DeviceEntry, MemoryBlock, MemoryTable, NumaMemoryState
from otel_numa.pipeline import build_pipeline
from otel_numa.testing.checkpoints import (
    cpu_manager_state_bytes,
    device_checkpoint_bytes,
    memory_manager_state_bytes,
)
from otel_numa.testing.kubelet_scenario import (
    KubeletScenario,
    Labels,
    Samples,
    ScenarioPod,
    build_scenario,
    counted_errors,
    labels,
    parse_exposition,
    series,
)
from otel_numa.testing.sysfs_tree import uniform_nodes

MIB = 1 << 20
GIB = 1 << 30
POD = "0c9a7e52-3b1f-4d8e-a6c2-5e4f3a2b1c01"
DELETED = "0c9a7e52-3b1f-4d8e-a6c2-5e4f3a2b1c02"
GPU = "example.com/gpu"

CPU_ENTRIES = {POD: {"a": {1, 2}, "b": {5}}, DELETED: {"x": {6}}}
MACHINE_STATE = {
    0: NumaMemoryState(
        1,
        (0,),
        {
            "memory": MemoryTable(8 * GIB, 0, 8 * GIB, 1 * GIB, 7 * GIB),
            "hugepages-2Mi": MemoryTable(512 * MIB, 0, 512 * MIB, 128 * MIB, 384 * MIB),
        },
    ),
    1: NumaMemoryState(
        2,
        (1,),
        {
            "memory": MemoryTable(8 * GIB, 0, 8 * GIB, 2 * GIB, 6 * GIB),
            "hugepages-2Mi": MemoryTable(512 * MIB, 0, 512 * MIB, 0, 512 * MIB),
        },
    ),
}
MEMORY_ENTRIES = {
    POD: {
        "a": [MemoryBlock((0,), "memory", 1 * GIB), MemoryBlock((0,), "hugepages-2Mi", 128 * MIB)],
        "b": [MemoryBlock((1,), "memory", 1 * GIB)],
    },
    DELETED: {"x": [MemoryBlock((1,), "memory", 1 * GIB)]},
}
DEVICE_ENTRIES = [
    DeviceEntry(POD, "a", GPU, {0: ("g0",)}),
    DeviceEntry(POD, "b", GPU, {1: ("g1",), 0: ("g1",)}),
    DeviceEntry(DELETED, "x", GPU, {1: ("g2",)}),
]

A = labels(k8s_pod_uid=POD, k8s_container_name="a")
B = labels(k8s_pod_uid=POD, k8s_container_name="b")

# What each file means once verified, by hand (the deleted pod counts nowhere but in the machine state).
EXPECTED_BY_SOURCE: dict[str, dict[str, dict[Labels, float]]] = {
    "cpu_manager": {
        "numa_cpu_allocated": {labels(numa_node_id=0): 2, labels(numa_node_id=1): 1},
        "numa_container_cpu_allocated": {A | labels(numa_node_id=0): 2, B | labels(numa_node_id=1): 1},
    },
    "memory_manager": {
        "numa_memory_allocatable_bytes": {labels(numa_node_id=0): 8 * GIB, labels(numa_node_id=1): 8 * GIB},
        "numa_memory_allocated_bytes": {labels(numa_node_id=0): 1 * GIB, labels(numa_node_id=1): 2 * GIB},
        "numa_hugepages_allocatable_bytes": {
            labels(numa_node_id=0, k8s_hugepage_size="2Mi"): 512 * MIB,
            labels(numa_node_id=1, k8s_hugepage_size="2Mi"): 512 * MIB,
        },
        "numa_hugepages_allocated_bytes": {
            labels(numa_node_id=0, k8s_hugepage_size="2Mi"): 128 * MIB,
            labels(numa_node_id=1, k8s_hugepage_size="2Mi"): 0,
        },
        "numa_container_memory_allocated_bytes": {
            A | labels(numa_node_id=0): 1 * GIB,
            B | labels(numa_node_id=1): 1 * GIB,
        },
        "numa_container_hugepages_allocated_bytes": {
            A | labels(numa_node_id=0, k8s_hugepage_size="2Mi"): 128 * MIB,
        },
    },
    "device_manager": {  # g1 is listed under NUMA 1 and 0: counted once, under 0
        "numa_device_allocated": {labels(numa_node_id=0, numa_resource_name=GPU): 2},
        "numa_container_device_allocated": {
            A | labels(numa_node_id=0, numa_resource_name=GPU): 1,
            B | labels(numa_node_id=0, numa_resource_name=GPU): 1,
        },
    },
}

LAYOUTS = {
    "cpu_manager": ("v2", "v3", "v4"),
    "memory_manager": ("v2", "v3"),
    "device_manager": ("v2",),
}


def valid_bytes(source: str, layout: str) -> bytes:
    if source == "cpu_manager":
        return cpu_manager_state_bytes("static", {0, 3, 4, 7}, CPU_ENTRIES, layout=layout)
    if source == "memory_manager":
        return memory_manager_state_bytes("Static", MACHINE_STATE, MEMORY_ENTRIES, layout=layout)
    return device_checkpoint_bytes(DEVICE_ENTRIES, {GPU: ["g0", "g1", "g2", "g3"]})


@dataclass
class Node:
    scenario: KubeletScenario
    registry: CollectorRegistry  # the agent's Prometheus page: each scrape is one collection
    errors: dict[str, float]  # numa_agent_source_errors_total by source, as of the last scrape

    def scrape(self) -> str:
        return generate_latest(self.registry).decode()

    def path(self, source: str) -> Path:
        return {
            "cpu_manager": self.scenario.cpu_manager_path,
            "memory_manager": self.scenario.memory_manager_path,
            "device_manager": self.scenario.device_checkpoint_path,
        }[source]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = tmp_path_factory.mktemp("properties")
    scenario = build_scenario(
        root,
        uniform_nodes(2, 4, hugepages={2048: (256, 192)}),
        [ScenarioPod(POD), ScenarioPod(DELETED, live=False)],
    )
    agent = scenario.agent()
    pipeline = build_pipeline(agent.options, agent.store, exporters=("prometheus",))
    assert pipeline.registry is not None
    node = Node(scenario, pipeline.registry, dict.fromkeys(EXPECTED_BY_SOURCE, 0.0))
    for source in EXPECTED_BY_SOURCE:
        replace_file(node.path(source), valid_bytes(source, "v2"))
    yield node
    pipeline.shutdown(timeout_s=1)


def replace_file(path: Path, data: bytes) -> None:
    """The kubelet's rename over the old file (a new inode each time), without its fsync, for speed."""
    temporary = path.with_name(f".{path.name}.new")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def errors_of(text: str | Samples, source: str) -> float:
    errors = counted_errors(text)
    return sum(count for key, count in errors.items() if ("numa_source", source) in key)


def check_damaged_file(node: Node, source: str, layout: str, damaged: bytes) -> None:
    replace_file(node.path(source), damaged)
    try:
        text = node.scrape()  # raises if anything but a SourceError escaped a reader
    finally:
        replace_file(node.path(source), valid_bytes(source, layout))

    samples = parse_exposition(text)
    found = {name: series(samples, name) for name in EXPECTED_BY_SOURCE[source]}
    counted = errors_of(samples, source) - node.errors[source]
    node.errors[source] = errors_of(samples, source)
    if found == EXPECTED_BY_SOURCE[source]:
        assert counted == 0, "a file that verified was counted as an error"
    else:
        # rejected whole: not one of its series, not even a stale one from the previous round
        assert found == {name: {} for name in found}, f"series from a file that does not verify: {found}"
        assert counted == 1, "a rejected file is counted once per collection"
    for other, expected in EXPECTED_BY_SOURCE.items():
        if other != source:
            for name, values in expected.items():
                assert series(samples, name) == values, name


sources = st.sampled_from(sorted(EXPECTED_BY_SOURCE))


@st.composite
def source_and_layout(draw: st.DrawFn) -> tuple[str, str]:
    source = draw(sources)
    return source, draw(st.sampled_from(LAYOUTS[source]))


# Byte-level damage: what a torn write, a bad disk or a stray editor does.


def _flip_bit(data: bytes, draw: st.DrawFn) -> bytes:
    index = draw(st.integers(0, len(data) - 1))
    bit = draw(st.integers(0, 7))
    return data[:index] + bytes([data[index] ^ (1 << bit)]) + data[index + 1 :]


def _replace_byte(data: bytes, draw: st.DrawFn) -> bytes:
    index = draw(st.integers(0, len(data) - 1))
    value = draw(st.integers(0, 255).filter(lambda v: v != data[index]))
    return data[:index] + bytes([value]) + data[index + 1 :]


def _change_digit(data: bytes, draw: st.DrawFn) -> bytes:
    positions = [i for i, byte in enumerate(data) if 0x30 <= byte <= 0x39]
    index = draw(st.sampled_from(positions))
    digit = draw(st.sampled_from([d for d in b"0123456789" if d != data[index]]))
    return data[:index] + bytes([digit]) + data[index + 1 :]


def _delete_span(data: bytes, draw: st.DrawFn) -> bytes:
    start = draw(st.integers(0, len(data) - 1))
    length = draw(st.integers(1, 16))
    return data[:start] + data[start + length :]


def _insert_bytes(data: bytes, draw: st.DrawFn) -> bytes:
    index = draw(st.integers(0, len(data)))
    return data[:index] + draw(st.binary(min_size=1, max_size=8)) + data[index:]


def _truncate(data: bytes, draw: st.DrawFn) -> bytes:
    return data[: draw(st.integers(0, len(data) - 1))]


BYTE_DAMAGE: list[Callable[[bytes, st.DrawFn], bytes]] = [
    _flip_bit,
    _replace_byte,
    _change_digit,
    _delete_span,
    _insert_bytes,
    _truncate,
]


@st.composite
def byte_damage(draw: st.DrawFn) -> tuple[str, str, bytes]:
    source, layout = draw(source_and_layout())
    data = valid_bytes(source, layout)
    damage = draw(st.sampled_from(BYTE_DAMAGE))
    return source, layout, damage(data, draw)


# Structural damage: valid JSON whose members or values were changed (what a buggy writer or a kubelet of
# another version might leave). The stored checksum is never set to 0 (which the kubelet accepts unchecked).

json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**65), 2**65),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["", "0-1", "1-2", "5", "3-2", "a", "-1", "memory", "hugepages-2Mi", "g1", "b"]),
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)

Path_ = tuple[Any, ...]


def _paths(value: Any, prefix: Path_ = ()) -> Iterator[Path_]:
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _paths(inner, (*prefix, index))


def _replace(value: Any, path: Path_, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replace(copy[head], rest, new)
    return copy


def _delete(value: Any, path: Path_) -> Any:
    head, rest = path[0], path[1:]
    if not rest:
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if k != head}
        return [v for i, v in enumerate(value) if i != head]
    if isinstance(value, dict):
        return {**value, head: _delete(value[head], rest)}
    copy = list(value)
    copy[head] = _delete(copy[head], rest)
    return copy


def _is_checksum(path: Path_) -> bool:
    return bool(path) and isinstance(path[-1], str) and path[-1].lower() in ("checksum", "datachecksum")


@st.composite
def structural_damage(draw: st.DrawFn) -> tuple[str, str, bytes]:
    source, layout = draw(source_and_layout())
    document = json.loads(valid_bytes(source, layout))
    paths = list(_paths(document))
    action = draw(st.sampled_from(["replace", "delete", "add member"]))
    if action == "replace":
        path = draw(st.sampled_from(paths[1:]))
        new = draw(json_values.filter(lambda v: not (_is_checksum(path) and v in (0, None))))
        document = _replace(document, path, new)
    elif action == "delete":  # a missing checksum would read as 0
        path = draw(st.sampled_from([p for p in paths[1:] if not _is_checksum(p)]))
        document = _delete(document, path)
    else:
        parent = draw(st.sampled_from([p for p in paths if isinstance(_at(document, p), dict)]))
        names = ["entries", "Entries", "machineState", "PodUID", "DeviceIDs", "x", "0", "-1"]
        member = {draw(st.sampled_from(names)): draw(json_values)}
        document = _replace(document, parent, {**_at(document, parent), **member})
    return source, layout, json.dumps(document, separators=(",", ":")).encode()


def _at(value: Any, path: Path_) -> Any:
    for step in path:
        value = value[step]
    return value


PROPERTY_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@PROPERTY_SETTINGS
@given(case=byte_damage())
def test_byte_damage_never_crashes_nor_leaks_allocation(node: Node, case: tuple[str, str, bytes]) -> None:
    check_damaged_file(node, *case)


@PROPERTY_SETTINGS
@given(case=structural_damage())
def test_structural_damage_never_crashes_nor_leaks_allocation(
    node: Node, case: tuple[str, str, bytes]
) -> None:
    check_damaged_file(node, *case)


@pytest.mark.parametrize("source", sorted(EXPECTED_BY_SOURCE))
def test_the_undamaged_node_exports_the_hand_written_series(node: Node, source: str) -> None:
    # the reference of every property above, checked once for each layout
    for layout in LAYOUTS[source]:
        replace_file(node.path(source), valid_bytes(source, layout))
        text = node.scrape()
        for name, expected in EXPECTED_BY_SOURCE[source].items():
            assert series(text, name) == expected, (layout, name)
        assert errors_of(text, source) == node.errors[source]
    replace_file(node.path(source), valid_bytes(source, "v2"))
