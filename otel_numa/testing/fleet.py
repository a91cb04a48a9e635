"""A simulated fleet: many distinct Kubernetes nodes, each with its own agent, for the fleet benchmark and
the cluster-view tests.

Each node is a :class:`~otel_numa.testing.large_node.LargeNode` of one of a few realistic shapes (a small
single-socket node, a 2-socket general node, an 8-NUMA EPYC node, a GPU node, nodes whose NUMA memory or
CPUs are nearly all handed out), with a pod count drawn per node, and a podresources server of its own
that answers with the same plan (so allocatable CPUs, memory and devices are known). Churn: a node moves on
to its next generation, where every exclusive container sits on another NUMA node (checkpoints and
podresources change together) and cgroup usage grows::

    with write_fleet(tmp_path, plan_fleet(30, seed=1)) as fleet:
        with run_fleet_agents(fleet, tmp_path, extra_args=["--exporter=prometheus"]) as agents:
            fleet.nodes[0].churn()
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import json_format

from otel_numa.proto import podresources_v1_pb2 as pb
from otel_numa.testing.large_node import GIB, MIB, LargeNode, LargeNodeSpec, write_large_node
from otel_numa.testing.peers import REPO, free_port, http_get, stop_process, wait_for
from otel_numa.testing.podresources_server import PodResourcesServer, PodResourcesState


@dataclass(frozen=True)
class NodeShape:
    """A kind of node: its machine and kubelet plan, and the range its pod count is drawn from."""

    name: str
    spec: LargeNodeSpec
    pods: tuple[int, int]  # inclusive range
    share: int  # nodes of this shape per 30


def _spec(**values: object) -> LargeNodeSpec:
    base = LargeNodeSpec(
        hugepage_sizes_kib=(2048, 1048576),
        containers_per_pod=2,
        device_resources=(),
        devices_per_resource=0,
        namespace="fleet",
    )
    return dataclasses.replace(base, **values)  # type: ignore[arg-type]


# Exclusive containers per NUMA node stay within its CPUs less the reserved one, so every plan fits.
SHAPES: tuple[NodeShape, ...] = (
    # one socket, 16 CPUs, 64 GiB; few Guaranteed pods
    NodeShape("small", _spec(numa_nodes=1, cpus_per_node=16, mem_per_node_kib=64 << 20,
                             exclusive_pod_every=8), (20, 56), 8),
    # two sockets, 2 x 32 CPUs, 2 x 128 GiB, the kubelet's default 110 pods at most
    NodeShape("general", _spec(numa_nodes=2, cpus_per_node=32, mem_per_node_kib=128 << 20,
                               exclusive_pod_every=4), (60, 110), 10),
    # EPYC, two sockets in NPS4: 8 NUMA nodes x 16 CPUs, 8 x 64 GiB, up to 250 pods
    NodeShape("epyc", _spec(numa_nodes=8, cpus_per_node=16, mem_per_node_kib=64 << 20,
                            exclusive_pod_every=5), (150, 250), 4),
    # GPU node: 2 x 48 CPUs, 2 x 256 GiB, 8 GPUs and 8 SR-IOV VFs over the NUMA nodes, licences without
    # NUMA affinity; a few large Guaranteed pods, GPUs left over
    NodeShape("gpu", _spec(numa_nodes=2, cpus_per_node=48, mem_per_node_kib=256 << 20,
                           container_memory_bytes=4 * GIB,
                           device_resources=("nvidia.com/gpu", "example.com/sriov-vf", "example.com/license"),
                           devices_per_resource=8, exclusive_pod_every=1), (4, 10), 3),
    # memory nearly all handed out (2 GiB per container on 48 GiB NUMA nodes), CPUs left: stranded CPUs
    NodeShape("memory-bound", _spec(numa_nodes=2, cpus_per_node=32, mem_per_node_kib=48 << 20,
                                    container_memory_bytes=2 * GIB, hugepage_sizes_kib=(2048,),
                                    exclusive_pod_every=2), (40, 40), 3),
    # telco node: every CPU exclusive, memory left, 1 GiB hugepages: stranded memory
    NodeShape("cpu-bound", _spec(numa_nodes=2, cpus_per_node=16, mem_per_node_kib=128 << 20,
                                 container_memory_bytes=512 * MIB, hugepage_sizes_kib=(1048576,),
                                 exclusive_pod_every=1), (15, 15), 2),
)  # fmt: skip

SHAPES_BY_NAME = {shape.name: shape for shape in SHAPES}


@dataclass(frozen=True)
class NodePlan:
    name: str
    shape: str
    spec: LargeNodeSpec


def plan_fleet(count: int, seed: int = 0, shapes: Sequence[str] | None = None) -> list[NodePlan]:
    """``count`` nodes in the shapes' shares (or cycling through ``shapes``), pod counts drawn with
    ``seed``; the same arguments give the same fleet."""
    draw = random.Random(seed)
    if shapes is None:
        weighted = [shape.name for shape in SHAPES for _ in range(shape.share)]
        names = [weighted[index * len(weighted) // count] for index in range(count)]
    else:
        names = [shapes[index % len(shapes)] for index in range(count)]
    plans = []
    for index, name in enumerate(names):
        shape = SHAPES_BY_NAME[name]
        pods = draw.randint(*shape.pods)
        plans.append(NodePlan(f"{name}-{index:03d}", name, dataclasses.replace(shape.spec, pods=pods)))
    return plans


class FleetNode:
    """One written node with its podresources server (started by :func:`write_fleet`)."""

    def __init__(self, plan: NodePlan, node: LargeNode, server: PodResourcesServer) -> None:
        self.plan = plan
        self.node = node
        self.server = server
        self.generation = 0

    @property
    def name(self) -> str:
        return self.plan.name

    def agent_args(self) -> list[str]:
        node = self.node
        return [
            f"--sysfs-root={node.sysfs_root}",
            f"--procfs-root={node.procfs_root}",
            f"--kubelet-root={node.kubelet_root}",
            f"--pod-logs-root={node.pod_logs_root}",
            f"--container-logs-root={node.container_logs_root}",
            f"--cgroup-root={node.cgroup_root}",
            f"--podresources-socket={self.server.socket_path}",
            f"--node-name={self.name}",
        ]

    def churn(self) -> None:
        """The node's pods are placed anew: next generation's checkpoints, podresources answer and usage."""
        self.generation += 1
        self.node.write_checkpoints(self.generation)
        self.server.state = podresources_state(self.node, self.generation)
        if self.node.spec.cgroups and self.node.spec.pods:
            self.node.write_cgroup_usage(self.generation)


def podresources_state(node: LargeNode, generation: int) -> PodResourcesState:
    document = node.podresources_state(generation)
    pods = [json_format.ParseDict(pod, pb.PodResources()) for pod in document["pods"]]
    allocatable = json_format.ParseDict(document["allocatable"], pb.AllocatableResourcesResponse())
    return PodResourcesState(pods=pods, allocatable=allocatable)


@dataclass
class Fleet:
    nodes: list[FleetNode]


@contextmanager
def write_fleet(root: Path, plans: Sequence[NodePlan]) -> Iterator[Fleet]:
    """Write every node under ``root/<name>`` and serve its podresources (in this process)."""
    with ExitStack() as stack:
        nodes = []
        for plan in plans:
            node = write_large_node(root / plan.name, plan.spec)
            server = stack.enter_context(PodResourcesServer(state=podresources_state(node, 0)))
            nodes.append(FleetNode(plan, node, server))
        yield Fleet(nodes)


@dataclass
class FleetAgent:
    node: FleetNode
    process: subprocess.Popen[bytes]
    prometheus_port: int
    health_port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.prometheus_port}"


@contextmanager
def run_fleet_agents(
    fleet: Fleet | Sequence[FleetNode], log_dir: Path, extra_args: Sequence[str] = (), ready_s: float = 120
) -> Iterator[list[FleetAgent]]:
    """One agent process per node, all started before any is waited for; ready when each /readyz is."""
    nodes = fleet.nodes if isinstance(fleet, Fleet) else list(fleet)
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NODE_NAME"))}
    agents: list[FleetAgent] = []
    try:
        for node in nodes:
            prometheus_port, health_port = free_port(), free_port()
            command = [
                sys.executable, "-m", "otel_numa", *node.agent_args(), *extra_args,
                f"--prometheus-address=127.0.0.1:{prometheus_port}",
                f"--health-address=127.0.0.1:{health_port}",
            ]  # fmt: skip
            with open(log_dir / f"agent-{node.name}.log", "wb") as log:
                process = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=REPO
                )
            agents.append(FleetAgent(node, process, prometheus_port, health_port))
        for agent in agents:
            wait_for(
                lambda agent=agent: (  # type: ignore[misc]
                    agent.process.poll() is None
                    and http_get(f"http://127.0.0.1:{agent.health_port}/readyz")[0] == 200
                ),
                ready_s,
                f"the agent of {agent.node.name} to be ready",
                interval_s=0.5,
            )
        yield agents
    finally:
        for agent in agents:
            stop_process(agent.process)
