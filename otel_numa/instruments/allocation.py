"""What the kubelet may hand out and has handed out, per NUMA node and per container."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from opentelemetry.util.types import AttributeValue

from otel_numa.instruments.base import NUMA_ID, Observe, Point
from otel_numa.model import Allocation, ContainerAllocation, ContainerRef, PodAllocation
from otel_numa.series_attributes import series_maker
from otel_numa.snapshot.store import Snapshot

SeriesMaker = Callable[..., Mapping[str, AttributeValue]]

HUGEPAGE_SIZE = "k8s.hugepage.size"
RESOURCE_NAME = "numa.resource.name"


def container_attributes(ref: ContainerRef) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        "k8s.pod.uid": ref.pod_uid,
        "k8s.container.name": ref.container_name,
    }
    if ref.pod_name is not None:
        attributes["k8s.pod.name"] = ref.pod_name
    if ref.namespace is not None:
        attributes["k8s.namespace.name"] = ref.namespace
    attributes.update(ref.extra_attributes)  # opt-in runtime enrichment (enrich_mode=attributes)
    return attributes


def container_series(ref: ContainerRef, *keys: str) -> SeriesMaker:
    """What makes the attributes of a container's series: its own, and a value for each of ``keys``."""
    return series_maker(container_attributes(ref), keys)


def _cpu_allocatable(a: Allocation) -> Mapping[int, int] | None:
    return a.cpu_allocatable


def _cpu_allocated(a: Allocation) -> Mapping[int, int] | None:
    return a.cpu_allocated


def _mem_allocatable(a: Allocation) -> Mapping[int, int] | None:
    return a.memory_allocatable


def _mem_allocated(a: Allocation) -> Mapping[int, int] | None:
    return a.memory_allocated


def _per_numa(
    pick: Callable[[Allocation], Mapping[int, int] | None],
) -> Callable[[Snapshot], Iterator[Point]]:
    def observe(snapshot: Snapshot) -> Iterator[Point]:
        values = pick(snapshot.allocation)
        if values is not None:
            yield from _numa_points(values)

    return observe


def _per_key(
    pick: Callable[[Allocation], Mapping[tuple[int, str], int] | None], key_attribute: str
) -> Callable[[Snapshot], Iterator[Point]]:
    def observe(snapshot: Snapshot) -> Iterator[Point]:
        values = pick(snapshot.allocation)
        if values is not None:
            yield from _keyed_points(values, key_attribute)

    return observe


def _numa_points(values: Mapping[int, int]) -> Iterator[Point]:
    for numa_id, value in sorted(values.items()):
        yield value, {NUMA_ID: numa_id}


def _keyed_points(values: Mapping[tuple[int, str], int], key_attribute: str) -> Iterator[Point]:
    for (numa_id, key), value in sorted(values.items()):
        yield value, {NUMA_ID: numa_id, key_attribute: key}


def _containers_per_numa(pick: Callable[[ContainerAllocation], Mapping[int, int]]) -> Observe:
    def observe(snapshot: Snapshot) -> Iterator[Point]:
        for container in snapshot.allocation.containers:
            values = pick(container)
            if values:
                series = container_series(container.container, NUMA_ID)
                for numa_id, value in sorted(values.items()):
                    yield value, series(numa_id)

    return observe


def _containers_per_key(
    pick: Callable[[ContainerAllocation], Mapping[tuple[int, str], int]], key_attribute: str
) -> Observe:
    def observe(snapshot: Snapshot) -> Iterator[Point]:
        for container in snapshot.allocation.containers:
            values = pick(container)
            if values:
                series = container_series(container.container, NUMA_ID, key_attribute)
                for (numa_id, key), value in sorted(values.items()):
                    yield value, series(numa_id, key)

    return observe


def pod_attributes(pod: PodAllocation) -> dict[str, AttributeValue]:
    """A pod's attributes: no ``k8s.container.name``, so pod-level series never sum with containers'."""
    attributes: dict[str, AttributeValue] = {"k8s.pod.uid": pod.pod_uid}
    if pod.pod_name is not None:
        attributes["k8s.pod.name"] = pod.pod_name
    if pod.namespace is not None:
        attributes["k8s.namespace.name"] = pod.namespace
    return attributes


def _pods(pick: Callable[[PodAllocation], Mapping[int, int]]) -> Callable[[Snapshot], Iterator[Point]]:
    def observe(snapshot: Snapshot) -> Iterator[Point]:
        for pod in snapshot.allocation.pods:
            series = series_maker(pod_attributes(pod), (NUMA_ID,))
            for numa_id, value in sorted(pick(pod).items()):
                yield value, series(numa_id)

    return observe


def _aligned(snapshot: Snapshot) -> Iterator[Point]:
    for container in snapshot.allocation.containers:
        aligned = container.aligned
        if aligned is not None:
            yield int(aligned), container_series(container.container)()


OBSERVERS: dict[str, Observe] = {
    "numa.cpu.allocatable": _per_numa(_cpu_allocatable),
    "numa.cpu.allocated": _per_numa(_cpu_allocated),
    "numa.memory.allocatable": _per_numa(_mem_allocatable),
    "numa.memory.allocated": _per_numa(_mem_allocated),
    "numa.hugepages.allocatable": _per_key(lambda a: a.hugepages_allocatable, HUGEPAGE_SIZE),
    "numa.hugepages.allocated": _per_key(lambda a: a.hugepages_allocated, HUGEPAGE_SIZE),
    "numa.device.capacity": _per_key(lambda a: a.device_capacity, RESOURCE_NAME),
    "numa.device.allocated": _per_key(lambda a: a.device_allocated, RESOURCE_NAME),
    "numa.container.cpu.allocated": _containers_per_numa(lambda c: c.cpus),
    "numa.container.memory.allocated": _containers_per_numa(lambda c: c.memory_bytes),
    "numa.container.hugepages.allocated": _containers_per_key(lambda c: c.hugepages_bytes, HUGEPAGE_SIZE),
    "numa.container.device.allocated": _containers_per_key(lambda c: c.devices, RESOURCE_NAME),
    "numa.pod.cpu.allocated": _pods(lambda p: p.cpus),
    "numa.pod.memory.allocated": _pods(lambda p: p.memory_bytes),
    "numa.container.aligned": _aligned,
}
