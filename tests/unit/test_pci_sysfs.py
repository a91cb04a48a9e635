"""numa.pci.device.count: real sysfs trees checked against hwloc (lstopo), and the NUMA rule's cases."""

from __future__ import annotations

import os
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from otel_numa.model import PciDevices
from otel_numa.sources import pci
from otel_numa.sources.sysfs import read_topology
from otel_numa.testing.device_tree import add_pci_function
from otel_numa.testing.hwloc import lstopo_pci_counts
from otel_numa.testing.kubelet_scenario import build_scenario, counted_errors, labels, series
from otel_numa.testing.sysfs_tree import uniform_nodes
from tests.support import FIXTURES

MACHINES = FIXTURES / "machines"
HWLOC_PCI = FIXTURES / "hwloc-pci"
# Functions whose placement hwloc's rules give differently (see the README beside the snapshots): a
# numa_node that the local CPUs do not confirm, and 32-bit PCI domains that Debian's hwloc skips.
HWLOC_DIFFERS: dict[str, dict[str, int | None]] = {
    "40intel64-2g2n4c+pcilocality": {"0000:43:00.0": -1},  # numa_node 2, every CPU local
    "2pa-pcidomain32bits": {"10000:00:00.0": None, "10000:00:04.0": None},  # not seen by hwloc
}
# PCI functions the agent counts on each snapshot (bridges left out)
HWLOC_PCI_EXPECTED_TOTALS = {
    "32em64t-2n8c+dax+nvme+mic+dimms": 126,
    "40intel64-2g2n4c+pcilocality": 21,
    "40intel64-4n10c+pci-conflicts": 1,
    "2pa-pcidomain32bits": 5,
    "fakepcilocalities": 12,
    "nvidiagpunumanodes": 6,
}


def _by_class(devices: PciDevices) -> dict[tuple[int, int], int]:
    """The agent's functions per (NUMA id, base class), bridges left out, as lstopo counts them."""
    counts: dict[tuple[int, int], int] = {}
    for function in devices.functions.values():
        if function.base_class != pci.BRIDGE_CLASS:
            key = (function.numa_node, function.base_class)
            counts[key] = counts.get(key, 0) + 1
    return counts


def _read(sysfs: Path, procfs: Path) -> PciDevices:
    topology = read_topology(sysfs)
    return pci.read_pci_devices(sysfs, topology)


def test_the_h200_guest_matches_lstopo_and_places_numa_node_minus_one_by_its_cpus(tmp_path: Path) -> None:
    with tarfile.open(MACHINES / "h200-vm.tar.bz2") as archive:
        archive.extractall(tmp_path, filter="data")
    root = tmp_path / "h200-vm"
    devices = _read(root / "sys", root / "proc")
    # every numa_node file says -1; local_cpulist 0-15 lies on the one node: node 0
    assert {f.numa_node for f in devices.functions.values()} == {0}
    assert devices.counts == {
        (0, "mass_storage", "physical"): 2,
        (0, "network", "physical"): 1,
        (0, "display", "physical"): 1,
        (0, "other", "physical"): 2,
    }
    assert _by_class(devices) == lstopo_pci_counts(root)


@pytest.mark.parametrize("name", sorted(HWLOC_PCI_EXPECTED_TOTALS))
def test_hwloc_snapshots_with_pci_devices_match_lstopo(tmp_path: Path, name: str) -> None:
    with tarfile.open(HWLOC_PCI / f"{name}.tar.bz2") as archive:
        archive.extractall(tmp_path, filter="data")
    (root,) = tmp_path.iterdir()
    devices = _read(root / "sys", root / "proc")
    assert sum(devices.counts.values()) == HWLOC_PCI_EXPECTED_TOTALS[name]
    # hwloc's answer, with the functions its rules place differently put where they put them
    differs = HWLOC_DIFFERS.get(name, {})
    as_hwloc_places = {}
    for address, function in devices.functions.items():
        if address not in differs:
            as_hwloc_places[address] = function
        elif (numa := differs[address]) is not None:
            as_hwloc_places[address] = replace(function, numa_node=numa)
    assert _by_class(PciDevices(as_hwloc_places)) == lstopo_pci_counts(root)
    assert set(differs) <= set(devices.functions)  # the agent counts them, by its own rule


def test_the_rule_on_the_snapshots_special_cases(tmp_path: Path) -> None:
    with tarfile.open(HWLOC_PCI / "40intel64-2g2n4c+pcilocality.tar.bz2") as archive:
        archive.extractall(tmp_path, filter="data")
    (root,) = tmp_path.iterdir()
    functions = _read(root / "sys", root / "proc").functions
    assert functions["0000:43:00.0"].numa_node == 2  # numa_node wins over local CPUs spanning all nodes
    assert functions["0000:00:1a.0"].numa_node == -1  # numa_node -1, every CPU local: no one node


def test_gpus_with_local_cpus_only_are_placed_by_them(tmp_path: Path) -> None:
    with tarfile.open(HWLOC_PCI / "nvidiagpunumanodes.tar.bz2") as archive:
        archive.extractall(tmp_path, filter="data")
    (root,) = tmp_path.iterdir()
    assert not list((root / "sys/bus/pci/devices").glob("*/numa_node"))
    assert _read(root / "sys", root / "proc").counts == {
        (0, "display", "physical"): 3,
        (8, "display", "physical"): 3,
    }


def test_this_machine_matches_lstopo() -> None:
    sysfs = Path("/sys")
    devices = _read(sysfs, Path("/proc"))
    assert len(devices.functions) == len(os.listdir(sysfs / "bus/pci/devices"))
    assert _by_class(devices) == lstopo_pci_counts(None)


def test_the_numa_rule_and_the_classes_on_a_two_node_tree(tmp_path: Path) -> None:
    node = build_scenario(tmp_path, uniform_nodes(2, 4))
    sysfs = node.sysfs_root
    add_pci_function(sysfs, "0000:3b:00.0", "0x020000", numa_node="1")  # numa_node wins
    add_pci_function(sysfs, "0000:3b:00.1", "0x020000", numa_node="1", physfn="0000:3b:00.0")  # an SR-IOV VF
    add_pci_function(sysfs, "0000:5e:00.0", "0x010802", numa_node="-1", local_cpulist="0-3")  # by its CPUs
    add_pci_function(sysfs, "0000:5f:00.0", "0x120000", local_cpulist="4-5")  # no numa_node file
    add_pci_function(sysfs, "0000:60:00.0", "0x0b4000", numa_node="-1", local_cpulist="0-7")  # both: -1
    add_pci_function(sysfs, "0000:61:00.0", "0x400000", numa_node="-1", local_cpulist="")  # no CPUs: -1
    add_pci_function(sysfs, "0000:00:00.0", "0x060000", numa_node="0")  # a host bridge: not counted
    expected = {
        labels(numa_node_id=1, pci_device_class="network", pci_function_kind="physical"): 1,
        labels(numa_node_id=1, pci_device_class="network", pci_function_kind="virtual"): 1,
        labels(numa_node_id=0, pci_device_class="mass_storage", pci_function_kind="physical"): 1,
        labels(numa_node_id=1, pci_device_class="processing_accelerator", pci_function_kind="physical"): 1,
        labels(numa_node_id=-1, pci_device_class="processor", pci_function_kind="physical"): 1,
        labels(numa_node_id=-1, pci_device_class="coprocessor", pci_function_kind="physical"): 1,
    }
    assert series(node.exposition(), "numa_pci_device_count") == expected
    # a class file holding garbage: its node's counts are unknown (absent, never one short)
    add_pci_function(sysfs, "0000:62:00.0", "garbage", numa_node="0")
    # a numa_node holding garbage: its class's counts are unknown, whatever the fallback would say
    add_pci_function(sysfs, "0000:63:00.0", "0x010802", numa_node="x", local_cpulist="4-7")
    text = node.exposition()
    assert series(text, "numa_pci_device_count") == {
        key: value
        for key, value in expected.items()
        if ("numa_node_id", "0") not in key and ("pci_device_class", "mass_storage") not in key
    }
    assert counted_errors(text) == {labels(numa_source="sysfs", error_type="corrupt"): 2}
    assert series(text, "numa_cpu_capacity") == {labels(numa_node_id=0): 4, labels(numa_node_id=1): 4}


def test_without_numa_every_function_is_on_node_zero(tmp_path: Path) -> None:
    node = build_scenario(tmp_path, uniform_nodes(1, 4), with_numa=False)
    add_pci_function(node.sysfs_root, "0000:01:00.0", "0x030000")
    assert series(node.exposition(), "numa_pci_device_count") == {
        labels(numa_node_id=0, pci_device_class="display", pci_function_kind="physical"): 1
    }


def test_the_topology_group_off_reads_no_pci(tmp_path: Path) -> None:
    node = build_scenario(tmp_path, uniform_nodes(2, 4))
    add_pci_function(node.sysfs_root, "0000:62:00.0", "garbage", numa_node="0")
    text = node.exposition(disable="topology")
    assert series(text, "numa_pci_device_count") == {}
    assert counted_errors(text) == {}
