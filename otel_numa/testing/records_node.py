"""Nodes where the records (checkpoints, podresources, CDI) and the kernel (cgroups) can be read side by side.

One machine: 2 NUMA nodes of 8 CPUs (node 0: CPUs 0-7, node 1: CPUs 8-15), 16 GiB each; cgroup v2 with the
systemd driver (or v1 with cgroupfs), container log links naming the containers, every pod with its pause
sandbox (no name, cpuset of the whole machine). Its variants, each what a real node looks like:

- :func:`static_node` ``"agree"``: the static CPU manager and the Static memory manager. shop/db-0 ``db``
  holds CPUs 2-5 and 1 GiB on node 0, shop/cache-0 ``cache`` CPUs 8-9 and 1 GiB on node 1; shop/web-0 and
  shop/web-1 ``app`` run in the shared pool 0-1,6-7,10-15. Every cgroup is as recorded.
- ``"widened"``: the same records, but the kernel no longer confines ``db``: its cpusets are the shared
  pool and both memory nodes (a reconcile that failed, a container restarted outside the kubelet).
- ``"restarted"``: the kubelet restarted with a fresh ``cpu_manager_state`` (no entries) while every
  container keeps its cpuset.
- ``"nri"``: as ``"agree"``, plus shop/nri-0 ``latency``, pinned to CPUs 12-13 and node 1 by an NRI
  resource policy with no kubelet record; the shared pool shrinks to 0-1,6-7,10-11,14-15.
- :func:`dra_node`: the CPU manager ``none``, CPUs and memory handed out by the DRA CPU driver (``dra.cpu``,
  individual or grouped devices) and the DRA memory driver, seen through podresources, the
  ``dra_manager_state`` checkpoint and their CDI specs (:mod:`otel_numa.testing.dra_drivers`). ml/trainer-0
  ``trainer``: a claim with CPUs 2-5, 1 GiB and 512 MiB of 2 MiB hugepages on node 0, and a GPU on node 0.
  ml/infer-0 ``infer``: a claim whose cpuset is ``dynamic``, its cgroup on CPUs 9-11, and a GPU on node 0.
  shop/web-0 and shop/web-1 ``app`` in the shared pool 0-1,6-8,12-15.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from otel_numa.model import DraClaim, DraDevice, MemoryBlock, MemoryTable, NumaMemoryState
from otel_numa.proto import podresources_v1_pb2 as pb
from otel_numa.testing.cgroup_tree import (
    Driver,
    FakeContainer,
    FakePod,
    Layout,
    Qos,
    container_dir,
    fake_container_id,
    write_cgroup_tree,
)
from otel_numa.testing.checkpoints import write_cpu_manager_state, write_memory_manager_state
from otel_numa.testing.device_tree import add_pci_function
from otel_numa.testing.dra_checkpoint import dra_checkpoint_bytes
from otel_numa.testing.dra_drivers import (
    MemoryAllocation,
    cpu_claim_devices,
    dynamic_resource,
    grouped_device,
    individual_devices,
    memory_claim_devices,
    write_cpu_spec,
    write_memory_spec,
)
from otel_numa.testing.kubelet_scenario import KubeletScenario, ScenarioPod, build_scenario
from otel_numa.testing.sysfs_tree import uniform_nodes

GIB = 1 << 30
MIB = 1 << 20
NODE_NAME = "scenario-node"
ALL_CPUS = "0-15"
SHARED = "0-1,6-7,10-15"

StaticVariant = Literal["agree", "widened", "restarted", "nri"]
DeviceMode = Literal["individual", "grouped"]


def _uid(number: int) -> str:
    return f"5e1f0c2a-0000-4000-8000-{number:012d}"


DB, CACHE, WEB_0, WEB_1, NRI, TRAINER, INFER = (_uid(n) for n in range(1, 8))
TRAINER_CLAIM, INFER_CLAIM, TRAINER_MEMORY = (_uid(n) for n in range(11, 14))


@dataclass(frozen=True)
class Container:
    pod_uid: str
    pod: str
    namespace: str
    name: str
    qos: Qos
    cpus: str
    mems: str

    @property
    def container_id(self) -> str:
        return fake_container_id(f"{self.pod_uid}/{self.name}")

    def labels(self) -> dict[str, str]:
        """The container's attributes as the Prometheus page shows them."""
        return {
            "k8s_pod_uid": self.pod_uid,
            "k8s_pod_name": self.pod,
            "k8s_namespace_name": self.namespace,
            "k8s_container_name": self.name,
        }


@dataclass
class RecordsNode:
    """A node's roots, its containers, and the podresources answer the kubelet would give (if any)."""

    scenario: KubeletScenario
    cgroup_root: Path
    container_logs_root: Path
    cdi_root: Path
    containers: dict[str, Container]  # by pod name (one container a pod)
    layout: Layout
    driver: Driver
    podresources: list[pb.PodResources] = field(default_factory=list)

    def cli_args(self, *extra: str, podresources_socket: str | None = None) -> list[str]:
        args = [
            "--cgroup-root",
            str(self.cgroup_root),
            "--container-logs-root",
            str(self.container_logs_root),
            "--cdi-spec-dirs",
            str(self.cdi_root),
        ]
        if podresources_socket is not None:
            args += ["--podresources-socket", podresources_socket]
        return self.scenario.cli_args(*args, *extra, podresources=podresources_socket is not None)

    def settings_values(self, podresources_socket: str = "none") -> dict[str, str]:
        return {
            "cgroup_root": str(self.cgroup_root),
            "container_logs_root": str(self.container_logs_root),
            "cdi_spec_dirs": str(self.cdi_root),
            "podresources_socket": podresources_socket,
        }

    def cpuset_file(self, pod: str) -> Path:
        """Where the effective ``cpuset.cpus`` of ``pod``'s container is."""
        found = self.containers[pod]
        fake = FakePod(found.pod_uid, found.qos)
        if self.layout == "v2":
            directory = container_dir(self.cgroup_root, "v2", self.driver, fake, found.container_id)
            return directory / "cpuset.cpus.effective"
        directory = container_dir(
            self.cgroup_root, "v1", self.driver, fake, found.container_id, controller="cpuset"
        )
        return directory / "cpuset.effective_cpus"

    def set_cpuset(self, pod: str, cpus: str, mems: str | None = None) -> None:
        """The kernel now confines ``pod``'s container to ``cpus`` (and ``mems``)."""
        path = self.cpuset_file(pod)
        path.write_text(cpus + "\n")
        if mems is not None:
            name = "cpuset.mems.effective" if self.layout == "v2" else "cpuset.effective_mems"
            (path.parent / name).write_text(mems + "\n")


def _table(total: int, reserved: int) -> MemoryTable:
    return MemoryTable(total, 0, total, reserved, total - reserved)


def _write_node(
    root: Path,
    containers: Sequence[Container],
    layout: Layout,
    driver: Driver,
) -> RecordsNode:
    pods: dict[str, list[Container]] = {}
    for container in containers:
        pods.setdefault(container.pod_uid, []).append(container)
    scenario = build_scenario(
        root,
        uniform_nodes(2, 8),
        [ScenarioPod(uid, found[0].pod, found[0].namespace) for uid, found in pods.items()],
    )
    cgroup_root, logs_root, cdi_root = root / "cgroup", root / "containers", root / "cdi"
    logs_root.mkdir()
    cdi_root.mkdir()
    fake_pods = []
    for uid, found in pods.items():
        sandbox = FakeContainer(
            fake_container_id(f"{uid}/pause"), {"anon": {0: 4096}}, ALL_CPUS, "0-1", is_sandbox=True
        )
        members = [
            FakeContainer(c.container_id, {"anon": {0: 64 * MIB, 1: 0}}, c.cpus, c.mems, 1_000_000)
            for c in found
        ]
        fake_pods.append(FakePod(uid, found[0].qos, (sandbox, *members)))
        for container in found:
            link = (
                logs_root
                / f"{container.pod}_{container.namespace}_{container.name}-{container.container_id}.log"
            )
            link.symlink_to(
                f"/var/log/pods/{container.namespace}_{container.pod}_{uid}/{container.name}/0.log"
            )
    write_cgroup_tree(cgroup_root, layout, driver, fake_pods)
    return RecordsNode(
        scenario,
        cgroup_root,
        logs_root,
        cdi_root,
        {c.pod: c for c in containers},
        layout,
        driver,
    )


def static_node(
    root: Path, variant: StaticVariant = "agree", *, layout: Layout = "v2", driver: Driver | None = None
) -> RecordsNode:
    """A static CPU manager node (see the module notes); records from the checkpoints alone."""
    shared = "0-1,6-7,10-11,14-15" if variant == "nri" else SHARED
    db_cpus, db_mems = (SHARED, "0-1") if variant == "widened" else ("2-5", "0")
    containers = [
        Container(DB, "db-0", "shop", "db", "guaranteed", db_cpus, db_mems),
        Container(CACHE, "cache-0", "shop", "cache", "guaranteed", "8-9", "1"),
        Container(WEB_0, "web-0", "shop", "app", "burstable", shared, "0-1"),
        Container(WEB_1, "web-1", "shop", "app", "burstable", shared, "0-1"),
    ]
    if variant == "nri":
        containers.append(Container(NRI, "nri-0", "shop", "latency", "burstable", "12-13", "1"))
    node = _write_node(root, containers, layout, driver or ("systemd" if layout == "v2" else "cgroupfs"))
    kubelet = node.scenario
    if variant == "restarted":
        write_cpu_manager_state(kubelet.cpu_manager_path, "static", range(16), {})
    else:
        write_cpu_manager_state(
            kubelet.cpu_manager_path,
            "static",
            [0, 1, 6, 7, *range(10, 16)],
            {DB: {"db": range(2, 6)}, CACHE: {"cache": [8, 9]}},
        )
    write_memory_manager_state(
        kubelet.memory_manager_path,
        "Static",
        {
            0: NumaMemoryState(1, (0,), {"memory": _table(16 * GIB, GIB)}),
            1: NumaMemoryState(1, (1,), {"memory": _table(16 * GIB, GIB)}),
        },
        {
            DB: {"db": [MemoryBlock((0,), "memory", GIB)]},
            CACHE: {"cache": [MemoryBlock((1,), "memory", GIB)]},
        },
    )
    return node


def dra_claims(mode: DeviceMode) -> tuple[DraClaim, DraClaim, DraClaim, DraClaim, DraClaim]:
    """The node's claims: trainer's CPUs, memory and GPU; infer's CPUs and GPU."""
    if mode == "individual":
        trainer_devices = cpu_claim_devices(TRAINER_CLAIM, NODE_NAME, individual_devices(range(2, 6)))
        infer_devices = cpu_claim_devices(INFER_CLAIM, NODE_NAME, individual_devices(range(9, 12)))
    else:
        trainer_devices = cpu_claim_devices(TRAINER_CLAIM, NODE_NAME, [grouped_device(0)], "a1b2c3")
        infer_devices = cpu_claim_devices(INFER_CLAIM, NODE_NAME, [grouped_device(1)], "d4e5f6")
    gpu = "gpu.example.com"  # GPUs are devices, placed by the PCI address in their names
    return (
        DraClaim("trainer-cpus", "ml", trainer_devices, TRAINER_CLAIM, frozenset({TRAINER})),
        DraClaim("infer-cpus", "ml", infer_devices, INFER_CLAIM, frozenset({INFER})),
        DraClaim(
            "trainer-memory",
            "ml",
            memory_claim_devices(TRAINER_MEMORY, NODE_NAME, ["memory-x7k2pq", "hugepages-2mi-q9w8e7"]),
            TRAINER_MEMORY,
            frozenset({TRAINER}),
        ),
        DraClaim(
            "trainer-gpu", "ml", (DraDevice(gpu, NODE_NAME, "gpu-0000-3b-00-0"),), "g1", frozenset({TRAINER})
        ),
        DraClaim(
            "infer-gpu", "ml", (DraDevice(gpu, NODE_NAME, "gpu-0000-5e-00-0"),), "g2", frozenset({INFER})
        ),
    )


def dra_node(root: Path, mode: DeviceMode = "individual") -> RecordsNode:
    """A node whose CPUs and memory are handed out by DRA drivers (see the module notes)."""
    containers = [
        Container(TRAINER, "trainer-0", "ml", "trainer", "guaranteed", "2-5", "0"),
        Container(INFER, "infer-0", "ml", "infer", "guaranteed", "9-11", "0-1"),
        Container(WEB_0, "web-0", "shop", "app", "burstable", "0-1,6-8,12-15", "0-1"),
        Container(WEB_1, "web-1", "shop", "app", "burstable", "0-1,6-8,12-15", "0-1"),
    ]
    node = _write_node(root, containers, "v2", "systemd")
    kubelet = node.scenario
    kubelet.cpu_manager_path.write_bytes(b'{"policyName":"none","defaultCpuSet":"","checksum":3242152201}')
    add_pci_function(kubelet.sysfs_root, "0000:3b:00.0", "0x030200", numa_node="0")
    add_pci_function(kubelet.sysfs_root, "0000:5e:00.0", "0x030200", numa_node="0")
    write_cpu_spec(node.cdi_root, TRAINER_CLAIM, "2-5")
    write_cpu_spec(node.cdi_root, INFER_CLAIM, "dynamic")
    write_memory_spec(
        node.cdi_root,
        [
            (
                TRAINER_MEMORY,
                [MemoryAllocation("memory", 0, "1Gi"), MemoryAllocation("hugepages-2Mi", 0, "512Mi")],
            )
        ],
    )
    trainer_cpus, infer_cpus, trainer_memory, trainer_gpu, infer_gpu = claims = dra_claims(mode)
    (kubelet.kubelet_root / "dra_manager_state").write_bytes(dra_checkpoint_bytes(claims))
    node.podresources = [
        pb.PodResources(
            name="trainer-0",
            namespace="ml",
            containers=[
                pb.ContainerResources(
                    name="trainer",
                    dynamic_resources=[
                        dynamic_resource(c) for c in (trainer_cpus, trainer_memory, trainer_gpu)
                    ],
                )
            ],
        ),
        pb.PodResources(
            name="infer-0",
            namespace="ml",
            containers=[
                pb.ContainerResources(
                    name="infer", dynamic_resources=[dynamic_resource(c) for c in (infer_cpus, infer_gpu)]
                )
            ],
        ),
        *(
            pb.PodResources(name=name, namespace="shop", containers=[pb.ContainerResources(name="app")])
            for name in ("web-0", "web-1")
        ),
    ]
    return node
