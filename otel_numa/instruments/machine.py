"""Topology, capacity and kernel usage per NUMA node."""

from __future__ import annotations

from collections.abc import Iterator

from otel_numa.accounting.allocation import hugepage_size_label
from otel_numa.instruments.base import NUMA_ID, Observe, Part, Point
from otel_numa.series_attributes import EMPTY_ATTRIBUTES, series_maker
from otel_numa.snapshot.store import Snapshot

KIB = 1024

# Each series' attributes made as the flat tuple the instruments keep (no dict to build and sort again on
# a round whose values changed: on a real machine memory, numastat and CPU time change every round).
_by_node = series_maker({}, (NUMA_ID,))
_by_node_and_size = series_maker({}, (NUMA_ID, "k8s.hugepage.size"))
_by_node_and_target = series_maker({}, (NUMA_ID, "numa.node.target_id"))
_by_node_and_mode = series_maker({}, (NUMA_ID, "cpu.mode"))
_by_node_and_state = series_maker({}, (NUMA_ID, "system.memory.state"))
_by_node_and_type = series_maker({}, (NUMA_ID, "numa.numastat.type"))
_by_node_and_pci = series_maker({}, (NUMA_ID, "pci.device.class", "pci.function.kind"))


def _node_count(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        yield len(snapshot.machine.topology.nodes), EMPTY_ATTRIBUTES


def _cpu_capacity(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for node in snapshot.machine.topology.nodes:
            if node.cpus_known:
                yield len(node.cpus), _by_node(node.id)


def _memory_capacity(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for node in snapshot.machine.topology.nodes:
            memory = snapshot.machine.memory.get(node.id)
            if memory is not None and memory.total_bytes is not None:
                yield memory.total_bytes, _by_node(node.id)


def _hugepages_capacity(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for node_id, pools in snapshot.machine.hugepages.items():
            for pool in pools:
                size = hugepage_size_label(pool.size_kib)
                if pool.total_pages is not None:
                    yield pool.total_pages * pool.size_kib * KIB, _by_node_and_size(node_id, size)


def _hp_free(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for node_id, pools in snapshot.machine.hugepages.items():
            for pool in pools:
                size = hugepage_size_label(pool.size_kib)
                if pool.free_pages is not None:
                    yield pool.free_pages * pool.size_kib * KIB, _by_node_and_size(node_id, size)


def _distances(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for node in snapshot.machine.topology.nodes:
            for target, distance in node.distances.items():
                yield distance, _by_node_and_target(node.id, target)


def _cpu_time(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for node_id, modes in snapshot.machine.cpu_time.items():
            for mode, seconds in modes.items():
                yield seconds, _by_node_and_mode(node_id, mode)


def _memory_usage(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for node_id, memory in snapshot.machine.memory.items():
            if memory.used_bytes is not None:
                yield memory.used_bytes, _by_node_and_state(node_id, "used")
            if memory.free_bytes is not None:
                yield memory.free_bytes, _by_node_and_state(node_id, "free")


NUMASTAT_TYPES = ("hit", "miss", "foreign", "interleave_hit", "local", "other")


def _numastat(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for node_id, counters in snapshot.machine.numastat.items():
            for kind in NUMASTAT_TYPES:
                if kind in counters:
                    yield counters[kind], _by_node_and_type(node_id, kind)


def _pci_count(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for (node_id, device_class, kind), count in sorted(snapshot.machine.pci.counts.items()):
            yield count, _by_node_and_pci(node_id, device_class, kind)


def _part(name: str) -> Part:
    """The machine's ``name`` piece of a snapshot (None before sysfs was read once)."""
    return lambda snapshot: snapshot.machine and getattr(snapshot.machine, name)


# each with the part of the machine it depends on only (the collector hands back the same object while its
# values are the same)
OBSERVERS: dict[str, tuple[Observe, Part]] = {
    "numa.node.count": (_node_count, _part("topology")),
    "numa.cpu.capacity": (_cpu_capacity, _part("topology")),
    "numa.memory.capacity": (_memory_capacity, _part("memory")),
    "numa.hugepages.capacity": (_hugepages_capacity, _part("hugepages")),
    "numa.node.distance": (_distances, _part("topology")),
    "numa.cpu.time": (_cpu_time, _part("cpu_time")),
    "numa.memory.usage": (_memory_usage, _part("memory")),
    "numa.hugepages.free": (_hp_free, _part("hugepages")),
    "numa.memory.page.allocations": (_numastat, _part("numastat")),
    "numa.pci.device.count": (_pci_count, _part("pci")),
}
