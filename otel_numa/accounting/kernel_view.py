"""The kernel's view of pinning, beside the records: pure functions over effective cpusets.

- ``numa.cpu.pinned``: the CPUs of a NUMA node that exactly one pod's containers may run on, by their
  effective ``cpuset.cpus``: CPUs held exclusively, whoever pinned them (the kubelet's CPU manager, a DRA
  CPU driver, an NRI resource policy). A CPU of the shared pool is open to many pods; a CPU no container may
  run on is pinned by nobody.
- ``numa.container.allocation.mismatch``: whether a container's recorded exclusive CPUs (memory NUMA nodes)
  differ from its effective ``cpuset.cpus`` (``cpuset.mems``); no answer without a record or a cpuset.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from otel_numa.model import ContainerAllocation, Topology


def mismatch(recorded: frozenset[int], effective: frozenset[int] | None) -> bool | None:
    """Whether the kernel enforces other ids than recorded; None with no record or no effective set."""
    if not recorded or effective is None:
        return None
    return recorded != effective


def cpu_mismatch(allocation: ContainerAllocation | None, effective: frozenset[int] | None) -> bool | None:
    """A CPU record read from the kernel (a DRA CPU claim naming no cpuset) is no record to compare."""
    if allocation is None or allocation.cpus_from_kernel:
        return None
    return mismatch(allocation.cpu_ids, effective)


def memory_mismatch(allocation: ContainerAllocation | None, effective: frozenset[int] | None) -> bool | None:
    return mismatch(allocation.memory_nodes, effective) if allocation is not None else None


def pinned_per_node(cpusets: Iterable[tuple[str, frozenset[int]]], topology: Topology) -> Mapping[int, int]:
    """CPUs of each NUMA node (whose CPUs are known) that exactly one pod's containers may run on, from
    (pod UID, effective CPUs) of each container."""
    by_pod: dict[str, set[frozenset[int]]] = {}
    for pod_uid, cpus in cpusets:
        by_pod.setdefault(pod_uid, set()).add(cpus)  # containers of a pod mostly share one set object
    once: set[int] = set()
    many: set[int] = set()
    pods_per_set: dict[frozenset[int], int] = {}
    for sets in by_pod.values():
        union = next(iter(sets)) if len(sets) == 1 else frozenset().union(*sets)
        pods_per_set[union] = pods_per_set.get(union, 0) + 1
    for cpus, pods in pods_per_set.items():
        if pods > 1:
            many |= cpus
        else:
            many |= once & cpus
            once |= cpus
    pinned = once - many
    return {node.id: len(pinned & node.cpus) for node in topology.nodes if node.cpus_known}
