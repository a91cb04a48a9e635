"""Pure functions from the sources' values to per-NUMA and per-container quantities."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from otel_numa.sources.sysfs import HugepagePool, NodeMemory, Topology

NO_NUMA = -1  # numa.node.id of a device with no NUMA affinity

HugepageKey = tuple[int, str]  # (numa id, k8s.hugepage.size)
DeviceKey = tuple[int, str]  # (numa id, numa.resource.name)


@dataclass(frozen=True, slots=True)
class MachineUsage:
    topology: Topology
    memory: Mapping[int, NodeMemory]
    hugepages: Mapping[int, tuple[HugepagePool, ...]]
    numastat: Mapping[int, Mapping[str, int]]
    cpu_time: Mapping[int, Mapping[str, float]]  # numa id -> cpu.mode -> seconds


@dataclass(frozen=True, slots=True)
class ContainerRef:
    pod_uid: str
    container_name: str
    pod_name: str | None = None
    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    container: ContainerRef
    cpus: Mapping[int, int] = field(default_factory=dict)
    memory_bytes: Mapping[int, int] = field(default_factory=dict)
    hugepages_bytes: Mapping[HugepageKey, int] = field(default_factory=dict)
    devices: Mapping[DeviceKey, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Allocation:
    """What the kubelet may hand out and has handed out; ``None`` means unknown (no series), never 0."""

    cpu_allocatable: Mapping[int, int] | None = None
    cpu_allocated: Mapping[int, int] | None = None
    memory_allocatable: Mapping[int, int] | None = None
    memory_allocated: Mapping[int, int] | None = None
    hugepages_allocatable: Mapping[HugepageKey, int] | None = None
    hugepages_allocated: Mapping[HugepageKey, int] | None = None
    device_capacity: Mapping[DeviceKey, int] | None = None
    device_allocated: Mapping[DeviceKey, int] | None = None
    containers: tuple[ContainerAllocation, ...] = ()


def hugepage_size_label(size_kib: int) -> str:
    """The kubelet's name for a page size: 2048 kB -> ``2Mi``, 1048576 kB -> ``1Gi``, 64 kB -> ``64Ki``."""
    for unit, factor in (("Gi", 1024 * 1024), ("Mi", 1024)):
        if size_kib % factor == 0:
            return f"{size_kib // factor}{unit}"
    return f"{size_kib}Ki"


def cpu_time_by_node(
    per_cpu: Mapping[int, Mapping[str, float]], topology: Topology
) -> dict[int, dict[str, float]]:
    """Sum per-CPU times over each node's CPUs; a node without CPUs has no CPU time at all."""
    result: dict[int, dict[str, float]] = {}
    for node in topology.nodes:
        totals: dict[str, float] = {}
        for cpu in sorted(node.cpus):
            for mode, seconds in per_cpu.get(cpu, {}).items():
                totals[mode] = totals.get(mode, 0.0) + seconds
        if totals:
            result[node.id] = totals
    return result


def cpus_per_node(cpus: frozenset[int], topology: Topology) -> dict[int, int]:
    """How many of ``cpus`` each node holds (every node listed, 0 included)."""
    return {node.id: len(cpus & node.cpus) for node in topology.nodes}
