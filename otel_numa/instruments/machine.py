"""Topology, capacity and kernel usage per NUMA node."""

from __future__ import annotations

from collections.abc import Iterator

from otel_numa.accounting import hugepage_size_label
from otel_numa.instruments.base import NUMA_ID, Instruments, Point
from otel_numa.snapshot import Snapshot

KIB = 1024


def register_topology(instruments: Instruments) -> None:
    instruments.add("updown", "numa.node.count", "{node}", "NUMA nodes of the machine.", _node_count)
    instruments.add("updown", "numa.cpu.capacity", "{cpu}", "Online CPUs of the NUMA node.", _cpu_capacity)
    instruments.add(
        "updown", "numa.memory.capacity", "By", "Memory of the NUMA node (MemTotal).", _memory_capacity
    )
    instruments.add(
        "updown",
        "numa.hugepages.capacity",
        "By",
        "Hugepages of the NUMA node (nr_hugepages x page size).",
        _hugepages_capacity,
    )


def register_distances(instruments: Instruments) -> None:
    instruments.add(
        "gauge",
        "numa.node.distance",
        "{distance}",
        "Relative access distance from this NUMA node to the target node (10 = local).",
        _distances,
    )


def register_usage(instruments: Instruments) -> None:
    instruments.add(
        "counter", "numa.cpu.time", "s", "CPU time of the node's CPUs, by mode (from /proc/stat).", _cpu_time
    )
    instruments.add(
        "updown", "numa.memory.usage", "By", "Memory of the NUMA node in use and free.", _memory_usage
    )
    instruments.add(
        "updown",
        "numa.hugepages.free",
        "By",
        "Free hugepages of the NUMA node (free_hugepages x size).",
        _hp_free,
    )
    instruments.add(
        "counter",
        "numa.memory.page.allocations",
        "{page}",
        "Page allocation events of the NUMA node by numastat type.",
        _numastat,
    )


def _node_count(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        yield len(snapshot.machine.topology.nodes), {}


def _cpu_capacity(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for node in snapshot.machine.topology.nodes:
            yield len(node.cpus), {NUMA_ID: node.id}


def _memory_capacity(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for node in snapshot.machine.topology.nodes:
            memory = snapshot.machine.memory.get(node.id)
            if memory is not None:
                yield memory.total_bytes, {NUMA_ID: node.id}


def _hugepages_capacity(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for node_id, pools in snapshot.machine.hugepages.items():
            for pool in pools:
                size = hugepage_size_label(pool.size_kib)
                yield pool.total_pages * pool.size_kib * KIB, {NUMA_ID: node_id, "k8s.hugepage.size": size}


def _hp_free(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for node_id, pools in snapshot.machine.hugepages.items():
            for pool in pools:
                size = hugepage_size_label(pool.size_kib)
                yield pool.free_pages * pool.size_kib * KIB, {NUMA_ID: node_id, "k8s.hugepage.size": size}


def _distances(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for node in snapshot.machine.topology.nodes:
            for target, distance in node.distances.items():
                yield distance, {NUMA_ID: node.id, "numa.node.target_id": target}


def _cpu_time(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for node_id, modes in snapshot.machine.cpu_time.items():
            for mode, seconds in modes.items():
                yield seconds, {NUMA_ID: node_id, "cpu.mode": mode}


def _memory_usage(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for node_id, memory in snapshot.machine.memory.items():
            yield memory.used_bytes, {NUMA_ID: node_id, "system.memory.state": "used"}
            yield memory.free_bytes, {NUMA_ID: node_id, "system.memory.state": "free"}


NUMASTAT_TYPES = ("hit", "miss", "foreign", "interleave_hit", "local", "other")


def _numastat(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.machine is not None:
        for node_id, counters in snapshot.machine.numastat.items():
            for kind in NUMASTAT_TYPES:
                if kind in counters:
                    yield counters[kind], {NUMA_ID: node_id, "numa.numastat.type": kind}
