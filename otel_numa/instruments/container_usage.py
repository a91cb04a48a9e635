"""Where each container's memory and CPU time really are, from its cgroup, how local its memory is, and
whether the kernel enforces what the records say (the CPUs pinned to one pod, each container's mismatch)."""

from __future__ import annotations

import functools
from collections.abc import Iterator

from opentelemetry.util.types import AttributeValue

from otel_numa.instruments.allocation import container_attributes, container_series
from otel_numa.instruments.base import NUMA_ID, Observe, Point
from otel_numa.model import ContainerUsage
from otel_numa.series_attributes import series_maker
from otel_numa.snapshot.store import Snapshot

MEMORY_TYPE = "numa.memory.type"
RESOURCE_KIND = "numa.resource.kind"
CPU_NODE_IDS = "numa.cpu.node.ids"
MEMORY_NODE_IDS = "numa.memory.node.ids"
LOCALITY_NODE_IDS = "numa.locality.node.ids"


@functools.lru_cache(maxsize=256)  # one string per distinct set, shared by every container's series
def node_list(nodes: frozenset[int]) -> str:
    """``{1, 0}`` -> ``"0,1"``: ascending ids, comma separated."""
    return ",".join(str(node) for node in sorted(nodes))


def _memory(snapshot: Snapshot) -> Iterator[Point]:
    for container in snapshot.container_usage:
        series = container_series(container.container, NUMA_ID, MEMORY_TYPE)
        for memory_type, by_node in container.memory_by_type.items():
            for node, amount in sorted(by_node.items()):
                yield amount, series(node, memory_type)


def _cpu_time(snapshot: Snapshot) -> Iterator[Point]:
    for container in snapshot.container_usage:
        series = container_series(container.container, NUMA_ID)
        for node, seconds in sorted(container.cpu_time_by_node.items()):
            yield seconds, series(node)


def _locality(snapshot: Snapshot) -> Iterator[Point]:
    for container in snapshot.container_usage:
        if container.locality is not None:
            yield container.locality, container_series(container.container)()


def _cpuset_nodes(snapshot: Snapshot) -> Iterator[Point]:
    for container in snapshot.container_usage:
        yield 1, series_maker({**container_attributes(container.container), **_node_sets(container)}, ())()


def _node_sets(container: ContainerUsage) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {}
    for key, nodes in (
        (CPU_NODE_IDS, container.cpu_nodes),
        (MEMORY_NODE_IDS, container.memory_nodes),
        (LOCALITY_NODE_IDS, container.intended_nodes),
    ):
        if nodes is not None:
            attributes[key] = node_list(nodes)
    return attributes


def _mismatch(snapshot: Snapshot) -> Iterator[Point]:
    for container in snapshot.container_usage:
        series = container_series(container.container, RESOURCE_KIND)
        for kind, differs in (("cpu", container.cpu_mismatch), ("memory", container.memory_mismatch)):
            if differs is not None:
                yield int(differs), series(kind)


def _pinned(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.cpu_pinned is not None:
        for numa_id, count in sorted(snapshot.cpu_pinned.items()):
            yield count, {NUMA_ID: numa_id}


OBSERVERS: dict[str, Observe] = {
    "numa.container.memory.usage": _memory,
    "numa.container.cpu.time": _cpu_time,
    "numa.container.memory.locality": _locality,
    "numa.container.cpuset.nodes": _cpuset_nodes,
    "numa.container.allocation.mismatch": _mismatch,
}
# observed with the snapshot's cpu_pinned, which changes apart from the containers' usage
PINNED_OBSERVERS: dict[str, Observe] = {"numa.cpu.pinned": _pinned}
