"""From a device node (a CDI spec's ``deviceNodes``) to the PCI functions behind it, from node-local facts.

- ``/dev/vfio/N``: the VFIO group N, whose functions are ``kernel/iommu_groups/N/devices/*``;
- ``/dev/nvidiaN``: NVIDIA's ``<procfs>/driver/nvidia/gpus/<pci address>/information`` whose
  ``Device Minor`` is N;
- any other character device: its major:minor (from the spec, else the host's device file) ->
  ``dev/char/MAJ:MIN`` in sysfs, a link into the device tree whose path names the PCI function.

A node that leads nowhere raises :class:`SourceCorrupt` with ``error_type`` ``unresolved``.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from otel_numa.sources.cdi import CdiDeviceNode
from otel_numa.sources.errors import SourceCorrupt, SourceError, SourceMissing
from otel_numa.sources.files import read_text
from otel_numa.sources.pci import PCI_ADDRESS

UNRESOLVED = "unresolved"
_VFIO_GROUP = re.compile(r"/dev/vfio/(\d+)")
_NVIDIA_GPU = re.compile(r"/dev/nvidia(\d+)")
_DEVICE_MINOR = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)
# a PCI address in a DRA device name: DNS labels spell "0000:3b:00.0" as "0000-3b-00-0"
_ADDRESS_IN_NAME = re.compile(
    r"(?<![0-9a-f])([0-9a-f]{4})[-:]([0-9a-f]{2})[-:]([0-9a-f]{2})[-.]([0-7])(?![0-9a-f])"
)


def addresses_in_name(name: str) -> tuple[str, ...]:
    """PCI addresses written in a device name, normalised to ``0000:3b:00.0``."""
    return tuple(f"{d}:{b}:{s}.{f}" for d, b, s, f in _ADDRESS_IN_NAME.findall(name.lower()))


def _unresolved(node: CdiDeviceNode, why: str) -> SourceCorrupt:
    return SourceCorrupt(f"device node {node.on_host}: {why}", error_type=UNRESOLVED)


def _vfio_group(sysfs_root: Path, node: CdiDeviceNode, group: str) -> tuple[str, ...]:
    directory = sysfs_root / "kernel" / "iommu_groups" / group / "devices"
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        raise _unresolved(node, f"no IOMMU group {group} in sysfs") from exc
    found = tuple(name for name in names if PCI_ADDRESS.fullmatch(name))
    if not found:
        raise _unresolved(node, f"IOMMU group {group} holds no PCI function")
    return found


def _nvidia_gpu(procfs_root: Path, node: CdiDeviceNode, minor: str) -> tuple[str, ...]:
    gpus = procfs_root / "driver" / "nvidia" / "gpus"
    try:
        addresses = sorted(os.listdir(gpus))
    except OSError as exc:
        raise _unresolved(node, f"no {gpus}") from exc
    for address in addresses:
        try:
            text = read_text(gpus / address / "information")
        except SourceError:
            continue
        match = _DEVICE_MINOR.search(text)
        if match is not None and match.group(1) == minor and PCI_ADDRESS.fullmatch(address.lower()):
            return (address.lower(),)
    raise _unresolved(node, f"no NVIDIA GPU with device minor {minor}")


def _char_device_numbers(node: CdiDeviceNode) -> tuple[int, int]:
    if node.major is not None and node.minor is not None and node.type in (None, "c", "u"):
        return node.major, node.minor
    try:
        info = os.stat(node.on_host)
    except OSError as exc:
        raise _unresolved(node, "no such device file and no major:minor in the spec") from exc
    if not stat.S_ISCHR(info.st_mode):
        raise _unresolved(node, "not a character device")
    return os.major(info.st_rdev), os.minor(info.st_rdev)


def _char_device(sysfs_root: Path, node: CdiDeviceNode) -> tuple[str, ...]:
    major, minor = _char_device_numbers(node)
    link = sysfs_root / "dev" / "char" / f"{major}:{minor}"
    try:
        target = os.path.realpath(link, strict=True)
    except OSError as exc:
        raise _unresolved(node, f"no {link}") from exc
    # the innermost PCI function on the device's path (a GPU behind bridges names them all)
    functions = [part for part in Path(target).parts if PCI_ADDRESS.fullmatch(part)]
    if not functions:
        raise _unresolved(node, f"{link} is not below a PCI function")
    return (functions[-1],)


def pci_functions_of(node: CdiDeviceNode, sysfs_root: Path, procfs_root: Path) -> tuple[str, ...]:
    """The PCI addresses behind ``node``; SourceCorrupt (``unresolved``) when it leads nowhere."""
    path = node.on_host
    if (match := _VFIO_GROUP.fullmatch(path)) is not None:
        return _vfio_group(sysfs_root, node, match.group(1))
    if (match := _NVIDIA_GPU.fullmatch(path)) is not None:
        return _nvidia_gpu(procfs_root, node, match.group(1))
    if node.type not in (None, "c", "u"):
        raise _unresolved(node, f"a device of type {node.type!r}, not a character device")
    try:
        return _char_device(sysfs_root, node)
    except SourceMissing as exc:
        raise _unresolved(node, str(exc)) from exc
