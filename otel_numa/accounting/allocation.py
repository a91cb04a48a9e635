"""Pure functions from the sources' values to per-NUMA and per-container quantities."""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field, replace

from otel_numa.accounting.dra import (
    add_dra_devices,
    dra_totals,
    pod_allocations,
    with_pinned_nodes,
)
from otel_numa.accounting.dra_claims import ClaimTotals, claim_totals, memory_totals_with_claims
from otel_numa.model import (
    NO_NUMA,
    Allocation,
    ContainerAllocation,
    ContainerDevices,
    ContainerMemory,
    ContainerRef,
    ContainerResources,
    CpuManagerState,
    DeviceKey,
    HugepageKey,
    JoinedPodResources,
    KubeletState,
    Topology,
    shared_set,
)


def hugepage_size_label(size_kib: int) -> str:
    """The kubelet's name for a page size: 2048 kB -> ``2Mi``, 1048576 kB -> ``1Gi``, 64 kB -> ``64Ki``."""
    for unit, factor in (("Gi", 1024 * 1024), ("Mi", 1024)):
        if size_kib % factor == 0:
            return f"{size_kib // factor}{unit}"
    return f"{size_kib}Ki"


def cpus_per_node(cpus: frozenset[int], topology: Topology) -> dict[int, int]:
    """How many of ``cpus`` each node holds (every node whose CPUs are known listed, 0 included)."""
    return {node.id: len(cpus & node.cpus) for node in topology.nodes if node.cpus_known}


# Allocation from the kubelet's checkpoints ------------------------------------------------------


def is_live(state: KubeletState) -> Callable[[str], bool]:
    """Whether a pod UID is alive; every pod is, when the live set is unknown."""
    live_pods = state.live_pods
    return (lambda _uid: True) if live_pods is None else live_pods.__contains__


def exclusive_cpus(
    cpu: CpuManagerState | None, live: Callable[[str], bool], replaced: Container[str] = frozenset()
) -> frozenset[int]:
    """The exclusive CPUs of live pods in the cpu manager checkpoint, but for containers of ``replaced``
    pods (podresources gives theirs). A v1 file (<= 1.17) keys entries by container id: all are counted.
    v3 pod-level CPU sets are exclusive too (a union: they may overlap their containers' sets)."""
    if cpu is None:
        return frozenset()
    found: set[int] = set()
    for owner, by_container in cpu.entries.items():
        if cpu.entries_keyed_by_container_id or (live(owner) and owner not in replaced):
            for cpus in by_container.values():
                found |= cpus
    for owner, cpus in cpu.pod_entries.items():
        if live(owner):
            found |= cpus
    return frozenset(found)


def device_numa(numa_ids: Iterable[int]) -> int:
    """A device listed under several NUMA nodes counts once, under the lowest real id it lists (else -1)."""
    real = [numa for numa in numa_ids if numa >= 0]
    return min(real) if real else NO_NUMA


def compute_allocation(
    state: KubeletState, topology: Topology, reserved_cpus: frozenset[int] | None
) -> Allocation:
    """Per-NUMA and per-container allocation; quantities that cannot be known stay ``None``.

    With a podresources answer the per-NUMA CPU and device totals are computed once, over both sources
    (:func:`apply_podresources`); without one, from the checkpoints alone. CPUs and memory of DRA CPU and
    memory drivers' claims count as CPUs and memory (:mod:`otel_numa.accounting.dra_claims`).
    """
    live = is_live(state)
    claims = claim_totals(state, live)
    containers: dict[tuple[str, str], _ContainerTotals] = {}

    def totals(uid: str, name: str) -> _ContainerTotals:
        key = (uid, name)
        if key not in containers:
            containers[key] = _ContainerTotals()
        return containers[key]

    cpu_allocated = _cpu_allocated(state, topology, live, totals, claims)
    memory = _memory_allocation(state, live, totals)
    device_allocated = _device_allocated(state, live, totals)

    if state.podresources is None and state.dra is not None:
        # the checkpoint names pods, not containers: DRA devices count in the per-NUMA totals only
        device_allocated = dra_totals(device_allocated or {}, (), state, live)
    allocation = Allocation(
        cpu_allocatable=_cpu_allocatable(state, topology, reserved_cpus),
        cpu_allocated=cpu_allocated,
        memory_allocatable=memory[0],
        memory_allocated=memory[1],
        hugepages_allocatable=memory[2],
        hugepages_allocated=memory[3],
        device_capacity=dict(state.allocatable_devices) if state.allocatable_devices is not None else None,
        device_allocated=device_allocated,
        containers=tuple(
            totals_.freeze(_container_ref(uid, name, state.pod_names))
            for (uid, name), totals_ in sorted(containers.items())
        ),
    )
    if state.cpu is None or state.memory is None or state.devices is None:
        # a container's alignment needs all its pinned resources: with a checkpoint missing or rejected it
        # is unknown (podresources, where it answers, gives the whole picture again)
        allocation = replace(
            allocation,
            containers=tuple(replace(c, alignment_unknown=True) for c in allocation.containers),
        )
    if state.podresources is not None:
        allocation = apply_podresources(allocation, state, topology, claims)
    memory_allocated, hugepages_allocated = memory_totals_with_claims(
        allocation.memory_allocated, allocation.hugepages_allocated, claims, topology
    )
    return replace(
        allocation,
        memory_allocated=memory_allocated,
        hugepages_allocated=hugepages_allocated,
        pods=pod_allocations(state, topology, live),
    )


@dataclass
class _ContainerTotals:
    cpus: dict[int, int] = field(default_factory=dict)
    memory: dict[int, int] = field(default_factory=dict)
    hugepages: dict[HugepageKey, int] = field(default_factory=dict)
    devices: dict[DeviceKey, int] = field(default_factory=dict)
    memory_nodes: set[int] = field(default_factory=set)  # every node of its memory blocks' affinities
    cpu_ids: frozenset[int] = frozenset()

    def freeze(self, ref: ContainerRef) -> ContainerAllocation:
        found = ContainerAllocation(
            ref,
            self.cpus,
            self.memory,
            self.hugepages,
            self.devices,
            cpu_ids=shared_set(self.cpu_ids),
            memory_nodes=shared_set(self.memory_nodes),
        )
        return with_pinned_nodes(found, self.memory_nodes)


def _container_ref(uid: str, name: str, pod_names: Mapping[str, tuple[str, str]]) -> ContainerRef:
    namespace, pod = pod_names.get(uid, (None, None))
    return ContainerRef(pod_uid=uid, container_name=name, pod_name=pod, namespace=namespace)


def _cpu_allocatable(
    state: KubeletState, topology: Topology, reserved_cpus: frozenset[int] | None
) -> dict[int, int] | None:
    if state.allocatable_cpus is not None:
        return cpus_per_node(state.allocatable_cpus, topology)
    if reserved_cpus is not None:
        return {node.id: len(node.cpus - reserved_cpus) for node in topology.nodes if node.cpus_known}
    return None


def _cpu_allocated(
    state: KubeletState,
    topology: Topology,
    live: Callable[[str], bool],
    totals: Callable[[str, str], _ContainerTotals],
    claims: ClaimTotals,
) -> dict[int, int] | None:
    if state.cpu is None:
        return None
    for owner, by_container in state.cpu.entries.items():
        # v1 (<= 1.17) keys entries by container id: no pod UID, no liveness check, no per-container series
        if state.cpu.entries_keyed_by_container_id or not live(owner):
            continue
        for container, cpus in by_container.items():
            per_node = {numa: count for numa, count in cpus_per_node(cpus, topology).items() if count}
            if per_node:
                container_totals = totals(owner, container)
                container_totals.cpus.update(per_node)
                container_totals.cpu_ids = cpus
    if state.podresources is not None:
        return None  # apply_podresources counts them once, over both sources
    if claims.cpus is None:
        return None  # a DRA CPU claim whose CPUs cannot be told this round
    return cpus_per_node(exclusive_cpus(state.cpu, live) | claims.cpus, topology)


_HUGEPAGES_PREFIX = "hugepages-"


def _memory_allocation(
    state: KubeletState, live: Callable[[str], bool], totals: Callable[[str, str], _ContainerTotals]
) -> tuple[
    dict[int, int] | None, dict[int, int] | None, dict[HugepageKey, int] | None, dict[HugepageKey, int] | None
]:
    memory = state.memory
    if memory is None or not memory.machine_state:  # policy None keeps no machine state: unknown, not 0
        return None, None, None, None
    allocatable: dict[int, int] = {}
    allocated: dict[int, int] = {}
    hp_allocatable: dict[HugepageKey, int] = {}
    hp_allocated: dict[HugepageKey, int] = {}
    # The machine state is authoritative for the per-NUMA totals.
    for numa, numa_state in memory.machine_state.items():
        for resource, table in numa_state.memory_map.items():
            if resource == "memory":
                allocatable[numa] = table.allocatable
                allocated[numa] = table.reserved
            elif resource.startswith(_HUGEPAGES_PREFIX):
                key = (numa, resource[len(_HUGEPAGES_PREFIX) :])
                hp_allocatable[key] = table.allocatable
                hp_allocated[key] = table.reserved
    for uid, by_container in memory.entries.items():
        if not live(uid):
            continue
        for container, blocks in by_container.items():
            container_totals = totals(uid, container)
            for block in blocks:
                container_totals.memory_nodes.update(block.numa_affinity)
                # a block spanning several nodes is put whole on the lowest one
                numa = min(block.numa_affinity) if block.numa_affinity else NO_NUMA
                if block.resource == "memory":
                    container_totals.memory[numa] = container_totals.memory.get(numa, 0) + block.size
                elif block.resource.startswith(_HUGEPAGES_PREFIX):
                    hp_key = (numa, block.resource[len(_HUGEPAGES_PREFIX) :])
                    container_totals.hugepages[hp_key] = (
                        container_totals.hugepages.get(hp_key, 0) + block.size
                    )
    return allocatable, allocated, hp_allocatable, hp_allocated


def _device_allocated(
    state: KubeletState, live: Callable[[str], bool], totals: Callable[[str, str], _ContainerTotals]
) -> dict[DeviceKey, int] | None:
    if state.devices is None:
        return None
    # device id -> every NUMA id it is listed under, per resource, over live containers
    placements: dict[tuple[str, str], set[int]] = {}
    owners: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for entry in state.devices.entries:
        if not live(entry.pod_uid):
            continue
        for numa, device_ids in entry.devices_by_numa.items():
            for device_id in device_ids:
                device = (entry.resource_name, device_id)
                placements.setdefault(device, set()).add(numa)
                owners.setdefault(device, set()).add((entry.pod_uid, entry.container_name))
    allocated: dict[DeviceKey, int] = {}
    for device, numa_ids in placements.items():
        key = (device_numa(numa_ids), device[0])
        allocated[key] = allocated.get(key, 0) + 1
        for uid, container in owners[device]:
            devices = totals(uid, container).devices
            devices[key] = devices.get(key, 0) + 1
    return allocated


# The podresources API over the checkpoints ------------------------------------------------------


def device_counts(groups: Iterable[ContainerDevices]) -> dict[DeviceKey, int]:
    """Devices per (NUMA id, resource), each (resource, device id) once, under the lowest NUMA id it lists."""
    placements: dict[tuple[str, str], set[int]] = {}
    for group in groups:
        for device_id in group.device_ids:
            placements.setdefault((group.resource_name, device_id), set()).update(group.numa_ids)
    counts: dict[DeviceKey, int] = {}
    for (resource, _device_id), numa_ids in placements.items():
        key = (device_numa(numa_ids), resource)
        counts[key] = counts.get(key, 0) + 1
    return counts


def with_podresources(
    state: KubeletState, joined: JoinedPodResources, live_pods: frozenset[str] | None
) -> KubeletState:
    """``state`` with podresources' allocatable view and live pod set
    (:func:`otel_numa.accounting.join.live_pod_set`).

    Allocatable CPUs are used only when the kubelet lists some: with the cpu manager's ``none`` policy
    it answers with none, which would read as "nothing allocatable".
    """
    allocatable = joined.allocatable
    cpus = allocatable.cpu_ids if allocatable is not None and allocatable.cpu_ids else None
    devices = device_counts(allocatable.devices) if allocatable is not None else None
    return replace(
        state,
        live_pods=live_pods,
        allocatable_cpus=cpus if cpus is not None else state.allocatable_cpus,
        allocatable_devices=devices if devices is not None else state.allocatable_devices,
        podresources=joined,
    )


def _memory_key(block: ContainerMemory) -> tuple[str, int]:
    """("memory" or the hugepage size, NUMA id): a block spanning several nodes goes whole on the lowest."""
    numa = min(block.numa_ids) if block.numa_ids else NO_NUMA
    kind = block.memory_type
    return (kind[len(_HUGEPAGES_PREFIX) :] if kind.startswith(_HUGEPAGES_PREFIX) else kind, numa)


def _container_from_api(
    ref: ContainerRef, container: ContainerResources, topology: Topology
) -> ContainerAllocation:
    cpus = {numa: count for numa, count in cpus_per_node(container.cpu_ids, topology).items() if count}
    memory: dict[int, int] = {}
    hugepages: dict[HugepageKey, int] = {}
    for block in container.memory:
        kind, numa = _memory_key(block)
        if block.memory_type == "memory":
            memory[numa] = memory.get(numa, 0) + block.size
        elif block.memory_type.startswith(_HUGEPAGES_PREFIX):
            hugepages[(numa, kind)] = hugepages.get((numa, kind), 0) + block.size
    spans = [numa for block in container.memory for numa in block.numa_ids]
    found = ContainerAllocation(
        ref,
        cpus,
        memory,
        hugepages,
        device_counts(container.devices),
        cpu_ids=container.cpu_ids,
        memory_nodes=shared_set(spans),
    )
    return with_pinned_nodes(found, spans)


def _has_any(allocation: ContainerAllocation) -> bool:
    return bool(
        allocation.cpus or allocation.memory_bytes or allocation.hugepages_bytes or allocation.devices
    )


def _disagrees(
    state: KubeletState, api: ContainerAllocation | None, checkpoint: ContainerAllocation | None
) -> bool:
    """Compares only what a checkpoint read this round can say (no cpu checkpoint: no CPU comparison)."""
    empty = ContainerAllocation(ContainerRef("", ""))
    api, checkpoint = api or empty, checkpoint or empty
    return (
        (state.cpu is not None and dict(api.cpus) != dict(checkpoint.cpus))
        or (
            state.memory is not None
            and (
                dict(api.memory_bytes) != dict(checkpoint.memory_bytes)
                or dict(api.hugepages_bytes) != dict(checkpoint.hugepages_bytes)
            )
        )
        or (state.devices is not None and dict(api.devices) != dict(checkpoint.devices))
    )


def apply_podresources(
    allocation: Allocation, state: KubeletState, topology: Topology, claims: ClaimTotals | None = None
) -> Allocation:
    """Let podresources win over the checkpoints.

    The containers of every joined pod come from its answer; per-NUMA CPU and device totals are recomputed
    over both (checkpoint entries of joined pods replaced, unjoined pods' CPUs and devices included, DRA
    CPU claims' CPUs too); per-NUMA allocatable memory and hugepages come from GetAllocatableResources when
    the memory manager gives none. Containers whose checkpoint allocation differs are listed in
    ``disagreements``.
    """
    joined = state.podresources
    assert joined is not None
    live = is_live(state)
    if claims is None:
        claims = claim_totals(state, live)

    from_api: dict[tuple[str, str], ContainerAllocation] = {}
    for uid, pod in joined.by_uid.items():
        for container in pod.containers:
            ref = ContainerRef(uid, container.name, pod.name, pod.namespace)
            found = _container_from_api(ref, container, topology)
            if _has_any(found):
                from_api[(uid, container.name)] = found
    from_checkpoints = {(c.container.pod_uid, c.container.container_name): c for c in allocation.containers}
    compared = set(from_api) | {key for key in from_checkpoints if key[0] in joined.by_uid}
    disagreements = frozenset(
        key for key in compared if _disagrees(state, from_api.get(key), from_checkpoints.get(key))
    )
    kept = {key: c for key, c in from_checkpoints.items() if key[0] not in joined.by_uid}
    containers = tuple(c for _key, c in sorted({**kept, **from_api}.items()))

    exclusive = set(exclusive_cpus(state.cpu, live, replaced=joined.by_uid))
    device_groups: list[ContainerDevices] = []
    if state.devices is not None:
        for entry in state.devices.entries:
            if live(entry.pod_uid) and entry.pod_uid not in joined.by_uid:
                for numa, device_ids in entry.devices_by_numa.items():
                    numa_ids = (numa,) if numa >= 0 else ()
                    device_groups.append(ContainerDevices(entry.resource_name, device_ids, numa_ids))
    for pod in joined.all_pods:
        exclusive |= pod.cpu_ids  # the pod-level pool holds its containers' CPUs: a union counts each once
        for container in pod.containers:
            exclusive |= container.cpu_ids
            device_groups.extend(container.devices)

    memory_allocatable = allocation.memory_allocatable
    hugepages_allocatable = allocation.hugepages_allocatable
    if memory_allocatable is None and joined.allocatable is not None and joined.allocatable.memory:
        memory_allocatable, hugepages_allocatable = {}, {}
        for block in joined.allocatable.memory:
            kind, numa = _memory_key(block)
            if block.memory_type == "memory":
                memory_allocatable[numa] = memory_allocatable.get(numa, 0) + block.size
            elif block.memory_type.startswith(_HUGEPAGES_PREFIX):
                hugepages_allocatable[(numa, kind)] = hugepages_allocatable.get((numa, kind), 0) + block.size

    return Allocation(
        cpu_allocatable=allocation.cpu_allocatable,
        cpu_allocated=(
            cpus_per_node(frozenset(exclusive) | claims.cpus, topology) if claims.cpus is not None else None
        ),
        memory_allocatable=memory_allocatable,
        memory_allocated=allocation.memory_allocated,
        hugepages_allocatable=hugepages_allocatable,
        hugepages_allocated=allocation.hugepages_allocated,
        device_capacity=allocation.device_capacity,
        device_allocated=dra_totals(device_counts(device_groups), joined.all_pods, state, live),
        containers=add_dra_devices(containers, joined, state, topology),
        disagreements=disagreements,
    )
