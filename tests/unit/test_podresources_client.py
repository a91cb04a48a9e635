"""The podresources client against a real gRPC server on a unix socket (otel_numa/testing)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from otel_numa.model import (
    AllocatableResources,
    ContainerDevices,
    ContainerMemory,
    ContainerResources,
    DraClaim,
    DraDevice,
    PodResources,
)
from otel_numa.proto import podresources_v1_pb2 as pb
from otel_numa.proto import podresources_v1_pb2_grpc as pb_grpc
from otel_numa.sources.errors import SourceCorrupt, SourceMissing, SourceUnavailable
from otel_numa.sources.podresources import DEFAULT_MAX_MESSAGE_BYTES, MAX_VALUES, PodResourcesClient
from otel_numa.sources.podresources_answer import MAX_ENTRIES, MachineLimits
from otel_numa.sources.wire_values import TooManyValues, count_values
from otel_numa.testing.podresources_server import PodResourcesServer, short_socket_dir
from tests.support import REPO

GiB = 1024**3
MiB = 1024**2


def topology(*numa_ids: int) -> pb.TopologyInfo:
    return pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa_id) for numa_id in numa_ids])


@pytest.fixture
def server() -> Iterator[PodResourcesServer]:
    with PodResourcesServer() as running:
        yield running


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    directory = short_socket_dir()
    yield directory
    for leftover in directory.iterdir():
        leftover.unlink()
    directory.rmdir()


def test_absent_socket_raises_source_missing_at_once(socket_dir: Path) -> None:
    client = PodResourcesClient(socket_dir / "kubelet.sock", timeout_s=5.0)
    started = time.monotonic()
    with pytest.raises(SourceMissing) as raised:
        client.list_pods()
    with pytest.raises(SourceMissing):
        client.allocatable()
    assert time.monotonic() - started < 0.5
    assert raised.value.error_type == "missing"


def test_socket_path_that_is_a_plain_file_is_unavailable(socket_dir: Path) -> None:
    (socket_dir / "kubelet.sock").write_text("")
    with pytest.raises(SourceUnavailable) as raised:
        PodResourcesClient(socket_dir / "kubelet.sock").list_pods()
    assert raised.value.error_type == "not_a_socket"


def test_list_pods_reports_cpus_devices_and_memory_with_numa_ids(server: PodResourcesServer) -> None:
    server.state.pods = [
        pb.PodResources(
            name="inference-6c9f7d5b8-k2x7p",
            namespace="ml",
            containers=[
                pb.ContainerResources(
                    name="model",
                    cpu_ids=[4, 5, 36, 37],
                    devices=[
                        pb.ContainerDevices(
                            resource_name="nvidia.com/gpu",
                            device_ids=["GPU-1f3c6a52-5d0e-8a7b-33c2-7e7f0c1d9a11"],
                            topology=topology(1),
                        ),
                        pb.ContainerDevices(resource_name="example.com/fpga", device_ids=["fpga0", "fpga1"]),
                    ],
                    memory=[
                        pb.ContainerMemory(memory_type="memory", size=8 * GiB, topology=topology(1, 0)),
                        pb.ContainerMemory(memory_type="hugepages-1Gi", size=2 * GiB, topology=topology(1)),
                    ],
                ),
                pb.ContainerResources(name="sidecar"),
            ],
        ),
        pb.PodResources(name="coredns-76f75df574-9xq2w", namespace="kube-system"),
    ]
    client = PodResourcesClient(server.socket_path)

    assert client.list_pods() == (
        PodResources(
            name="inference-6c9f7d5b8-k2x7p",
            namespace="ml",
            containers=(
                ContainerResources(
                    name="model",
                    cpu_ids=frozenset({4, 5, 36, 37}),
                    devices=(
                        ContainerDevices(
                            resource_name="nvidia.com/gpu",
                            device_ids=("GPU-1f3c6a52-5d0e-8a7b-33c2-7e7f0c1d9a11",),
                            numa_ids=(1,),
                        ),
                        ContainerDevices(
                            resource_name="example.com/fpga", device_ids=("fpga0", "fpga1"), numa_ids=()
                        ),
                    ),
                    memory=(
                        ContainerMemory(memory_type="memory", size=8 * GiB, numa_ids=(0, 1)),
                        ContainerMemory(memory_type="hugepages-1Gi", size=2 * GiB, numa_ids=(1,)),
                    ),
                ),
                ContainerResources(name="sidecar", cpu_ids=frozenset(), devices=(), memory=()),
            ),
        ),
        PodResources(name="coredns-76f75df574-9xq2w", namespace="kube-system", containers=()),
    )
    client.close()


def test_the_same_answer_gives_the_same_pods_and_a_new_one_is_read_anew(server: PodResourcesServer) -> None:
    def pod(name: str, cpus: list[int]) -> pb.PodResources:
        return pb.PodResources(
            name=name, namespace="ns", containers=[pb.ContainerResources(name="c", cpu_ids=cpus)]
        )

    server.state.pods = [pod("a", [1, 2]), pod("b", [3])]
    client = PodResourcesClient(server.socket_path)
    first = client.list_pods()
    assert client.list_pods() is first  # one comparison of the answer's bytes, nothing built again
    server.state.pods = [pod("a", [1, 2]), pod("b", [3, 4])]  # one CPU more for b
    changed = client.list_pods()
    assert changed is not first and changed[1].containers[0].cpu_ids == frozenset({3, 4})
    server.state.pods = []
    assert client.list_pods() == ()
    server.state.pods = [pod("a", [1, 2]), pod("b", [3])]
    assert client.list_pods() == first
    # once the machine is known the same answer is judged again by its limits; an equal result is the
    # object already held (the join holds it: no second copy of every pod)
    again = client.list_pods()
    assert client.list_pods(MachineLimits(highest_cpu=7, numa_nodes=frozenset({0}))) is again
    client.close()


def test_allocatable_reports_cpus_devices_and_memory(server: PodResourcesServer) -> None:
    server.state.allocatable = pb.AllocatableResourcesResponse(
        cpu_ids=[2, 3, 4, 5, 34, 35],
        devices=[
            pb.ContainerDevices(
                resource_name="intel.com/sriov_netdevice",
                device_ids=["0000:3b:02.0", "0000:3b:02.1"],
                topology=topology(0),
            )
        ],
        memory=[
            pb.ContainerMemory(memory_type="memory", size=120 * GiB, topology=topology(0)),
            pb.ContainerMemory(memory_type="hugepages-2Mi", size=512 * MiB, topology=topology(1)),
        ],
    )
    with PodResourcesClient(server.socket_path) as client:
        assert client.allocatable() == AllocatableResources(
            cpu_ids=frozenset({2, 3, 4, 5, 34, 35}),
            devices=(
                ContainerDevices(
                    resource_name="intel.com/sriov_netdevice",
                    device_ids=("0000:3b:02.0", "0000:3b:02.1"),
                    numa_ids=(0,),
                ),
            ),
            memory=(
                ContainerMemory(memory_type="memory", size=120 * GiB, numa_ids=(0,)),
                ContainerMemory(memory_type="hugepages-2Mi", size=512 * MiB, numa_ids=(1,)),
            ),
        )


def test_kubelet_without_get_allocatable_answers_unimplemented(server: PodResourcesServer) -> None:
    server.state.allocatable_unimplemented = True
    server.state.pods = [pb.PodResources(name="web-0", namespace="shop")]
    with PodResourcesClient(server.socket_path) as client:
        with pytest.raises(SourceUnavailable) as raised:
            client.allocatable()
        assert raised.value.error_type == "unimplemented"
        assert [pod.name for pod in client.list_pods()] == ["web-0"]


def test_slow_kubelet_gives_up_after_the_timeout(server: PodResourcesServer) -> None:
    server.state.delay_s = 10.0
    timeout_s = 0.5
    with PodResourcesClient(server.socket_path, timeout_s=timeout_s) as client:
        for call in (client.list_pods, client.allocatable):
            started = time.monotonic()
            with pytest.raises(SourceUnavailable) as raised:
                call()
            assert time.monotonic() - started < timeout_s + 0.5
            assert raised.value.error_type == "deadline_exceeded"


def test_server_that_appears_later_is_reached_by_the_same_client(socket_dir: Path) -> None:
    client = PodResourcesClient(socket_dir / "kubelet.sock", timeout_s=2.0)
    with pytest.raises(SourceMissing):
        client.list_pods()
    with PodResourcesServer(socket_dir / "kubelet.sock") as server:
        server.state.pods = [pb.PodResources(name="web-0", namespace="shop")]
        assert [pod.name for pod in client.list_pods()] == ["web-0"]
    with pytest.raises(SourceMissing):
        client.list_pods()  # the kubelet went away and removed its socket
    with PodResourcesServer(socket_dir / "kubelet.sock") as server:
        server.state.pods = [pb.PodResources(name="web-1", namespace="shop")]
        assert [pod.name for pod in client.list_pods()] == ["web-1"]
    client.close()


def test_one_channel_serves_many_calls(server: PodResourcesServer, monkeypatch: pytest.MonkeyPatch) -> None:
    created: list[str] = []
    real_insecure_channel = grpc.insecure_channel

    def counting_insecure_channel(target: str, *args: object, **kwargs: object) -> object:
        created.append(target)
        return real_insecure_channel(target, *args, **kwargs)

    monkeypatch.setattr(grpc, "insecure_channel", counting_insecure_channel)
    with PodResourcesClient(server.socket_path) as client:
        assert created == []  # created lazily
        for _ in range(5):
            client.list_pods()
            client.allocatable()
    assert created == [f"unix://{server.socket_path}"]
    assert server.calls == {"List": 5, "GetAllocatableResources": 5}


def _realistic_pods(pod_count: int, containers_per_pod: int) -> list[pb.PodResources]:
    """Guaranteed pods with two exclusive CPUs, one GPU, memory and hugepages per container."""
    pods = []
    for pod_index in range(pod_count):
        containers = []
        for container_index in range(containers_per_pod):
            first_cpu = 2 * (pod_index * containers_per_pod + container_index)
            numa_id = container_index % 2
            containers.append(
                pb.ContainerResources(
                    name=f"worker-{container_index}",
                    cpu_ids=[first_cpu, first_cpu + 1],
                    devices=[
                        pb.ContainerDevices(
                            resource_name="nvidia.com/gpu",
                            device_ids=[f"GPU-{pod_index:08x}-{container_index:04x}-4f3b-9a1e-0c1d2e3f4a5b"],
                            topology=topology(numa_id),
                        )
                    ],
                    memory=[
                        pb.ContainerMemory(memory_type="memory", size=4 * GiB, topology=topology(numa_id)),
                        pb.ContainerMemory(
                            memory_type="hugepages-1Gi", size=2 * GiB, topology=topology(numa_id)
                        ),
                    ],
                )
            )
        pods.append(
            pb.PodResources(
                name=f"batch-{pod_index:04d}-7d9c8b6f5-x2k4q", namespace="analytics", containers=containers
            )
        )
    return pods


def test_thousand_pods_of_four_containers_arrive_whole(server: PodResourcesServer) -> None:
    server.state.pods = _realistic_pods(1000, 4)
    # Such a node's answer is about 0.6 MB, well below the 4 MiB the client receives.
    assert pb.ListPodResourcesResponse(pod_resources=server.state.pods).ByteSize() < 4 * MiB
    with PodResourcesClient(server.socket_path) as client:
        pods = client.list_pods()
    assert len(pods) == 1000
    assert sum(len(pod.containers) for pod in pods) == 4000
    last = pods[-1].containers[-1]
    assert last.cpu_ids == frozenset({7998, 7999})
    assert last.devices[0].device_ids == ("GPU-000003e7-0003-4f3b-9a1e-0c1d2e3f4a5b",)
    assert last.devices[0].numa_ids == (1,)


def test_an_answer_past_the_entry_cap_is_refused_whole(server: PodResourcesServer) -> None:
    """4,000 containers with two dozen devices each (a synthetic worst case: ~105,000 entries, 2.9 MB) are
    past what one answer may hold; refused at the entry that crosses the cap, never built whole."""
    pods = _realistic_pods(1000, 4)
    for pod_index, pod in enumerate(pods):
        for container_index, container in enumerate(pod.containers):
            container.devices.add(
                resource_name="example.com/accelerator",
                device_ids=[f"acc-{pod_index:03x}{container_index:x}{index:02x}" for index in range(24)],
                topology=topology(0),
            )
    server.state.pods = pods
    assert pb.ListPodResourcesResponse(pod_resources=pods).ByteSize() < DEFAULT_MAX_MESSAGE_BYTES
    with PodResourcesClient(server.socket_path) as client, pytest.raises(SourceCorrupt) as raised:
        client.list_pods()
    assert raised.value.error_type == "over_limit"
    assert str(raised.value).endswith(f"List: more than {MAX_ENTRIES} entries; the answer is left out")


def test_an_answer_past_the_message_cap_is_refused_by_grpc(server: PodResourcesServer) -> None:
    """The allocatable CPUs 0..3,999,999 (a 13.9 MB answer) never reach the agent's memory."""
    server.state.allocatable = pb.AllocatableResourcesResponse(cpu_ids=range(4_000_000))
    with PodResourcesClient(server.socket_path) as client, pytest.raises(SourceUnavailable) as raised:
        client.allocatable()
    assert raised.value.error_type == "resource_exhausted"


def test_an_answer_of_many_small_values_is_refused_before_it_is_parsed(server: PodResourcesServer) -> None:
    """500,000 empty devices (3 MB, ~65 MB once parsed): counted from the bytes, refused unparsed."""
    empty = pb.ContainerDevices(topology=pb.TopologyInfo(nodes=[pb.NUMANode()]))
    server.state.allocatable = pb.AllocatableResourcesResponse(devices=[empty] * 500_000)
    with PodResourcesClient(server.socket_path) as client, pytest.raises(SourceCorrupt) as raised:
        client.allocatable()
    assert raised.value.error_type == "over_limit"
    assert str(raised.value).endswith(f"more than {MAX_VALUES} values; the answer is left out")


def test_values_are_counted_as_the_wire_holds_them() -> None:
    pods = _realistic_pods(10, 2)
    data = pb.ListPodResourcesResponse(pod_resources=pods).SerializeToString()
    # a pod: itself, name, namespace; a container: itself, name, cpu_ids (2, packed: at most 2 bytes
    # counted, here 1 each), a device (itself, name, id, topology, node, ID), two memory blocks (each
    # itself, type, size, topology, node, ID)
    per_container = 3 + 2 + 6 + 2 * 6
    assert count_values(data, pb.ListPodResourcesResponse.DESCRIPTOR, 10**6) <= 10 * (3 + 2 * per_container)
    with pytest.raises(TooManyValues):
        count_values(data, pb.ListPodResourcesResponse.DESCRIPTOR, 100)
    with pytest.raises(SourceCorrupt):
        count_values(data[:-3], pb.ListPodResourcesResponse.DESCRIPTOR, 10**6)


MACHINE = MachineLimits(highest_cpu=31, numa_nodes=frozenset({0, 1}))


@pytest.mark.parametrize(
    ("pods", "allocatable", "error_type"),
    [
        # a CPU the machine does not have, in a container's set, a pod's pool, or allocatable
        (
            [pb.PodResources(name="p", containers=[pb.ContainerResources(name="c", cpu_ids=[3, 32])])],
            None,
            "out_of_range",
        ),
        ([pb.PodResources(name="p", cpu_ids=range(64))], None, "out_of_range"),
        (None, pb.AllocatableResourcesResponse(cpu_ids=range(33)), "out_of_range"),
        (None, pb.AllocatableResourcesResponse(cpu_ids=[-1]), "out_of_range"),
        # a NUMA node the machine does not have, for a device or a memory block
        (
            None,
            pb.AllocatableResourcesResponse(
                devices=[pb.ContainerDevices(resource_name="r", device_ids=["d"], topology=topology(0, 2))]
            ),
            "out_of_range",
        ),
        (
            [
                pb.PodResources(
                    name="p",
                    containers=[
                        pb.ContainerResources(
                            name="c",
                            memory=[pb.ContainerMemory(memory_type="memory", size=1, topology=topology(7))],
                        )
                    ],
                )
            ],
            None,
            "out_of_range",
        ),
        # 200,000 allocatable devices (one series per NUMA node and resource, were they turned into series)
        (
            None,
            pb.AllocatableResourcesResponse(
                devices=[
                    pb.ContainerDevices(
                        resource_name="r", device_ids=[f"d{index}"], topology=topology(index % 2)
                    )
                    for index in range(200_000)
                ]
            ),
            "over_limit",
        ),
        # a set longer than the machine's CPUs: it repeats ids
        (
            [pb.PodResources(name="p", containers=[pb.ContainerResources(name="c", cpu_ids=[5] * 33)])],
            None,
            "over_limit",
        ),
    ],
)
def test_an_answer_beyond_the_machine_is_refused_whole(
    server: PodResourcesServer,
    pods: list[pb.PodResources] | None,
    allocatable: pb.AllocatableResourcesResponse | None,
    error_type: str,
) -> None:
    server.state.pods = pods or []
    server.state.allocatable = allocatable or pb.AllocatableResourcesResponse()
    with PodResourcesClient(server.socket_path) as client, pytest.raises(SourceCorrupt) as raised:
        client.list_pods(MACHINE) if pods else client.allocatable(MACHINE)
    assert raised.value.error_type == error_type
    assert "the answer is left out" in str(raised.value)


def test_an_old_kubelets_shared_pool_in_every_container_is_an_answer_like_any_other(
    server: PodResourcesServer,
) -> None:
    """Kubelets before 1.22 list the whole shared pool as the CPUs of every container outside it: 110 such
    containers name the 32 CPUs 110 times over."""
    server.state.pods = [
        pb.PodResources(name=f"p{index}", containers=[pb.ContainerResources(name="c", cpu_ids=range(2, 32))])
        for index in range(110)
    ]
    with PodResourcesClient(server.socket_path) as client:
        pods = client.list_pods(MACHINE)
    assert len(pods) == 110 and all(pod.containers[0].cpu_ids == frozenset(range(2, 32)) for pod in pods)


def test_an_answer_read_before_the_machine_was_known_is_read_again_within_it(
    server: PodResourcesServer,
) -> None:
    """The same bytes, read first within the widest limits and then within the machine's: refused then."""
    server.state.pods = [
        pb.PodResources(name="p", containers=[pb.ContainerResources(name="c", cpu_ids=[40])])
    ]
    with PodResourcesClient(server.socket_path) as client:
        assert client.list_pods()[0].containers[0].cpu_ids == frozenset({40})
        with pytest.raises(SourceCorrupt) as raised:
            client.list_pods(MACHINE)
    assert raised.value.error_type == "out_of_range"


def _start_server_process(socket_path: Path, state_file: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "otel_numa.testing.podresources_server", "--socket", str(socket_path)]
    process = subprocess.Popen(
        [*command, "--state", str(state_file)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def test_kubelet_killed_and_restarted_in_another_process(socket_dir: Path, tmp_path: Path) -> None:
    socket_path = socket_dir / "kubelet.sock"
    state_file = tmp_path / "state.json"
    state_file.write_text(
        json.dumps(
            {"pods": [{"name": "db-0", "namespace": "prod", "containers": [{"name": "pg", "cpuIds": [7]}]}]}
        )
    )
    client = PodResourcesClient(socket_path, timeout_s=2.0)
    process = _start_server_process(socket_path, state_file)
    try:
        assert client.list_pods()[0].containers[0].cpu_ids == frozenset({7})
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        assert socket_path.exists()  # a killed kubelet leaves its socket file behind
        started = time.monotonic()
        with pytest.raises(SourceUnavailable) as raised:
            client.list_pods()
        assert raised.value.error_type == "unavailable"
        assert time.monotonic() - started < 2.0

        process = _start_server_process(socket_path, state_file)
        assert [pod.name for pod in client.list_pods()] == ["db-0"]
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=10)


def test_list_pods_reports_dra_claims_and_pod_level_resources(server: PodResourcesServer) -> None:
    claim = pb.DynamicResource(
        claim_name="gpus",
        claim_namespace="ml",
        claim_resources=[
            pb.ClaimResource(
                cdi_devices=[pb.CDIDevice(name="k8s.gpu.nvidia.com/claim=c1-gpu-0")],
                driver_name="gpu.nvidia.com",
                pool_name="node-a",
                device_name="gpu-0",
            ),
            pb.ClaimResource(
                driver_name="gpu.nvidia.com", pool_name="node-a", device_name="gpu-1", share_id="s1"
            ),
        ],
    )
    server.state.pods = [
        pb.PodResources(
            name="train-0",
            namespace="ml",
            containers=[pb.ContainerResources(name="train", cpu_ids=[2, 3], dynamic_resources=[claim])],
            cpu_ids=[0, 1, 2, 3],
            memory=[pb.ContainerMemory(memory_type="memory", size=GiB, topology=topology(0))],
        )
    ]
    with PodResourcesClient(server.socket_path) as client:
        (pod,) = client.list_pods()
    assert pod.cpu_ids == frozenset({0, 1, 2, 3})
    assert pod.memory == (ContainerMemory("memory", GiB, (0,)),)
    (container,) = pod.containers
    assert container.cpu_ids == frozenset({2, 3})
    assert container.dynamic_resources == (
        DraClaim(
            "gpus",
            "ml",
            (
                DraDevice("gpu.nvidia.com", "node-a", "gpu-0", ("k8s.gpu.nvidia.com/claim=c1-gpu-0",)),
                DraDevice("gpu.nvidia.com", "node-a", "gpu-1", (), share_id="s1"),
            ),
        ),
    )


def test_the_test_server_answers_get_as_the_kubelet_does(server: PodResourcesServer) -> None:
    server.state.pods = [pb.PodResources(name="web-0", namespace="shop")]
    channel = grpc.insecure_channel(f"unix://{server.socket_path}")
    try:
        stub = pb_grpc.PodResourcesListerStub(channel)
        found = stub.Get(pb.GetPodResourcesRequest(pod_name="web-0", pod_namespace="shop"), timeout=5)
        assert found.pod_resources.name == "web-0"
        with pytest.raises(grpc.RpcError) as caught:
            stub.Get(pb.GetPodResourcesRequest(pod_name="gone", pod_namespace="shop"), timeout=5)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        channel.close()
