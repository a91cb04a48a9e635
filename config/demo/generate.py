"""Write the demo node under config/demo/: a whole machine and its kubelet, the same on any host.

    .venv/bin/python config/demo/generate.py [DEST]     (default: this directory)

The machine (sysfs/ and procfs/) has 4 NUMA nodes with 4 CPUs, 8 GiB and 512 x 2 MiB hugepages each, like
the 16amd64-4n4c hwloc snapshot, and the PCI functions the kubelet's devices sit on. The kubelet state
describes four pods on it, so allocation, capacity and usage agree whatever host runs the demo:

- default/web-0 (Burstable): container "app", no exclusive resources, a QAT device with no NUMA affinity
- trading/matcher-0 (Guaranteed): container "engine" pinned to CPUs 4-7 (NUMA 1), 2 GiB of memory and
  256 MiB of 2 MiB hugepages on NUMA 1, an SR-IOV VF on NUMA 1; 30% of its anonymous memory sits on NUMA 0
  (memory locality 0.7: the case to alert on)
- ml/trainer-0 (Guaranteed): container "train" on CPUs 10-13 (NUMA 2, 3), 4 GiB on NUMA 2-3, a GPU on NUMA 2
  (spans two NUMA nodes: not aligned)
- db/postgres-0 (Guaranteed, pod-level resources): the pod holds CPUs 2-3 and 1 GiB of memory on NUMA 0 as
  a whole (cpu and memory manager ``podEntries``); its container "postgres" takes all of them, plus the other
  SR-IOV VF, which sits on NUMA 1: exclusive CPUs on one node and the NIC on another, the misalignment to find

The checkpoints carry checksums the kubelet itself would accept. Files are world-readable, because the image
runs as a non-root user. podresources.json is the kubelet's podresources answer for these pods (List and
GetAllocatableResources, protobuf JSON), which the stack's podresources test server gives the agent.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from google.protobuf import json_format  # noqa: E402

from otel_numa.model import DeviceEntry, MemoryBlock, MemoryTable, NumaMemoryState  # noqa: E402
from otel_numa.testing.cgroup_tree import FakeContainer, FakePod, write_cgroup_tree  # noqa: E402
from otel_numa.testing.checkpoints import (  # noqa: E402
    write_cpu_manager_state,
    write_device_checkpoint,
    write_memory_manager_state,
)
from otel_numa.testing.demo import demo_podresources_state  # noqa: E402
from otel_numa.testing.sysfs_tree import NodeSpec, write_file, write_machine  # noqa: E402

GIB = 1024**3
MIB = 1024**2

WEB = ("default", "web-0", "6f1c1e4e-3d4b-4c55-9a57-0d7f4c2b1a01")
MATCHER = ("trading", "matcher-0", "0b8e5a2c-7c1d-4f0e-8b3a-5d6e7f809102")
TRAINER = ("ml", "trainer-0", "c3d2e1f0-a9b8-4c7d-8e6f-5a4b3c2d1e03")
POSTGRES = ("db", "postgres-0", "5d4c3b2a-1f0e-4d9c-8b7a-6e5f4d3c2b04")
PODS = (WEB, MATCHER, TRAINER, POSTGRES)

CONTAINER_IDS = {
    (WEB[2], "app"): "a1" * 32,
    (MATCHER[2], "engine"): "b2" * 32,
    (TRAINER[2], "train"): "c3" * 32,
    (POSTGRES[2], "postgres"): "d4" * 32,
}

NODE_MEMORY = 8 * GIB
HUGEPAGES_2M = 512 * 2 * MIB  # 512 x 2 MiB per node, as on the paired snapshot
SYSTEM_RESERVED = {0: 1 * GIB, 1: 0, 2: 0, 3: 0}
MEMORY_RESERVED = {0: 1 * GIB, 1: 2 * GIB, 2: 4 * GIB, 3: 0}  # trainer's 4 GiB block spans 2-3, booked on 2
HUGEPAGES_RESERVED = {0: 0, 1: 256 * MIB, 2: 0, 3: 0}
NUMA_NODES = range(4)
CPUS_PER_NODE = 4
# Memory the kernel reports in use per node: the containers' share below plus the system's own.
MEMORY_USED = {0: 3 * GIB, 1: 3 * GIB, 2: 5 * GIB, 3: 2 * GIB}

# PCI functions (address, class, NUMA node) behind the kubelet's devices, plus the SR-IOV VFs' parent.
PCI_FUNCTIONS = (
    ("0000:3d:00.1", 0x0B4000, -1, None),  # QAT: firmware states no NUMA node
    ("0000:3d:00.2", 0x0B4000, -1, None),
    ("0000:5e:00.0", 0x020000, 1, None),  # the NIC whose VFs the matcher uses
    ("0000:5e:02.3", 0x020000, 1, "0000:5e:00.0"),
    ("0000:5e:02.4", 0x020000, 1, "0000:5e:00.0"),
    ("0000:af:00.0", 0x030200, 2, None),  # GPU-4f5e6d7c
    ("0000:d8:00.0", 0x030200, 3, None),  # GPU-8a9b0c1d
)


def _table(total: int, system_reserved: int, reserved: int) -> MemoryTable:
    allocatable = total - system_reserved
    return MemoryTable(total, system_reserved, allocatable, reserved, allocatable - reserved)


# postgres-0's pod-level resources, all of which its one container takes
POSTGRES_CPUS = range(2, 4)
POSTGRES_MEMORY = MemoryBlock((0,), "memory", 1 * GIB)


def write_kubelet(root: Path) -> None:
    root.mkdir(parents=True)
    write_cpu_manager_state(
        root / "cpu_manager_state",
        "static",
        [0, 1, 8, 9, 14, 15],
        {
            MATCHER[2]: {"engine": range(4, 8)},
            TRAINER[2]: {"train": range(10, 14)},
            POSTGRES[2]: {"postgres": POSTGRES_CPUS},
        },
        pod_entries={POSTGRES[2]: POSTGRES_CPUS},
        layout="v3",  # the first with podEntries
    )
    machine_state = {
        numa: NumaMemoryState(
            number_of_assignments=1,
            cells=(2, 3) if numa in (2, 3) else (numa,),
            memory_map={
                "memory": _table(NODE_MEMORY, SYSTEM_RESERVED[numa], MEMORY_RESERVED[numa]),
                "hugepages-2Mi": _table(HUGEPAGES_2M, 0, HUGEPAGES_RESERVED[numa]),
            },
        )
        for numa in range(4)
    }
    write_memory_manager_state(
        root / "memory_manager_state",
        "Static",
        machine_state,
        {
            MATCHER[2]: {
                "engine": [
                    MemoryBlock((1,), "memory", 2 * GIB),
                    MemoryBlock((1,), "hugepages-2Mi", 256 * MIB),
                ]
            },
            TRAINER[2]: {"train": [MemoryBlock((2, 3), "memory", 4 * GIB)]},
            POSTGRES[2]: {"postgres": [POSTGRES_MEMORY]},
        },
        pod_entries={POSTGRES[2]: [POSTGRES_MEMORY]},
    )
    devices = root / "device-plugins"
    devices.mkdir(parents=True, exist_ok=True)
    write_device_checkpoint(
        devices / "kubelet_internal_checkpoint",
        [
            DeviceEntry(WEB[2], "app", "intel.com/qat", {-1: ("qat-0000:3d:00.1",)}),
            DeviceEntry(MATCHER[2], "engine", "example.com/sriov-vf", {1: ("0000:5e:02.3",)}),
            DeviceEntry(TRAINER[2], "train", "nvidia.com/gpu", {2: ("GPU-4f5e6d7c",)}),
            DeviceEntry(POSTGRES[2], "postgres", "example.com/sriov-vf", {1: ("0000:5e:02.4",)}),
        ],
        {
            "intel.com/qat": ["qat-0000:3d:00.1", "qat-0000:3d:00.2"],
            "example.com/sriov-vf": ["0000:5e:02.3", "0000:5e:02.4"],
            "nvidia.com/gpu": ["GPU-4f5e6d7c", "GPU-8a9b0c1d"],
        },
    )
    for _, _, uid in PODS:
        (root / "pods" / uid).mkdir(parents=True, exist_ok=True)
        (root / "pods" / uid / ".keep").write_text("")


def node_cpus(numa: int) -> range:
    return range(numa * CPUS_PER_NODE, (numa + 1) * CPUS_PER_NODE)


def write_sysfs_and_procfs(dest: Path) -> None:
    """dest/sysfs and dest/procfs: the machine the kubelet state above was written for."""
    hugepages_2m = HUGEPAGES_2M // (2 * MIB)
    nodes = [
        NodeSpec(
            numa,
            cpus=node_cpus(numa),
            mem_total_kib=NODE_MEMORY // 1024,
            mem_free_kib=(NODE_MEMORY - MEMORY_USED[numa]) // 1024,
            hugepages={2048: (hugepages_2m, hugepages_2m - HUGEPAGES_RESERVED[numa] // (2 * MIB))},
            numastat={"numa_hit": 9_000_000 + numa, "numa_miss": 40_000, "local_node": 8_900_000},
            distances=[10 if numa == other else 21 for other in NUMA_NODES],
        )
        for numa in NUMA_NODES
    ]
    # ticks per CPU: the pinned CPUs busy, the shared pool lightly used
    busy = set(range(4, 8)) | set(range(10, 14)) | set(POSTGRES_CPUS)
    ticks = {
        cpu: (
            900_000 if cpu in busy else 90_000,
            0,
            30_000,
            100_000 if cpu in busy else 900_000,
            0,
            0,
            0,
            0,
            0,
            0,
        )
        for numa in NUMA_NODES
        for cpu in node_cpus(numa)
    }
    scratch = dest / ".machine"
    shutil.rmtree(scratch, ignore_errors=True)
    sysfs, procfs = write_machine(scratch, nodes, cpu_times=ticks)
    sysfs.rename(dest / "sysfs")
    procfs.rename(dest / "procfs")
    scratch.rmdir()
    devices = dest / "sysfs" / "bus" / "pci" / "devices"
    for address, pci_class, numa, parent in PCI_FUNCTIONS:
        function = devices / address
        write_file(function / "class", f"0x{pci_class:06x}\n")
        write_file(function / "numa_node", f"{numa}\n")
        cpus = node_cpus(numa) if numa >= 0 else range(CPUS_PER_NODE * len(NUMA_NODES))
        write_file(function / "local_cpulist", f"{cpus[0]}-{cpus[-1]}\n")
        if parent is not None:
            os.symlink(f"../{parent}", function / "physfn")


def write_logs(pod_logs: Path, container_logs: Path) -> None:
    for namespace, name, uid in PODS:
        directory = pod_logs / f"{namespace}_{name}_{uid}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / ".keep").write_text("")
    container_logs.mkdir(parents=True, exist_ok=True)
    for (uid, container), container_id in CONTAINER_IDS.items():
        namespace, name, _ = next(pod for pod in PODS if pod[2] == uid)
        link = container_logs / f"{name}_{namespace}_{container}-{container_id}.log"
        os.symlink(f"/var/log/pods/{namespace}_{name}_{uid}/{container}/0.log", link)


def write_cgroups(root: Path) -> None:
    pods = [
        FakePod(
            WEB[2],
            "burstable",
            (
                FakeContainer(
                    CONTAINER_IDS[(WEB[2], "app")],
                    {"anon": {0: 96 * MIB, 1: 32 * MIB}},
                    "0-1,8-9,14-15",
                    "0-3",
                ),
            ),
        ),
        FakePod(
            MATCHER[2],
            "guaranteed",
            (
                FakeContainer(
                    CONTAINER_IDS[(MATCHER[2], "engine")],
                    {"anon": {0: 300 * MIB, 1: 700 * MIB}, "file": {1: 64 * MIB}},
                    "4-7",
                    "1",
                    cpu_usage_usec=5_000_000,
                ),
            ),
        ),
        FakePod(
            TRAINER[2],
            "guaranteed",
            (
                FakeContainer(
                    CONTAINER_IDS[(TRAINER[2], "train")],
                    {"anon": {2: 2 * GIB, 3: 1 * GIB}},
                    "10-13",
                    "2-3",
                    cpu_usage_usec=8_000_000,
                ),
            ),
        ),
        FakePod(
            POSTGRES[2],
            "guaranteed",
            (
                FakeContainer(
                    CONTAINER_IDS[(POSTGRES[2], "postgres")],
                    {"anon": {0: 512 * MIB}, "file": {0: 128 * MIB}},
                    "2-3",
                    "0",
                    cpu_usage_usec=3_000_000,
                ),
            ),
        ),
    ]
    write_cgroup_tree(root, "v2", "systemd", pods, nodes=(0, 1, 2, 3))


TREES = ("sysfs", "procfs", "kubelet", "pod-logs", "container-logs", "cgroup")


def write_podresources(path: Path) -> None:
    """The podresources answer, as otel_numa.testing.podresources_server --state reads it."""
    state = demo_podresources_state()
    document = {
        "pods": [json_format.MessageToDict(pod) for pod in state.pods],
        "allocatable": json_format.MessageToDict(state.allocatable),
    }
    path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    path.chmod(0o644)


def main(dest: Path) -> None:
    for name in TREES:
        shutil.rmtree(dest / name, ignore_errors=True)
    write_sysfs_and_procfs(dest)
    write_kubelet(dest / "kubelet")
    write_logs(dest / "pod-logs", dest / "container-logs")
    write_cgroups(dest / "cgroup")
    write_podresources(dest / "podresources.json")
    (dest / "kubelet" / "README.md").write_text(
        "Demo kubelet state written by ../generate.py; see ../README.md.\n"
    )
    for name in TREES:
        for path in (dest / name).rglob("*"):
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() else 0o644)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
