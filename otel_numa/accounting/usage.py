"""Pure functions from cgroup usage, container names and the kubelet's allocation to per-container NUMA usage.

Memory locality. A container has *intended* NUMA nodes when one of these holds (the first that applies):

1. the memory manager placed it: the nodes of its ``memory`` and ``hugepages-*`` blocks in the allocation.
   The allocation lists a block spanning several nodes under its lowest node only; the kubelet writes the
   block's whole affinity into the container's ``cpuset.mems``, so when the effective mems are confined,
   include every block node and start at the lowest of them, the mems are the intended nodes;
2. its effective ``cpuset.mems`` is confined: a proper subset of the machine's nodes with memory;
3. its effective CPUs are confined: the nodes holding them are a proper subset of the nodes with CPUs
   (exclusive CPUs from the cpu manager, with memory left to first touch).

Otherwise the container may use any node and has no locality. Locality is the share of the container's
*resident* memory that sits on its intended nodes. Resident memory is the user memory the kernel keeps on
its page lists: on cgroup v2 ``anon`` + ``file`` (``file`` holds the page cache, tmpfs and shared memory;
``shmem``, ``*_thp``, ``active_*``, ``unevictable`` ... are parts of these two and are not added again); on
cgroup v1 ``anon`` + ``file`` + ``unevictable`` (there they are the three disjoint page lists, and mlocked
memory lives only on the last). Kernel memory (stacks, page tables, slab) follows the allocating CPU, not
the application's placement, and is left out. A container with no resident memory has no locality.

CPU time per node. The kernel reports a cgroup's CPU time as one total (cgroup v2 has no per-CPU figure;
v1's ``cpuacct.usage_percpu`` is not read, so both versions behave alike). Each round's increase is split
over the NUMA nodes in proportion to how many of the container's effective CPUs each node holds, and added
to per-node running totals: exact for a container confined to one node, an estimate otherwise, and
monotonic even when a shared-pool cpuset changes between rounds.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from otel_numa.accounting.kernel_view import cpu_mismatch, memory_mismatch
from otel_numa.model import (
    NO_NUMA,
    Allocation,
    CgroupLayout,
    ContainerAllocation,
    ContainerIdentity,
    ContainerNumaUsage,
    ContainerRef,
    ContainerUsage,
    CpuTimeSplit,
    Topology,
    shared_set,
    small_map,
)

# Memory types exported per container and node by default: every type adds a series per container and node
# (the largest family on a busy node); "file" includes shmem, and anon + file is what locality uses.
DEFAULT_MEMORY_TYPES = frozenset({"anon", "file"})
# Resident memory per cgroup version (what locality divides)
RESIDENT_MEMORY_TYPES: Mapping[CgroupLayout, tuple[str, ...]] = {
    "v2": ("anon", "file"),
    "v1": ("anon", "file", "unevictable"),
}


def memory_types_to_read(exported: frozenset[str], layout: CgroupLayout) -> frozenset[str]:
    """The ``memory.numa_stat`` types a round must parse: the exported ones and those locality needs."""
    return exported.union(RESIDENT_MEMORY_TYPES[layout])


@dataclass(frozen=True, slots=True)
class MachineNodes:
    """What "confined" is measured against: the machine's nodes with memory, and each node's CPUs."""

    with_memory: frozenset[int]
    cpus: Mapping[int, frozenset[int]]

    @classmethod
    def of(cls, topology: Topology | None, memory_bytes_by_node: Mapping[int, int]) -> MachineNodes:
        cpus = {node.id: node.cpus for node in topology.nodes} if topology is not None else {}
        return cls(frozenset(node for node, total in memory_bytes_by_node.items() if total > 0), cpus)


def nodes_of_cpus(cpus: frozenset[int], machine: MachineNodes) -> frozenset[int]:
    return shared_set(node for node, node_cpus in machine.cpus.items() if cpus & node_cpus)


def resident_by_node(memory_by_type: Mapping[str, Mapping[int, int]], layout: CgroupLayout) -> dict[int, int]:
    resident: dict[int, int] = {}
    for memory_type in RESIDENT_MEMORY_TYPES[layout]:
        for node, amount in memory_by_type.get(memory_type, {}).items():
            resident[node] = resident.get(node, 0) + amount
    return resident


def allocated_nodes(allocation: ContainerAllocation | None) -> frozenset[int]:
    """Nodes of the container's memory manager blocks (memory and hugepages)."""
    if allocation is None:
        return shared_set(())
    nodes = set(allocation.memory_bytes) | {numa for numa, _size in allocation.hugepages_bytes}
    return shared_set(node for node in nodes if node != NO_NUMA)


def intended_nodes(
    placed: frozenset[int],
    mems: frozenset[int] | None,
    cpus: frozenset[int] | None,
    machine: MachineNodes,
) -> frozenset[int] | None:
    """The nodes a container's memory should be on (see the module notes), or ``None`` when not confined."""
    confined_mems = mems if mems and mems < machine.with_memory else None
    if placed:
        # a multi-node block is listed under its lowest node, which is then the lowest of the mems too
        widen = confined_mems is not None and placed <= confined_mems and min(confined_mems) == min(placed)
        return confined_mems if widen and confined_mems is not None else placed
    if confined_mems is not None:
        return confined_mems
    if cpus:
        cpu_nodes = nodes_of_cpus(cpus, machine)
        nodes_with_cpus = frozenset(node for node, node_cpus in machine.cpus.items() if node_cpus)
        if cpu_nodes and cpu_nodes < nodes_with_cpus:
            return cpu_nodes
    return None


def memory_locality(resident: Mapping[int, int], intended: frozenset[int] | None) -> float | None:
    """Share of resident memory on the intended nodes; ``None`` when not confined or nothing is resident."""
    if intended is None:
        return None
    total = sum(resident.values())
    if total <= 0:
        return None
    return sum(amount for node, amount in resident.items() if node in intended) / total


def cpu_shares(cpus: frozenset[int], machine: MachineNodes) -> dict[int, float]:
    """Fraction of the container's CPUs on each node that holds some of them (empty when none is known)."""
    counts = {node: len(cpus & node_cpus) for node, node_cpus in machine.cpus.items()}
    known = sum(counts.values())
    return {node: count / known for node, count in counts.items() if count} if known else {}


def advance_cpu_time(
    previous: CpuTimeSplit | None, total_s: float, shares: Mapping[int, float]
) -> CpuTimeSplit:
    """Add the CPU time used since ``previous`` to the per-node totals, split by this round's ``shares``.

    A first reading (or a total that went back: a new cgroup under the same id) is split whole.
    """
    if previous is None or total_s < previous.total_s:
        return CpuTimeSplit(total_s, small_map({node: total_s * share for node, share in shares.items()}))
    if total_s == previous.total_s:
        return previous  # no time to split: the same split, the same object
    delta = total_s - previous.total_s
    by_node = dict(previous.by_node.items())  # pairs: a dict built from a Mapping looks up each key
    for node, share in shares.items():
        by_node[node] = by_node.get(node, 0.0) + delta * share
    return CpuTimeSplit(total_s, small_map(by_node))


class JoinMemo:
    """The last join's containers, by container id, with what each was made from: in the next join a
    container whose reading, name and CPU time split are the same objects and whose allocation is equal is
    that same :class:`ContainerUsage` (a pod replaced leaves the others' as they were)."""

    def __init__(self) -> None:
        self.context: tuple[object, ...] | None = None  # the layout, machine and types they were joined with
        self.last: dict[str, tuple[object, object, object, object, ContainerUsage]] = {}


def join_usage(
    usages: Iterable[ContainerNumaUsage],
    layout: CgroupLayout,
    names: Mapping[str, ContainerIdentity],
    allocation: Allocation,
    machine: MachineNodes,
    cpu_time: Mapping[str, CpuTimeSplit],
    live_pods: frozenset[str] | None = None,
    exported: frozenset[str] = DEFAULT_MEMORY_TYPES,
    memo: JoinMemo | None = None,
) -> tuple[ContainerUsage, ...]:
    """Per-container usage with names, locality and per-node CPU time, sorted by pod UID and name.

    ``names`` maps container ids to identities (from ``/var/log/containers``, or any other provider such
    as the runtime); a container without a name (sandboxes have none) is left out, because the kubelet's
    allocation and every per-container series key containers by name. ``cpu_time`` is keyed by container id.
    A cgroup of a pod the kubelet no longer has (``live_pods``, when known) is left out too: it is being
    torn down, and its pod's other series are gone already. Each container's record (its allocation) is
    compared with its effective cpusets (:mod:`otel_numa.accounting.kernel_view`). With a ``memo``, a
    container whose inputs are those of the last join is its last :class:`ContainerUsage`.
    """
    allocations = {(c.container.pod_uid, c.container.container_name): c for c in allocation.containers}
    joined: dict[tuple[str, str], ContainerUsage] = {}
    last: dict[str, tuple[object, object, object, object, ContainerUsage]] = {}
    made: dict[str, tuple[object, object, object, object, ContainerUsage]] = {}
    if memo is not None:
        context = (layout, machine, exported)
        if memo.context == context:
            last = memo.last
        memo.context, memo.last = context, made
    for usage in usages:
        identity = names.get(usage.container_id)
        if identity is None or (live_pods is not None and usage.pod_uid not in live_pods):
            continue
        ref = ContainerRef(usage.pod_uid, identity.container_name, identity.pod_name, identity.namespace)
        key = (ref.pod_uid, ref.container_name)
        if key in joined:  # a restart caught mid-way: keep one, so attribute sets stay unique
            continue
        recorded = allocations.get(key)
        split = cpu_time.get(usage.container_id)
        before = last.get(usage.container_id)
        if (
            before is not None
            and before[0] is usage
            and before[1] is identity
            and before[2] is split
            and (before[3] is recorded or before[3] == recorded)
        ):
            joined[key] = before[4]
            made[usage.container_id] = before
            continue
        intended = intended_nodes(allocated_nodes(recorded), usage.mems, usage.cpus, machine)
        joined[key] = ContainerUsage(
            container=ref,
            container_id=usage.container_id,
            memory_by_type=_nonzero(usage.memory_by_type, exported),
            cpu_nodes=nodes_of_cpus(usage.cpus, machine) or None if usage.cpus is not None else None,
            memory_nodes=usage.mems,
            intended_nodes=intended,
            locality=memory_locality(resident_by_node(usage.memory_by_type, layout), intended),
            cpu_time_by_node=split.by_node if split is not None else {},
            cpus=usage.cpus,
            cpu_mismatch=cpu_mismatch(recorded, usage.cpus),
            memory_mismatch=memory_mismatch(recorded, usage.mems),
        )
        if memo is not None:
            made[usage.container_id] = (usage, identity, split, recorded, joined[key])
    return tuple(joined[key] for key in sorted(joined))


def _nonzero(
    memory_by_type: Mapping[str, Mapping[int, int]], types: Collection[str]
) -> Mapping[str, Mapping[int, int]]:
    """The exported types, without the nodes where the container has none: sparse, so that 1,000 containers
    on 16 nodes do not make 64,000 series of zeros. A type with no zero is the parsed mapping itself, not a
    copy (parsed readings are never changed), and so are the readings when all of them are exported."""
    found: dict[str, Mapping[int, int]] = {}
    for memory_type, by_node in memory_by_type.items():
        if memory_type not in types:
            continue
        if by_node and 0 in by_node.values():
            by_node = small_map({node: amount for node, amount in by_node.items() if amount})
        if by_node:
            found[memory_type] = by_node
    if len(found) == len(memory_by_type) and all(found[kind] is memory_by_type[kind] for kind in found):
        return memory_by_type
    return small_map(found)
