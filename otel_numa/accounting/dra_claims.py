"""CPUs and memory handed out by DRA drivers: counted as CPUs and memory, never as devices.

A claim of the CPU driver (``dra.cpu``) holds the CPUs its CDI device names (:class:`DraDriverRecord`);
where the device names none (``dynamic``, a missing or untrusted spec), its CPUs are the effective cpuset
of the containers that use it (``KubeletState.kernel_cpus``), and such a container has no CPU record of its
own to compare with its cgroup. A claim of the memory driver (``dra.memory``) holds the memory and
hugepages blocks its CDI device names, each on one NUMA node.

Claims are known by (namespace, name): podresources names them so per container, the ``dra_manager_state``
checkpoint per pod. Per-NUMA totals count each CPU once (a union) and each claim's blocks once, however
many containers use it; a claim whose CPUs or memory cannot be told this round makes those totals unknown
(``None``), never one short.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from otel_numa.model import (
    NO_NUMA,
    ContainerMemory,
    DraClaim,
    DraDevice,
    HugepageKey,
    KubeletState,
    Topology,
)
from otel_numa.sources.dra_drivers import CPU_AND_MEMORY_DRIVERS, CPU_DRIVER, MEMORY_DRIVER

ClaimKey = tuple[str, str]  # (namespace, name)
_HUGEPAGES = "hugepages-"


def counts_as_device(device: DraDevice) -> bool:
    """Whether a DRA device is a device (a GPU, a NIC), not CPUs or memory handed out through DRA."""
    return device.driver not in CPU_AND_MEMORY_DRIVERS


@dataclass
class ClaimUse:
    """What one container gets from its CPU and memory claims this round."""

    cpus: set[int] = field(default_factory=set)
    memory: list[ContainerMemory] = field(default_factory=list)
    memory_nodes: set[int] = field(default_factory=set)
    cpus_from_kernel: bool = False
    unknown: bool = False  # a claim's CPUs or memory cannot be told: its series are left out

    @property
    def empty(self) -> bool:
        return not (self.cpus or self.memory or self.cpus_from_kernel or self.unknown)


def _cdi_names(devices: Iterable[DraDevice], driver: str) -> tuple[list[str], bool]:
    """The CDI device names of ``driver``'s devices, and whether any of its devices names none."""
    names: list[str] = []
    nameless = False
    for device in devices:
        if device.driver == driver:
            names.extend(device.cdi_devices)
            nameless = nameless or not device.cdi_devices
    return names, nameless


def _has(devices: Iterable[DraDevice], driver: str) -> bool:
    return any(device.driver == driver for device in devices)


def claim_use(claims: Iterable[DraClaim], state: KubeletState, container: tuple[str, str] | None) -> ClaimUse:
    """The CPUs and memory a container's (or, with ``container`` None, a pod's) claims hold."""
    use = ClaimUse()
    for claim in claims:
        if _has(claim.devices, CPU_DRIVER):
            names, nameless = _cdi_names(claim.devices, CPU_DRIVER)
            records = [state.dra_records.get(name) for name in names]
            given = [record.cpus for record in records if record is not None and record.cpus is not None]
            for cpus in given:
                use.cpus |= cpus
            if nameless or not names or len(given) < len(records):
                kernel = state.kernel_cpus.get(container) if container is not None else None
                if kernel is None:
                    use.unknown = True
                else:
                    use.cpus |= kernel
                    use.cpus_from_kernel = True
        if _has(claim.devices, MEMORY_DRIVER):
            names, nameless = _cdi_names(claim.devices, MEMORY_DRIVER)
            memory_records = [state.dra_records.get(name) for name in dict.fromkeys(names)]
            if nameless or not names or any(record is None for record in memory_records):
                use.unknown = True
            for record in memory_records:
                if record is not None:
                    use.memory.extend(record.memory)
                    use.memory_nodes.update(numa for block in record.memory for numa in block.numa_ids)
    return use


@dataclass(frozen=True, slots=True)
class ClaimTotals:
    """Per-NUMA totals over every live claim; ``None``: not known this round."""

    cpus: frozenset[int] | None
    memory: Mapping[int, int] | None
    hugepages: Mapping[HugepageKey, int] | None
    any_memory: bool  # some live claim is a memory claim


def claim_totals(state: KubeletState, live: Callable[[str], bool]) -> ClaimTotals:
    """The CPUs and memory of every claim a live container (podresources) or a live pod (the checkpoint)
    uses, each claim once."""
    uses: dict[ClaimKey, list[ClaimUse]] = {}
    claims: dict[ClaimKey, DraClaim] = {}
    joined = state.podresources
    if joined is not None:
        for uid, pod in joined.by_uid.items():
            for container in pod.containers:
                for claim in container.dynamic_resources:
                    if _is_cpu_or_memory(claim):
                        key = (claim.namespace, claim.name)
                        claims.setdefault(key, claim)
                        uses.setdefault(key, []).append(claim_use((claim,), state, (uid, container.name)))
        for pod in joined.unjoined:  # no UID: no cgroup to read a dynamic claim's CPUs from
            for container in pod.containers:
                for claim in container.dynamic_resources:
                    if _is_cpu_or_memory(claim):
                        key = (claim.namespace, claim.name)
                        claims.setdefault(key, claim)
                        uses.setdefault(key, []).append(claim_use((claim,), state, None))
    if state.dra is not None:
        for dra_claim in state.dra.claims:
            key = (dra_claim.namespace, dra_claim.name)
            if key in uses or not _is_cpu_or_memory(dra_claim):
                continue
            if any(live(uid) for uid in dra_claim.pod_uids):  # the checkpoint names pods, not containers
                claims[key] = dra_claim
                uses[key] = [claim_use((dra_claim,), state, None)]
    cpus: set[int] = set()
    cpus_known = True
    memory: dict[int, int] = {}
    hugepages: dict[HugepageKey, int] = {}
    memory_known = True
    any_memory = False
    for key, claim_uses in uses.items():
        for use in claim_uses:
            cpus |= use.cpus
        if _has(claims[key].devices, CPU_DRIVER) and any(use.unknown for use in claim_uses):
            cpus_known = False
        if _has(claims[key].devices, MEMORY_DRIVER):
            any_memory = True
            first = claim_uses[0]  # every container of a claim gets the same blocks: counted once
            memory_known = memory_known and not first.unknown
            add_blocks(first.memory, memory, hugepages)
    return ClaimTotals(
        frozenset(cpus) if cpus_known else None,
        memory if memory_known else None,
        hugepages if memory_known else None,
        any_memory,
    )


def _is_cpu_or_memory(claim: DraClaim) -> bool:
    return any(not counts_as_device(device) for device in claim.devices)


def add_blocks(
    blocks: Iterable[ContainerMemory], memory: dict[int, int], hugepages: dict[HugepageKey, int]
) -> None:
    """Add ``blocks`` to per-node memory and (node, size) hugepages, a block on its lowest node."""
    for block in blocks:
        numa = min(block.numa_ids) if block.numa_ids else NO_NUMA
        if block.memory_type == "memory":
            memory[numa] = memory.get(numa, 0) + block.size
        elif block.memory_type.startswith(_HUGEPAGES):
            key = (numa, block.memory_type[len(_HUGEPAGES) :])
            hugepages[key] = hugepages.get(key, 0) + block.size


def memory_totals_with_claims(
    recorded: Mapping[int, int] | None,
    recorded_hugepages: Mapping[HugepageKey, int] | None,
    totals: ClaimTotals,
    topology: Topology,
) -> tuple[Mapping[int, int] | None, Mapping[HugepageKey, int] | None]:
    """The memory manager's per-NUMA totals with the memory claims' added. With no memory manager totals,
    the claims' alone, every NUMA node listed (0 where no claim is): a node whose memory driver holds
    claims shows where they are; with no claim at all, nothing tells that a driver runs (absent)."""
    if not totals.any_memory:
        return recorded, recorded_hugepages
    if totals.memory is None or totals.hugepages is None:
        return None, None
    memory = dict(recorded) if recorded is not None else dict.fromkeys(topology.node_ids, 0)
    hugepages = dict(recorded_hugepages) if recorded_hugepages is not None else {}
    for numa, amount in totals.memory.items():
        memory[numa] = memory.get(numa, 0) + amount
    sizes = {size for _numa, size in totals.hugepages}
    if recorded_hugepages is None:
        hugepages.update(((numa, size), 0) for numa in topology.node_ids for size in sizes)
    for key, amount in totals.hugepages.items():
        hugepages[key] = hugepages.get(key, 0) + amount
    return memory, hugepages


def needing_kernel_cpus(state: KubeletState) -> frozenset[tuple[str, str]]:
    """The (pod uid, container) whose CPU claim names no cpuset: their effective cpusets are wanted."""
    joined = state.podresources
    if joined is None:
        return frozenset()
    wanted: set[tuple[str, str]] = set()
    for uid, pod in joined.by_uid.items():
        for container in pod.containers:
            for claim in container.dynamic_resources:
                if not _has(claim.devices, CPU_DRIVER):
                    continue
                names, nameless = _cdi_names(claim.devices, CPU_DRIVER)
                records = [state.dra_records.get(name) for name in names]
                if nameless or not names or any(record is None or record.cpus is None for record in records):
                    wanted.add((uid, container.name))
    return frozenset(wanted)
