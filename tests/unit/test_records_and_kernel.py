"""The parts of records-against-the-kernel on their own: the DRA CPU and memory drivers' CDI values as their
releases write them (otel_numa.testing.dra_drivers), and the count of CPUs pinned to one pod."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_numa.accounting.kernel_view import mismatch, pinned_per_node
from otel_numa.model import ContainerMemory, NumaNode, Topology
from otel_numa.sources.cdi import parse_cdi_spec
from otel_numa.sources.dra_drivers import claim_cpus, claim_memory
from otel_numa.sources.errors import SourceCorrupt, SourceError
from otel_numa.testing.dra_drivers import (
    MemoryAllocation,
    cpu_spec_bytes,
    cpu_spec_file_name,
    memory_spec_bytes,
)

UID = "8ec6fd12-bb08-4936-a857-866f50153c21"
MACHINE = frozenset(range(128))
TWO_NODES = Topology(
    nodes=(NumaNode(0, frozenset(range(8)), {}), NumaNode(1, frozenset(range(8, 16)), {})),
    online_cpus=frozenset(range(16)),
    numa_enabled=True,
    overlapping_cpus=frozenset(),
)


# --- the CPU driver ---------------------------------------------------------------------------------


def test_the_cpu_drivers_spec_gives_the_claims_cpus() -> None:
    spec = parse_cdi_spec(cpu_spec_bytes(UID, "4-5,68-69"), Path("/var/run/cdi") / cpu_spec_file_name(UID))
    (device,) = spec.devices
    assert device.name == f"dra.k8s.io/cpu=claim-{UID}"
    assert claim_cpus(device.env, MACHINE) == frozenset({4, 5, 68, 69})


def test_a_dynamic_or_missing_cpuset_names_no_cpus() -> None:
    assert claim_cpus([f"DRA_CPUSET_{UID}=dynamic"], MACHINE) is None
    assert claim_cpus(["OTHER=1"], MACHINE) is None
    assert claim_cpus([], MACHINE) is None
    # two claims' entries on one device (never written so, but a union if they are)
    assert claim_cpus(["DRA_CPUSET_a=0-1", "DRA_CPUSET_b=3"], MACHINE) == frozenset({0, 1, 3})


@pytest.mark.parametrize(
    ("value", "error_type"),
    [
        ("", "invalid_spec"),
        ("0-3,", "invalid_spec"),
        (" 0-3", "invalid_spec"),
        ("3-1", "invalid_spec"),
        ("0-3,abc", "invalid_spec"),
        ("0-200", "out_of_range"),
        ("999999999999", "out_of_range"),
    ],
)
def test_a_value_that_is_not_a_cpuset_of_the_machine_is_never_trusted(value: str, error_type: str) -> None:
    with pytest.raises(SourceCorrupt) as raised:
        claim_cpus([f"DRA_CPUSET_{UID}={value}"], MACHINE)
    assert raised.value.error_type == error_type
    assert value not in str(raised.value) or not value  # the value is never quoted


@settings(max_examples=300, deadline=None)
@given(value=st.text(max_size=40))
def test_any_value_is_a_cpuset_or_an_error(value: str) -> None:
    try:
        found = claim_cpus([f"DRA_CPUSET_{UID}={value}"], MACHINE)
    except SourceError:
        return
    assert found is None or found <= MACHINE


# --- the memory driver ------------------------------------------------------------------------------


def test_the_memory_drivers_spec_gives_the_claims_blocks() -> None:
    data = memory_spec_bytes(
        [
            (UID, [MemoryAllocation("memory", 1, "2Gi"), MemoryAllocation("hugepages-1Gi", 1, "4Gi")]),
            ("c2", [MemoryAllocation("hugepages-2Mi", 0, "512Mi")]),
        ]
    )
    spec = parse_cdi_spec(data, Path("/var/run/cdi/dra.memory.json"))
    devices = {device.name: device for device in spec.devices}
    assert claim_memory(devices[f"dra.k8s.io/memory=claim-{UID}"].env, {0, 1}) == (
        ContainerMemory("memory", 2 << 30, (1,)),
        ContainerMemory("hugepages-1Gi", 4 << 30, (1,)),
    )
    assert claim_memory(devices["dra.k8s.io/memory=claim-c2"].env, {0, 1}) == (
        ContainerMemory("hugepages-2Mi", 512 << 20, (0,)),
    )


@pytest.mark.parametrize(
    ("env", "error_type"),
    [
        ([f"DRAMEMORY_{UID}_memory=numanode:1,size:lots"], "invalid_spec"),
        ([f"DRAMEMORY_{UID}_memory=numanode:7,size:1Gi"], "out_of_range"),
        ([f"DRAMEMORY_{UID}_memory=numanode:0,size:1Gi", f"DRAMEMORY_{UID}_NUMANodes=0,1"], "invalid_spec"),
        ([f"DRAMEMORY_{UID}_memory=numanode:0,size:1Gi", f"DRAMEMORY_{UID}_NUMANodes=9"], "out_of_range"),
        (["DRAMEMORY_memory=numanode:0,size:1Gi"], "invalid_spec"),
    ],
)
def test_a_memory_value_out_of_shape_is_never_trusted(env: list[str], error_type: str) -> None:
    with pytest.raises(SourceCorrupt) as raised:
        claim_memory(env, {0, 1})
    assert raised.value.error_type == error_type


def test_sizes_as_kubernetes_writes_quantities_and_resources_of_later_releases() -> None:
    env = [
        f"DRAMEMORY_{UID}_memory=numanode:0,size:1048576",
        f"DRAMEMORY_{UID}_hugepages_64Ki=numanode:0,size:128Ki",
        f"DRAMEMORY_{UID}_memoryfuture=numanode:0,size:1Gi",
    ]
    assert claim_memory(env, {0}) == (
        ContainerMemory("memory", 1 << 20, (0,)),
        ContainerMemory("hugepages-64Ki", 128 << 10, (0,)),
    )


# --- the kernel's view ------------------------------------------------------------------------------


def test_pinned_cpus_are_those_of_exactly_one_pod() -> None:
    shared = frozenset({0, 1, 6, 7, 10, 11, 12, 13, 14, 15})
    cpusets = [
        ("web-0", shared),
        ("web-1", shared),
        ("db-0", frozenset({2, 3, 4, 5})),
        ("cache-0", frozenset({8})),
        ("cache-0", frozenset({9})),  # its two containers: their union
        ("twins-0", frozenset({15})),  # on a shared CPU: not pinned
    ]
    assert pinned_per_node(cpusets, TWO_NODES) == {0: 4, 1: 2}
    assert pinned_per_node([], TWO_NODES) == {0: 0, 1: 0}


@settings(max_examples=200, deadline=None)
@given(
    cpusets=st.lists(
        st.tuples(st.sampled_from("abcde"), st.frozensets(st.integers(0, 15), min_size=1)), max_size=12
    )
)
def test_pinned_cpus_agree_with_the_definition(cpusets: list[tuple[str, frozenset[int]]]) -> None:
    pods_of = {cpu: {pod for pod, cpus in cpusets if cpu in cpus} for cpu in range(16)}
    expected = {node.id: sum(1 for cpu in node.cpus if len(pods_of[cpu]) == 1) for node in TWO_NODES.nodes}
    assert pinned_per_node(cpusets, TWO_NODES) == expected


def test_mismatch_needs_a_record_and_a_cpuset() -> None:
    assert mismatch(frozenset({2, 3}), frozenset({2, 3})) is False
    assert mismatch(frozenset({2, 3}), frozenset({0, 1, 2, 3})) is True
    assert mismatch(frozenset(), frozenset({1})) is None
    assert mismatch(frozenset({1}), None) is None
