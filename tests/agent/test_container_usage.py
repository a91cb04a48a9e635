"""Per-container NUMA usage: the background refresher, the join with names and allocation, the rules.

Machines and amounts are small and written by hand; every expected value below is worked out from them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from otel_numa.accounting.usage import (
    JoinMemo,
    MachineNodes,
    advance_cpu_time,
    intended_nodes,
    join_usage,
    memory_locality,
    resident_by_node,
)
from otel_numa.model import (
    Allocation,
    CgroupLayout,
    ContainerAllocation,
    ContainerIdentity,
    ContainerNumaUsage,
    ContainerRef,
    CpuTimeSplit,
    MachineUsage,
    NumaNode,
    Topology,
)
from otel_numa.snapshot.collectors.cgroups import CgroupCollector, ContainerLogNames
from otel_numa.snapshot.collectors.machine import MachineCollector
from otel_numa.snapshot.source_status import SourceRegistry
from otel_numa.sources.cgroups import ContainerCgroup, read_container_usage
from otel_numa.testing.cgroup_tree import FakeContainer, FakePod, fake_container_id, write_cgroup_tree
from otel_numa.testing.kubelet_scenario import ScenarioPod, build_scenario, labels, series
from otel_numa.testing.sysfs_tree import uniform_nodes

MIB = 1 << 20
POD_A = "0d9a4f5e-1111-4c2b-8d3e-000000000001"
POD_B = "0d9a4f5e-1111-4c2b-8d3e-000000000002"
ID_1, ID_2, ID_3, SANDBOX = (fake_container_id(seed) for seed in ("one", "two", "three", "sandbox"))

# Two nodes of 4 CPUs (node 0: CPUs 0-3, node 1: CPUs 4-7), both with memory.
TWO_NODES = MachineNodes(frozenset({0, 1}), {0: frozenset(range(4)), 1: frozenset(range(4, 8))})


def _pods() -> list[FakePod]:
    return [
        FakePod(
            POD_A,
            "guaranteed",
            (
                FakeContainer(SANDBOX, {"anon": {0: 4096}}, cpus="0-7", mems="0-1", is_sandbox=True),
                FakeContainer(ID_1, {"anon": {0: 1 * MIB, 1: 3 * MIB}}, cpus="4-5", mems="0-1"),
                FakeContainer(ID_2, {"anon": {0: 2 * MIB, 1: 0}}, cpus="0-7", mems="0-1"),
            ),
        ),
        FakePod(POD_B, "burstable", (FakeContainer(ID_3, {"file": {0: 5 * MIB, 1: 5 * MIB}}, mems="0"),)),
    ]


def _link(logs: Path, pod: str, namespace: str, container: str, container_id: str) -> None:
    logs.mkdir(exist_ok=True)
    target = f"/var/log/pods/{namespace}_{pod}_x/{container}/0.log"
    (logs / f"{pod}_{namespace}_{container}-{container_id}.log").symlink_to(target)


def _node(tmp_path: Path) -> tuple[Path, Path]:
    """A v2 systemd tree of :func:`_pods` and log links naming containers 1-3 (the sandbox has none)."""
    cgroup, logs = tmp_path / "cgroup", tmp_path / "containers"
    write_cgroup_tree(cgroup, "v2", "systemd", _pods())
    _link(logs, "web-0", "shop", "app", ID_1)
    _link(logs, "web-0", "shop", "sidecar", ID_2)
    _link(logs, "batch-1", "jobs", "worker", ID_3)
    return cgroup, logs


# --- the refresher ---------------------------------------------------------------------------------


def test_container_vanishing_mid_round_is_skipped_silently(tmp_path: Path) -> None:
    cgroup, logs = _node(tmp_path)
    read: list[str] = []

    def stop_container_2_first(found: ContainerCgroup, layout: CgroupLayout) -> ContainerNumaUsage | None:
        read.append(found.container_id)
        if found.container_id == ID_2:
            shutil.rmtree(found.path)  # the runtime removes the cgroup after the tree was listed
        return read_container_usage(found, layout)

    registry = SourceRegistry()
    collector = CgroupCollector(cgroup, ContainerLogNames(logs), registry, reader=stop_container_2_first)
    collector.refresh()

    assert ID_2 in read
    assert collector.view is not None
    assert sorted(u.container_id for u in collector.view.usages) == sorted([SANDBOX, ID_1, ID_3])
    (report,) = registry.reports()
    assert report.name == "cgroup" and report.last_good is not None
    assert report.errors == {"corrupt": 0, "unavailable": 0}
    names = [c.container.container_name for c in collector.containers(Allocation(), None)]
    assert names == ["app", "worker"]  # by pod UID; the sandbox has no name and is not reported


def test_one_corrupt_container_is_counted_and_the_others_stay(tmp_path: Path) -> None:
    cgroup, logs = _node(tmp_path)
    corrupt = next(cgroup.rglob(f"*{ID_1}.scope")) / "memory.numa_stat"
    corrupt.write_text("anon N0=lots N1=0\n")
    registry = SourceRegistry()
    collector = CgroupCollector(cgroup, ContainerLogNames(logs), registry)

    collector.refresh()
    collector.refresh()

    assert collector.view is not None
    assert sorted(u.container_id for u in collector.view.usages) == sorted([SANDBOX, ID_2, ID_3])
    (report,) = registry.reports()
    assert report.errors == {"corrupt": 2, "unavailable": 0}  # one failed read per round
    assert report.last_good is not None


def test_containers_past_the_limit_are_left_out_and_counted(tmp_path: Path) -> None:
    cgroup, logs = _node(tmp_path)  # four container cgroups, the sandbox included
    registry = SourceRegistry()
    collector = CgroupCollector(cgroup, ContainerLogNames(logs), registry, max_containers=2)

    collector.refresh()

    assert collector.view is not None and len(collector.view.usages) == 2
    (report,) = registry.reports()
    assert report.errors == {"corrupt": 0, "unavailable": 0, "over_limit": 1}


def test_ids_beyond_the_machine_make_the_file_an_error(tmp_path: Path) -> None:
    """Once the machine is known (2 nodes, CPUs 0-7), a numa_stat naming node 5 or a cpuset naming CPU 9 is
    an error of its container; the others stay. A bad cpuset costs only the container's cpusets."""
    cgroup, logs = _node(tmp_path)
    directory = next(cgroup.rglob(f"*{ID_1}.scope"))
    (directory / "memory.numa_stat").write_text("anon N0=4096 N5=4096\nfile N0=0 N5=0\n")
    (next(cgroup.rglob(f"*{ID_2}.scope")) / "cpuset.cpus.effective").write_text("0-9\n")
    topology = Topology(
        nodes=(NumaNode(0, frozenset(range(4)), {}), NumaNode(1, frozenset(range(4, 8)), {})),
        online_cpus=frozenset(range(8)),
        numa_enabled=True,
        overlapping_cpus=frozenset(),
    )
    registry = SourceRegistry()
    collector = CgroupCollector(cgroup, ContainerLogNames(logs), registry, topology=lambda: topology)

    collector.refresh()

    assert collector.view is not None
    usages = {usage.container_id: usage for usage in collector.view.usages}
    assert sorted(usages) == sorted([SANDBOX, ID_2, ID_3])
    assert usages[ID_2].cpus is None and usages[ID_2].mems is None
    assert usages[ID_2].memory_by_type == {"anon": {0: 2 * MIB, 1: 0}}
    (report,) = registry.reports()
    assert report.errors == {"corrupt": 0, "unavailable": 0, "out_of_range": 2}


def test_containers_gone_between_rounds_and_kubepods_gone(tmp_path: Path) -> None:
    cgroup, logs = _node(tmp_path)
    registry = SourceRegistry()
    collector = CgroupCollector(cgroup, ContainerLogNames(logs), registry)
    collector.refresh()
    assert len(collector.containers(Allocation(), None)) == 3

    shutil.rmtree(next(cgroup.rglob(f"*{POD_B.replace('-', '_')}.slice")))
    collector.refresh()
    assert [c.container.container_name for c in collector.containers(Allocation(), None)] == [
        "app",
        "sidecar",
    ]

    shutil.rmtree(cgroup / "kubepods.slice")  # not a Kubernetes node (any more): nothing, and no error
    collector.refresh()
    assert collector.view is None and collector.containers(Allocation(), None) == ()
    (report,) = registry.reports()
    assert report.errors == {"corrupt": 0, "unavailable": 0} and not report.present


def test_missing_container_logs_names_nobody(tmp_path: Path) -> None:
    cgroup, _logs = _node(tmp_path)
    collector = CgroupCollector(cgroup, ContainerLogNames(tmp_path / "absent"), SourceRegistry())
    collector.refresh()
    assert collector.view is not None and len(collector.view.usages) == 4
    assert collector.containers(Allocation(), None) == ()


def test_names_come_from_any_provider(tmp_path: Path) -> None:
    cgroup, _logs = _node(tmp_path)
    from_runtime = {ID_3: ContainerIdentity("batch-1", "jobs", "worker", ID_3)}
    collector = CgroupCollector(cgroup, lambda: from_runtime, SourceRegistry())
    collector.refresh()
    (worker,) = collector.containers(Allocation(), None)
    assert worker.container == ContainerRef(POD_B, "worker", "batch-1", "jobs")


def test_cpu_time_per_node_stays_monotonic_when_the_cpuset_changes(tmp_path: Path) -> None:
    cgroup, logs = _node(tmp_path)
    scope = next(cgroup.rglob(f"*{ID_2}.scope"))
    (scope / "cpu.stat").write_text("usage_usec 8000000\nuser_usec 0\nsystem_usec 0\n")  # 8 s on CPUs 0-7
    collector = CgroupCollector(cgroup, ContainerLogNames(logs), SourceRegistry())
    machine = _machine_usage(tmp_path)

    collector.refresh()
    first = {c.container.container_name: c for c in collector.containers(Allocation(), machine)}
    assert first["sidecar"].cpu_time_by_node == pytest.approx(
        {0: 4.0, 1: 4.0}
    )  # half of the CPUs on each node

    # Exclusive CPUs went to another pod: the shared pool shrinks to 0-3,7; then 5 s more.
    (scope / "cpuset.cpus.effective").write_text("0-3,7\n")
    (scope / "cpu.stat").write_text("usage_usec 13000000\nuser_usec 0\nsystem_usec 0\n")
    collector.refresh()
    second = {c.container.container_name: c for c in collector.containers(Allocation(), machine)}
    assert second["sidecar"].cpu_time_by_node == pytest.approx({0: 4.0 + 4.0, 1: 4.0 + 1.0})
    # a container confined to node 1 has all its time there
    assert second["app"].cpu_time_by_node == {1: 0.0}
    # the same view joined again (a new scrape, a new allocation) counts nothing twice
    again = collector.containers(Allocation(), machine)
    assert again[1].container.container_name == "sidecar"
    assert again[1].cpu_time_by_node == pytest.approx({0: 8.0, 1: 5.0})


def _machine_usage(tmp_path: Path) -> MachineUsage:
    scenario = build_scenario(tmp_path / "machine", uniform_nodes(2, 4))
    usage = MachineCollector(scenario.sysfs_root, scenario.procfs_root, SourceRegistry()).collect()
    assert usage is not None
    return usage


# --- the rules -------------------------------------------------------------------------------------


def test_resident_memory_is_anon_and_file_on_v2_and_the_three_lists_on_v1() -> None:
    memory = {
        "anon": {0: 10, 1: 20},
        "file": {0: 1, 1: 2},
        "shmem": {0: 1000},  # part of file
        "kernel_stack": {0: 5000},
        "unevictable": {1: 300},
    }
    assert resident_by_node(memory, "v2") == {0: 11, 1: 22}
    assert resident_by_node(memory, "v1") == {0: 11, 1: 322}


@pytest.mark.parametrize(
    ("placed", "mems", "cpus", "expected"),
    [
        # memory manager block on node 1; mems that are not its affinity: the block decides
        ({1}, {0, 1}, {4, 5}, {1}),
        ({1}, {0, 1, 2}, {4, 5}, {1}),
        # a block spanning nodes 1 and 2 is listed under node 1; the kubelet's mems 1-2 widen it
        ({1}, {1, 2}, None, {1, 2}),
        # mems that do not include the block: the block decides
        ({1}, {0}, None, {1}),
        # no block: confined mems
        (set(), {0}, {0, 1, 2, 3, 4, 5, 6, 7}, {0}),
        # no block, mems everywhere, exclusive CPUs on node 0
        (set(), {0, 1, 2}, {2, 3}, {0}),
        # shared pool on two nodes of three: confined too
        (set(), {0, 1, 2}, {0, 4}, {0, 1}),
        # every node: not confined
        (set(), {0, 1, 2}, {0, 4, 8}, None),
        (set(), None, None, None),
    ],
)
def test_intended_nodes(
    placed: set[int], mems: set[int] | None, cpus: set[int] | None, expected: set[int] | None
) -> None:
    three = MachineNodes(
        frozenset({0, 1, 2}), {0: frozenset(range(4)), 1: frozenset(range(4, 8)), 2: frozenset(range(8, 12))}
    )
    result = intended_nodes(
        frozenset(placed),
        frozenset(mems) if mems is not None else None,
        frozenset(cpus) if cpus is not None else None,
        three,
    )
    assert result == (frozenset(expected) if expected is not None else None)


def test_a_cpu_less_memory_node_does_not_make_every_container_confined() -> None:
    # node 2 has memory but no CPUs (HBM): CPUs on 0 and 1 are all CPU nodes
    machine = MachineNodes(frozenset({0, 1, 2}), {0: frozenset({0}), 1: frozenset({1}), 2: frozenset()})
    assert intended_nodes(frozenset(), frozenset({0, 1, 2}), frozenset({0, 1}), machine) is None


def test_locality() -> None:
    assert memory_locality({0: 30, 1: 70}, frozenset({1})) == pytest.approx(0.7)
    assert memory_locality({0: 30, 1: 70}, frozenset({0, 1})) == 1.0
    assert memory_locality({0: 0, 1: 0}, frozenset({1})) is None  # nothing resident yet
    assert memory_locality({0: 30}, None) is None


def test_cpu_time_first_reading_and_a_new_cgroup() -> None:
    first = advance_cpu_time(None, 9.0, {0: 2 / 3, 1: 1 / 3})
    assert first == CpuTimeSplit(9.0, {0: 6.0, 1: 3.0})
    assert advance_cpu_time(first, 12.0, {1: 1.0}) == CpuTimeSplit(12.0, {0: 6.0, 1: 6.0})
    assert advance_cpu_time(first, 1.0, {1: 1.0}) == CpuTimeSplit(1.0, {1: 1.0})  # went back: start over
    assert advance_cpu_time(first, 9.0, {1: 1.0}) is first  # no time passed: the same split


def test_join_with_allocation_names_and_exported_types() -> None:
    usage = ContainerNumaUsage(
        POD_A,
        ID_1,
        {"anon": {0: 3 * MIB, 1: 7 * MIB}, "kernel_stack": {0: 1 * MIB}, "active_anon": {0: 1, 1: 1}},
        frozenset({4, 5}),
        frozenset({0, 1}),
        2.0,
    )
    allocation = Allocation(
        containers=(ContainerAllocation(ContainerRef(POD_A, "app"), memory_bytes={1: 8 * MIB}),)
    )
    names = {ID_1: ContainerIdentity("web-0", "shop", "app", ID_1)}
    all_v2_types = frozenset({"anon", "file", "kernel_stack", "shmem"})
    (joined,) = join_usage([usage], "v2", names, allocation, TWO_NODES, {}, None, all_v2_types)
    assert joined.container == ContainerRef(POD_A, "app", "web-0", "shop")
    assert joined.memory_by_type == {"anon": {0: 3 * MIB, 1: 7 * MIB}, "kernel_stack": {0: 1 * MIB}}
    assert joined.intended_nodes == frozenset({1}) and joined.locality == pytest.approx(0.7)
    assert joined.cpu_nodes == frozenset({1}) and joined.memory_nodes == frozenset({0, 1})
    assert join_usage([usage], "v2", {}, allocation, TWO_NODES, {}) == ()
    # the cgroup of a pod the kubelet no longer has is not reported; unknown liveness keeps it
    assert join_usage([usage], "v2", names, allocation, TWO_NODES, {}, frozenset({"another-pod"})) == ()
    assert len(join_usage([usage], "v2", names, allocation, TWO_NODES, {}, frozenset({POD_A}))) == 1


def test_a_join_keeps_the_containers_whose_inputs_are_the_same() -> None:
    def usage_of(pod: str, container_id: str, anon: int) -> ContainerNumaUsage:
        return ContainerNumaUsage(pod, container_id, {"anon": {0: anon}}, frozenset({1}), frozenset({0}), 2.0)

    a, b = usage_of(POD_A, ID_1, MIB), usage_of(POD_B, ID_2, 2 * MIB)
    names = {
        ID_1: ContainerIdentity("web-0", "shop", "app", ID_1),
        ID_2: ContainerIdentity("db-0", "shop", "db", ID_2),
    }

    def allocation(pinned: int) -> Allocation:
        return Allocation(containers=(ContainerAllocation(ContainerRef(POD_A, "app"), cpus={0: pinned}),))

    memo = JoinMemo()
    first = join_usage([a, b], "v2", names, allocation(1), TWO_NODES, {}, memo=memo)
    # the same inputs (an equal allocation made anew): the same objects
    again = join_usage([a, b], "v2", names, allocation(1), TWO_NODES, {}, memo=memo)
    assert all(x is y for x, y in zip(first, again, strict=True))
    # one container's reading changed, another's allocation: only those are joined anew
    b2 = usage_of(POD_B, ID_2, 3 * MIB)
    changed = join_usage([a, b2], "v2", names, allocation(1), TWO_NODES, {}, memo=memo)
    assert changed[0] is first[0] and changed[1] is not first[1]
    assert changed[1].memory_by_type == {"anon": {0: 3 * MIB}}
    pinned = join_usage([a, b2], "v2", names, allocation(2), TWO_NODES, {}, memo=memo)
    assert pinned[0] is not changed[0] and pinned[1] is changed[1]  # joined again (the same outcome)
    # another machine: every container anew, equal to a join without a memo
    other = MachineNodes(frozenset({0, 1}), {0: frozenset(range(2)), 1: frozenset(range(2, 8))})
    moved = join_usage([a, b2], "v2", names, allocation(2), other, {}, memo=memo)
    assert all(x is not y for x, y in zip(moved, pinned, strict=True))
    assert moved == join_usage([a, b2], "v2", names, allocation(2), other, {})


# --- the series ------------------------------------------------------------------------------------


def test_series_names_types_and_switches(tmp_path: Path) -> None:
    cgroup, logs = _node(tmp_path)
    # both pods exist for the kubelet (<kubelet-root>/pods/<uid>), so their cgroups are reported
    scenario = build_scenario(
        tmp_path / "node", uniform_nodes(2, 4), [ScenarioPod(POD_A), ScenarioPod(POD_B)]
    )
    roots = {"cgroup_root": cgroup, "container_logs_root": logs}
    text = scenario.exposition(**roots)

    app = labels(k8s_pod_uid=POD_A, k8s_container_name="app", k8s_pod_name="web-0", k8s_namespace_name="shop")
    assert "# TYPE numa_container_memory_locality gauge" in text  # unit "1" adds no suffix
    assert "# TYPE numa_container_cpu_time_seconds_total counter" in text
    assert "# TYPE numa_container_memory_usage_bytes gauge" in text
    # app: CPUs 4-5 (node 1), mems 0-1, no memory manager: local to node 1, 3 of 4 MiB there
    assert series(text, "numa_container_memory_locality")[app] == 0.75
    usage = series(text, "numa_container_memory_usage_bytes")
    assert usage[app | labels(numa_node_id=1, numa_memory_type="anon")] == 3 * MIB
    assert usage[app | labels(numa_node_id=0, numa_memory_type="anon")] == 1 * MIB
    assert {dict(key)["numa_memory_type"] for key in usage} == {"anon", "file"}  # the types the files list
    info = series(text, "numa_container_cpuset_nodes")
    assert (
        info[app | labels(numa_cpu_node_ids="1", numa_memory_node_ids="0,1", numa_locality_node_ids="1")] == 1
    )
    # worker: mems confined to node 0, but half of its page cache is on node 1
    worker = labels(
        k8s_pod_uid=POD_B, k8s_container_name="worker", k8s_pod_name="batch-1", k8s_namespace_name="jobs"
    )
    assert series(text, "numa_container_memory_locality")[worker] == 0.5
    # sidecar: CPUs and mems on both nodes: no locality
    assert len(series(text, "numa_container_memory_locality")) == 2

    for group in ("container_usage", "containers"):
        switched_off = scenario.exposition(**roots, disable=frozenset({group}))
        assert "numa_container_memory_usage_bytes" not in switched_off
        assert "numa_container_memory_locality" not in switched_off


def test_only_the_used_memory_types_are_parsed(tmp_path: Path) -> None:
    cgroup, logs = _node(tmp_path)
    scope = next(cgroup.rglob(f"*{ID_1}.scope"))
    # a type the agent does not use, with a value it could not parse: skipped, so no error
    (scope / "memory.numa_stat").write_text("anon N0=4096 N1=8192\nslab_reclaimable N0=? N1=?\n")
    registry = SourceRegistry()
    collector = CgroupCollector(cgroup, ContainerLogNames(logs), registry)
    collector.refresh()
    app = next(c for c in collector.containers(Allocation(), None) if c.container_id == ID_1)
    assert app.memory_by_type == {"anon": {0: 4096, 1: 8192}}
    assert registry.reports()[0].errors == {"corrupt": 0, "unavailable": 0}
