"""PCI functions, device nodes and CDI specs for device tests, laid out as the kernel and the drivers do.

- ``<sysfs>/bus/pci/devices/<address>`` links into ``<sysfs>/devices/pci<domain>:<bus>/...`` holding
  ``class``, ``numa_node``, ``local_cpulist`` (and ``physfn`` for an SR-IOV VF);
- ``<sysfs>/dev/char/MAJ:MIN`` links to a class device below its PCI function (an RDMA ``uverbs`` node);
- ``<sysfs>/kernel/iommu_groups/N/devices/<address>`` (VFIO);
- ``<procfs>/driver/nvidia/gpus/<address>/information`` with its ``Device Minor`` line, as NVIDIA's
  driver writes it;
- CDI specs as the public DRA drivers write them (``cdiVersion``, ``kind``, ``devices[].containerEdits``
  with ``deviceNodes``; spec-wide edits with control nodes), in YAML or JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml


def add_pci_function(
    sysfs_root: Path,
    address: str,
    device_class: str,
    *,
    numa_node: str | None = None,
    local_cpulist: str | None = None,
    physfn: str | None = None,
) -> Path:
    """A PCI function, linked from ``bus/pci/devices``; ``None`` leaves a file out. Returns its directory."""
    bus = address.rsplit(":", 1)[0]
    real = sysfs_root / "devices" / f"pci{bus}" / address
    real.mkdir(parents=True, exist_ok=True)
    (real / "class").write_text(f"{device_class}\n")
    if numa_node is not None:
        (real / "numa_node").write_text(f"{numa_node}\n")
    if local_cpulist is not None:
        (real / "local_cpulist").write_text(f"{local_cpulist}\n")
    if physfn is not None:
        os.symlink(f"../{physfn}", real / "physfn")
    links = sysfs_root / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(real, links), links / address)
    return real


def add_char_device(sysfs_root: Path, address: str, major: int, minor: int, name: str) -> None:
    """``dev/char/MAJ:MIN`` -> a class device (``name``) below the PCI function at ``address``."""
    bus = address.rsplit(":", 1)[0]
    device = sysfs_root / "devices" / f"pci{bus}" / address / "infiniband_verbs" / name
    device.mkdir(parents=True)
    (device / "dev").write_text(f"{major}:{minor}\n")
    chars = sysfs_root / "dev" / "char"
    chars.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(device, chars), chars / f"{major}:{minor}")


def add_iommu_group(sysfs_root: Path, group: int, addresses: Sequence[str]) -> None:
    devices = sysfs_root / "kernel" / "iommu_groups" / str(group) / "devices"
    devices.mkdir(parents=True)
    for address in addresses:
        bus = address.rsplit(":", 1)[0]
        os.symlink(
            os.path.relpath(sysfs_root / "devices" / f"pci{bus}" / address, devices), devices / address
        )


def add_nvidia_gpu(procfs_root: Path, address: str, minor: int) -> None:
    """``driver/nvidia/gpus/<address>/information`` as NVIDIA's kernel module prints it."""
    directory = procfs_root / "driver" / "nvidia" / "gpus" / address
    directory.mkdir(parents=True)
    (directory / "information").write_text(
        "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 120\nGPU UUID: \t GPU-5a1c\n"
        "Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
        "DMA Mask: \t 0xfffffffffffff\n"
        f"Bus Location: \t {address}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"
    )


def cdi_spec(kind: str, devices: Mapping[str, Sequence[Mapping[str, object]]]) -> dict[str, object]:
    """A CDI spec: each device with its own device nodes, and spec-wide control nodes as drivers add."""
    return {
        "cdiVersion": "0.6.0",
        "kind": kind,
        "devices": [
            {"name": name, "containerEdits": {"deviceNodes": list(nodes), "env": [f"DEVICE={name}"]}}
            for name, nodes in devices.items()
        ],
        "containerEdits": {"deviceNodes": [{"path": "/dev/ctl-does-not-exist"}]},
    }


def write_cdi_spec(directory: Path, file_name: str, spec: Mapping[str, object]) -> Path:
    """``spec`` as YAML or JSON by the file's suffix."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / file_name
    text = json.dumps(spec, indent=2) if file_name.endswith(".json") else yaml.safe_dump(dict(spec))
    path.write_text(text)
    return path
