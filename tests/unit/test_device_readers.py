"""The CDI spec reader, device node resolution, and what the device readers cost a node with no change."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from otel_numa.model import DraClaim, DraDevice, DraManagerState, KubeletState, PciDevices
from otel_numa.snapshot.collectors.cdi_specs import CdiSpecs
from otel_numa.snapshot.collectors.dra import DraPlacer
from otel_numa.snapshot.collectors.machine import MachineCollector
from otel_numa.snapshot.source_status import SourceRegistry
from otel_numa.sources.cdi import CdiDevice, CdiDeviceNode, CdiSpec, parse_cdi_spec, read_cdi_spec
from otel_numa.sources.device_nodes import addresses_in_name, pci_functions_of
from otel_numa.sources.errors import SourceCorrupt, SourceError
from otel_numa.sources.pci import read_pci_devices
from otel_numa.sources.sysfs import read_topology
from otel_numa.testing.device_tree import (
    add_char_device,
    add_iommu_group,
    add_nvidia_gpu,
    add_pci_function,
    cdi_spec,
    write_cdi_spec,
)
from otel_numa.testing.sysfs_tree import uniform_nodes, write_machine

# Shaped like the per-claim specs a GPU DRA driver writes: one device per allocated GPU, its own device
# node, environment and hooks; the spec-wide edits hold the control nodes every GPU shares.
CLAIM_SPEC_YAML = b"""---
cdiVersion: 0.5.0
kind: k8s.gpu.example.com/claim
devices:
- name: 6e1a27c2-8d5f-4f1e-9c1b-2a4c3e5f7a90-gpu-0
  containerEdits:
    env:
    - GPU_DEVICE_0=gpu-0
    deviceNodes:
    - path: /dev/gpu0
      hostPath: /dev/gpu0
    hooks:
    - hookName: createContainer
      path: /usr/bin/gpu-ctk
      args: [gpu-ctk, hook, update-ldcache]
containerEdits:
  deviceNodes:
  - path: /dev/gpuctl
  - path: /dev/gpu-uvm
  mounts:
  - hostPath: /usr/lib/libgpu.so.1
    containerPath: /usr/lib/libgpu.so.1
    options: [ro, nosuid, nodev, bind]
"""


def test_a_driver_shaped_yaml_spec_keeps_each_devices_own_nodes_and_env(tmp_path: Path) -> None:
    spec = parse_cdi_spec(CLAIM_SPEC_YAML, tmp_path / "k8s.gpu.example.com-claim_6e1a.yaml")
    assert spec == CdiSpec(
        "k8s.gpu.example.com/claim",
        (
            CdiDevice(
                "k8s.gpu.example.com/claim=6e1a27c2-8d5f-4f1e-9c1b-2a4c3e5f7a90-gpu-0",
                (CdiDeviceNode("/dev/gpu0", "/dev/gpu0"),),
                ("GPU_DEVICE_0=gpu-0",),
            ),
        ),
    )


@pytest.mark.parametrize(
    ("text", "error_type"),
    [
        (b"{", "parse_error"),
        (b"[]", "invalid_spec"),
        (b'{"cdiVersion": "0.6.0", "devices": []}', "invalid_spec"),  # no kind
        (b'{"cdiVersion": "0.6.0", "kind": "no-slash", "devices": []}', "invalid_spec"),
        (b'{"cdiVersion": "0.6.0", "kind": "a.com/b", "devices": {}}', "invalid_spec"),
        (b'{"cdiVersion": "0.6.0", "kind": "a.com/b", "devices": [{"containerEdits": {}}]}', "invalid_spec"),
        (
            b'{"cdiVersion": "0.6.0", "kind": "a.com/b", "devices": [{"name": "x", '
            b'"containerEdits": {"deviceNodes": [{"path": "/dev/x", "major": -1}]}}]}',
            "invalid_spec",
        ),
    ],
)
def test_a_file_that_is_no_spec_is_rejected_whole(tmp_path: Path, text: bytes, error_type: str) -> None:
    with pytest.raises(SourceCorrupt) as caught:
        parse_cdi_spec(text, tmp_path / "bad.json")
    assert caught.value.error_type == error_type


def test_specs_read_from_several_directories_the_later_wins(tmp_path: Path) -> None:
    nodes = {"d": [{"path": "/dev/a"}]}
    write_cdi_spec(tmp_path / "etc", "vendor.json", cdi_spec("vendor.com/x", nodes))
    write_cdi_spec(tmp_path / "run", "vendor.yaml", cdi_spec("vendor.com/x", {"d": [{"path": "/dev/b"}]}))
    (tmp_path / "run" / "broken.yml").write_text("kind: [\n")
    (tmp_path / "run" / "notes.txt").write_text("not a spec")
    errors: list[SourceError] = []
    found = CdiSpecs([tmp_path / "etc", tmp_path / "run", tmp_path / "absent"]).read(errors)
    assert found == {"vendor.com/x=d": CdiDevice("vendor.com/x=d", (CdiDeviceNode("/dev/b"),), ("DEVICE=d",))}
    assert [error.error_type for error in errors] == ["parse_error"]


def test_pci_addresses_in_device_names() -> None:
    assert addresses_in_name("gpu-0000-3b-00-0") == ("0000:3b:00.0",)
    assert addresses_in_name("pci-0000:AF:00.1") == ("0000:af:00.1",)
    assert addresses_in_name("gpu-0") == ()
    assert addresses_in_name("uuid-10000-3b-00-01") == ()  # part of a longer number: not an address


def test_device_nodes_lead_to_their_pci_functions(tmp_path: Path) -> None:
    sysfs, procfs = write_machine(tmp_path, uniform_nodes(2, 2))
    add_pci_function(sysfs, "0000:5e:00.0", "0x020000", numa_node="1")
    add_pci_function(sysfs, "0000:d8:00.0", "0x120000", numa_node="0")
    add_pci_function(sysfs, "0000:af:00.0", "0x030200", numa_node="1")
    add_char_device(sysfs, "0000:5e:00.0", 231, 64, "uverbs0")
    add_iommu_group(sysfs, 7, ["0000:d8:00.0"])
    add_nvidia_gpu(procfs, "0000:af:00.0", 3)
    assert pci_functions_of(CdiDeviceNode("/dev/infiniband/uverbs0", None, "c", 231, 64), sysfs, procfs) == (
        "0000:5e:00.0",
    )
    assert pci_functions_of(CdiDeviceNode("/dev/vfio/7"), sysfs, procfs) == ("0000:d8:00.0",)
    assert pci_functions_of(CdiDeviceNode("/dev/nvidia3"), sysfs, procfs) == ("0000:af:00.0",)
    for nowhere in (
        CdiDeviceNode("/dev/vfio/8"),
        CdiDeviceNode("/dev/nvidia4"),
        CdiDeviceNode("/dev/x", None, "c", 231, 65),
        CdiDeviceNode("/dev/null"),  # a real character device (1:3), but no PCI function is behind it
        CdiDeviceNode("/dev/sda", None, "b", 8, 0),
    ):
        with pytest.raises(SourceCorrupt) as caught:
            pci_functions_of(nowhere, sysfs if nowhere.path != "/dev/null" else Path("/sys"), procfs)
        assert caught.value.error_type == "unresolved", nowhere


def test_without_change_cdi_specs_and_placements_are_not_worked_out_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sysfs, procfs = write_machine(tmp_path, uniform_nodes(2, 2))
    add_pci_function(sysfs, "0000:5e:00.0", "0x020000", numa_node="1")
    add_char_device(sysfs, "0000:5e:00.0", 231, 64, "uverbs0")
    cdi = tmp_path / "cdi"
    nodes = [{"path": "/dev/infiniband/uverbs0", "type": "c", "major": 231, "minor": 64}]
    write_cdi_spec(cdi, "nic.json", cdi_spec("example.com/nic", {"nic-0": nodes}))
    monkeypatch.setattr("otel_numa.snapshot.collectors.cdi_specs.RACY_NS", 0)  # trust stats taken now
    reads = _counting(monkeypatch, "otel_numa.snapshot.collectors.cdi_specs.read_cdi_spec", read_cdi_spec)
    resolutions = _counting(
        monkeypatch, "otel_numa.snapshot.collectors.dra.pci_functions_of", pci_functions_of
    )
    placer = DraPlacer([cdi], sysfs, procfs, SourceRegistry())
    topology = read_topology(sysfs)
    nic = DraDevice("net.example.com", "p", "nic-0", ("example.com/nic=nic-0",))
    state = KubeletState(dra=_state(nic))
    first = placer.place(state, PciDevices(), topology)
    assert first[0] == {nic.key: 1}
    for _ in range(5):
        assert placer.place(KubeletState(dra=_state(nic)), PciDevices(), topology) is first
    assert (len(reads), len(resolutions)) == (1, 1)
    # a new spec file (written by rename) changes the directory: read again
    write_cdi_spec(cdi, "other.json", cdi_spec("example.com/other", {"x": []}))
    placer.place(state, PciDevices(), topology)
    assert len(reads) == 2


def _counting(monkeypatch: pytest.MonkeyPatch, target: str, real: Callable[..., Any]) -> list[int]:
    """Replace ``target`` with ``real`` that also counts its calls; the list grows by one per call."""
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(target, counted)
    return calls


def _state(*devices: DraDevice) -> DraManagerState:
    return DraManagerState((DraClaim("c", "ns", devices, "uid", frozenset({"pod"})),))


def test_pci_functions_are_read_with_the_topology_not_every_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sysfs, procfs = write_machine(tmp_path, uniform_nodes(2, 2))
    add_pci_function(sysfs, "0000:5e:00.0", "0x020000", numa_node="1")
    reads = _counting(monkeypatch, "otel_numa.sources.pci.read_pci_devices", read_pci_devices)
    collector = MachineCollector(sysfs, procfs, SourceRegistry())
    for _ in range(5):
        usage = collector.collect()
        assert usage is not None and usage.pci.counts == {(1, "network", "physical"): 1}
    assert len(reads) == 1
