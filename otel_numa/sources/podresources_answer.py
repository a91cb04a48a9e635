"""One podresources answer turned into the model's values, within limits: ids the machine has, and caps far
above a real node's on what one answer may hold.

The kubelet is trusted as little as a file is. An answer naming a CPU or a NUMA node the machine does not
have is not about this machine (``out_of_range``); one holding more than :data:`MAX_ENTRIES` entries (pods,
containers, device groups, device ids, memory blocks, DRA claims and their devices), or a CPU set longer
than the machine's CPUs (it must repeat an id), is past a cap (``over_limit``). Either is refused whole, at
the first entry that breaks the rule, before it is built: its ids never become series, and what refusing it
costs is bounded by the caps, whatever the answer holds. CPU sets are not capped together: kubelets before
1.22 list the whole shared pool for every container outside it, so a real answer may hold the machine's CPUs
once per container (the answer's values are bounded before it is parsed, otel_numa.sources.wire_values).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from otel_numa.model import (
    AllocatableResources,
    ContainerDevices,
    ContainerMemory,
    ContainerResources,
    DraClaim,
    DraDevice,
    PodResources,
    shared_name,
    shared_set,
)
from otel_numa.proto import podresources_v1_pb2 as pb
from otel_numa.sources.errors import SourceCorrupt
from otel_numa.sources.files import MAX_CPU_ID, MAX_NUMA_NODE_ID, OUT_OF_RANGE

OVER_LIMIT = "over_limit"
# A 5,000-container node answers with ~100,000 entries at most (a few devices and memory blocks each);
# KubeVirt nodes list ~1,000 device ids per resource as allocatable.
MAX_ENTRIES = 100_000


@dataclass(frozen=True, slots=True)
class MachineLimits:
    """The ids of the machine the answer must be about; the widest any kernel has while it is not known."""

    highest_cpu: int = MAX_CPU_ID
    numa_nodes: frozenset[int] | None = None  # None: any id up to MAX_NUMA_NODE_ID

    @property
    def cpu_ids(self) -> int:
        """CPU ids one set may list: every CPU of the machine once."""
        return self.highest_cpu + 1


class AnswerReader:
    """Reads one answer; raises :class:`SourceCorrupt` at the first entry past the machine or a cap."""

    def __init__(self, limits: MachineLimits, what: str) -> None:
        self._limits = limits
        self._what = what
        self._entries = 0

    def pods(self, pods: Sequence[pb.PodResources]) -> tuple[PodResources, ...]:
        self._count(len(pods))
        return tuple(self._pod(pod) for pod in pods)

    def allocatable(self, response: pb.AllocatableResourcesResponse) -> AllocatableResources:
        return AllocatableResources(
            cpu_ids=self._cpus(response.cpu_ids),
            devices=self._devices(response.devices),
            memory=self._memory(response.memory),
        )

    def _refuse(self, what: str, error_type: str) -> SourceCorrupt:
        return SourceCorrupt(f"{self._what}: {what}; the answer is left out", error_type=error_type)

    def _count(self, entries: int) -> None:
        self._entries += entries
        if self._entries > MAX_ENTRIES:
            raise self._refuse(f"more than {MAX_ENTRIES} entries", OVER_LIMIT)

    def _cpus(self, ids: Sequence[int]) -> frozenset[int]:
        if not ids:
            return shared_set(())
        if min(ids) < 0 or max(ids) > self._limits.highest_cpu:
            raise self._refuse("a CPU the machine does not have", OUT_OF_RANGE)
        if len(ids) > self._limits.cpu_ids:
            raise self._refuse(f"a set of more than {self._limits.cpu_ids} CPU ids", OVER_LIMIT)
        return shared_set(ids)

    def _numa_ids(self, topology: pb.TopologyInfo) -> tuple[int, ...]:
        nodes = topology.nodes
        self._count(len(nodes))
        ids = {node.ID for node in nodes}
        known = self._limits.numa_nodes
        if any(
            not 0 <= numa <= MAX_NUMA_NODE_ID or (known is not None and numa not in known) for numa in ids
        ):
            raise self._refuse("a NUMA node the machine does not have", OUT_OF_RANGE)
        return tuple(sorted(ids))

    def _devices(self, devices: Sequence[pb.ContainerDevices]) -> tuple[ContainerDevices, ...]:
        found = []
        self._count(len(devices))  # all at once: 200,000 of them are refused before the first is read
        for device in devices:
            self._count(len(device.device_ids))
            found.append(
                ContainerDevices(
                    resource_name=shared_name(device.resource_name),
                    device_ids=tuple(device.device_ids),
                    numa_ids=self._numa_ids(device.topology),
                )
            )
        return tuple(found)

    def _memory(self, blocks: Sequence[pb.ContainerMemory]) -> tuple[ContainerMemory, ...]:
        self._count(len(blocks))
        return tuple(
            ContainerMemory(
                memory_type=block.memory_type, size=block.size, numa_ids=self._numa_ids(block.topology)
            )
            for block in blocks
        )

    def _claims(self, dynamic: Sequence[pb.DynamicResource]) -> tuple[DraClaim, ...]:
        self._count(len(dynamic))
        return tuple(
            DraClaim(
                name=shared_name(claim.claim_name),
                namespace=shared_name(claim.claim_namespace),
                devices=self._claim_devices(claim.claim_resources),
            )
            for claim in dynamic
        )

    def _claim_devices(self, resources: Sequence[pb.ClaimResource]) -> tuple[DraDevice, ...]:
        self._count(len(resources))
        for resource in resources:
            self._count(len(resource.cdi_devices))
        return tuple(
            DraDevice(
                driver=shared_name(resource.driver_name),
                pool=resource.pool_name,
                device=resource.device_name,
                cdi_devices=tuple(cdi.name for cdi in resource.cdi_devices),
                share_id=resource.share_id if resource.HasField("share_id") else None,
            )
            for resource in resources
        )

    def _containers(self, containers: Iterable[pb.ContainerResources]) -> tuple[ContainerResources, ...]:
        return tuple(
            ContainerResources(
                name=shared_name(container.name),
                cpu_ids=self._cpus(container.cpu_ids),
                devices=self._devices(container.devices),
                memory=self._memory(container.memory),
                dynamic_resources=self._claims(container.dynamic_resources),
            )
            for container in containers
        )

    def _pod(self, pod: pb.PodResources) -> PodResources:
        self._count(len(pod.containers))
        return PodResources(
            name=shared_name(pod.name),
            namespace=shared_name(pod.namespace),
            containers=self._containers(pod.containers),
            cpu_ids=self._cpus(pod.cpu_ids),
            memory=self._memory(pod.memory),
        )
