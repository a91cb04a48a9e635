"""Large synthetic Kubernetes nodes: sysfs, procfs, the kubelet's state, pod logs and cgroups, all consistent.

The default :class:`LargeNodeSpec` is the largest node the agent is sized for: 16 NUMA nodes, 1,024 CPUs,
4 hugepage sizes, 250 pods x 4 containers in the CPU, memory and device checkpoints, 64 devices over 4
resources. Scale and fault tests and the benchmarks share it::

    node = write_large_node(tmp_path)                      # or LargeNodeSpec(numa_nodes=8, cpus_per_node=48)
    agent = Agent(Settings(**node.settings_values()))
    node.write_checkpoints(generation=1)                   # every checkpoint changes (valid checksums)

The files come from the existing builders (:mod:`otel_numa.testing.sysfs_tree`,
:mod:`otel_numa.testing.checkpoints`, :mod:`otel_numa.testing.cgroup_tree`); this module only plans who
gets what. The plan is also returned as plain numbers (:class:`ExpectedAllocation`), so a test can check
the agent's series against it.

Placement: every ``exclusive_pod_every``-th pod (pod index divisible by it; by default every pod) is a
Guaranteed pod whose containers have exclusive CPUs; the others are Burstable or BestEffort pods running
in the shared pool. Exclusive container ``c`` (global index among the exclusive ones, pods in order) is
pinned to one exclusive CPU on NUMA node ``(c + generation) % numa_nodes``, the first
``reserved_cpus_per_node`` CPUs of every node forming the kubelet's reserved, shared pool. Its memory block
(and, for one container of each pod, a hugepage block) sits on the same node. Device ``k`` of a resource is
on NUMA node ``k % numa_nodes``, except that the last resource has no NUMA affinity (``-1``); the first
``devices`` exclusive containers get one device each.

Cgroups (v2, systemd driver): an exclusive container's cpuset is its CPU and its node, and all its memory
is there; a shared container's cpuset is the shared pool on every node, and its memory is spread over
``shared_memory_nodes`` nodes from its home node ``pod index % numa_nodes``.
:meth:`LargeNode.write_cgroup_usage` rewrites the usage files (``memory.numa_stat``, ``cpu.stat``) with the
values of another generation: anon and file memory and CPU time grow with the generation, the way a running
node's do between two scrapes. :meth:`LargeNode.podresources_state` is the kubelet's podresources answer for
the same plan, for :mod:`otel_numa.testing.podresources_server`.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import uuid
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_numa.model import DeviceEntry, MemoryBlock, MemoryTable, NumaMemoryState
from otel_numa.sources.files import format_cpulist
from otel_numa.testing.cgroup_tree import (
    PAGE_SIZE,
    FakeContainer,
    FakePod,
    Qos,
    container_dir,
    fake_container_id,
    make_pods,
    pod_relative_dir,
    render_cpu_stat_v2,
    render_numa_stat_v2,
    write_cgroup_tree,
    write_kubepods_sums,
)
from otel_numa.testing.checkpoints import (
    cpu_manager_state_bytes,
    device_checkpoint_bytes,
    memory_manager_state_bytes,
    write_atomically,
)
from otel_numa.testing.sysfs_tree import NodeSpec, write_machine

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

DEFAULT_RESOURCES = ("nvidia.com/gpu", "example.com/sriov-vf", "intel.com/qat", "example.com/license")
# arm64 with 4 KiB base pages offers all four; x86 has the middle two
DEFAULT_HUGEPAGE_SIZES_KIB = (64, 2048, 32768, 1048576)


@dataclass(frozen=True)
class LargeNodeSpec:
    numa_nodes: int = 16
    cpus_per_node: int = 64
    mem_per_node_kib: int = 64 << 20  # 64 GiB
    hugepage_sizes_kib: tuple[int, ...] = DEFAULT_HUGEPAGE_SIZES_KIB
    pods: int = 250
    containers_per_pod: int = 4
    device_resources: tuple[str, ...] = DEFAULT_RESOURCES
    devices_per_resource: int = 16
    reserved_cpus_per_node: int = 1
    container_memory_bytes: int = 256 * MIB
    cpu_layout: str = "v2"
    memory_layout: str = "v2"
    cgroups: bool = True  # write a cgroup v2 tree (systemd driver) for the containers
    namespace: str = "bench"
    exclusive_pod_every: int = 1  # every n-th pod is Guaranteed with exclusive CPUs; the others share
    shared_memory_nodes: int = 3  # nodes a shared-pool container's memory is spread over

    def exclusive(self, pod_index: int) -> bool:
        return pod_index % self.exclusive_pod_every == 0

    @property
    def cpus(self) -> int:
        return self.numa_nodes * self.cpus_per_node

    @property
    def containers(self) -> int:
        return self.pods * self.containers_per_pod

    @property
    def devices(self) -> int:
        return len(self.device_resources) * self.devices_per_resource


def crowded(containers: int) -> LargeNodeSpec:
    """A node of ``containers`` containers (4 a pod) whose every other pod is Guaranteed, each container of
    those with an exclusive CPU, memory and hugepage blocks: past 2,000 containers more of them have records
    of their own than the agent gives series to. 8 NUMA nodes x 320 CPUs, so that every one of them gets a
    CPU; the chart's sizing is measured on it (benchmarks/bench_containers.py)."""
    return LargeNodeSpec(
        numa_nodes=8,
        cpus_per_node=320,
        mem_per_node_kib=256 << 20,
        hugepage_sizes_kib=(2048, 1048576),
        pods=containers // 4,
        containers_per_pod=4,
        container_memory_bytes=64 * MIB,
        exclusive_pod_every=2,
    )


def machine_only(numa_nodes: int, cpus_per_node: int) -> LargeNodeSpec:
    """A machine with an empty kubelet: no checkpoints, pods, devices or cgroups (e.g. 8 x 48 CPUs)."""
    return LargeNodeSpec(
        numa_nodes=numa_nodes,
        cpus_per_node=cpus_per_node,
        hugepage_sizes_kib=(2048, 1048576),
        pods=0,
        devices_per_resource=0,
        cgroups=False,
    )


@dataclass(frozen=True)
class ExpectedAllocation:
    """What the checkpoints of one generation hand out, counted from the plan (not from the agent)."""

    cpus_by_numa: Mapping[int, int]  # exclusive CPUs
    memory_by_numa: Mapping[int, int]  # bytes reserved for containers
    hugepages_by_numa: Mapping[tuple[int, str], int]  # (numa id, "hugepages-2Mi") -> bytes
    devices_by_numa: Mapping[tuple[int, str], int]  # (numa id or -1, resource) -> devices
    containers: int


def hugepage_resource(size_kib: int) -> str:
    """The kubelet's resource name: ``hugepages-2Mi``, ``hugepages-1Gi``, ``hugepages-64Ki``."""
    for unit, factor in (("Gi", 1 << 20), ("Mi", 1 << 10)):
        if size_kib % factor == 0:
            return f"hugepages-{size_kib // factor}{unit}"
    return f"hugepages-{size_kib}Ki"


def _hugepage_pools(spec: LargeNodeSpec) -> dict[int, tuple[int, int]]:
    """Per-node pools, page size KiB -> (total, free): 8 GiB per size, a quarter in use."""
    pools: dict[int, tuple[int, int]] = {}
    for size in spec.hugepage_sizes_kib:
        total = max(1, (8 << 20) // size)
        pools[size] = (total, total - total // 4)
    return pools


def container_name(index: int) -> str:
    return f"app-{index}"


@dataclass(frozen=True)
class _Placement:
    pod_uid: str
    pod_index: int
    name: str
    numa: int
    cpu: int
    hugepage_kib: int | None  # a one-page hugepage block of that size, or none


class LargeNode:
    """The written node: its roots, its pods and the checkpoints of any generation."""

    def __init__(self, spec: LargeNodeSpec, root: Path, pods: tuple[FakePod, ...]) -> None:
        self.spec = spec
        self.root = root
        self.sysfs_root = root / "sys"
        self.procfs_root = root / "proc"
        self.kubelet_root = root / "kubelet"
        self.pod_logs_root = root / "pod-logs"
        self.container_logs_root = root / "container-logs"
        self.cgroup_root = root / "cgroup"
        self.pods = pods
        self._renamed: dict[int, str] = {}  # pods replaced under another name (replace_pod)

    # paths --------------------------------------------------------------------------------------

    @property
    def cpu_manager_path(self) -> Path:
        return self.kubelet_root / "cpu_manager_state"

    @property
    def memory_manager_path(self) -> Path:
        return self.kubelet_root / "memory_manager_state"

    @property
    def device_checkpoint_path(self) -> Path:
        return self.kubelet_root / "device-plugins" / "kubelet_internal_checkpoint"

    def pod_name(self, pod_index: int) -> str:
        return self._renamed.get(pod_index, f"pod-{pod_index:04d}")

    def reserved_cpus(self) -> frozenset[int]:
        per_node = self.spec.cpus_per_node
        return frozenset(
            node * per_node + offset
            for node in range(self.spec.numa_nodes)
            for offset in range(self.spec.reserved_cpus_per_node)
        )

    # the agent's view ---------------------------------------------------------------------------

    def cli_args(self) -> list[str]:
        """The agent's flags for this node (no podresources socket: the checkpoints alone decide)."""
        return [
            "--sysfs-root",
            str(self.sysfs_root),
            "--procfs-root",
            str(self.procfs_root),
            "--kubelet-root",
            str(self.kubelet_root),
            "--pod-logs-root",
            str(self.pod_logs_root),
            "--container-logs-root",
            str(self.container_logs_root),
            "--cgroup-root",
            str(self.cgroup_root),
            "--podresources-socket",
            "none",
            "--node-name",
            "large-node",
        ]

    def settings_values(self) -> dict[str, object]:
        """Keyword arguments for ``Settings`` matching :meth:`cli_args`, with both HTTP endpoints off."""
        return {
            "sysfs_root": self.sysfs_root,
            "procfs_root": self.procfs_root,
            "kubelet_root": self.kubelet_root,
            "pod_logs_root": self.pod_logs_root,
            "container_logs_root": self.container_logs_root,
            "cgroup_root": self.cgroup_root,
            "podresources_socket": "none",
            "node_name": "large-node",
            "prometheus_address": "none",
            "health_address": "none",
        }

    # the plan -----------------------------------------------------------------------------------

    def _placements(self, generation: int) -> list[_Placement]:
        spec = self.spec
        free_cpus: dict[int, list[int]] = {
            numa: [
                numa * spec.cpus_per_node + offset
                for offset in range(spec.reserved_cpus_per_node, spec.cpus_per_node)
            ]
            for numa in range(spec.numa_nodes)
        }
        pools = _hugepage_pools(spec)
        free_pages = {
            (numa, size): pool[0] for numa in range(spec.numa_nodes) for size, pool in pools.items()
        }
        sizes = spec.hugepage_sizes_kib
        placements: list[_Placement] = []
        serial = -1
        for pod_index, pod in enumerate(self.pods):
            if not spec.exclusive(pod_index):
                continue  # shared-pool pods have no checkpoint entries
            # one container per pod asks for a hugepage, chosen so that consecutive pods use different nodes
            hugepage_container = (pod_index // spec.containers_per_pod) % spec.containers_per_pod
            for index in range(spec.containers_per_pod):
                serial += 1
                numa = (serial + generation) % spec.numa_nodes
                if not free_cpus[numa]:
                    raise ValueError(f"NUMA node {numa} has too few CPUs for {spec.containers} containers")
                cpu = free_cpus[numa].pop(0)
                hugepage: int | None = None
                size = sizes[(pod_index // spec.numa_nodes) % len(sizes)] if sizes else 0
                if index == hugepage_container and free_pages.get((numa, size), 0) > 0:
                    hugepage = size
                    free_pages[(numa, size)] -= 1
                placements.append(_Placement(pod.uid, pod_index, container_name(index), numa, cpu, hugepage))
        return placements

    def _memory_blocks(self, placement: _Placement) -> list[MemoryBlock]:
        blocks = [MemoryBlock((placement.numa,), "memory", self.spec.container_memory_bytes)]
        if placement.hugepage_kib is not None:
            size = placement.hugepage_kib * KIB
            blocks.append(MemoryBlock((placement.numa,), hugepage_resource(placement.hugepage_kib), size))
        return blocks

    def _device_numa(self, resource_index: int, device_index: int) -> int:
        if resource_index == len(self.spec.device_resources) - 1:
            return -1
        return device_index % self.spec.numa_nodes

    def _device_entries(self, placements: Sequence[_Placement], generation: int) -> list[DeviceEntry]:
        resources = self.spec.device_resources
        entries: list[DeviceEntry] = []
        for number in range(min(self.spec.devices, len(placements))):
            placement = placements[(number + generation) % len(placements)]
            resource_index, device_index = number % len(resources), number // len(resources)
            device_id = f"{resources[resource_index].rpartition('/')[2]}-{device_index}"
            numa = self._device_numa(resource_index, device_index)
            entries.append(
                DeviceEntry(
                    placement.pod_uid, placement.name, resources[resource_index], {numa: (device_id,)}
                )
            )
        return entries

    def expected(self, generation: int = 0) -> ExpectedAllocation:
        placements = self._placements(generation)
        memory: Counter[int] = Counter()
        hugepages: Counter[tuple[int, str]] = Counter()
        for placement in placements:
            for block in self._memory_blocks(placement):
                if block.resource == "memory":
                    memory[block.numa_affinity[0]] += block.size
                else:
                    hugepages[(block.numa_affinity[0], block.resource)] += block.size
        devices: Counter[tuple[int, str]] = Counter()
        for entry in self._device_entries(placements, generation):
            for numa, ids in entry.devices_by_numa.items():
                devices[(numa, entry.resource_name)] += len(ids)
        return ExpectedAllocation(
            cpus_by_numa=dict(Counter(p.numa for p in placements)),
            memory_by_numa=dict(memory),
            hugepages_by_numa=dict(hugepages),
            devices_by_numa=dict(devices),
            containers=len(placements),
        )

    # checkpoints --------------------------------------------------------------------------------

    def checkpoint_bytes(self, generation: int = 0) -> dict[Path, bytes]:
        """The three checkpoints of ``generation``; consecutive generations differ in every file."""
        spec = self.spec
        placements = self._placements(generation)
        cpu_entries: dict[str, dict[str, set[int]]] = defaultdict(dict)
        memory_entries: dict[str, dict[str, list[MemoryBlock]]] = defaultdict(dict)
        for placement in placements:
            cpu_entries[placement.pod_uid][placement.name] = {placement.cpu}
            memory_entries[placement.pod_uid][placement.name] = self._memory_blocks(placement)
        taken = {placement.cpu for placement in placements}
        default_cpus = set(range(spec.cpus)) - taken

        expected = self.expected(generation)
        pools = _hugepage_pools(spec)
        machine_state: dict[int, NumaMemoryState] = {}
        for numa in range(spec.numa_nodes):
            system_reserved = GIB if numa == 0 else 0
            tables = {
                "memory": _table(
                    spec.mem_per_node_kib * KIB, system_reserved, expected.memory_by_numa.get(numa, 0)
                )
            }
            for size_kib, (total_pages, _) in pools.items():
                resource = hugepage_resource(size_kib)
                used = expected.hugepages_by_numa.get((numa, resource), 0)
                tables[resource] = _table(total_pages * size_kib * KIB, 0, used)
            assignments = sum(1 for placement in placements if placement.numa == numa)
            machine_state[numa] = NumaMemoryState(assignments, (numa,), tables)

        resources = spec.device_resources
        registered = {
            resource: [f"{resource.rpartition('/')[2]}-{index}" for index in range(spec.devices_per_resource)]
            for resource in resources
        }
        return {
            self.cpu_manager_path: cpu_manager_state_bytes(
                "static", default_cpus, cpu_entries, layout=spec.cpu_layout
            ),
            self.memory_manager_path: memory_manager_state_bytes(
                "Static", machine_state, memory_entries, layout=spec.memory_layout
            ),
            self.device_checkpoint_path: device_checkpoint_bytes(
                self._device_entries(placements, generation),
                {name: ids for name, ids in registered.items() if ids},
            ),
        }

    def write_checkpoints(self, generation: int = 0) -> None:
        """Replace every checkpoint with generation ``generation``'s, the way the kubelet writes them."""
        for path, data in self.checkpoint_bytes(generation).items():
            write_atomically(path, data)

    # podresources -------------------------------------------------------------------------------

    def podresources_state(self, generation: int = 0) -> dict[str, Any]:
        """The kubelet's podresources answer for the plan of ``generation``, as the JSON document that
        ``python -m otel_numa.testing.podresources_server --state`` reads (protobuf JSON field names)."""
        spec = self.spec
        placements = {(p.pod_uid, p.name): p for p in self._placements(generation)}
        devices: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for entry in self._device_entries(list(placements.values()), generation):
            for numa, ids in entry.devices_by_numa.items():
                devices[(entry.pod_uid, entry.container_name)].append(
                    _pr_devices(entry.resource_name, ids, numa)
                )
        pods: list[dict[str, Any]] = []
        for pod_index, pod in enumerate(self.pods):
            containers: list[dict[str, Any]] = []
            for index in range(spec.containers_per_pod):
                name = container_name(index)
                container: dict[str, Any] = {"name": name}
                placement = placements.get((pod.uid, name))
                if placement is not None:
                    container["cpu_ids"] = [placement.cpu]
                    container["memory"] = [
                        {"memory_type": block.resource, "size": block.size, **_pr_topology(placement.numa)}
                        for block in self._memory_blocks(placement)
                    ]
                if devices.get((pod.uid, name)):
                    container["devices"] = devices[(pod.uid, name)]
                containers.append(container)
            pods.append(
                {"name": self.pod_name(pod_index), "namespace": spec.namespace, "containers": containers}
            )
        allocatable_memory = [
            {"memory_type": "memory", "size": spec.mem_per_node_kib * KIB - (GIB if numa == 0 else 0)}
            | _pr_topology(numa)
            for numa in range(spec.numa_nodes)
        ]
        for size_kib, (total_pages, _) in _hugepage_pools(spec).items():
            allocatable_memory += [
                {"memory_type": hugepage_resource(size_kib), "size": total_pages * size_kib * KIB}
                | _pr_topology(numa)
                for numa in range(spec.numa_nodes)
            ]
        allocatable_devices = [
            _pr_devices(
                resource,
                (f"{resource.rpartition('/')[2]}-{index}",),
                self._device_numa(resource_index, index),
            )
            for resource_index, resource in enumerate(spec.device_resources)
            for index in range(spec.devices_per_resource)
        ]
        allocatable = {
            "cpu_ids": sorted(set(range(spec.cpus)) - self.reserved_cpus()),
            "devices": allocatable_devices,
            "memory": allocatable_memory,
        }
        return {"pods": pods if spec.pods else [], "allocatable": allocatable}

    # cgroups ------------------------------------------------------------------------------------

    def shared_pool(self) -> frozenset[int]:
        """The CPUs no container holds exclusively (generation 0), the reserved ones included."""
        taken = {placement.cpu for placement in self._placements(0)}
        return frozenset(range(self.spec.cpus)) - taken

    def home_node(self, pod_index: int) -> int:
        """Where a shared-pool pod's memory mostly is."""
        return pod_index % self.spec.numa_nodes

    def cgroup_pods(self, generation: int = 0) -> tuple[FakePod, ...]:
        """The pods with the cgroup contents of ``generation``: cpusets from the generation-0 placement,
        memory and CPU time growing with ``generation``."""
        spec = self.spec
        by_container = {(p.pod_uid, p.name): p for p in self._placements(0)}
        shared_cpus = format_cpulist(set(self.shared_pool()))
        all_nodes = format_cpulist(set(range(spec.numa_nodes)))
        pods: list[FakePod] = []
        for pod_index, pod in enumerate(self.pods):
            containers = []
            for index, container in enumerate(pod.containers):
                placement = by_container.get((pod.uid, container_name(index)))
                if placement is not None:
                    # a pinned container's pages are all on its node; the file still lists every node (as 0)
                    spread: tuple[int, ...] = (placement.numa,)
                    cpus, mems = str(placement.cpu), str(placement.numa)
                else:
                    home = self.home_node(pod_index)
                    width = min(spec.shared_memory_nodes, spec.numa_nodes)
                    spread = tuple((home + step) % spec.numa_nodes for step in range(width))
                    cpus, mems = shared_cpus, all_nodes
                containers.append(
                    dataclasses.replace(
                        container,
                        memory_bytes=_spread_memory(container.memory_bytes, spread, generation),
                        cpus=cpus,
                        mems=mems,
                        cpu_usage_usec=container.cpu_usage_usec + generation * 10_000,
                    )
                )
            pods.append(dataclasses.replace(pod, containers=tuple(containers)))
        return tuple(pods)

    def replace_pod(self, pod_index: int, serial: int, generation: int = 0) -> FakePod:
        """Replace shared-pool pod ``pod_index`` by a new one of the same shape (a new name, UID and
        container ids), as a ReplicaSet re-creating it does: the old pod's cgroups, ``pods/`` directory and
        log entries go, the new one's come (cgroup values of ``generation``). The checkpoints hold no
        shared-pool pod; :meth:`podresources_state` answers for the new one. ``serial`` makes the new name
        and UID.
        """
        if self.spec.exclusive(pod_index):
            raise ValueError(f"pod {pod_index} holds exclusive CPUs: the checkpoints would change too")
        old = self.pods[pod_index]
        uid = str(uuid.uuid5(uuid.NAMESPACE_OID, f"{old.uid}/{serial}"))
        new = dataclasses.replace(
            old,
            uid=uid,
            containers=tuple(
                dataclasses.replace(container, container_id=fake_container_id(f"{uid}/{index}"))
                for index, container in enumerate(old.containers)
            ),
        )
        shutil.rmtree(self.cgroup_root / pod_relative_dir("systemd", old))
        shutil.rmtree(self.kubelet_root / "pods" / old.uid)
        shutil.rmtree(self._pod_log_dir(pod_index, old))
        for index, container in enumerate(old.containers):
            self._container_log_link(pod_index, index, container).unlink()
        self.pods = (*self.pods[:pod_index], new, *self.pods[pod_index + 1 :])
        self._renamed[pod_index] = f"pod-{pod_index:04d}-{serial}"
        pods, nodes = self.cgroup_pods(generation), range(self.spec.numa_nodes)
        written = [pods[pod_index]]
        write_cgroup_tree(self.cgroup_root, "v2", "systemd", written, nodes=nodes, kubepods_sums=False)
        write_kubepods_sums(self.cgroup_root, "systemd", pods, nodes)
        self._write_pod_directory(pod_index)
        return new

    def _pod_log_dir(self, pod_index: int, pod: FakePod) -> Path:
        return self.pod_logs_root / f"{self.spec.namespace}_{self.pod_name(pod_index)}_{pod.uid}"

    def _container_log_link(self, pod_index: int, index: int, container: FakeContainer) -> Path:
        name = f"{self.pod_name(pod_index)}_{self.spec.namespace}_{container_name(index)}"
        return self.container_logs_root / f"{name}-{container.container_id}.log"

    def _write_pod_directory(self, pod_index: int) -> None:
        """``pods/<uid>/containers/<name>``, ``<pod-logs>/<ns>_<pod>_<uid>/<name>/0.log`` and the
        ``<container-logs>/<pod>_<ns>_<name>-<id>.log`` links, as the kubelet lays them out."""
        pod = self.pods[pod_index]
        log_dir = self._pod_log_dir(pod_index, pod)
        for index, container in enumerate(pod.containers):
            name = container_name(index)
            (self.kubelet_root / "pods" / pod.uid / "containers" / name).mkdir(parents=True)
            (log_dir / name).mkdir(parents=True)
            log_file = log_dir / name / "0.log"
            log_file.write_text("")
            os.symlink(log_file, self._container_log_link(pod_index, index, container))

    def write_cgroup_usage(self, generation: int) -> None:
        """Rewrite every container's ``memory.numa_stat`` and ``cpu.stat`` with ``generation``'s values
        (in place, as the kernel's files change; cpusets and the rest of the tree stay)."""
        nodes = list(range(self.spec.numa_nodes))
        pods = self.cgroup_pods(generation)
        for pod in pods:
            for container in pod.containers:
                directory = container_dir(self.cgroup_root, "v2", "systemd", pod, container.container_id)
                (directory / "memory.numa_stat").write_text(
                    render_numa_stat_v2(container.memory_bytes, nodes)
                )
                (directory / "cpu.stat").write_text(render_cpu_stat_v2(container.cpu_usage_usec))
        write_kubepods_sums(self.cgroup_root, "systemd", pods, nodes)


def _pr_topology(numa: int) -> dict[str, Any]:
    """podresources ``topology``: none for a device without NUMA affinity."""
    return {} if numa < 0 else {"topology": {"nodes": [{"ID": numa}]}}


def _pr_devices(resource: str, ids: Sequence[str], numa: int) -> dict[str, Any]:
    return {"resource_name": resource, "device_ids": list(ids), **_pr_topology(numa)}


# memory types that change between two scrapes of a running container; the others stay
_GROWING_TYPES = ("anon", "file")


def _spread_memory(
    memory: Mapping[str, Mapping[int, int]], nodes: Sequence[int], generation: int
) -> dict[str, dict[int, int]]:
    """Each type's total over ``nodes``: half on the first, the rest shared by the others, in whole pages;
    anon and file grow by one page per node and generation."""
    spread: dict[str, dict[int, int]] = {}
    for kind, by_node in memory.items():
        pages = sum(by_node.values()) // PAGE_SIZE
        shares = (
            [pages]
            if len(nodes) == 1
            else [pages // 2] + [pages // (2 * (len(nodes) - 1))] * (len(nodes) - 1)
        )
        growth = generation if kind in _GROWING_TYPES else 0
        spread[kind] = {node: (share + growth) * PAGE_SIZE for node, share in zip(nodes, shares, strict=True)}
    return spread


def _table(total: int, system_reserved: int, reserved: int) -> MemoryTable:
    allocatable = total - system_reserved
    if reserved > allocatable:
        raise ValueError(f"the plan reserves {reserved} bytes of {allocatable} allocatable")
    return MemoryTable(total, system_reserved, allocatable, reserved, allocatable - reserved)


def machine_nodes(spec: LargeNodeSpec) -> list[NodeSpec]:
    """The NUMA nodes of ``spec`` for :func:`write_machine`, with distances 10/16/32 by socket."""
    pools = _hugepage_pools(spec)
    per_socket = max(1, spec.numa_nodes // 2)

    def distance(a: int, b: int) -> int:
        if a == b:
            return 10
        return 16 if a // per_socket == b // per_socket else 32

    return [
        NodeSpec(
            id=numa,
            cpus=range(numa * spec.cpus_per_node, (numa + 1) * spec.cpus_per_node),
            mem_total_kib=spec.mem_per_node_kib,
            mem_free_kib=spec.mem_per_node_kib // 2 + numa * 1024,
            hugepages=pools,
            numastat={"numa_hit": 10_000_000 * (numa + 1), "local_node": 9_000_000 * (numa + 1)},
            distances=[distance(numa, other) for other in range(spec.numa_nodes)],
        )
        for numa in range(spec.numa_nodes)
    ]


def write_large_node(root: Path, spec: LargeNodeSpec | None = None) -> LargeNode:
    """Write the node of ``spec`` (default: the largest) under ``root``, with generation 0's checkpoints."""
    spec = spec or LargeNodeSpec()
    write_machine(root, machine_nodes(spec), hugepage_sizes_kib=spec.hugepage_sizes_kib)
    numa_ids = list(range(spec.numa_nodes))
    node = large_node_at(root, spec)
    (node.kubelet_root / "pods").mkdir(parents=True)
    (node.kubelet_root / "device-plugins").mkdir()
    node.pod_logs_root.mkdir()
    node.container_logs_root.mkdir()
    if spec.pods:
        _write_pod_directories(node)
        node.write_checkpoints(0)
    if spec.cgroups:  # with no pods, the kubepods hierarchy a kubelet makes before its first pod
        _write_cgroups(node, numa_ids)
    return node


def large_node_at(root: Path, spec: LargeNodeSpec | None = None) -> LargeNode:
    """The node :func:`write_large_node` wrote under ``root`` with the same ``spec`` (nothing is written)."""
    spec = spec or LargeNodeSpec()
    pods = (
        make_pods(spec.pods, spec.containers_per_pod, nodes=list(range(spec.numa_nodes))) if spec.pods else ()
    )
    # exclusive CPUs are only for Guaranteed pods; the shared ones alternate Burstable and BestEffort
    classes: tuple[Qos, Qos] = ("burstable", "besteffort")
    pods = tuple(
        dataclasses.replace(pod, qos="guaranteed" if spec.exclusive(index) else classes[index % 2])
        for index, pod in enumerate(pods)
    )
    return LargeNode(spec, root, pods)


def _write_pod_directories(node: LargeNode) -> None:
    for pod_index in range(len(node.pods)):
        node._write_pod_directory(pod_index)


def _write_cgroups(node: LargeNode, numa_ids: Sequence[int]) -> None:
    """A cgroup v2 tree whose effective cpusets, mems and memory match the generation-0 placement."""
    write_cgroup_tree(node.cgroup_root, "v2", "systemd", node.cgroup_pods(0), nodes=numa_ids)
