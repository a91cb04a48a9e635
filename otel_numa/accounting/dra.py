"""Pure functions for DRA devices, pod-level resources and alignment, over the data model only.

- A DRA device is one (driver, pool, device); it counts once in the per-NUMA totals however many
  containers or claims use it (a shared device, ``share_id``, included), under the NUMA node the snapshot
  placed it on (-1 when none). Each container that uses it counts it once in its own series.
- Pod-level exclusive CPUs and memory (podresources' pod fields, the checkpoints' ``podEntries``) are shown
  per pod; the per-NUMA totals take a union of CPU sets, so a CPU held by a pod and its container is
  counted once.
- CPUs and memory of DRA CPU and memory drivers' claims are CPUs and memory, never devices
  (:mod:`otel_numa.accounting.dra_claims`): a container's claims add to its CPUs and memory.
- A container is aligned when all its NUMA-pinned resources lie on one node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from otel_numa.accounting.dra_claims import ClaimUse, add_blocks, claim_use, counts_as_device
from otel_numa.model import (
    NO_NUMA,
    ContainerAllocation,
    ContainerMemory,
    ContainerRef,
    DeviceKey,
    DraDevice,
    DraDeviceKey,
    JoinedPodResources,
    KubeletState,
    MemoryBlock,
    PodAllocation,
    PodResources,
    Topology,
    shared_set,
)


def with_pinned_nodes(
    allocation: ContainerAllocation, memory_nodes: Iterable[int] = ()
) -> ContainerAllocation:
    """``allocation`` with the NUMA nodes of all its NUMA-pinned resources (devices with no node left out);
    ``memory_nodes``: every node of its memory blocks' affinities (a block may span several)."""
    nodes = {numa for numa, count in allocation.cpus.items() if count}
    nodes.update(allocation.memory_bytes)
    nodes.update(numa for numa, _size in allocation.hugepages_bytes)
    nodes.update(numa for numa, _resource in allocation.devices)
    nodes.update(memory_nodes)
    nodes.discard(NO_NUMA)
    return replace(allocation, pinned_nodes=frozenset(nodes))


def _numa(state: KubeletState, device: DraDevice) -> int:
    return state.dra_numa.get(device.key, NO_NUMA)


def dra_totals(
    counts: Mapping[DeviceKey, int],
    pods: Iterable[PodResources],
    state: KubeletState,
    live: Callable[[str], bool],
) -> dict[DeviceKey, int]:
    """``counts`` plus every DRA device once: those podresources lists for ``pods``, and those of the
    checkpoint's claims used by a live pod (the same device from both counts once)."""
    devices: dict[DraDeviceKey, DraDevice] = {}
    for pod in pods:
        for container in pod.containers:
            for claim in container.dynamic_resources:
                devices.update((device.key, device) for device in claim.devices if counts_as_device(device))
    if state.dra is not None:
        for dra_claim in state.dra.claims:
            if any(live(uid) for uid in dra_claim.pod_uids):
                for device in dra_claim.devices:
                    if counts_as_device(device):
                        devices.setdefault(device.key, device)
    totals = dict(counts)
    for key, device in devices.items():
        total_key = (_numa(state, device), key[0])
        totals[total_key] = totals.get(total_key, 0) + 1
    # a driver with a device that cannot be placed this round: its totals are unknown, not wrong
    unknown = {driver for driver, *_ in state.dra_unknown & devices.keys()}
    return {key: count for key, count in totals.items() if key[1] not in unknown} if unknown else totals


def add_dra_devices(
    containers: tuple[ContainerAllocation, ...],
    joined: JoinedPodResources,
    state: KubeletState,
    topology: Topology | None = None,
) -> tuple[ContainerAllocation, ...]:
    """The containers with the DRA devices podresources lists for them (1 per device per container), and
    the CPUs and memory of their CPU and memory claims (with ``topology``)."""
    by_key = {(c.container.pod_uid, c.container.container_name): c for c in containers}
    changed = False
    for uid, pod in joined.by_uid.items():
        for container in pod.containers:
            if not container.dynamic_resources:
                continue
            key = (uid, container.name)
            devices = {
                device.key: device
                for claim in container.dynamic_resources
                for device in claim.devices
                if counts_as_device(device)
            }
            use = claim_use(container.dynamic_resources, state, key) if topology is not None else None
            if not devices and (use is None or use.empty):
                continue
            found = by_key.get(key) or ContainerAllocation(
                ContainerRef(uid, container.name, pod.name, pod.namespace)
            )
            counts = dict(found.devices)
            unknown = {device.driver for device in devices.values() if device.key in state.dra_unknown}
            for device in devices.values():
                count_key = (_numa(state, device), device.driver)
                counts[count_key] = counts.get(count_key, 0) + 1
            if unknown:  # this container's series of such a driver are unknown, not wrong
                counts = {count_key: n for count_key, n in counts.items() if count_key[1] not in unknown}
            found = replace(found, devices=counts)
            if use is not None and topology is not None:
                found = _with_claims(found, use, topology)
            spans = [numa for block in container.memory for numa in block.numa_ids]
            pinned = with_pinned_nodes(found, [*found.pinned_nodes, *spans, *found.memory_nodes])
            claims_unknown = use is not None and use.unknown
            by_key[key] = replace(pinned, alignment_unknown=bool(unknown) or claims_unknown)
            changed = True
    return tuple(c for _key, c in sorted(by_key.items())) if changed else containers


def _with_claims(found: ContainerAllocation, use: ClaimUse, topology: Topology) -> ContainerAllocation:
    """``found`` with its CPU and memory claims: CPUs a union with its own, memory blocks added."""
    cpu_ids = found.cpu_ids | use.cpus
    memory, hugepages = dict(found.memory_bytes), dict(found.hugepages_bytes)
    add_blocks(use.memory, memory, hugepages)
    return replace(
        found,
        cpus=_cpus_per_node(frozenset(cpu_ids), topology),
        memory_bytes=memory,
        hugepages_bytes=hugepages,
        cpu_ids=shared_set(cpu_ids),
        memory_nodes=shared_set(found.memory_nodes | use.memory_nodes),
        cpus_from_kernel=found.cpus_from_kernel or use.cpus_from_kernel,
    )


def _cpus_per_node(cpus: frozenset[int], topology: Topology) -> dict[int, int]:
    found = {node.id: len(cpus & node.cpus) for node in topology.nodes if node.cpus_known}
    return {numa: count for numa, count in found.items() if count}


def _memory_per_node(blocks: Iterable[ContainerMemory | MemoryBlock]) -> dict[int, int]:
    """Bytes of ``memory`` blocks per node, a block spanning several nodes on the lowest."""
    found: dict[int, int] = {}
    for block in blocks:
        if isinstance(block, MemoryBlock):
            kind, numa_ids = block.resource, block.numa_affinity
        else:
            kind, numa_ids = block.memory_type, block.numa_ids
        if kind == "memory":
            numa = min(numa_ids) if numa_ids else NO_NUMA
            found[numa] = found.get(numa, 0) + block.size
    return found


def pod_allocations(
    state: KubeletState, topology: Topology, live: Callable[[str], bool]
) -> tuple[PodAllocation, ...]:
    """Pod-level exclusive CPUs and memory per live pod: podresources' pod fields for the pods it answers
    for, else the checkpoints' ``podEntries``."""
    pods: dict[str, PodAllocation] = {}
    joined = state.podresources.by_uid if state.podresources is not None else {}
    for uid, pod in joined.items():
        if pod.cpu_ids or pod.memory:
            pods[uid] = PodAllocation(
                uid,
                pod.name,
                pod.namespace,
                _cpus_per_node(pod.cpu_ids, topology),
                _memory_per_node(pod.memory),
            )
    cpu_entries = state.cpu.pod_entries if state.cpu is not None else {}
    memory_entries = state.memory.pod_entries if state.memory is not None else {}
    for uid in sorted(set(cpu_entries) | set(memory_entries)):
        if uid in joined or not live(uid):
            continue
        namespace, name = state.pod_names.get(uid, (None, None))
        pods[uid] = PodAllocation(
            uid,
            name,
            namespace,
            _cpus_per_node(cpu_entries.get(uid, frozenset()), topology),
            _memory_per_node(memory_entries.get(uid, ())),
        )
    return tuple(pods[uid] for uid in sorted(pods) if pods[uid].cpus or pods[uid].memory_bytes)
