"""The demo node of the local stack (``config/demo/``, written by ``config/demo/generate.py``), as the
kubelet's podresources API would list its pods: shared by the dashboard's live test and the catalogue's
real scrape."""

from __future__ import annotations

from pathlib import Path

from otel_numa.proto import podresources_v1_pb2 as pb
from otel_numa.testing.podresources_server import PodResourcesState

DEMO = Path(__file__).resolve().parents[2] / "config" / "demo"

GIB, MIB = 1024**3, 1024**2
Device = tuple[str, str, list[int]]  # resource, device id, NUMA ids
Memory = tuple[str, int, list[int]]  # type, bytes, NUMA ids
Container = tuple[str, list[int], list[Device], list[Memory]]  # name, exclusive CPUs, devices, memory
DEMO_PODS: list[tuple[str, str, list[Container]]] = [
    ("default", "web-0", [("app", [], [("intel.com/qat", "qat-0000:3d:00.1", [])], [])]),
    (
        "trading",
        "matcher-0",
        [
            (
                "engine",
                [4, 5, 6, 7],
                [("example.com/sriov-vf", "0000:5e:02.3", [1])],
                [("memory", 2 * GIB, [1]), ("hugepages-2Mi", 256 * MIB, [1])],
            )
        ],
    ),
    (
        "ml",
        "trainer-0",
        [
            (
                "train",
                [10, 11, 12, 13],
                [("nvidia.com/gpu", "GPU-4f5e6d7c", [2])],
                [("memory", 4 * GIB, [2, 3])],
            )
        ],
    ),
    (
        "db",
        "postgres-0",
        [
            (
                "postgres",
                [2, 3],
                [("example.com/sriov-vf", "0000:5e:02.4", [1])],
                [("memory", 1 * GIB, [0])],
            )
        ],
    ),
]
# Pod-level exclusive resources (namespace, pod) -> (CPUs, memory): postgres-0's container takes them all.
POD_LEVEL: dict[tuple[str, str], tuple[list[int], list[Memory]]] = {
    ("db", "postgres-0"): ([2, 3], [("memory", 1 * GIB, [0])]),
}
ALLOCATABLE_DEVICES: list[Device] = [
    ("intel.com/qat", "qat-0000:3d:00.1", []),
    ("intel.com/qat", "qat-0000:3d:00.2", []),
    ("example.com/sriov-vf", "0000:5e:02.3", [1]),
    ("example.com/sriov-vf", "0000:5e:02.4", [1]),
    ("nvidia.com/gpu", "GPU-4f5e6d7c", [2]),
    ("nvidia.com/gpu", "GPU-8a9b0c1d", [3]),
]


def _devices(resource: str, device: str, numa: list[int]) -> pb.ContainerDevices:
    topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in numa]) if numa else None
    return pb.ContainerDevices(resource_name=resource, device_ids=[device], topology=topology)


def _memory(memory: list[Memory]) -> list[pb.ContainerMemory]:
    return [
        pb.ContainerMemory(
            memory_type=kind, size=size, topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in numa])
        )
        for kind, size, numa in memory
    ]


def demo_podresources_state() -> PodResourcesState:
    pods = [
        pb.PodResources(
            name=name,
            namespace=namespace,
            cpu_ids=POD_LEVEL.get((namespace, name), ([], []))[0],
            memory=_memory(POD_LEVEL.get((namespace, name), ([], []))[1]),
            containers=[
                pb.ContainerResources(
                    name=container,
                    cpu_ids=cpus,
                    devices=[_devices(*d) for d in devices],
                    memory=_memory(memory),
                )
                for container, cpus, devices, memory in containers
            ],
        )
        for namespace, name, containers in DEMO_PODS
    ]
    allocatable = pb.AllocatableResourcesResponse(
        cpu_ids=list(range(2, 16)), devices=[_devices(*d) for d in ALLOCATABLE_DEVICES]
    )
    return PodResourcesState(pods=pods, allocatable=allocatable)
