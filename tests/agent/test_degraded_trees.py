"""Real trees with one kind of damage: the agent reports what hwloc's lstopo reports on the same tree.

lstopo (Debian's hwloc) reads the damaged tree itself and is the independent oracle for node ids, CPUs per
node and memory per node. Then the machine collector: a bad file is counted once and costs only its own
values, which keep their last good value; parts that are not asked for are never opened.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from otel_numa.cli.settings import Settings
from otel_numa.daemon.agent import Agent
from otel_numa.model import HugepagePool
from otel_numa.options import MachinePart
from otel_numa.snapshot.collectors.machine import ALL_MACHINE_PARTS, MachineCollector
from otel_numa.snapshot.source_status import SourceRegistry
from otel_numa.testing.device_tree import add_pci_function
from otel_numa.testing.fault_sweep import VARIANTS, Exposition, damage, parse, run_once
from otel_numa.testing.hwloc import extract_snapshot, hwloc_topology
from otel_numa.testing.sysfs_tree import NodeSpec, write_file, write_machine

NODE_DIR = "sys/devices/system/node"
CPU_DIR = "sys/devices/system/cpu"


def once(top: Path) -> Exposition:
    nowhere = top / "absent"
    status, text = run_once(
        [
            *("--sysfs-root", str(top / "sys"), "--procfs-root", str(top / "proc")),
            *("--kubelet-root", str(nowhere), "--podresources-socket", "none"),
            *("--pod-logs-root", str(nowhere), "--container-logs-root", str(nowhere)),
            *("--cgroup-root", str(nowhere), "--node-name", "degraded", "--log-level", "error"),
        ]
    )
    assert status == 0
    return parse(text)


def per_node(exposition: Exposition, name: str) -> dict[int, float]:
    return {
        int(dict(labels)["numa_node_id"]): value
        for (sample, labels), value in exposition.items()
        if sample == name
    }


def errors(exposition: Exposition, source: str) -> float:
    return sum(
        value
        for (sample, labels), value in exposition.items()
        if sample == "numa_agent_source_errors_total" and ("numa_source", source) in labels
    )


def without_health(exposition: Exposition) -> Exposition:
    own = ("numa_agent_", "process_")
    return {key: value for key, value in exposition.items() if not key[0].startswith(own)}


def assert_reports_what_lstopo_reports(top: Path) -> Exposition:
    hwloc = hwloc_topology(top)
    exposition = once(top)
    assert exposition[("numa_node_count", frozenset())] == len(hwloc.nodes)
    assert per_node(exposition, "numa_cpu_capacity") == {
        node.os_index: len(node.cpus) for node in hwloc.nodes.values()
    }
    assert per_node(exposition, "numa_memory_capacity_bytes") == {
        node.os_index: node.local_memory for node in hwloc.nodes.values()
    }
    return exposition


# --- Must show: lstopo on the same damaged tree --------------------------------------------------------


@pytest.mark.parametrize(
    ("snapshot", "remove_cpu_online", "cpu"),
    [
        # no cpu/online: the per-CPU files decide; cpu2 is offline (its topology directory is gone)
        ("16em64t-4s2c2t-offlines", False, 2),
        # the same without cpu/online on a tree whose CPUs all have an online file; cpu5 is online
        ("16amd64-4n4c-cgroup-distance-merge", True, 5),
        ("48amd64-4pa2n6c-sparse", True, 30),
    ],
)
def test_an_empty_per_cpu_online_file(
    tmp_path: Path, quiet_logging: None, snapshot: str, remove_cpu_online: bool, cpu: int
) -> None:
    top = extract_snapshot(snapshot, tmp_path)
    if remove_cpu_online:
        (top / CPU_DIR / "online").unlink()
    clean = assert_reports_what_lstopo_reports(top)
    (top / CPU_DIR / f"cpu{cpu}" / "online").write_bytes(b"")
    damaged = assert_reports_what_lstopo_reports(top)
    assert errors(damaged, "sysfs") == 1, "the empty file is counted once"
    assert without_health(damaged) == without_health(clean)  # nothing else moved


@pytest.mark.parametrize("snapshot", ["16amd64-4n4c-cgroup-distance-merge", "48amd64-4pa2n6c-sparse"])
def test_node_meminfo_with_only_memtotal(tmp_path: Path, quiet_logging: None, snapshot: str) -> None:
    top = extract_snapshot(snapshot, tmp_path)
    for meminfo in sorted((top / NODE_DIR).glob("node*/meminfo")):
        lines = meminfo.read_text().splitlines(keepends=True)
        meminfo.write_text("".join(line for line in lines if "MemTotal:" in line))
    exposition = assert_reports_what_lstopo_reports(top)
    assert not per_node(exposition, "numa_memory_usage_bytes")  # MemFree/MemUsed are not there
    assert errors(exposition, "sysfs") == 0  # fields a kernel leaves out are not an error


# --- the machine collector ------------------------------------------------------------------------------

TWO_NODES = (
    NodeSpec(0, cpus=range(4), mem_total_kib=8 << 20, mem_free_kib=6 << 20, hugepages={2048: (512, 500)}),
    NodeSpec(1, cpus=range(4, 8), mem_total_kib=4 << 20, mem_free_kib=1 << 20, hugepages={2048: (256, 0)}),
)


def sysfs_errors(registry: SourceRegistry, name: str = "sysfs") -> int:
    return sum(next(r for r in registry.reports() if r.name == name).errors.values())


def test_a_bad_file_keeps_its_last_good_value_and_costs_nothing_else(tmp_path: Path) -> None:
    sysfs_root, procfs_root = write_machine(tmp_path, TWO_NODES)
    registry = SourceRegistry()
    collector = MachineCollector(sysfs_root, procfs_root, registry)
    first = collector.collect()
    assert first is not None
    node1 = sysfs_root / "devices/system/node/node1"
    write_file(node1 / "meminfo", "Node 1 MemTotal: 4194304 kB\nNode 1 MemFree: lots\n")
    write_file(node1 / "hugepages/hugepages-2048kB/free_hugepages", "")
    second = collector.collect()
    assert second is not None
    assert second.memory[1] == first.memory[1]  # MemFree kept from the last round
    assert second.hugepages[1] == (HugepagePool(2048, 256, 0),)
    assert second.memory[0] == first.memory[0] and second.cpu_time == first.cpu_time
    assert sysfs_errors(registry) == 2
    assert sysfs_errors(registry, "procfs") == 0
    # the topology is read again when a mask changes (here only its spelling): a node whose cpulist and
    # cpumap are unusable then keeps its last good CPUs
    write_file(node1 / "cpulist", "4-x\n")
    (node1 / "cpumap").unlink()
    write_file(sysfs_root / "devices/system/node/online", "0,1\n")
    third = collector.collect()
    assert third is not None and third.topology is first.topology  # the same as before: kept
    assert third.topology.node(1).cpus == frozenset(range(4, 8))
    assert third.cpu_time == first.cpu_time
    assert sysfs_errors(registry) == 5  # meminfo, free_hugepages and the cpulist


def test_a_part_whose_values_are_the_same_is_the_same_object(tmp_path: Path) -> None:
    """What lets the instruments reuse their observations (otel_numa/snapshot/identity.py): each per-node
    part of the machine is handed on as the same object while its values are the same, and as a new one
    when a value changed."""
    sysfs_root, procfs_root = write_machine(tmp_path, TWO_NODES)
    nothing = tmp_path / "nothing"
    settings = Settings(
        sysfs_root=sysfs_root, procfs_root=procfs_root, kubelet_root=nothing, cgroup_root=nothing
    )
    store = Agent(settings.to_options()).store
    first, second = store.refresh().machine, store.refresh().machine
    assert first is not None and second is not None
    assert second.memory is first.memory and second.hugepages is first.hugepages
    assert second.numastat is first.numastat and second.cpu_time is first.cpu_time
    write_file(
        sysfs_root / "devices/system/node/node1/meminfo",
        "Node 1 MemTotal: 4194304 kB\nNode 1 MemFree: 2097152 kB\n",
    )
    third = store.refresh().machine
    assert third is not None and third.memory is not second.memory
    assert third.memory[1].free_bytes == 2 << 30 and third.memory[0] == first.memory[0]


def test_a_fresh_collector_without_good_data_reports_the_node_as_unknown(tmp_path: Path) -> None:
    sysfs_root, procfs_root = write_machine(tmp_path, TWO_NODES)
    write_file(sysfs_root / "devices/system/node/node1/cpulist", "\n4-7")  # cut short: no newline at the end
    (sysfs_root / "devices/system/node/node1/cpumap").unlink()
    registry = SourceRegistry()
    usage = MachineCollector(sysfs_root, procfs_root, registry).collect()
    assert usage is not None
    assert not usage.topology.node(1).cpus_known
    assert usage.topology.node(0).cpus == frozenset(range(4))
    assert set(usage.cpu_time) == {0}  # node 1's CPUs are unknown: its time is absent, not 0
    assert sysfs_errors(registry) == 1


def test_a_bad_stat_line_makes_its_node_time_absent_not_low(tmp_path: Path) -> None:
    sysfs_root, procfs_root = write_machine(tmp_path, TWO_NODES)
    stat = procfs_root / "stat"
    stat.write_text(stat.read_text().replace("cpu5 ", "cpu5 x"))
    registry = SourceRegistry()
    usage = MachineCollector(sysfs_root, procfs_root, registry).collect()
    assert usage is not None
    assert set(usage.cpu_time) == {0}
    assert sysfs_errors(registry, "procfs") == 1


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    paths: list[str] = []
    real_open = os.open

    def recording_open(file: Any, *args: Any, **kwargs: Any) -> int:
        paths.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    return paths


def test_parts_not_asked_for_are_never_opened(tmp_path: Path, opened: list[str]) -> None:
    sysfs_root, procfs_root = write_machine(tmp_path, TWO_NODES)
    add_pci_function(sysfs_root, "0000:3b:00.0", "0x020000", numa_node="1")
    collector = MachineCollector(
        sysfs_root, procfs_root, SourceRegistry(), parts=frozenset({MachinePart.MEMORY})
    )
    usage = collector.collect()
    assert usage is not None
    assert set(usage.memory) == {0, 1}
    assert usage.hugepages == {} and usage.numastat == {} and usage.cpu_time == {}
    assert usage.pci.counts == {}
    names = {Path(path).name for path in opened}
    assert "meminfo" in names and "cpulist" in names  # the topology is always read
    assert not names & {"numastat", "nr_hugepages", "free_hugepages", "stat", "class", "numa_node"}
    assert {"memory", "hugepages", "numastat", "cpu_time", "pci"} == ALL_MACHINE_PARTS


def test_damage_is_undone(tmp_path: Path) -> None:
    path = write_file(tmp_path / "cpulist", "0-3\n")
    for variant in VARIANTS:
        restore = damage(path, variant)
        assert not path.is_file() or path.read_bytes() != b"0-3\n"
        restore()
        assert path.read_bytes() == b"0-3\n"
    shutil.rmtree(tmp_path)
