"""Synthetic kubelet cgroup trees (cgroup v1 and v2, systemd and cgroupfs drivers) for tests and benchmarks.

Files are written in the kernel's documented formats: v2 ``memory.numa_stat`` as ``type N0=<bytes> ...``
(Documentation/admin-guide/cgroup-v2.rst), v1 as ``type=<total pages> N0=<pages> ...`` followed by the
``hierarchical_`` lines (Documentation/admin-guide/cgroup-v1/memory.rst). Paths follow the kubelet's cgroup
naming (pkg/kubelet/cm).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from otel_numa.model import ContainerNumaUsage
from otel_numa.sources.cgroups import detect_cgroup_layout, find_container_cgroups, read_container_usage

Layout = Literal["v1", "v2"]
Driver = Literal["systemd", "cgroupfs"]
Qos = Literal["guaranteed", "burstable", "besteffort"]

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

# Types a v2 kernel lists, in its order; enough to look like the real file.
V2_TYPES = (
    "anon",
    "file",
    "kernel_stack",
    "pagetables",
    "sec_pagetables",
    "shmem",
    "file_mapped",
    "file_dirty",
    "file_writeback",
    "swapcached",
    "anon_thp",
    "file_thp",
    "shmem_thp",
    "inactive_anon",
    "active_anon",
    "inactive_file",
    "active_file",
    "unevictable",
    "slab_reclaimable",
    "slab_unreclaimable",
)
V1_TYPES = ("file", "anon", "unevictable")

# Other interface files of a cgroup directory, so that listing a directory costs what it does for real.
_V2_OTHER_FILES = ("cgroup.procs", "cgroup.type", "cpu.max", "memory.current", "memory.max", "memory.stat")
_V1_OTHER_FILES = ("tasks", "cgroup.procs", "notify_on_release", "memory.usage_in_bytes", "memory.stat")


@dataclass(frozen=True)
class FakeContainer:
    container_id: str
    memory_bytes: Mapping[str, Mapping[int, int]]  # type -> NUMA node -> bytes (whole pages for v1)
    cpus: str = "0-3"  # cpulist text of the effective cpuset
    mems: str = "0"
    cpu_usage_usec: int = 0
    is_sandbox: bool = False


@dataclass(frozen=True)
class FakePod:
    uid: str
    qos: Qos
    containers: tuple[FakeContainer, ...] = field(default_factory=tuple)


# --- file formats ---------------------------------------------------------------------------------


def render_numa_stat_v2(memory_bytes: Mapping[str, Mapping[int, int]], nodes: Sequence[int]) -> str:
    """v2 ``memory.numa_stat``: one line per type, one ``N<id>=<bytes>`` per node with memory."""
    return "".join(
        f"{name} " + " ".join(f"N{node}={by_node.get(node, 0)}" for node in nodes) + "\n"
        for name, by_node in memory_bytes.items()
    )


def render_numa_stat_v1(
    memory_bytes: Mapping[str, Mapping[int, int]],
    nodes: Sequence[int],
    *,
    page_size: int = PAGE_SIZE,
    hierarchical_bytes: Mapping[str, Mapping[int, int]] | None = None,
) -> str:
    """v1 ``memory.numa_stat`` in pages: total, file, anon, unevictable, then the ``hierarchical_`` lines.

    ``hierarchical_bytes`` defaults to ``memory_bytes`` (a leaf cgroup counts only itself).
    """

    def pages(amount: int) -> int:
        if amount % page_size:
            raise ValueError(f"{amount} bytes is not a whole number of {page_size}-byte pages")
        return amount // page_size

    def block(prefix: str, source: Mapping[str, Mapping[int, int]]) -> str:
        totals = {node: sum(source.get(name, {}).get(node, 0) for name in V1_TYPES) for node in nodes}
        rows = [("total", totals)] + [(name, source.get(name, {})) for name in V1_TYPES]
        return "".join(
            f"{prefix}{name}={pages(sum(by_node.get(node, 0) for node in nodes))} "
            + " ".join(f"N{node}={pages(by_node.get(node, 0))}" for node in nodes)
            + "\n"
            for name, by_node in rows
        )

    return block("", memory_bytes) + block("hierarchical_", hierarchical_bytes or memory_bytes)


def render_cpu_stat_v2(usage_usec: int) -> str:
    """v2 ``cpu.stat``: the CPU time, half user and half system, and no throttling."""
    return (
        f"usage_usec {usage_usec}\nuser_usec {usage_usec // 2}\nsystem_usec {usage_usec - usage_usec // 2}\n"
        "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n"
    )


# --- paths ----------------------------------------------------------------------------------------


def pod_relative_dir(driver: Driver, pod: FakePod) -> str:
    """The pod's cgroup below the hierarchy root, as the kubelet names it."""
    if driver == "systemd":
        escaped = pod.uid.replace("-", "_")
        if pod.qos == "guaranteed":
            return f"kubepods.slice/kubepods-pod{escaped}.slice"
        return f"kubepods.slice/kubepods-{pod.qos}.slice/kubepods-{pod.qos}-pod{escaped}.slice"
    if pod.qos == "guaranteed":
        return f"kubepods/pod{pod.uid}"
    return f"kubepods/{pod.qos}/pod{pod.uid}"


def container_relative_dir(driver: Driver, pod: FakePod, container_id: str, runtime: str) -> str:
    name = f"{runtime}-{container_id}.scope" if driver == "systemd" else container_id
    return f"{pod_relative_dir(driver, pod)}/{name}"


def container_dir(
    root: Path,
    layout: Layout,
    driver: Driver,
    pod: FakePod,
    container_id: str,
    *,
    runtime: str = "cri-containerd",
    controller: str = "memory",
) -> Path:
    """Where a container's cgroup is: under ``root`` (v2) or under ``root/<controller>`` (v1)."""
    relative = container_relative_dir(driver, pod, container_id, runtime)
    return root / relative if layout == "v2" else root / controller / relative


# --- trees ----------------------------------------------------------------------------------------


def _write(directory: Path, files: Mapping[str, str], filler: Iterable[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in filler:
        (directory / name).write_text("0\n")
    for name, text in files.items():
        (directory / name).write_text(text)


def write_cgroup_tree(
    root: Path,
    layout: Layout,
    driver: Driver,
    pods: Iterable[FakePod],
    *,
    runtime: str = "cri-containerd",
    nodes: Sequence[int] = (0, 1),
    cpuacct_dir: str = "cpuacct",
    page_size: int = PAGE_SIZE,
    kubepods_sums: bool = True,
) -> None:
    """Write the kubepods tree of ``pods`` under ``root`` (which plays ``/sys/fs/cgroup``); v2 with the
    kubepods cgroup's own counters, the sums of ``pods``' (``kubepods_sums``: :func:`write_kubepods_sums`)."""
    pods = tuple(pods)
    kubepods = "kubepods.slice" if driver == "systemd" else "kubepods"
    if layout == "v2":
        _write(root, {"cgroup.controllers": "cpuset cpu io memory hugetlb pids\n"}, ())
        (root / kubepods).mkdir(exist_ok=True)
    else:
        for controller in ("memory", "cpuset", cpuacct_dir):
            (root / controller / kubepods).mkdir(parents=True, exist_ok=True)
    hierarchy = root if layout == "v2" else root / "memory"
    filler = _V2_OTHER_FILES if layout == "v2" else _V1_OTHER_FILES
    for pod in pods:
        _write(hierarchy / pod_relative_dir(driver, pod), {"memory.numa_stat": ""}, filler)
        for container in pod.containers:
            _write_container(root, layout, driver, pod, container, runtime, nodes, cpuacct_dir, page_size)
    if layout == "v2" and kubepods_sums:
        write_kubepods_sums(root, driver, pods, nodes)


def write_kubepods_sums(root: Path, driver: Driver, pods: Iterable[FakePod], nodes: Sequence[int]) -> None:
    """The v2 kubepods cgroup's own ``memory.numa_stat`` and ``cpu.stat``, written in place: what the
    kernel sums there over every container below it."""
    memory: dict[str, dict[int, int]] = {}
    usage_usec = 0
    for pod in pods:
        for container in pod.containers:
            usage_usec += container.cpu_usage_usec
            for kind, by_node in container.memory_bytes.items():
                into = memory.setdefault(kind, {})
                for node, amount in by_node.items():
                    into[node] = into.get(node, 0) + amount
    kubepods = root / ("kubepods.slice" if driver == "systemd" else "kubepods")
    (kubepods / "memory.numa_stat").write_text(render_numa_stat_v2(memory, nodes))
    (kubepods / "cpu.stat").write_text(render_cpu_stat_v2(usage_usec))


def _write_container(
    root: Path,
    layout: Layout,
    driver: Driver,
    pod: FakePod,
    container: FakeContainer,
    runtime: str,
    nodes: Sequence[int],
    cpuacct_dir: str,
    page_size: int,
) -> None:
    def where(controller: str) -> Path:
        return container_dir(
            root, layout, driver, pod, container.container_id, runtime=runtime, controller=controller
        )

    if layout == "v2":
        files = {
            "memory.numa_stat": render_numa_stat_v2(container.memory_bytes, nodes),
            "cpuset.cpus.effective": container.cpus + "\n",
            "cpuset.mems.effective": container.mems + "\n",
            "cpu.stat": render_cpu_stat_v2(container.cpu_usage_usec),
        }
        _write(where("memory"), files, _V2_OTHER_FILES)
        return
    numa_stat = render_numa_stat_v1(container.memory_bytes, nodes, page_size=page_size)
    _write(where("memory"), {"memory.numa_stat": numa_stat}, _V1_OTHER_FILES)
    cpuset = {
        "cpuset.cpus": container.cpus + "\n",
        "cpuset.mems": container.mems + "\n",
        "cpuset.effective_cpus": container.cpus + "\n",
        "cpuset.effective_mems": container.mems + "\n",
    }
    _write(where("cpuset"), cpuset, ("tasks",))
    _write(where(cpuacct_dir), {"cpuacct.usage": f"{container.cpu_usage_usec * 1000}\n"}, ("tasks",))


# --- populations ----------------------------------------------------------------------------------


def fake_container_id(seed: str) -> str:
    """A 64-hex container id, stable for a given seed."""
    return hashlib.sha256(seed.encode()).hexdigest()


def make_pods(
    pod_count: int,
    containers_per_pod: int,
    *,
    layout: Layout = "v2",
    nodes: Sequence[int] = (0, 1),
    with_sandbox: bool = False,
    seed: int = 0,
    page_size: int = PAGE_SIZE,
) -> tuple[FakePod, ...]:
    """Pods cycling through the three QoS classes, with distinct, predictable amounts per container.

    v2 containers get every type of :data:`V2_TYPES`; v1 containers get file, anon and unevictable.
    """
    qos_cycle: tuple[Qos, ...] = ("guaranteed", "burstable", "besteffort")
    types = V2_TYPES if layout == "v2" else V1_TYPES
    pods: list[FakePod] = []
    for pod_index in range(pod_count):
        uid = str(uuid.UUID(int=(seed << 64) + pod_index + 1))
        containers: list[FakeContainer] = []
        if with_sandbox:
            containers.append(
                FakeContainer(
                    fake_container_id(f"{seed}/{pod_index}/sandbox"),
                    {"anon": {nodes[0]: page_size}},
                    cpu_usage_usec=1000,
                    is_sandbox=True,
                )
            )
        for index in range(containers_per_pod):
            serial = pod_index * containers_per_pod + index + 1
            memory = {
                name: {
                    node: page_size * (serial + position + node_index)
                    for node_index, node in enumerate(nodes)
                }
                for position, name in enumerate(types)
            }
            containers.append(
                FakeContainer(
                    fake_container_id(f"{seed}/{pod_index}/{index}"),
                    memory,
                    cpus=f"{index * 2}-{index * 2 + 1}",
                    mems=",".join(str(node) for node in nodes),
                    cpu_usage_usec=serial * 1_000_000 + index,
                )
            )
        pods.append(FakePod(uid, qos_cycle[pod_index % 3], tuple(containers)))
    return tuple(pods)


def read_all_usage(cgroup_root: Path) -> tuple[ContainerNumaUsage, ...]:
    """Usage of every container cgroup under the root through the source's own entry points; containers
    that stop meanwhile are left out (errors raise as the source raises them)."""
    layout = detect_cgroup_layout(cgroup_root)
    usages = (read_container_usage(cgroup, layout) for cgroup in find_container_cgroups(cgroup_root))
    return tuple(usage for usage in usages if usage is not None)
