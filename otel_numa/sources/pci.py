"""PCI functions and their NUMA nodes from sysfs (``bus/pci/devices``).

A function's NUMA node is its ``numa_node`` when that is >= 0; else the one NUMA node whose CPUs hold all
of its local CPUs (``local_cpulist``, else the ``local_cpus`` mask), online CPUs only; else -1. Without
NUMA the one synthetic node 0 holds every CPU, so every function is on node 0.

Each function is judged on its own and a bad file (reported to the error sink) never yields a guess: a
function whose ``class`` is unusable leaves out the counts of its NUMA node, one whose ``numa_node`` or
local CPU list is unusable (or that has no local CPU file at all) leaves out the counts of its class and
kind. Such counts are absent, never one short.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from otel_numa.model import NO_NUMA, PciCountKey, PciDevices, PciFunction, Topology
from otel_numa.sources.errors import SourceCorrupt, SourceError, SourceMissing, SourceUnavailable
from otel_numa.sources.files import ErrorSink, parse_cpulist, parse_cpumask, read_value_text, report

PCI_DEVICES_DIR = Path("bus/pci/devices")
# domain:bus:device.function, as the kernel names PCI functions
PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
BRIDGE_CLASS = 0x06

# base class -> pci.device.class; anything else is "other"
CLASS_NAMES: dict[int, str] = {
    0x00: "unclassified",
    0x01: "mass_storage",
    0x02: "network",
    0x03: "display",
    0x04: "multimedia",
    0x05: "memory",
    0x07: "communication",
    0x08: "system_peripheral",
    0x09: "input",
    0x0A: "docking_station",
    0x0B: "processor",
    0x0C: "serial_bus",
    0x0D: "wireless",
    0x0E: "intelligent_io",
    0x0F: "satellite",
    0x10: "encryption",
    0x11: "signal_processing",
    0x12: "processing_accelerator",
    0x13: "non_essential_instrumentation",
    0x40: "coprocessor",
}
PHYSICAL, VIRTUAL = "physical", "virtual"


def class_name(base_class: int) -> str:
    return CLASS_NAMES.get(base_class, "other")


def parse_class(text: str) -> int:
    """The base class (top byte) of a ``class`` file such as ``0x030200``."""
    stripped = text.strip()
    if not re.fullmatch(r"0x[0-9a-fA-F]{6}", stripped):
        raise SourceCorrupt(f"not a PCI class: {stripped[:40]!r}")
    return int(stripped, 16) >> 16


def _parse_numa_node(text: str) -> int:
    stripped = text.strip()
    if not re.fullmatch(r"-?\d{1,6}", stripped):
        raise SourceCorrupt(f"not a NUMA node id: {stripped[:40]!r}")
    return int(stripped)


def node_of_cpus(cpus: frozenset[int], topology: Topology) -> int:
    """The one node whose CPUs hold all of ``cpus`` (online ones); -1 when none or several do."""
    online = cpus & topology.online_cpus
    holders = [node.id for node in topology.nodes if node.cpus_known and online <= node.cpus]
    return holders[0] if len(holders) == 1 else NO_NUMA


def _optional(path: str, on_error: ErrorSink | None) -> str | None:
    try:
        return read_value_text(path)
    except SourceMissing:
        return None
    except SourceError as error:
        report(error, on_error)
        return None


class _Unknown(Exception):
    """A function whose local CPU files are all missing: its node cannot be told (never a guess)."""


def _function_numa(directory: str, topology: Topology, on_error: ErrorSink | None) -> int:
    if not topology.numa_enabled:
        return topology.nodes[0].id if topology.nodes else 0  # the one synthetic node holds everything
    text = _optional(f"{directory}/numa_node", on_error)
    if text is not None:
        try:
            numa = _parse_numa_node(text)
        except SourceCorrupt as error:
            report(SourceCorrupt(f"{directory}/numa_node: {error}"), on_error)
        else:
            if numa >= 0:
                return numa
    for name, parse in (("local_cpulist", parse_cpulist), ("local_cpus", parse_cpumask)):
        text = _optional(f"{directory}/{name}", on_error)
        if text is None:
            continue
        try:
            return node_of_cpus(parse(text), topology)
        except SourceCorrupt as error:
            report(SourceCorrupt(f"{directory}/{name}: {error}"), on_error)
            break
    raise _Unknown


def function_numa(directory: str, topology: Topology, on_error: ErrorSink | None = None) -> int | None:
    """The NUMA node of the PCI function in ``directory`` (a ``bus/pci/devices/<address>`` path), -1 when
    its local CPUs lie on no one node; None when neither ``numa_node`` nor a local CPU file tells."""
    try:
        return _function_numa(directory, topology, on_error)
    except _Unknown:
        return None


def _read_function(
    sysfs_root: Path, address: str, topology: Topology
) -> tuple[int | None, int | None, bool, list[SourceError]]:
    """(its node, its base class, whether it is a VF, the errors met); a node or class that cannot be
    told for sure is None."""
    directory = f"{sysfs_root / PCI_DEVICES_DIR}/{address}"
    numa_errors: list[SourceError] = []
    try:
        numa: int | None = _function_numa(directory, topology, numa_errors.append)
    except _Unknown:
        numa = None
    class_errors: list[SourceError] = []
    text = _optional(f"{directory}/class", class_errors.append)
    base_class: int | None = None
    if text is not None:
        try:
            base_class = parse_class(text)
        except SourceCorrupt as error:
            class_errors.append(SourceCorrupt(f"{directory}/class: {error}"))
    if numa_errors:
        numa = None  # a fallback after a bad file would be a guess
    return numa, base_class, _is_virtual(directory), numa_errors + class_errors


def _is_virtual(directory: str) -> bool:
    return os.path.lexists(f"{directory}/physfn")


def list_addresses(sysfs_root: Path) -> tuple[str, ...]:
    """The PCI addresses under ``bus/pci/devices``, sorted; empty when the machine has no PCI bus."""
    try:
        with os.scandir(sysfs_root / PCI_DEVICES_DIR) as entries:
            return tuple(sorted(entry.name for entry in entries if PCI_ADDRESS.fullmatch(entry.name)))
    except (FileNotFoundError, NotADirectoryError):
        return ()
    except OSError as exc:
        raise SourceUnavailable(f"{sysfs_root / PCI_DEVICES_DIR}: {exc.strerror or exc}") from exc


def count_functions(functions: Iterable[PciFunction]) -> dict[PciCountKey, int]:
    """Functions per (NUMA id, class name, function kind), bridges left out."""
    counts: dict[PciCountKey, int] = {}
    for function in functions:
        if function.base_class == BRIDGE_CLASS:
            continue
        key = (function.numa_node, class_name(function.base_class), VIRTUAL if function.virtual else PHYSICAL)
        counts[key] = counts.get(key, 0) + 1
    return counts


def read_pci_devices(sysfs_root: Path, topology: Topology, on_error: ErrorSink | None = None) -> PciDevices:
    """Every PCI function of the machine with its NUMA node, and the counts of the non-bridges.

    A function whose ``class`` cannot be read or used leaves out the counts of its NUMA node; one whose
    node cannot be told leaves out the counts of its class and kind: absent, never a wrong number.
    """
    functions: dict[str, PciFunction] = {}
    unknown_nodes: set[int] = set()
    unknown_kinds: set[tuple[str, str]] = set()
    everything_unknown = False
    for address in list_addresses(sysfs_root):
        numa, base_class, virtual, errors = _read_function(sysfs_root, address, topology)
        for error in errors:
            report(error, on_error)
        if numa is not None and base_class is not None:
            functions[address] = PciFunction(address, numa, base_class, virtual)
        elif base_class is not None:
            if base_class != BRIDGE_CLASS:
                unknown_kinds.add((class_name(base_class), VIRTUAL if virtual else PHYSICAL))
        elif numa is not None:
            unknown_nodes.add(numa)
        elif os.path.isdir(f"{sysfs_root / PCI_DEVICES_DIR}/{address}"):
            everything_unknown = True
    counts = count_functions(functions.values())
    if everything_unknown:
        counts = {}
    counts = {
        key: count
        for key, count in counts.items()
        if key[0] not in unknown_nodes and (key[1], key[2]) not in unknown_kinds
    }
    return PciDevices(functions, counts)
