"""The sysfs reader on synthetic trees: the cases no real snapshot has (formats, races, damage)."""

from __future__ import annotations

import builtins
import errno
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_numa.model import HugepagePool, NodeMemory, NumaNode
from otel_numa.sources import sysfs
from otel_numa.sources.errors import SourceCorrupt, SourceError, SourceMissing, SourceUnavailable
from otel_numa.testing.sysfs_tree import (
    NodeSpec,
    format_cpumask,
    format_node_meminfo,
    set_cpu_online,
    uniform_nodes,
    write_file,
    write_machine,
)

KIB = 1024
NODE_DIR = "devices/system/node"

TWO_NODES = (
    NodeSpec(
        0,
        cpus=range(0, 4),
        mem_total_kib=8_000_000,
        mem_free_kib=6_000_000,
        hugepages={2048: (512, 500)},
        numastat={"numa_hit": 100, "numa_miss": 2, "local_node": 90, "other_node": 12},
    ),
    NodeSpec(
        1,
        cpus=range(4, 8),
        mem_total_kib=4_000_000,
        mem_free_kib=1_000_000,
        hugepages={2048: (256, 0)},
        numastat={"numa_hit": 300, "numa_foreign": 7},
    ),
)


@pytest.fixture
def machine(tmp_path: Path) -> tuple[Path, Path]:
    return write_machine(tmp_path, TWO_NODES)


@pytest.fixture
def fresh_overlap_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sysfs, "_reported_overlaps", set())


@pytest.fixture
def fail_open(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Path, int], None]]:
    """Make opening one path fail with an OS error (root ignores chmod, so the error is injected)."""
    failures: dict[str, int] = {}
    real_open, real_os_open = builtins.open, os.open

    def fail_if_listed(file: Any) -> None:
        code = failures.get(str(file))
        if code is not None:
            raise OSError(code, "injected", str(file))

    def fake_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        fail_if_listed(file)
        return real_open(file, *args, **kwargs)

    def fake_os_open(file: Any, *args: Any, **kwargs: Any) -> int:
        fail_if_listed(file)
        return real_os_open(file, *args, **kwargs)

    # the readers use both (files read every round go through os.open)
    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)

    def add(path: Path, code: int) -> None:
        failures[str(path)] = code

    yield add


def node_file(sysfs_root: Path, node: int, name: str) -> Path:
    return sysfs_root / NODE_DIR / f"node{node}" / name


# --- a plain machine, expectations from the specs above ------------------------------------------


def test_two_nodes(machine: tuple[Path, Path]) -> None:
    sysfs_root, procfs_root = machine
    topology = sysfs.read_topology(sysfs_root)
    assert topology.nodes == (
        NumaNode(id=0, cpus=frozenset({0, 1, 2, 3}), distances={0: 10, 1: 20}),
        NumaNode(id=1, cpus=frozenset({4, 5, 6, 7}), distances={0: 20, 1: 10}),
    )
    assert topology.online_cpus == frozenset(range(8))
    assert topology.numa_enabled
    assert topology.overlapping_cpus == frozenset()
    assert sysfs.NodeFiles(sysfs_root, topology, procfs_root).memory() == {
        0: NodeMemory(total_bytes=8_000_000 * KIB, free_bytes=6_000_000 * KIB, used_bytes=2_000_000 * KIB),
        1: NodeMemory(total_bytes=4_000_000 * KIB, free_bytes=1_000_000 * KIB, used_bytes=3_000_000 * KIB),
    }
    assert sysfs.NodeFiles(sysfs_root, topology).hugepages() == {
        0: (HugepagePool(size_kib=2048, total_pages=512, free_pages=500),),
        1: (HugepagePool(size_kib=2048, total_pages=256, free_pages=0),),
    }
    assert sysfs.NodeFiles(sysfs_root, topology).numastat() == {
        0: {"hit": 100, "miss": 2, "foreign": 0, "interleave_hit": 0, "local": 90, "other": 12},
        1: {"hit": 300, "miss": 0, "foreign": 7, "interleave_hit": 0, "local": 0, "other": 0},
    }


def test_builder_writes_the_kernels_formats(tmp_path: Path) -> None:
    # lines and masks as they appear in the hwloc snapshots (16amd64-4n4c node0, 48amd64 node0, buggynuma)
    assert format_node_meminfo(0, [("MemTotal", 8387892), ("Inactive(anon)", 28)], hugepage_counts=True) == (
        "Node 0 MemTotal:        8387892 kB\nNode 0 Inactive(anon):       28 kB\n"
    )
    assert (
        format_node_meminfo(0, [("HugePages_Total", 512)], hugepage_counts=True)
        == "Node 0 HugePages_Total:   512\n"
    )
    assert format_cpumask(range(6), 48) == "0000,0000003f"
    assert format_cpumask(range(42, 48), 48) == "fc00,00000000"
    assert format_cpumask(range(8), 8) == "ff"
    sysfs_root, procfs_root = write_machine(tmp_path, TWO_NODES)
    assert (sysfs_root / "devices/system/cpu/online").read_text() == "0-7\n"
    assert node_file(sysfs_root, 1, "cpulist").read_text() == "4-7\n"
    assert node_file(sysfs_root, 1, "distance").read_text() == "20 10\n"
    assert not (sysfs_root / "devices/system/cpu/cpu0/online").exists()
    assert (
        (procfs_root / "meminfo")
        .read_text()
        .startswith("MemTotal:       12000000 kB\nMemFree:         7000000 kB\n")
    )


# --- formats no snapshot has ---------------------------------------------------------------------


def test_cpumap_without_cpulist(tmp_path: Path) -> None:
    nodes = [
        NodeSpec(0, cpus={0, 1, 40, 41}, mem_total_kib=1000),
        NodeSpec(1, cpus={2, 3, 64}, mem_total_kib=1000),
    ]
    sysfs_root, _procfs_root = write_machine(tmp_path, nodes, node_cpu_files=("cpumap",))
    assert not node_file(sysfs_root, 0, "cpulist").exists()
    assert node_file(sysfs_root, 1, "cpumap").read_text() == "1,00000000,0000000c\n"
    topology = sysfs.read_topology(sysfs_root)
    assert topology.node(0).cpus == frozenset({0, 1, 40, 41})
    assert topology.node(1).cpus == frozenset({2, 3, 64})


def test_blank_first_line_and_trailing_nul(tmp_path: Path) -> None:
    sysfs_root, procfs_root = write_machine(tmp_path, TWO_NODES, meminfo_blank_first_line=True)
    for path in (
        node_file(sysfs_root, 0, "meminfo"),
        node_file(sysfs_root, 0, "cpulist"),
        node_file(sysfs_root, 0, "distance"),
        node_file(sysfs_root, 0, "numastat"),
        sysfs_root / NODE_DIR / "online",
        sysfs_root / "devices/system/cpu/online",
    ):
        path.write_bytes(path.read_bytes() + b"\x00")
    assert node_file(sysfs_root, 0, "meminfo").read_text().startswith("\nNode 0 MemTotal:")
    topology = sysfs.read_topology(sysfs_root)
    assert topology.node(0) == NumaNode(id=0, cpus=frozenset({0, 1, 2, 3}), distances={0: 10, 1: 20})
    assert sysfs.NodeFiles(sysfs_root, topology, procfs_root).memory()[0] == NodeMemory(
        8_000_000 * KIB, 6_000_000 * KIB, 2_000_000 * KIB
    )
    assert sysfs.NodeFiles(sysfs_root, topology).numastat()[0]["hit"] == 100


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # no MemUsed (used = total - free)
        ([("MemTotal", 1000), ("MemFree", 400)], NodeMemory(1000 * KIB, 400 * KIB, 600 * KIB)),
        # no MemFree (free = total - used)
        ([("MemTotal", 1000), ("MemUsed", 300)], NodeMemory(1000 * KIB, 700 * KIB, 300 * KIB)),
        # MemUsed as the kernel states it, even when it disagrees with total - free
        (
            [("MemTotal", 1000), ("MemFree", 400), ("MemUsed", 500)],
            NodeMemory(1000 * KIB, 400 * KIB, 500 * KIB),
        ),
        # each field stands alone: a total alone is the capacity, free and used without a total too
        ([("MemTotal", 1000)], NodeMemory(1000 * KIB, None, None)),
        ([("MemFree", 400), ("MemUsed", 600)], NodeMemory(None, 400 * KIB, 600 * KIB)),
        # only unrelated fields: the node has no memory value
        ([("Active", 5), ("Dirty", 0)], None),
    ],
)
def test_missing_meminfo_fields(
    tmp_path: Path, fields: list[tuple[str, int | None]], expected: NodeMemory | None
) -> None:
    sysfs_root, procfs_root = write_machine(tmp_path, TWO_NODES)
    write_file(node_file(sysfs_root, 1, "meminfo"), format_node_meminfo(1, fields, hugepage_counts=True))
    topology = sysfs.read_topology(sysfs_root)
    memory = sysfs.NodeFiles(sysfs_root, topology, procfs_root).memory()
    assert memory.get(1) == expected
    assert memory[0].total_bytes == 8_000_000 * KIB


def test_multiple_hugepage_sizes(tmp_path: Path) -> None:
    nodes = [
        NodeSpec(
            0, cpus=[0], mem_total_kib=4 << 20, hugepages={64: (100, 90), 2048: (10, 5), 1048576: (2, 1)}
        ),
        NodeSpec(1, cpus=[1], mem_total_kib=4 << 20, hugepages={1048576: (1, 1)}),
        NodeSpec(2, cpus=[2]),  # no memory: no hugepages directory at all
    ]
    sysfs_root, procfs_root = write_machine(tmp_path, nodes)
    assert not node_file(sysfs_root, 2, "hugepages").exists()
    topology = sysfs.read_topology(sysfs_root)
    assert sysfs.NodeFiles(sysfs_root, topology).hugepages() == {
        0: (
            HugepagePool(size_kib=64, total_pages=100, free_pages=90),
            HugepagePool(size_kib=2048, total_pages=10, free_pages=5),
            HugepagePool(size_kib=1048576, total_pages=2, free_pages=1),
        ),
        1: (
            HugepagePool(size_kib=64, total_pages=0, free_pages=0),
            HugepagePool(size_kib=2048, total_pages=0, free_pages=0),
            HugepagePool(size_kib=1048576, total_pages=1, free_pages=1),
        ),
    }
    assert sysfs.NodeFiles(sysfs_root, topology, procfs_root).memory()[2] == NodeMemory(0, 0, 0)


def test_sparse_ids_and_memory_only_node(tmp_path: Path) -> None:
    nodes = [
        NodeSpec(0, cpus=range(4), mem_total_kib=1000, mem_free_kib=500),
        NodeSpec(33, cpus=range(4, 8), mem_total_kib=1000, mem_free_kib=500),
        NodeSpec(72, mem_total_kib=64 << 20, mem_free_kib=64 << 20),  # HBM-like: memory, no CPU
    ]
    sysfs_root, _procfs_root = write_machine(tmp_path, nodes)
    topology = sysfs.read_topology(sysfs_root)
    assert topology.node_ids == (0, 33, 72)
    assert topology.node(72) == NumaNode(id=72, cpus=frozenset(), distances={0: 20, 33: 20, 72: 10})
    assert topology.node(33).distances == {0: 20, 33: 10, 72: 20}


# --- online CPUs -----------------------------------------------------------------------------------


def test_offline_cpus_from_per_cpu_files(tmp_path: Path) -> None:
    sysfs_root, _procfs_root = write_machine(
        tmp_path, TWO_NODES, online_cpus=[0, 1, 2, 4, 5], cpu_online_file=False
    )
    assert not (sysfs_root / "devices/system/cpu/online").exists()
    assert not (sysfs_root / "devices/system/cpu/cpu0/online").exists()  # cpu0: no file, online
    topology = sysfs.read_topology(sysfs_root)
    assert topology.online_cpus == frozenset({0, 1, 2, 4, 5})
    assert topology.node(0).cpus == frozenset({0, 1, 2})
    assert topology.node(1).cpus == frozenset({4, 5})


def test_cpu0_offline(tmp_path: Path) -> None:
    sysfs_root, _procfs_root = write_machine(
        tmp_path, TWO_NODES, online_cpus=range(1, 8), cpu_online_file=False
    )
    assert (sysfs_root / "devices/system/cpu/cpu0/online").read_text() == "0\n"
    assert sysfs.read_topology(sysfs_root).node(0).cpus == frozenset({1, 2, 3})


@pytest.mark.parametrize("cpu_online_file", [True, False], ids=["cpu-online-file", "per-cpu-files"])
def test_signature_changes_when_a_cpu_goes_offline(tmp_path: Path, cpu_online_file: bool) -> None:
    sysfs_root, _procfs_root = write_machine(tmp_path, TWO_NODES, cpu_online_file=cpu_online_file)
    before = sysfs.topology_signature(sysfs_root)
    assert sysfs.topology_signature(sysfs_root) == before
    write_file(
        node_file(sysfs_root, 0, "meminfo"), format_node_meminfo(0, [("MemTotal", 1)], hugepage_counts=True)
    )
    assert sysfs.topology_signature(sysfs_root) == before  # memory is not topology
    set_cpu_online(sysfs_root, 5, False)
    offline = sysfs.topology_signature(sysfs_root)
    assert offline != before
    assert sysfs.read_topology(sysfs_root).node(1).cpus == frozenset({4, 6, 7})
    set_cpu_online(sysfs_root, 5, True)
    assert sysfs.topology_signature(sysfs_root) == before


def test_signature_changes_when_a_node_goes_away(tmp_path: Path) -> None:
    sysfs_root, _ = write_machine(tmp_path, TWO_NODES)
    before = sysfs.topology_signature(sysfs_root)
    write_file(sysfs_root / NODE_DIR / "online", "0\n")
    assert sysfs.topology_signature(sysfs_root) != before
    # without the online file, the node directories tell
    (sysfs_root / NODE_DIR / "online").unlink()
    listed = sysfs.topology_signature(sysfs_root)
    shutil.rmtree(sysfs_root / NODE_DIR / "node1")
    assert sysfs.topology_signature(sysfs_root) != listed


# --- distances -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "possible", "expected"),
    [
        ("10 20", None, {0: 10, 2: 20}),
        # one value per possible node (as offline-cpu0-node0 shows): the possible ids line up
        ("10 15 20", "0-2", {0: 10, 2: 20}),
        # too short: what can be mapped is mapped
        ("10", None, {0: 10}),
        # too long, and no id list of that length: no value is known to be whose
        ("10 20 30 40", None, {}),
        ("", None, {}),
    ],
)
def test_distance_rows_of_odd_length(
    tmp_path: Path, row: str, possible: str | None, expected: dict[int, int]
) -> None:
    nodes = [NodeSpec(0, cpus=[0], mem_total_kib=1), NodeSpec(2, cpus=[1], mem_total_kib=1)]
    sysfs_root, _procfs_root = write_machine(tmp_path, nodes)
    write_file(node_file(sysfs_root, 0, "distance"), row + "\n")
    if possible is not None:
        write_file(sysfs_root / NODE_DIR / "possible", possible + "\n")
    assert sysfs.read_topology(sysfs_root).node(0).distances == expected


# --- overlapping cpulists --------------------------------------------------------------------------


def test_overlap_warned_once_per_distinct_set(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, fresh_overlap_warnings: None
) -> None:
    nodes = [NodeSpec(0, cpus=range(0, 6), mem_total_kib=1), NodeSpec(1, cpus=range(4, 8), mem_total_kib=1)]
    sysfs_root, _procfs_root = write_machine(tmp_path, nodes)
    with caplog.at_level(logging.WARNING, logger=sysfs.__name__):
        for _ in range(3):
            topology = sysfs.read_topology(sysfs_root)
        assert topology.overlapping_cpus == frozenset({4, 5})
        assert topology.node(0).cpus == frozenset(range(6))  # as the kernel states it
        write_file(node_file(sysfs_root, 1, "cpulist"), "3-7\n")
        assert sysfs.read_topology(sysfs_root).overlapping_cpus == frozenset({3, 4, 5})
    messages = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(messages) == 2
    assert "4-5" in messages[0] and "3-5" in messages[1]


# --- files that vanish or cannot be read -----------------------------------------------------------


def test_node_files_vanishing(machine: tuple[Path, Path]) -> None:
    sysfs_root, procfs_root = machine
    topology = sysfs.read_topology(sysfs_root)
    node_file(sysfs_root, 1, "meminfo").unlink()
    node_file(sysfs_root, 1, "numastat").unlink()
    node_file(sysfs_root, 0, "hugepages/hugepages-2048kB/free_hugepages").unlink()
    assert set(sysfs.NodeFiles(sysfs_root, topology, procfs_root).memory()) == {0}
    assert set(sysfs.NodeFiles(sysfs_root, topology).numastat()) == {0}
    # each counter file stands alone: the pool keeps its total
    assert sysfs.NodeFiles(sysfs_root, topology).hugepages() == {
        0: (HugepagePool(size_kib=2048, total_pages=512, free_pages=None),),
        1: (HugepagePool(size_kib=2048, total_pages=256, free_pages=0),),
    }


def test_node_going_offline_between_reads(machine: tuple[Path, Path]) -> None:
    sysfs_root, procfs_root = machine
    topology = sysfs.read_topology(sysfs_root)
    shutil.rmtree(sysfs_root / NODE_DIR / "node1")
    assert set(sysfs.NodeFiles(sysfs_root, topology, procfs_root).memory()) == {0}
    assert set(sysfs.NodeFiles(sysfs_root, topology).hugepages()) == {0}
    assert set(sysfs.NodeFiles(sysfs_root, topology).numastat()) == {0}


def test_node_going_offline_during_the_topology_read(
    machine: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sysfs_root, _procfs_root = machine
    node1 = sysfs_root / NODE_DIR / "node1"
    real_open = os.open

    def racing_open(file: Any, *args: Any, **kwargs: Any) -> int:
        if str(file) == str(node1 / "cpulist") and node1.exists():
            shutil.rmtree(node1)  # the node is hot-removed after its directory was listed
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", racing_open)
    topology = sysfs.read_topology(sysfs_root)
    assert topology.node_ids == (0,)


def test_node_without_cpulist_or_cpumap_has_no_cpus(machine: tuple[Path, Path]) -> None:
    sysfs_root, _procfs_root = machine
    node_file(sysfs_root, 1, "cpulist").unlink()
    node_file(sysfs_root, 1, "cpumap").unlink()
    assert sysfs.read_topology(sysfs_root).node(1).cpus == frozenset()


def test_directory_in_place_of_a_file(machine: tuple[Path, Path]) -> None:
    sysfs_root, procfs_root = machine
    for name in ("meminfo", "numastat", "cpulist", "distance"):
        node_file(sysfs_root, 1, name).unlink()
        node_file(sysfs_root, 1, name).mkdir()
    pool = node_file(sysfs_root, 0, "hugepages/hugepages-2048kB/nr_hugepages")
    pool.unlink()
    pool.mkdir()
    topology = sysfs.read_topology(sysfs_root)
    assert topology.node(1) == NumaNode(id=1, cpus=frozenset({4, 5, 6, 7}), distances={})  # from cpumap
    assert set(sysfs.NodeFiles(sysfs_root, topology, procfs_root).memory()) == {0}
    assert set(sysfs.NodeFiles(sysfs_root, topology).numastat()) == {0}
    assert sysfs.NodeFiles(sysfs_root, topology).hugepages()[0] == (HugepagePool(2048, None, 500),)


def test_permission_denied_on_a_node_file(
    machine: tuple[Path, Path], fail_open: Callable[[Path, int], None]
) -> None:
    sysfs_root, procfs_root = machine
    fail_open(node_file(sysfs_root, 0, "meminfo"), errno.EACCES)
    fail_open(node_file(sysfs_root, 0, "numastat"), errno.EIO)
    topology = sysfs.read_topology(sysfs_root)
    assert set(sysfs.NodeFiles(sysfs_root, topology, procfs_root).memory()) == {1}
    assert set(sysfs.NodeFiles(sysfs_root, topology).numastat()) == {1}


def test_permission_denied_on_the_cpu_online_file(
    machine: tuple[Path, Path], fail_open: Callable[[Path, int], None]
) -> None:
    sysfs_root, _procfs_root = machine
    before = sysfs.topology_signature(sysfs_root)
    fail_open(sysfs_root / "devices/system/cpu/online", errno.EACCES)
    errors: list[SourceError] = []
    # the cpuN/online files tell the same, so nothing is lost; the unreadable file is reported
    topology = sysfs.read_topology(sysfs_root, on_error=errors.append)
    assert topology.online_cpus == frozenset(range(8))
    assert [node.cpus for node in topology.nodes] == [frozenset(range(4)), frozenset(range(4, 8))]
    assert [error.error_type for error in errors] == [SourceUnavailable.error_type]
    assert sysfs.topology_signature(sysfs_root) != before  # the mask now comes from the cpuN files


# --- missing roots and corrupt content ---------------------------------------------------------------


def test_missing_cpu_root(machine: tuple[Path, Path]) -> None:
    sysfs_root, _procfs_root = machine
    shutil.rmtree(sysfs_root / "devices/system/cpu")
    with pytest.raises(SourceMissing):
        sysfs.read_topology(sysfs_root)
    with pytest.raises(SourceMissing):
        sysfs.topology_signature(sysfs_root)
    with pytest.raises(SourceMissing):
        sysfs.read_topology(sysfs_root / "nowhere")


def test_missing_node_root_after_topology(machine: tuple[Path, Path]) -> None:
    sysfs_root, procfs_root = machine
    topology = sysfs.read_topology(sysfs_root)
    shutil.rmtree(sysfs_root / NODE_DIR)
    with pytest.raises(SourceMissing):
        sysfs.NodeFiles(sysfs_root, topology, procfs_root).memory()
    with pytest.raises(SourceMissing):
        sysfs.NodeFiles(sysfs_root, topology).hugepages()
    with pytest.raises(SourceMissing):
        sysfs.NodeFiles(sysfs_root, topology).numastat()


@pytest.mark.parametrize(
    ("relative", "content", "reader"),
    [
        ("devices/system/node/node0/cpulist", "0-x\n", "topology"),
        ("devices/system/node/node0/cpulist", "5-2\n", "topology"),
        ("devices/system/cpu/online", "zero\n", "topology"),
        ("devices/system/cpu/cpu3/online", "yes\n", "topology-no-online-file"),
        ("devices/system/node/node0/distance", "10 twenty\n", "topology"),
        ("devices/system/node/node1/meminfo", "Node 1 MemTotal: lots\n", "memory"),
        ("devices/system/node/node1/meminfo", "Node 1 MemTotal: 12 MB\n", "memory"),
        ("devices/system/node/node0/numastat", "numa_hit many\n", "numastat"),
        ("devices/system/node/node0/numastat", "numa_hit 1 2\n", "numastat"),
        ("devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages", "-\n", "hugepages"),
    ],
)
def test_corrupt_content(tmp_path: Path, relative: str, content: str, reader: str) -> None:
    sysfs_root, procfs_root = write_machine(
        tmp_path, TWO_NODES, cpu_online_file=reader != "topology-no-online-file"
    )
    topology = sysfs.read_topology(sysfs_root)
    write_file(sysfs_root / relative, content)
    readers: dict[str, Callable[[], object]] = {
        "topology": lambda: sysfs.read_topology(sysfs_root),
        "topology-no-online-file": lambda: sysfs.read_topology(sysfs_root),
        "memory": lambda: sysfs.NodeFiles(sysfs_root, topology, procfs_root).memory(),
        "numastat": lambda: sysfs.NodeFiles(sysfs_root, topology).numastat(),
        "hugepages": lambda: sysfs.NodeFiles(sysfs_root, topology).hugepages(),
    }
    with pytest.raises(SourceCorrupt):
        readers[reader]()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from(["cpulist", "cpumap", "distance", "meminfo", "numastat"]),
    content=st.text(max_size=40),
)
def test_garbage_only_ever_raises_source_errors(machine: tuple[Path, Path], name: str, content: str) -> None:
    sysfs_root, procfs_root = machine
    write_file(node_file(sysfs_root, 0, name), content)
    try:
        topology = sysfs.read_topology(sysfs_root)
        sysfs.NodeFiles(sysfs_root, topology, procfs_root).memory()
        sysfs.NodeFiles(sysfs_root, topology).numastat()
        sysfs.NodeFiles(sysfs_root, topology).hugepages()
    except SourceError:
        pass


# --- a kernel without NUMA ---------------------------------------------------------------------------

UMA = [
    NodeSpec(0, cpus=range(4), mem_total_kib=2_000_000, mem_free_kib=1_500_000, hugepages={2048: (64, 60)})
]


def test_no_numa(tmp_path: Path) -> None:
    sysfs_root, procfs_root = write_machine(tmp_path, UMA, with_numa=False, online_cpus=[0, 1, 3])
    assert not (sysfs_root / NODE_DIR).exists()
    topology = sysfs.read_topology(sysfs_root)
    assert topology.nodes == (NumaNode(id=0, cpus=frozenset({0, 1, 3}), distances={}),)
    assert not topology.numa_enabled
    assert sysfs.NodeFiles(sysfs_root, topology, procfs_root).memory() == {
        0: NodeMemory(total_bytes=2_000_000 * KIB, free_bytes=1_500_000 * KIB, used_bytes=500_000 * KIB)
    }
    assert sysfs.NodeFiles(sysfs_root, topology).hugepages() == {0: (HugepagePool(2048, 64, 60),)}
    assert sysfs.NodeFiles(sysfs_root, topology).numastat() == {}


def test_no_numa_hugepages_from_proc_meminfo(tmp_path: Path) -> None:
    sysfs_root, procfs_root = write_machine(tmp_path, UMA, with_numa=False, global_hugepages=False)
    topology = sysfs.read_topology(sysfs_root)
    assert sysfs.NodeFiles(sysfs_root, topology, procfs_root).hugepages() == {
        0: (HugepagePool(2048, 64, 60),)
    }
    assert (
        sysfs.NodeFiles(sysfs_root, topology).hugepages() == {}
    )  # no procfs root given: nothing to fall back on


def test_no_numa_without_proc_meminfo(tmp_path: Path) -> None:
    sysfs_root, procfs_root = write_machine(tmp_path, UMA, with_numa=False)
    (procfs_root / "meminfo").unlink()
    topology = sysfs.read_topology(sysfs_root)
    with pytest.raises(SourceMissing):
        sysfs.NodeFiles(sysfs_root, topology, procfs_root).memory()


def test_uniform_machine_scales(tmp_path: Path) -> None:
    nodes = uniform_nodes(16, 256, hugepages={2048: (8, 8)})
    sysfs_root, _procfs_root = write_machine(tmp_path, nodes, cpu_dirs=False)
    assert not (sysfs_root / "devices/system/cpu/cpu0").exists()
    topology = sysfs.read_topology(sysfs_root)
    assert topology.node_ids == tuple(range(16))
    assert topology.node(15).cpus == frozenset(range(3840, 4096))
    assert topology.node(3).distances[3] == 10 and topology.node(3).distances[4] == 20
    assert len(sysfs.NodeFiles(sysfs_root, topology).hugepages()) == 16


# --- NodeFiles: one per topology, read every round -------------------------------------------------


def pool_dir(sysfs_root: Path, node: int, size_kib: int) -> Path:
    return node_file(sysfs_root, node, f"hugepages/hugepages-{size_kib}kB")


def test_node_files_follow_the_values_round_after_round(machine: tuple[Path, Path]) -> None:
    sysfs_root, procfs_root = machine
    files = sysfs.NodeFiles(sysfs_root, sysfs.read_topology(sysfs_root), procfs_root)
    assert files.hugepages()[0] == (HugepagePool(size_kib=2048, total_pages=512, free_pages=500),)
    assert files.numastat()[1]["hit"] == 300
    write_file(pool_dir(sysfs_root, 0, 2048) / "free_hugepages", "17\n")
    write_file(node_file(sysfs_root, 1, "numastat"), "numa_hit 301\nnuma_miss 0\n")
    write_file(node_file(sysfs_root, 1, "meminfo"), "Node 1 MemTotal: 4000000 kB\nNode 1 MemFree: 3000 kB\n")
    assert files.hugepages()[0] == (HugepagePool(size_kib=2048, total_pages=512, free_pages=17),)
    assert files.numastat()[1] == {"hit": 301, "miss": 0}
    assert files.memory()[1] == NodeMemory(
        total_bytes=4_000_000 * KIB, free_bytes=3000 * KIB, used_bytes=(4_000_000 - 3000) * KIB
    )


def test_node_files_list_the_pools_again_when_one_vanishes(machine: tuple[Path, Path]) -> None:
    sysfs_root, procfs_root = machine
    files = sysfs.NodeFiles(sysfs_root, sysfs.read_topology(sysfs_root), procfs_root)
    assert files.hugepages()[0] == (HugepagePool(2048, 512, 500),)
    # a new page size is not looked for every round ...
    write_file(pool_dir(sysfs_root, 0, 1048576) / "nr_hugepages", "4\n")
    write_file(pool_dir(sysfs_root, 0, 1048576) / "free_hugepages", "3\n")
    assert files.hugepages()[0] == (HugepagePool(2048, 512, 500),)
    # ... but a fresh NodeFiles (a new topology) sees it, and so does this one once a listed pool is gone
    fresh = sysfs.NodeFiles(sysfs_root, sysfs.read_topology(sysfs_root), procfs_root)
    assert fresh.hugepages()[0] == (HugepagePool(2048, 512, 500), HugepagePool(1048576, 4, 3))
    shutil.rmtree(pool_dir(sysfs_root, 0, 2048))
    assert files.hugepages() == {0: (HugepagePool(1048576, 4, 3),), 1: (HugepagePool(2048, 256, 0),)}
    shutil.rmtree(node_file(sysfs_root, 0, "hugepages"))
    assert files.hugepages() == {1: (HugepagePool(2048, 256, 0),)}


def test_node_files_see_hugepages_of_memory_added_later(tmp_path: Path) -> None:
    nodes = [NodeSpec(0, cpus=[0], mem_total_kib=4 << 20, hugepages={2048: (4, 4)}), NodeSpec(1, cpus=[1])]
    sysfs_root, procfs_root = write_machine(tmp_path, nodes)
    files = sysfs.NodeFiles(sysfs_root, sysfs.read_topology(sysfs_root), procfs_root)
    assert set(files.hugepages()) == {0}  # node 1 has no memory, so no hugepages directory
    write_file(pool_dir(sysfs_root, 1, 2048) / "nr_hugepages", "2\n")  # memory hot-added
    write_file(pool_dir(sysfs_root, 1, 2048) / "free_hugepages", "1\n")
    assert files.hugepages()[1] == (HugepagePool(2048, 2, 1),)


def test_node_files_report_bad_nodes_and_keep_the_others(
    machine: tuple[Path, Path], fail_open: Callable[[Path, int], None]
) -> None:
    sysfs_root, procfs_root = machine
    files = sysfs.NodeFiles(sysfs_root, sysfs.read_topology(sysfs_root), procfs_root)
    files.hugepages()  # the pools are listed now; what follows hits the cached paths
    fail_open(pool_dir(sysfs_root, 0, 2048) / "nr_hugepages", errno.EACCES)
    write_file(pool_dir(sysfs_root, 1, 2048) / "free_hugepages", "lots\n")
    errors: list[tuple[int, str]] = []

    def on_node_error(node_id: int, error: SourceError) -> None:
        errors.append((node_id, error.error_type))

    assert files.hugepages(on_node_error=on_node_error) == {
        0: (HugepagePool(2048, None, 500),),
        1: (HugepagePool(2048, 256, None),),
    }
    assert errors == [(0, SourceUnavailable.error_type), (1, SourceCorrupt.error_type)]
    errors.clear()
    # without a handler: an unreadable file is skipped, a corrupt one fails the read
    with pytest.raises(SourceCorrupt):
        files.hugepages()
    write_file(pool_dir(sysfs_root, 1, 2048) / "free_hugepages", "3\n")
    assert files.hugepages() == {0: (HugepagePool(2048, None, 500),), 1: (HugepagePool(2048, 256, 3),)}
    fail_open(node_file(sysfs_root, 1, "meminfo"), errno.EIO)
    fail_open(node_file(sysfs_root, 0, "numastat"), errno.EACCES)
    assert set(files.memory(on_node_error=on_node_error)) == {0}
    assert set(files.numastat(on_node_error=on_node_error)) == {1}
    assert errors == [(1, SourceUnavailable.error_type), (0, SourceUnavailable.error_type)]


def test_node_files_of_a_vanished_node_directory(machine: tuple[Path, Path]) -> None:
    sysfs_root, procfs_root = machine
    files = sysfs.NodeFiles(sysfs_root, sysfs.read_topology(sysfs_root), procfs_root)
    files.hugepages()
    shutil.rmtree(sysfs_root / NODE_DIR)
    for read in (files.memory, files.hugepages, files.numastat):
        with pytest.raises(SourceMissing):
            read()


def test_nodes_by_cpu(tmp_path: Path, fresh_overlap_warnings: None) -> None:
    nodes = [NodeSpec(0, cpus=[0, 1, 2]), NodeSpec(1, cpus=[2, 3]), NodeSpec(2, mem_total_kib=1000)]
    sysfs_root, _procfs_root = write_machine(tmp_path, nodes, online_cpus=[0, 1, 2])
    topology = sysfs.read_topology(sysfs_root)
    # CPU 2 claimed by both nodes (buggy firmware), CPU 3 offline, node 2 without CPUs
    assert sysfs.nodes_by_cpu(topology) == {0: (0,), 1: (0,), 2: (0, 1)}
