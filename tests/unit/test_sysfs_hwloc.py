"""The sysfs reader on every real snapshot in tests/fixtures/hwloc/, checked against Debian's hwloc.

hwloc (lstopo) reads the same files and is the independent source of node ids, CPUs, memory, hugepage
counts and distances. Its rules differ from the agent's in known ways (README beside the snapshots);
each snapshot's entry in ``HWLOC_DIFFERENCES`` states those differences explicitly. What hwloc does not
report (free memory, numastat, free hugepages) is checked against values copied by hand from the files.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from otel_numa.model import HugepagePool, NodeMemory, NumaNode, Topology
from otel_numa.sources import sysfs
from otel_numa.testing.hwloc import HwlocTopology, extract_snapshot, hwloc_topology, snapshot_names

SNAPSHOTS = snapshot_names()
KIB = 1024


@dataclass(frozen=True)
class Expected:
    """What the agent should report for one snapshot."""

    cpus: dict[int, frozenset[int]]  # node id -> online CPUs
    memory_total: dict[int, int]  # node id -> bytes
    hugepages: dict[int, dict[int, int]]  # node id -> page size in KiB -> nr_hugepages
    distances: dict[int, dict[int, int]]  # node id -> target id -> distance


def from_hwloc(hwloc: HwlocTopology) -> Expected:
    return Expected(
        cpus={node.os_index: node.cpus for node in hwloc.nodes.values()},
        memory_total={node.os_index: node.local_memory for node in hwloc.nodes.values()},
        hugepages={
            node.os_index: {size // KIB: count for size, count in node.hugepage_counts.items()}
            for node in hwloc.nodes.values()
            if node.hugepage_counts
        },
        distances={
            node.os_index: dict(hwloc.distances.get(node.os_index, {})) for node in hwloc.nodes.values()
        },
    )


# --- how the agent's rules differ from hwloc's, per snapshot --------------------------------------


def _as_hwloc(expected: Expected) -> Expected:
    return expected


def _single_node_distance(node_id: int) -> Callable[[Expected], Expected]:
    # hwloc writes no distance matrix for a machine with one node; the agent reports the node's own
    # row from its distance file ("10", or "21 10" for offline-cpu0-node0 whose first value belongs to
    # the offline node 0, which is not a node of the machine and so is not a target).
    def adjust(expected: Expected) -> Expected:
        return replace(expected, distances={node_id: {node_id: 10}})

    return adjust


def _buggynuma(expected: Expected) -> Expected:
    # Every node's cpulist claims CPUs 0-7. hwloc keeps node 0 and drops nodes 1-7 as overlapping;
    # the agent reports all 8 nodes as the kernel states them. Values for 1-7 are from their files:
    # cpulist "0-7", meminfo MemTotal, hugepages-2048kB/nr_hugepages "0", distance rows all "10".
    every_cpu = frozenset(range(8))
    totals_kib = {1: 2096128, 2: 2097152, 3: 2097152, 4: 2097152, 5: 2097152, 6: 2097152, 7: 2097152}
    return Expected(
        cpus={0: expected.cpus[0]} | {node: every_cpu for node in totals_kib},
        memory_total={0: expected.memory_total[0]} | {node: kib * KIB for node, kib in totals_kib.items()},
        hugepages={0: expected.hugepages[0]} | {node: {2048: 0} for node in totals_kib},
        distances={node: {target: 10 for target in range(8)} for node in range(8)},
    )


def _fakememinitiators(expected: Expected) -> Expected:
    # Nodes 4-10 have no CPU (cpumap all zero; 5-10 have memory, 4 is a generic initiator with neither).
    # hwloc attaches each to a nearby initiator and so lists that initiator's CPUs under it; the agent
    # reports no CPU for them. Nodes 0-4 have no memory: hwloc leaves out local_memory (read as 0) and
    # hugepages, as the agent does.
    cpuless = range(4, 11)
    return replace(expected, cpus=expected.cpus | {node: frozenset() for node in cpuless})


HWLOC_DIFFERENCES: dict[str, Callable[[Expected], Expected]] = {
    # Its cgroup allows only CPUs 0-3 and nodes 2-3: lstopo runs with --disallowed so it lists everything,
    # like the agent, which reports the machine and not its own cgroup.
    "16amd64-4n4c-cgroup-distance-merge": _as_hwloc,
    "16amd64-8n2c": _as_hwloc,
    "16em64t-4s2c2t-offlines": _single_node_distance(0),
    # No devices/system/node: hwloc and the agent both make one node 0 from /proc/meminfo, no distances.
    "2arm-2c": _as_hwloc,
    "2i386-2t-hugepagesizecount": _as_hwloc,
    "48amd64-4pa2n6c-sparse": _as_hwloc,
    "8em64t-2s2ca2c-buggynuma": _buggynuma,
    "fakememinitiators-1np2c+1npp+gi": _fakememinitiators,
    "offline-cpu0-node0": _single_node_distance(1),
}


# --- fixtures ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    name: str
    top: Path
    hwloc: HwlocTopology

    @property
    def sysfs(self) -> Path:
        return self.top / "sys"

    @property
    def procfs(self) -> Path:
        return self.top / "proc"

    def topology(self) -> Topology:
        return sysfs.read_topology(self.sysfs)

    def expected(self) -> Expected:
        return HWLOC_DIFFERENCES[self.name](from_hwloc(self.hwloc))


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Snapshot]:
    """Extract each snapshot and run lstopo on it once per module."""
    cache: dict[str, Snapshot] = {}
    base = tmp_path_factory.mktemp("hwloc")

    def get(name: str) -> Snapshot:
        if name not in cache:
            top = extract_snapshot(name, base)
            cache[name] = Snapshot(name=name, top=top, hwloc=hwloc_topology(top))
        return cache[name]

    return get


@pytest.fixture(params=SNAPSHOTS)
def snapshot(request: pytest.FixtureRequest, snapshots: Callable[[str], Snapshot]) -> Snapshot:
    name: str = request.param
    if name not in HWLOC_DIFFERENCES:
        pytest.fail(f"snapshot {name} has no HWLOC_DIFFERENCES entry: compare it with lstopo and add one")
    return snapshots(name)


@pytest.fixture
def fresh_overlap_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget the overlaps warned about so far, so a test sees the first warning itself."""
    monkeypatch.setattr(sysfs, "_reported_overlaps", set())


def test_every_snapshot_is_covered() -> None:
    assert len(SNAPSHOTS) >= 9, "the hwloc snapshots are missing from tests/fixtures/hwloc"
    assert set(SNAPSHOTS) == set(HWLOC_DIFFERENCES)


# --- against hwloc, every snapshot ---------------------------------------------------------------


def test_node_ids_match_hwloc(snapshot: Snapshot) -> None:
    assert snapshot.topology().node_ids == tuple(sorted(snapshot.expected().cpus))


def test_cpus_per_node_match_hwloc(snapshot: Snapshot) -> None:
    topology = snapshot.topology()
    assert {node.id: node.cpus for node in topology.nodes} == snapshot.expected().cpus


def test_memory_per_node_matches_hwloc(snapshot: Snapshot) -> None:
    topology = snapshot.topology()
    memory = sysfs.NodeFiles(snapshot.sysfs, topology, snapshot.procfs).memory()
    assert {node: value.total_bytes for node, value in memory.items()} == snapshot.expected().memory_total


def test_hugepages_per_size_match_hwloc(snapshot: Snapshot) -> None:
    topology = snapshot.topology()
    pools = sysfs.NodeFiles(snapshot.sysfs, topology, snapshot.procfs).hugepages()
    actual = {
        node: {pool.size_kib: pool.total_pages for pool in node_pools} for node, node_pools in pools.items()
    }
    assert actual == snapshot.expected().hugepages


def test_node_files_kept_across_rounds_match_hwloc(snapshot: Snapshot) -> None:
    """The collector keeps one NodeFiles per topology: every round reads what hwloc sees."""
    files = sysfs.NodeFiles(snapshot.sysfs, snapshot.topology(), snapshot.procfs)
    for _ in range(2):  # the second round reads the pools listed in the first
        memory = files.memory()
        assert {node: value.total_bytes for node, value in memory.items()} == snapshot.expected().memory_total
        pools = {
            node: {pool.size_kib: pool.total_pages for pool in node_pools}
            for node, node_pools in files.hugepages().items()
        }
        assert pools == snapshot.expected().hugepages


def test_distances_match_hwloc(snapshot: Snapshot) -> None:
    topology = snapshot.topology()
    assert {node.id: dict(node.distances) for node in topology.nodes} == snapshot.expected().distances


def test_signature_is_stable(snapshot: Snapshot) -> None:
    first = sysfs.topology_signature(snapshot.sysfs)
    assert sysfs.topology_signature(snapshot.sysfs) == first
    assert all(isinstance(part, str) for part in first)


# --- values hwloc does not report, copied by hand from the files ---------------------------------


def test_hugepage_snapshot_literals(snapshots: Callable[[str], Snapshot]) -> None:
    snap = snapshots("16amd64-4n4c-cgroup-distance-merge")
    topology = snap.topology()
    assert sysfs.NodeFiles(snap.sysfs, topology, snap.procfs).memory()[0] == NodeMemory(
        total_bytes=8387892 * KIB, free_bytes=6739740 * KIB, used_bytes=1648152 * KIB
    )
    pools = sysfs.NodeFiles(snap.sysfs, topology).hugepages()
    assert pools == {
        node: (HugepagePool(size_kib=2048, total_pages=512, free_pages=512),) for node in range(4)
    }
    assert sysfs.NodeFiles(snap.sysfs, topology).numastat()[0] == {
        "hit": 19833863,
        "miss": 1,
        "foreign": 0,
        "interleave_hit": 5876,
        "local": 19833784,
        "other": 80,
    }


def test_old_kernel_meminfo_with_blank_first_line(snapshots: Callable[[str], Snapshot]) -> None:
    snap = snapshots("16amd64-8n2c")
    topology = snap.topology()
    memory = sysfs.NodeFiles(snap.sysfs, topology, snap.procfs).memory()
    assert memory[0] == NodeMemory(
        total_bytes=8386704 * KIB, free_bytes=6895672 * KIB, used_bytes=1491032 * KIB
    )
    assert memory[7].free_bytes == 8249784 * KIB
    assert (
        sysfs.NodeFiles(snap.sysfs, topology).hugepages() == {}
    )  # no hugepages directories in this snapshot
    assert sysfs.NodeFiles(snap.sysfs, topology).numastat()[6]["other"] == 729939266


def test_offline_cpus_are_left_out(snapshots: Callable[[str], Snapshot]) -> None:
    # no cpu/online file: cpu2, cpu5, cpu13 and cpu14 have online "0", cpu0 has no online file
    snap = snapshots("16em64t-4s2c2t-offlines")
    topology = snap.topology()
    assert topology.online_cpus == frozenset({0, 1, 3, 4, 6, 7, 8, 9, 10, 11, 12, 15})
    assert topology.nodes[0].cpus == topology.online_cpus  # cpumap ffff, no cpulist
    assert topology.numa_enabled


def test_no_numa_kernel_uses_proc_meminfo(snapshots: Callable[[str], Snapshot]) -> None:
    snap = snapshots("2arm-2c")
    topology = snap.topology()
    assert not topology.numa_enabled
    assert topology.node_ids == (0,)
    assert topology.nodes[0].cpus == frozenset({0, 1})
    assert sysfs.NodeFiles(snap.sysfs, topology, snap.procfs).memory() == {
        0: NodeMemory(total_bytes=280840 * KIB, free_bytes=250460 * KIB, used_bytes=(280840 - 250460) * KIB)
    }
    # no kernel/mm/hugepages and no HugePages_* lines in /proc/meminfo: nothing to report
    assert sysfs.NodeFiles(snap.sysfs, topology, snap.procfs).hugepages() == {}
    assert sysfs.NodeFiles(snap.sysfs, topology).numastat() == {}


def test_no_numa_kernel_hugepages_from_kernel_mm(snapshots: Callable[[str], Snapshot]) -> None:
    snap = snapshots("2i386-2t-hugepagesizecount")
    topology = snap.topology()
    assert sysfs.NodeFiles(snap.sysfs, topology).hugepages() == {
        0: (
            HugepagePool(size_kib=2048, total_pages=1, free_pages=0),
            HugepagePool(size_kib=16777216, total_pages=1, free_pages=0),
        )
    }
    memory = sysfs.NodeFiles(snap.sysfs, topology, snap.procfs).memory()[0]
    assert memory.total_bytes == 400016779264 * KIB
    assert memory.free_bytes == 105040 * KIB


def test_sparse_node_ids(snapshots: Callable[[str], Snapshot]) -> None:
    snap = snapshots("48amd64-4pa2n6c-sparse")
    topology = snap.topology()
    assert topology.node_ids == (0, 1, 2, 33, 34, 45, 72, 73)
    assert topology.node(33).cpus == frozenset(range(18, 24))
    # node0's row "10 16 16 22 16 22 16 22" over online nodes 0-2,33-34,45,72-73
    assert topology.node(0).distances == {0: 10, 1: 16, 2: 16, 33: 22, 34: 16, 45: 22, 72: 16, 73: 22}
    assert sysfs.NodeFiles(snap.sysfs, topology, snap.procfs).memory()[73].used_bytes == 298944 * KIB
    assert sysfs.NodeFiles(snap.sysfs, topology).numastat()[45]["hit"] == 248718


def test_buggy_firmware_overlap_is_reported_and_warned_once(
    snapshots: Callable[[str], Snapshot], caplog: pytest.LogCaptureFixture, fresh_overlap_warnings: None
) -> None:
    snap = snapshots("8em64t-2s2ca2c-buggynuma")
    with caplog.at_level(logging.WARNING, logger=sysfs.__name__):
        first = snap.topology()
        second = snap.topology()
    assert first == second
    assert first.overlapping_cpus == frozenset(range(8))
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "0-7" in warnings[0].getMessage()


def test_buggy_firmware_cpus_count_in_every_node_that_claims_them(
    snapshots: Callable[[str], Snapshot], fresh_overlap_warnings: None
) -> None:
    topology = snapshots("8em64t-2s2ca2c-buggynuma").topology()
    claims = sysfs.nodes_by_cpu(topology)
    assert set(claims) == set(range(8))
    assert all(claims[cpu] == topology.node_ids for cpu in range(8))


def test_memory_only_and_cpu_only_nodes(snapshots: Callable[[str], Snapshot]) -> None:
    snap = snapshots("fakememinitiators-1np2c+1npp+gi")
    topology = snap.topology()
    memory = sysfs.NodeFiles(snap.sysfs, topology, snap.procfs).memory()
    assert topology.node(0).cpus == frozenset({0, 1})
    assert memory[0] == NodeMemory(0, 0, 0)  # CPUs, no memory
    assert topology.node(10).cpus == frozenset()  # memory, no CPU
    assert memory[10] == NodeMemory(total_bytes=780140544 * KIB, free_bytes=780140544 * KIB, used_bytes=0)
    assert topology.node(4).cpus == frozenset() and memory[4].total_bytes == 0  # a generic initiator
    assert topology.overlapping_cpus == frozenset()
    assert sysfs.NodeFiles(snap.sysfs, topology).numastat() == {}  # no numastat files in this snapshot


def test_offline_node0(snapshots: Callable[[str], Snapshot]) -> None:
    snap = snapshots("offline-cpu0-node0")
    topology = snap.topology()
    assert topology.online_cpus == frozenset(range(4, 21))
    # cpulist "1,3,...,23" intersected with online 4-20
    assert topology.nodes == (
        NumaNode(id=1, cpus=frozenset({5, 7, 9, 11, 13, 15, 17, 19}), distances={1: 10}),
    )
    assert sysfs.NodeFiles(snap.sysfs, topology, snap.procfs).memory()[1].free_bytes == 57913400 * KIB
    assert sysfs.NodeFiles(snap.sysfs, topology).numastat()[1]["local"] == 1333461646


def test_numastat_keys(snapshot: Snapshot) -> None:
    topology = snapshot.topology()
    stats = sysfs.NodeFiles(snapshot.sysfs, topology).numastat()
    with_file = sorted(
        int(path.parent.name[4:]) for path in snapshot.sysfs.glob("devices/system/node/node*/numastat")
    )
    assert sorted(stats) == with_file
    for counters in stats.values():
        assert set(counters) == {"hit", "miss", "foreign", "interleave_hit", "local", "other"}


def test_signature_follows_a_cpu_going_offline(snapshots: Callable[[str], Snapshot]) -> None:
    # one snapshot with devices/system/cpu/online, one with only cpuN/online files (cpu3 has none there)
    for name in ("16amd64-4n4c-cgroup-distance-merge", "16em64t-4s2c2t-offlines"):
        snap = snapshots(name)
        before = sysfs.topology_signature(snap.sysfs)
        online_file = snap.sysfs / "devices/system/cpu/online"
        cpu3 = snap.sysfs / "devices/system/cpu/cpu3/online"
        saved = {path: path.read_bytes() for path in (online_file, cpu3) if path.exists()}
        try:
            if online_file.exists():
                online_file.write_text("0-2,4-15\n")
            cpu3.write_text("0\n")
            assert sysfs.topology_signature(snap.sysfs) != before, name
            assert 3 not in snap.topology().online_cpus
        finally:
            for path in (online_file, cpu3):
                if path in saved:
                    path.write_bytes(saved[path])
                else:
                    path.unlink(missing_ok=True)
        assert sysfs.topology_signature(snap.sysfs) == before
