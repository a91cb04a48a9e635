"""The typed values that flow between the agent's layers: sources -> accounting -> snapshot -> instruments.

Plain immutable dataclasses, no I/O and no third-party imports, so that every layer (and a test) can use
them without pulling in gRPC, OpenTelemetry or a file reader. Sources produce the machine and kubelet
values; accounting turns them into allocation and per-container usage; the snapshot holds the results.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

NO_NUMA = -1  # numa.node.id of a device with no NUMA affinity


class Source(enum.StrEnum):
    """What the agent reads: the values of ``numa.source`` on its health series."""

    SYSFS = "sysfs"
    PROCFS = "procfs"
    CPU_MANAGER = "cpu_manager"
    MEMORY_MANAGER = "memory_manager"
    DEVICE_MANAGER = "device_manager"
    PODRESOURCES = "podresources"
    CRI = "cri"
    CGROUP = "cgroup"
    DRA_MANAGER = "dra_manager"
    CDI = "cdi"


CgroupLayout = Literal["v1", "v2"]
HugepageKey = tuple[int, str]  # (numa id, k8s.hugepage.size)
DeviceKey = tuple[int, str]  # (numa id, numa.resource.name)
PodName = tuple[str, str]  # (namespace, name)

T = TypeVar("T")


class Interned(Generic[T]):
    """Hands back one object for all equal values: the first one seen. Holds at most ``limit`` distinct
    values and forgets them all at once past that, so values that change without end cannot pile up."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._known: dict[T, T] = {}

    def __call__(self, value: T) -> T:
        found = self._known.get(value)
        if found is None:
            if len(self._known) >= self._limit:
                self._known.clear()
            self._known[value] = found = value
        return found


# far more than a node's distinct node sets and exclusive CPU sets
_shared_sets: Interned[frozenset[int]] = Interned(limit=4096)


# Longest name kept, in characters: Kubernetes names are at most 253 (a pod's), namespaces and container
# names 63, UIDs 36, container ids 64. A longer one is cut to this length (docs/decisions/hostile-input.md).
MAX_NAME_LENGTH = 253


def valid_name(text: str) -> str:
    """``text`` as a valid attribute value: invalid UTF-8 (a file name's undecodable bytes, which Python
    holds as lone surrogates) replaced by U+FFFD, and cut to :data:`MAX_NAME_LENGTH` characters."""
    if len(text) > MAX_NAME_LENGTH:
        text = text[:MAX_NAME_LENGTH]
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            # undecodable file-name bytes come back as those bytes, anything else as one U+FFFD each
            raw = text.encode("utf-8", "surrogateescape" if _only_escapes(text) else "surrogatepass")
            text = raw.decode("utf-8", "replace")
    return text


def _only_escapes(text: str) -> bool:
    return all(not "\ud800" <= char <= "\udfff" or "\udc80" <= char <= "\udcff" for char in text)


def shared_name(text: str) -> str:
    """One string object for all equal pod names, namespaces, container names, pod UIDs and container
    IDs: every source parses its own (log names, cgroup paths, the checkpoints, podresources), and a
    container's are kept for as long as it lives (~0.4 KB per container in copies). Interned, so a
    string no source holds any more is freed. Names are data: each is made a valid attribute value
    here (:func:`valid_name`), where it enters the agent, so no name can fail a page or a push."""
    return sys.intern(valid_name(text))


def shared_set(ids: Iterable[int]) -> frozenset[int]:
    """One frozenset object for all equal sets of ids kept per container (its NUMA nodes, its exclusive
    CPUs): a node of 1,000 containers has a handful of distinct ones, and even an empty frozenset takes
    216 bytes."""
    return _shared_sets(frozenset(ids))


# Small mappings -------------------------------------------------------------------------------------

K = TypeVar("K", int, str)
V = TypeVar("V")

# the key tuples of small maps (a node's NUMA ids, the memory types, attribute names): a few dozen
_small_map_keys: Interned[tuple[Any, ...]] = Interned(limit=1024)


class SmallMap(tuple[Any, ...], Mapping[K, V]):
    """An immutable mapping of a few entries kept per container (node -> bytes, memory type -> nodes),
    stored as one tuple: ``(keys, *values)``, the keys tuple shared by every map with the same keys. A dict
    of two entries takes ~220 bytes; this takes 64. Equal to any mapping with the same items."""

    __slots__ = ()

    def __getitem__(self, key: Any) -> Any:
        keys = tuple.__getitem__(self, 0)
        if key not in keys:
            raise KeyError(key)
        return tuple.__getitem__(self, keys.index(key) + 1)

    def get(self, key: Any, default: Any = None) -> Any:
        keys = tuple.__getitem__(self, 0)
        return tuple.__getitem__(self, keys.index(key) + 1) if key in keys else default

    def __iter__(self) -> Iterator[K]:
        return iter(tuple.__getitem__(self, 0))

    def __len__(self) -> int:
        return tuple.__len__(self) - 1

    def __contains__(self, key: object) -> bool:
        return key in tuple.__getitem__(self, 0)

    def keys(self) -> KeysView[K]:
        return KeysView(self)

    def values(self) -> ValuesView[V]:
        return _SmallMapValues(self)

    def items(self) -> ItemsView[K, V]:
        return _SmallMapItems(self)

    def pairs(self) -> Iterator[tuple[K, V]]:
        """The items, without a lookup per key."""
        return zip(tuple.__getitem__(self, 0), tuple.__getitem__(self, slice(1, None)), strict=True)

    def __eq__(self, other: object) -> bool:
        if type(other) is type(self):
            return tuple.__eq__(self, other)
        if isinstance(other, Mapping):
            return len(other) == len(self) and all(
                key in other and other[key] == value for key, value in self.pairs()
            )
        if isinstance(other, tuple):
            # never equal to the plain tuple it is stored as: that tuple is no mapping, so equality stays
            # transitive (a map equal to a dict and to a tuple would make the two equal)
            return False
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = tuple.__hash__

    def __repr__(self) -> str:
        return repr(dict(self.pairs()))


class _SmallMapItems(ItemsView[Any, Any]):
    _mapping: SmallMap[Any, Any]

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return self._mapping.pairs()


class _SmallMapValues(ValuesView[Any]):
    _mapping: SmallMap[Any, Any]

    def __iter__(self) -> Iterator[Any]:
        return iter(tuple.__getitem__(self._mapping, slice(1, None)))


def small_map(entries: Mapping[K, V]) -> SmallMap[K, V]:
    """``entries`` as a :class:`SmallMap`, in their order."""
    if type(entries) is SmallMap:
        return entries
    return tuple.__new__(SmallMap, (_small_map_keys(tuple(entries)), *entries.values()))


# Machine ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NumaNode:
    id: int
    cpus: frozenset[int]
    # target node id -> distance, in the order of the online node ids (10 = local); empty when unknown
    distances: Mapping[int, int]
    # False when neither cpulist nor cpumap (or no online mask) could be read: ``cpus`` is then empty and
    # every CPU number of the node is unknown (absent), not 0
    cpus_known: bool = True


@dataclass(frozen=True, slots=True)
class Topology:
    nodes: tuple[NumaNode, ...]  # sorted by id
    online_cpus: frozenset[int]
    # False when the kernel has no devices/system/node: one synthetic node 0 holds every online CPU
    numa_enabled: bool
    # CPUs that more than one node's cpulist claims (buggy firmware); reported as the kernel states them
    overlapping_cpus: frozenset[int]

    @property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(node.id for node in self.nodes)

    def node(self, node_id: int) -> NumaNode:
        """The node with this id (``KeyError`` when there is none)."""
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(node_id)


@dataclass(frozen=True, slots=True)
class NodeMemory:
    # each from its own meminfo field (used: MemUsed, else MemTotal - MemFree); None when not known
    total_bytes: int | None
    free_bytes: int | None
    used_bytes: int | None


@dataclass(frozen=True, slots=True)
class HugepagePool:
    size_kib: int
    total_pages: int | None  # nr_hugepages; None when that file could not be read
    free_pages: int | None  # free_hugepages; likewise


@dataclass(frozen=True, slots=True)
class PciFunction:
    """One PCI function of ``bus/pci/devices`` (bridges included; the count leaves them out)."""

    address: str  # domain:bus:device.function, e.g. 0000:3b:00.0
    numa_node: int  # by the PCI rule: numa_node, else the one node holding its local CPUs, else -1
    base_class: int  # the top byte of ``class``
    virtual: bool  # an SR-IOV virtual function (it has a ``physfn`` link)


PciCountKey = tuple[int, str, str]  # (numa id, pci.device.class, pci.function.kind)


@dataclass(frozen=True, slots=True)
class PciDevices:
    """The machine's PCI functions, read with the topology; empty when the PCI part is not read."""

    functions: Mapping[str, PciFunction] = field(default_factory=dict)  # by address
    counts: Mapping[PciCountKey, int] = field(default_factory=dict)  # bridges left out

    def numa_of(self, address: str) -> int | None:
        """The NUMA node of the function at ``address``; None when there is no such function."""
        found = self.functions.get(address)
        return None if found is None else found.numa_node


NO_PCI = PciDevices()


@dataclass(frozen=True, slots=True)
class MachineUsage:
    topology: Topology
    memory: Mapping[int, NodeMemory]
    hugepages: Mapping[int, tuple[HugepagePool, ...]]
    numastat: Mapping[int, Mapping[str, int]]
    cpu_time: Mapping[int, Mapping[str, float]]  # numa id -> cpu.mode -> seconds
    pci: PciDevices = NO_PCI


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """What the agent's own process costs, read once per collection."""

    cpu_user_s: float
    cpu_system_s: float
    resident_bytes: int
    open_file_descriptors: int
    threads: int


# The kubelet's checkpoints ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CpuManagerState:
    """A verified CPU manager checkpoint.

    ``entries`` maps pod UID -> container name -> exclusive CPUs. In a v1 file
    (``entries_keyed_by_container_id``) the keys are container ids, each mapping the empty container name
    to its CPUs: they match no pod UID. ``pod_entries`` (v3, v4) maps pod UID -> the pod's CPU pool.
    Entries of deleted pods stay until the kubelet's next allocation: callers drop those of dead pods.
    """

    policy_name: str
    default_cpu_set: frozenset[int]
    entries: Mapping[str, Mapping[str, frozenset[int]]]
    layout: str = "v2"
    entries_keyed_by_container_id: bool = False
    pod_entries: Mapping[str, frozenset[int]] = field(default_factory=dict)
    checksum_verified: bool = True


@dataclass(frozen=True, slots=True)
class MemoryTable:
    """One resource on one NUMA node, in bytes (hugepages too): ``reserved`` is what containers hold."""

    total: int
    system_reserved: int
    allocatable: int
    reserved: int
    free: int


@dataclass(frozen=True, slots=True)
class NumaMemoryState:
    """``memory_map`` keys are resource names: ``memory``, ``hugepages-2Mi``, ``hugepages-1Gi``, ..."""

    number_of_assignments: int
    cells: tuple[int, ...]
    memory_map: Mapping[str, MemoryTable]


@dataclass(frozen=True, slots=True)
class MemoryBlock:
    numa_affinity: tuple[int, ...]
    resource: str
    size: int


@dataclass(frozen=True, slots=True)
class MemoryManagerState:
    """A verified memory manager checkpoint.

    ``entries`` maps pod UID -> container name -> blocks; ``pod_entries`` (v2, v3) maps pod UID -> the
    pod's blocks. Entries of deleted pods stay until the kubelet's next allocation: callers drop them.
    """

    policy_name: str
    machine_state: Mapping[int, NumaMemoryState]
    entries: Mapping[str, Mapping[str, tuple[MemoryBlock, ...]]]
    layout: str = "v2"
    pod_entries: Mapping[str, tuple[MemoryBlock, ...]] = field(default_factory=dict)
    checksum_verified: bool = True


@dataclass(frozen=True, slots=True)
class DeviceEntry:
    """The devices of one resource allocated to one container.

    ``devices_by_numa`` maps a NUMA node id to device ids, ``-1`` meaning no NUMA affinity. A v1 file
    (Kubernetes <= 1.19) records no NUMA node at all: its devices are all filed under ``-1`` (the kubelet
    itself, converting such a file, files them under node 0, which would be a guess).
    """

    pod_uid: str
    container_name: str
    resource_name: str
    devices_by_numa: Mapping[int, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class DeviceManagerState:
    """A verified device checkpoint: entries in file order, and device ids per registered resource."""

    entries: tuple[DeviceEntry, ...]
    registered_devices: Mapping[str, tuple[str, ...]]
    layout: str = "v2"


# The podresources API -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]
    numa_ids: tuple[int, ...]  # sorted, without repeats; empty when the device has no NUMA affinity


@dataclass(frozen=True, slots=True)
class ContainerMemory:
    memory_type: str  # "memory" or "hugepages-<size>"
    size: int  # bytes
    numa_ids: tuple[int, ...]  # sorted, without repeats


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One device a DRA driver allocated for a ResourceClaim (podresources ``ClaimResource``, or a device
    of the ``dra_manager_state`` checkpoint)."""

    driver: str  # numa.resource.name, e.g. gpu.nvidia.com
    pool: str
    device: str
    cdi_devices: tuple[str, ...] = ()  # fully qualified CDI names: vendor/class=name
    share_id: str | None = None  # a shared (consumable capacity) allocation

    @property
    def key(self) -> DraDeviceKey:
        return (self.driver, self.pool, self.device)


DraDeviceKey = tuple[str, str, str]  # (driver, pool, device): one physical device


@dataclass(frozen=True, slots=True)
class DraClaim:
    """A ResourceClaim's devices; ``pod_uids`` only from the checkpoint (podresources names containers)."""

    name: str
    namespace: str
    devices: tuple[DraDevice, ...]
    uid: str = ""
    pod_uids: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class DraDriverRecord:
    """What a DRA CPU or memory driver wrote for one claim into its CDI device's environment
    (``DRA_CPUSET_<claim UID>``, ``DRAMEMORY_<claim UID>_<resource>``)."""

    # the claim's CPUs; None: no cpuset given (``dynamic``, missing, or not a cpuset), so the CPUs are the
    # effective cpuset of the containers that use the claim
    cpus: frozenset[int] | None = None
    memory: tuple[ContainerMemory, ...] = ()  # memory and hugepages blocks, each on its NUMA node


@dataclass(frozen=True, slots=True)
class DraManagerState:
    """A verified DRA manager checkpoint: the prepared resource claims."""

    claims: tuple[DraClaim, ...]

    @property
    def claim_count(self) -> int:
        return len(self.claims)


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    cpu_ids: frozenset[int]  # exclusive CPUs only; empty for containers in the shared pool
    devices: tuple[ContainerDevices, ...]
    memory: tuple[ContainerMemory, ...]
    dynamic_resources: tuple[DraClaim, ...] = ()  # DRA claims the container uses


@dataclass(frozen=True, slots=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...]
    # pod-level exclusive resources (pod-level resource managers); the containers' lie inside them
    cpu_ids: frozenset[int] = frozenset()
    memory: tuple[ContainerMemory, ...] = ()


@dataclass(frozen=True, slots=True)
class AllocatableResources:
    cpu_ids: frozenset[int]
    devices: tuple[ContainerDevices, ...]
    memory: tuple[ContainerMemory, ...]


@dataclass(frozen=True, slots=True)
class PodResourcesView:
    """One good answer of the podresources API; ``allocatable`` is None when the kubelet lacks the call."""

    pods: tuple[PodResources, ...]
    allocatable: AllocatableResources | None


@dataclass(frozen=True, slots=True)
class JoinedPodResources:
    """A :class:`PodResourcesView` with its pods keyed by UID where the join succeeded."""

    by_uid: Mapping[str, PodResources]
    unjoined: tuple[PodResources, ...]
    allocatable: AllocatableResources | None

    @property
    def all_pods(self) -> tuple[PodResources, ...]:
        return (*self.by_uid.values(), *self.unjoined)


# Kubelet state and allocation ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KubeletState:
    """The kubelet's checkpoints (each ``None`` when absent or rejected this round) and who is alive."""

    cpu: CpuManagerState | None = None
    memory: MemoryManagerState | None = None
    devices: DeviceManagerState | None = None
    dra: DraManagerState | None = None
    # NUMA node of each DRA device that node-local facts place (PCI address, CDI device nodes); others -1
    dra_numa: Mapping[DraDeviceKey, int] = field(default_factory=dict)
    # DRA devices whose placement cannot be told this round (their CDI spec is missing or rejected)
    dra_unknown: frozenset[DraDeviceKey] = frozenset()
    # UIDs of pods that exist (podresources' answer, else <kubelet-root>/pods/); None: unknown, keep all
    live_pods: frozenset[str] | None = None
    pod_names: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # uid -> (namespace, name)
    # podresources' allocatable view; it wins over what the checkpoints and settings imply
    allocatable_cpus: frozenset[int] | None = None
    allocatable_devices: Mapping[DeviceKey, int] | None = None
    # podresources' answer joined to UIDs (see otel_numa.accounting.join); where it disagrees with a
    # checkpoint it wins
    podresources: JoinedPodResources | None = None
    # what DRA CPU and memory drivers gave each claim, by the claim's CDI device name
    dra_records: Mapping[str, DraDriverRecord] = field(default_factory=dict)
    # (pod uid, container) -> effective CPUs, for the containers of DRA CPU claims that name no cpuset
    kernel_cpus: Mapping[tuple[str, str], frozenset[int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ContainerRef:
    pod_uid: str
    container_name: str
    pod_name: str | None = None
    namespace: str | None = None
    # opt-in runtime enrichment put straight on the per-container series (enrich_mode=attributes)
    extra_attributes: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    container: ContainerRef
    cpus: Mapping[int, int] = field(default_factory=dict)
    memory_bytes: Mapping[int, int] = field(default_factory=dict)
    hugepages_bytes: Mapping[HugepageKey, int] = field(default_factory=dict)
    devices: Mapping[DeviceKey, int] = field(default_factory=dict)
    # NUMA nodes of every NUMA-pinned resource (exclusive CPUs, memory blocks, placed devices); -1 never
    pinned_nodes: frozenset[int] = frozenset()
    # True when a device of the container could not be placed this round: its alignment is not known
    alignment_unknown: bool = False
    # what is recorded for it, compared with its cgroup: its exclusive CPUs (cpu manager, podresources,
    # DRA CPU claims) and the NUMA nodes of its memory (memory manager blocks, DRA memory claims)
    cpu_ids: frozenset[int] = frozenset()
    memory_nodes: frozenset[int] = frozenset()
    # some of its CPUs are its effective cpuset (a DRA CPU claim with no cpuset): no record to compare
    cpus_from_kernel: bool = False

    @property
    def aligned(self) -> bool | None:
        """True on one node, False across several, None with nothing NUMA-pinned or when not known."""
        if self.alignment_unknown or not self.pinned_nodes:
            return None
        return len(self.pinned_nodes) == 1


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """Pod-level exclusive resources (no container name): CPUs and memory per NUMA node."""

    pod_uid: str
    pod_name: str | None = None
    namespace: str | None = None
    cpus: Mapping[int, int] = field(default_factory=dict)
    memory_bytes: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Allocation:
    """What the kubelet may hand out and has handed out; ``None`` means unknown (no series), never 0."""

    cpu_allocatable: Mapping[int, int] | None = None
    cpu_allocated: Mapping[int, int] | None = None
    memory_allocatable: Mapping[int, int] | None = None
    memory_allocated: Mapping[int, int] | None = None
    hugepages_allocatable: Mapping[HugepageKey, int] | None = None
    hugepages_allocated: Mapping[HugepageKey, int] | None = None
    device_capacity: Mapping[DeviceKey, int] | None = None
    device_allocated: Mapping[DeviceKey, int] | None = None
    containers: tuple[ContainerAllocation, ...] = ()
    # (pod uid, container) whose checkpoint allocation differs from podresources' (which won)
    disagreements: frozenset[tuple[str, str]] = frozenset()
    # (pod uid, container) -> enrichment attributes of numa.container.info (opt-in, from the runtime)
    container_info: Mapping[tuple[str, str], Mapping[str, str]] | None = None
    pods: tuple[PodAllocation, ...] = ()


# Containers' usage --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerIdentity:
    pod_name: str
    namespace: str
    container_name: str
    container_id: str


@dataclass(frozen=True, slots=True)
class ContainerNumaUsage:
    pod_uid: str
    container_id: str
    # memory type (anon, file, kernel_stack, shmem, ...) -> NUMA node id -> bytes.
    # v1 kernels report only anon, file and unevictable; "total" is a sum, not a type.
    memory_by_type: Mapping[str, Mapping[int, int]]
    cpus: frozenset[int] | None  # effective cpuset; None when the cpuset controller is not there
    mems: frozenset[int] | None
    cpu_time_s: float | None  # CPU time of the container since it started; None when unknown


@dataclass(frozen=True, slots=True)
class CpuTimeSplit:
    """A container's CPU time as last read, and its running per-node totals."""

    total_s: float
    by_node: Mapping[int, float]


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    container: ContainerRef
    container_id: str
    memory_by_type: Mapping[str, Mapping[int, int]]  # exported types only, no zeros: type -> node -> bytes
    cpu_nodes: frozenset[int] | None  # nodes holding the effective CPUs; None when unknown
    memory_nodes: frozenset[int] | None  # effective cpuset.mems; None when unknown
    intended_nodes: frozenset[int] | None  # None: not confined, so no locality
    locality: float | None
    cpu_time_by_node: Mapping[int, float] = field(default_factory=dict)
    cpus: frozenset[int] | None = None  # the effective CPUs; None when unknown
    # whether the recorded exclusive CPUs (memory nodes) differ from the effective cpuset (mems); None: no
    # record, or no effective cpuset this round
    cpu_mismatch: bool | None = None
    memory_mismatch: bool | None = None
