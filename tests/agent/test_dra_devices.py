"""DRA devices of several drivers placed on NUMA nodes, pod-level CPUs, and numa.container.aligned."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_numa.model import DraClaim, DraDevice
from otel_numa.proto import podresources_v1_pb2 as pb
from otel_numa.testing.checkpoints import write_cpu_manager_state
from otel_numa.testing.device_tree import (
    add_char_device,
    add_iommu_group,
    add_nvidia_gpu,
    add_pci_function,
    cdi_spec,
    write_cdi_spec,
)
from otel_numa.testing.dra_checkpoint import dra_checkpoint_bytes
from otel_numa.testing.kubelet_scenario import (
    KubeletScenario,
    ScenarioPod,
    build_scenario,
    counted_errors,
    labels,
    series,
)
from otel_numa.testing.peers import run_agent, run_prometheus, wait_for
from otel_numa.testing.podresources_server import PodResourcesServer, short_socket_dir
from otel_numa.testing.sysfs_tree import uniform_nodes

TRAIN, INFER, NET, POOLED = (f"{n}{n}{n}{n}0000-0000-0000-0000-000000000000"[:36] for n in "abcd")
NVIDIA = "gpu.nvidia.com"

# the devices, each placed by a different node-local fact
GPU_BY_ADDRESS = DraDevice("gpu.example.com", "node-a", "gpu-0000-3b-00-0")  # its name: node 0
VFIO = DraDevice("vfio.example.com", "node-a", "vf-a", ("example.com/vfio=vf-a",))  # IOMMU group: node 0
NVIDIA_GPU = DraDevice(NVIDIA, "node-a", "gpu-1", ("k8s.gpu.nvidia.com/claim=gpu-1",))  # /dev/nvidia1: node 1
NIC = DraDevice(
    "net.example.com", "node-a", "nic-0", ("example.com/nic=nic-0",)
)  # uverbs char device: node 1
FPGA = DraDevice("fpga.example.com", "node-a", "fpga-0")  # nothing places it: -1


@pytest.fixture
def node(tmp_path: Path) -> KubeletScenario:
    pods = [
        ScenarioPod(uid, name, "ml") for uid, name in ((TRAIN, "train-0"), (INFER, "infer-0"), (NET, "net-0"))
    ]
    scenario = build_scenario(tmp_path, uniform_nodes(2, 4), [*pods, ScenarioPod(POOLED, "pooled-0", "ml")])
    sysfs, procfs = scenario.sysfs_root, scenario.procfs_root
    add_pci_function(sysfs, "0000:3b:00.0", "0x030200", numa_node="0")
    add_pci_function(sysfs, "0000:d8:00.0", "0x120000", numa_node="0")
    add_pci_function(sysfs, "0000:5d:00.0", "0x060400", numa_node="1")  # a bridge: never counted
    add_pci_function(sysfs, "0000:5e:00.0", "0x020000", numa_node="1")
    add_pci_function(sysfs, "0000:af:00.0", "0x030200", numa_node="-1", local_cpulist="4-7")
    add_char_device(sysfs, "0000:5e:00.0", 231, 64, "uverbs0")
    add_iommu_group(sysfs, 42, ["0000:d8:00.0"])
    add_nvidia_gpu(procfs, "0000:af:00.0", 1)
    cdi = tmp_path / "cdi"
    write_cdi_spec(
        cdi,
        "k8s.gpu.nvidia.com-claim_gpu.yaml",
        cdi_spec("k8s.gpu.nvidia.com/claim", {"gpu-1": [{"path": "/dev/nvidia1"}]}),
    )
    write_cdi_spec(
        cdi,
        "example.com-nic.json",
        cdi_spec(
            "example.com/nic",
            {"nic-0": [{"path": "/dev/infiniband/uverbs0", "type": "c", "major": 231, "minor": 64}]},
        ),
    )
    write_cdi_spec(
        cdi, "example.com-vfio.yaml", cdi_spec("example.com/vfio", {"vf-a": [{"path": "/dev/vfio/42"}]})
    )
    return scenario


def _claim(name: str, *devices: DraDevice) -> pb.DynamicResource:
    return pb.DynamicResource(
        claim_name=name,
        claim_namespace="ml",
        claim_resources=[
            pb.ClaimResource(
                cdi_devices=[pb.CDIDevice(name=cdi) for cdi in d.cdi_devices],
                driver_name=d.driver,
                pool_name=d.pool,
                device_name=d.device,
            )
            for d in devices
        ],
    )


def podresources_pods() -> list[pb.PodResources]:
    nic_claim = _claim("nic", NIC)  # one claim, two containers: the device counts once per NUMA node
    return [
        pb.PodResources(
            name="train-0",
            namespace="ml",
            containers=[
                pb.ContainerResources(
                    name="train", cpu_ids=[0, 1], dynamic_resources=[_claim("gpus", GPU_BY_ADDRESS, VFIO)]
                )
            ],
        ),
        pb.PodResources(
            name="infer-0",
            namespace="ml",
            containers=[
                pb.ContainerResources(
                    name="infer", cpu_ids=[2], dynamic_resources=[_claim("gpu", NVIDIA_GPU)]
                )
            ],
        ),
        pb.PodResources(
            name="net-0",
            namespace="ml",
            containers=[
                pb.ContainerResources(name="net", dynamic_resources=[nic_claim]),
                pb.ContainerResources(name="sidecar", dynamic_resources=[nic_claim, _claim("fpga", FPGA)]),
            ],
        ),
        # pod-level resources: the pod's pool holds its container's CPUs
        pb.PodResources(
            name="pooled-0",
            namespace="ml",
            cpu_ids=[4, 5, 6, 7],
            memory=[
                pb.ContainerMemory(
                    memory_type="memory", size=2 << 30, topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=1)])
                )
            ],
            containers=[pb.ContainerResources(name="worker", cpu_ids=[4, 5])],
        ),
    ]


def checkpoint_claims() -> list[DraClaim]:
    return [
        DraClaim("gpus", "ml", (GPU_BY_ADDRESS, VFIO), uid="c1", pod_uids=frozenset({TRAIN})),
        DraClaim("gpu", "ml", (NVIDIA_GPU,), uid="c2", pod_uids=frozenset({INFER})),
        DraClaim("nic", "ml", (NIC,), uid="c3", pod_uids=frozenset({NET})),
        DraClaim("fpga", "ml", (FPGA,), uid="c4", pod_uids=frozenset({NET})),
    ]


EXPECTED_TOTALS = {
    labels(numa_node_id=0, numa_resource_name="gpu.example.com"): 1,
    labels(numa_node_id=0, numa_resource_name="vfio.example.com"): 1,
    labels(numa_node_id=1, numa_resource_name=NVIDIA): 1,
    labels(numa_node_id=1, numa_resource_name="net.example.com"): 1,
    labels(numa_node_id=-1, numa_resource_name="fpga.example.com"): 1,
}


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    directory = short_socket_dir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def _container(uid: str, pod: str, container: str, **more: str | int) -> frozenset[tuple[str, str]]:
    return labels(
        k8s_pod_uid=uid, k8s_pod_name=pod, k8s_namespace_name="ml", k8s_container_name=container, **more
    )


def test_dra_devices_from_podresources_are_placed_by_node_local_facts(
    node: KubeletScenario, socket_dir: Path, tmp_path: Path
) -> None:
    with PodResourcesServer(socket_dir / "kubelet.sock") as server:
        server.state.pods = podresources_pods()
        text = node.exposition(
            podresources_socket=str(server.socket_path), cdi_spec_dirs=str(tmp_path / "cdi")
        )
    assert series(text, "numa_device_allocated") == EXPECTED_TOTALS
    per_container = series(text, "numa_container_device_allocated")
    assert (
        per_container[_container(NET, "net-0", "net", numa_node_id=1, numa_resource_name="net.example.com")]
        == 1
    )
    assert (
        per_container[
            _container(NET, "net-0", "sidecar", numa_node_id=1, numa_resource_name="net.example.com")
        ]
        == 1
    )
    assert (
        per_container[
            _container(NET, "net-0", "sidecar", numa_node_id=-1, numa_resource_name="fpga.example.com")
        ]
        == 1
    )
    assert (
        per_container[_container(INFER, "infer-0", "infer", numa_node_id=1, numa_resource_name=NVIDIA)] == 1
    )
    # CPUs on node 0 with a GPU on node 1: not aligned; the others are on one node
    assert series(text, "numa_container_aligned") == {
        _container(TRAIN, "train-0", "train"): 1,
        _container(INFER, "infer-0", "infer"): 0,
        _container(NET, "net-0", "net"): 1,
        _container(NET, "net-0", "sidecar"): 1,  # the unplaced FPGA does not count against it
        _container(POOLED, "pooled-0", "worker"): 1,
    }
    assert counted_errors(text) == {}


def test_the_same_node_without_podresources_gives_the_same_totals_from_the_checkpoint(
    node: KubeletScenario, tmp_path: Path
) -> None:
    (node.kubelet_root / "dra_manager_state").write_bytes(dra_checkpoint_bytes(checkpoint_claims()))
    text = node.exposition(cdi_spec_dirs=str(tmp_path / "cdi"))
    assert series(text, "numa_device_allocated") == EXPECTED_TOTALS
    assert series(text, "numa_container_aligned") == {}  # the checkpoint names no container


def test_a_deleted_pods_claims_are_not_counted(node: KubeletScenario, tmp_path: Path) -> None:
    (node.kubelet_root / "dra_manager_state").write_bytes(dra_checkpoint_bytes(checkpoint_claims()))
    node.remove_pod_directory(INFER)
    text = node.exposition(cdi_spec_dirs=str(tmp_path / "cdi"))
    assert series(text, "numa_device_allocated") == {
        key: value for key, value in EXPECTED_TOTALS.items() if ("numa_resource_name", NVIDIA) not in key
    }


def test_pod_level_cpus_are_counted_once(node: KubeletScenario, socket_dir: Path, tmp_path: Path) -> None:
    with PodResourcesServer(socket_dir / "kubelet.sock") as server:
        server.state.pods = podresources_pods()
        text = node.exposition(
            podresources_socket=str(server.socket_path), cdi_spec_dirs=str(tmp_path / "cdi")
        )
    # node 0: train's 0,1 and infer's 2; node 1: the pooled pod's 4-7, its worker's 4,5 among them
    assert series(text, "numa_cpu_allocated") == {labels(numa_node_id=0): 3, labels(numa_node_id=1): 4}
    pod = labels(k8s_pod_uid=POOLED, k8s_pod_name="pooled-0", k8s_namespace_name="ml")
    assert series(text, "numa_pod_cpu_allocated") == {pod | labels(numa_node_id=1): 4}
    assert series(text, "numa_pod_memory_allocated_bytes") == {pod | labels(numa_node_id=1): 2 << 30}
    assert (
        series(text, "numa_container_cpu_allocated")[_container(POOLED, "pooled-0", "worker", numa_node_id=1)]
        == 2
    )


def test_bad_cdi_spec_and_dangling_device_node_cost_only_their_own_devices(
    node: KubeletScenario, socket_dir: Path, tmp_path: Path
) -> None:
    cdi = tmp_path / "cdi"
    (cdi / "broken.yaml").write_text("cdiVersion: [unterminated\n")
    # the NIC's node now names a character device that sysfs does not know
    write_cdi_spec(
        cdi,
        "example.com-nic.json",
        cdi_spec(
            "example.com/nic",
            {"nic-0": [{"path": "/dev/infiniband/uverbs9", "type": "c", "major": 231, "minor": 99}]},
        ),
    )
    with PodResourcesServer(socket_dir / "kubelet.sock") as server:
        server.state.pods = podresources_pods()
        text = node.exposition(podresources_socket=str(server.socket_path), cdi_spec_dirs=str(cdi))
    expected = dict(EXPECTED_TOTALS)
    del expected[labels(numa_node_id=1, numa_resource_name="net.example.com")]
    expected[labels(numa_node_id=-1, numa_resource_name="net.example.com")] = 1
    assert series(text, "numa_device_allocated") == expected
    assert counted_errors(text) == {
        labels(numa_source="cdi", error_type="parse_error"): 1,
        labels(numa_source="cdi", error_type="unresolved"): 1,
    }


def test_a_corrupt_dra_checkpoint_costs_only_the_dra_totals(node: KubeletScenario, tmp_path: Path) -> None:
    data = bytearray(dra_checkpoint_bytes(checkpoint_claims()))
    data[data.index(b"gpu-1")] = ord("h")  # the CRC-32 no longer matches
    (node.kubelet_root / "dra_manager_state").write_bytes(bytes(data))
    text = node.exposition(cdi_spec_dirs=str(tmp_path / "cdi"))
    assert series(text, "numa_device_allocated") == {}
    assert series(text, "numa_cpu_capacity") == {labels(numa_node_id=0): 4, labels(numa_node_id=1): 4}
    assert counted_errors(text) == {labels(numa_source="dra_manager", error_type="checksum_mismatch"): 1}


def test_a_cdi_device_no_spec_defines_leaves_its_drivers_numbers_absent(
    node: KubeletScenario, socket_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "cdi" / "k8s.gpu.nvidia.com-claim_gpu.yaml").unlink()  # the claim's spec is gone
    with PodResourcesServer(socket_dir / "kubelet.sock") as server:
        server.state.pods = podresources_pods()
        text = node.exposition(
            podresources_socket=str(server.socket_path), cdi_spec_dirs=str(tmp_path / "cdi")
        )
    assert series(text, "numa_device_allocated") == {
        key: value for key, value in EXPECTED_TOTALS.items() if ("numa_resource_name", NVIDIA) not in key
    }
    aligned = series(text, "numa_container_aligned")
    assert _container(INFER, "infer-0", "infer") not in aligned  # not known, so not 0 or 1
    assert aligned[_container(TRAIN, "train-0", "train")] == 1
    assert counted_errors(text) == {}


def test_alignment_read_from_a_real_prometheus(
    node: KubeletScenario, socket_dir: Path, tmp_path: Path
) -> None:
    """The agent as a process, scraped by Prometheus: the panel's query lists the container that is not
    aligned, and a container whose GPU moves next to its CPUs turns aligned."""
    with PodResourcesServer(socket_dir / "kubelet.sock") as server:
        server.state.pods = podresources_pods()
        args = node.cli_args(
            "--podresources-socket",
            str(server.socket_path),
            "--cdi-spec-dirs",
            str(tmp_path / "cdi"),
            "--interval",
            "1",
            podresources=True,
        )
        with (
            run_agent(args, tmp_path) as agent,
            run_prometheus(tmp_path, [f"127.0.0.1:{agent.prometheus_port}"]) as prom,
        ):
            wait_for(lambda: len(prom.query("numa_container_aligned")) == 5, 40, "five containers' alignment")
            unaligned = prom.series("numa_container_aligned == 0")
            assert [dict(key)["k8s_container_name"] for key in unaligned] == ["infer"]
            assert {
                dict(key)["k8s_container_name"] for key in prom.series("numa_container_aligned == 1")
            } == {
                "train",
                "net",
                "sidecar",
                "worker",
            }
            # the inference pod gets the GPU on node 0, where its CPU is
            pods = podresources_pods()
            del pods[1].containers[0].dynamic_resources[:]
            pods[1].containers[0].dynamic_resources.append(_claim("gpu", GPU_BY_ADDRESS))
            server.state.pods = pods
            wait_for(lambda: not prom.query("numa_container_aligned == 0"), 40, "the container to be aligned")
            pci = prom.series('sum by (numa_node_id) (numa_pci_device_count{pci_device_class="display"})')
            assert pci == {frozenset({("numa_node_id", "0")}): 1.0, frozenset({("numa_node_id", "1")}): 1.0}


def test_pod_level_cpus_from_the_checkpoints_pod_entries_are_counted_once(node: KubeletScenario) -> None:
    write_cpu_manager_state(
        node.cpu_manager_path,
        "static",
        {0, 1, 2, 3},
        {POOLED: {"worker": {4, 5}}},
        pod_entries={POOLED: {4, 5, 6, 7}},
        layout="v3",
    )
    text = node.exposition(compat="numainfo")
    assert series(text, "numa_cpu_allocated") == {labels(numa_node_id=0): 0, labels(numa_node_id=1): 4}
    pod = labels(k8s_pod_uid=POOLED, k8s_pod_name="pooled-0", k8s_namespace_name="ml")
    assert series(text, "numa_pod_cpu_allocated") == {pod | labels(numa_node_id=1): 4}
    # numainfo_exporter's view counts each exclusive CPU once too
    allocation = {
        dict(key)["numanode"]: value
        for key, value in series(text, "numainfo_core_count").items()
        if ("type", "allocation") in key
    }
    assert allocation == {"node00": 0, "node01": 4}


def test_without_cdi_directories_names_still_place_devices(node: KubeletScenario) -> None:
    (node.kubelet_root / "dra_manager_state").write_bytes(dra_checkpoint_bytes(checkpoint_claims()))
    totals = series(node.exposition(cdi_spec_dirs=""), "numa_device_allocated")
    assert totals[labels(numa_node_id=0, numa_resource_name="gpu.example.com")] == 1  # by its name
    # the CDI devices no spec defines: their drivers' numbers are not known
    assert not any(("numa_resource_name", NVIDIA) in key for key in totals)
