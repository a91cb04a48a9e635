"""Where DRA-allocated devices sit: a NUMA node for each (driver, pool, device), from node-local facts.

Each CDI spec file is parsed again only when its own stat changes (:mod:`.cdi_specs`); placements are
worked out again only when the CDI devices, the PCI functions or the set of allocated devices change. A
node with no PCI or DRA change pays one ``stat`` per CDI directory and spec file per round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from otel_numa.accounting.allocation import device_numa
from otel_numa.model import NO_NUMA, DraDevice, DraDeviceKey, KubeletState, PciDevices, Source, Topology
from otel_numa.snapshot.collectors.cdi_specs import CdiDevices, CdiSpecs
from otel_numa.snapshot.source_status import SourceRegistry
from otel_numa.sources.device_nodes import addresses_in_name, pci_functions_of
from otel_numa.sources.dra_drivers import CPU_AND_MEMORY_DRIVERS
from otel_numa.sources.errors import SourceError, SourceMissing
from otel_numa.sources.pci import function_numa

Placement = tuple[Mapping[DraDeviceKey, int], frozenset[DraDeviceKey]]  # (NUMA node per device, unknown)


def dra_devices(state: KubeletState) -> tuple[DraDevice, ...]:
    """Every DRA device the kubelet state names, in podresources' claims and in the checkpoint's; CPUs and
    memory handed out through DRA are no devices and have no place of their own."""
    found: dict[DraDeviceKey, DraDevice] = {}
    if state.podresources is not None:
        for pod in state.podresources.all_pods:
            for container in pod.containers:
                for claim in container.dynamic_resources:
                    found.update((device.key, device) for device in claim.devices)
    if state.dra is not None:
        for claim in state.dra.claims:
            for device in claim.devices:
                found.setdefault(device.key, device)
    return tuple(found[key] for key in sorted(found) if key[0] not in CPU_AND_MEMORY_DRIVERS)


class DraPlacer:
    def __init__(
        self, cdi_dirs: Iterable[Path], sysfs_root: Path, procfs_root: Path, registry: SourceRegistry
    ) -> None:
        self._dirs = tuple(cdi_dirs)
        self._sysfs_root = sysfs_root
        self._procfs_root = procfs_root
        self._tracker = registry.tracker(Source.CDI)
        self._specs = CdiSpecs(self._dirs)
        self._inputs: tuple[object, ...] | None = None
        self._placed: Placement = ({}, frozenset())
        self.cdi_devices: CdiDevices = {}  # as the last round read them (DRA CPU and memory claims' edits)

    def place(self, state: KubeletState, pci: PciDevices, topology: Topology) -> Placement:
        """NUMA node per DRA device of ``state``, and the devices that cannot be placed this round (a CDI
        device no spec defines); the same objects while nothing changed."""
        devices = dra_devices(state)
        errors: list[SourceError] = []
        with self._tracker.timed():
            cdi = self._specs.read(errors)  # one stat per directory and file while nothing changed
            self.cdi_devices = cdi
            inputs = (devices, cdi, pci, topology)
            if self._inputs is None or not all(
                a is b or a == b for a, b in zip(inputs, self._inputs, strict=True)
            ):
                placed = {device.key: self._numa_of(device, cdi, pci, topology, errors) for device in devices}
                self._placed = (
                    {key: numa for key, numa in placed.items() if numa is not None},
                    frozenset(key for key, numa in placed.items() if numa is None),
                )
                self._inputs = inputs
        for error in errors:
            self._tracker.failed(error)
        if errors:
            pass
        elif not self._specs.present:
            # no CDI directory at all (a node without CDI): the source is absent, as a missing file is
            self._tracker.failed(SourceMissing("no CDI spec directory: " + ", ".join(map(str, self._dirs))))
        else:
            self._tracker.succeeded()
        return self._placed

    def _numa_of(
        self,
        device: DraDevice,
        cdi: CdiDevices,
        pci: PciDevices,
        topology: Topology,
        errors: list[SourceError],
    ) -> int | None:
        """By a PCI address in the device's name, else by its CDI device nodes; else -1. None when a CDI
        device it names is in no spec (removed, or its spec rejected): its node cannot be told."""
        # an address in the name counts only if the machine has that function (else it is a coincidence)
        addresses = [a for a in addresses_in_name(device.device) if self._has_function(a, pci)]
        if not addresses:
            if any(name not in cdi for name in device.cdi_devices):
                return None
            for name in device.cdi_devices:
                for node in cdi[name].device_nodes:
                    try:
                        addresses.extend(pci_functions_of(node, self._sysfs_root, self._procfs_root))
                    except SourceError as error:
                        errors.append(error)  # this device stays unplaced (-1); counted once per change
        numa_ids = [self._pci_numa(address, pci, topology) for address in addresses]
        if any(numa is None for numa in numa_ids):
            return None
        return device_numa(numa for numa in numa_ids if numa is not None) if numa_ids else NO_NUMA

    def _has_function(self, address: str, pci: PciDevices) -> bool:
        return address in pci.functions or (self._sysfs_root / "bus" / "pci" / "devices" / address).exists()

    def _pci_numa(self, address: str, pci: PciDevices, topology: Topology) -> int | None:
        """The function's node: from the PCI inventory, else read now; None when a file of the function is
        bad (the machine read counts it) or no rule places it."""
        known = pci.numa_of(address)
        if known is not None:
            return known
        directory = self._sysfs_root / "bus" / "pci" / "devices" / address
        if not directory.exists():
            return NO_NUMA
        errors: list[SourceError] = []
        numa = function_numa(str(directory), topology, errors.append)
        return None if errors else numa
