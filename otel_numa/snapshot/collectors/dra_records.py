"""What DRA CPU and memory drivers recorded for the claims in use, read from their claims' CDI devices.

The CDI specs are the ones :class:`~otel_numa.snapshot.collectors.dra.DraPlacer` reads each round; the
records are worked out again only when the claims in use, the specs or the machine change. A value that
cannot be trusted (not a cpuset, CPUs or NUMA nodes the machine lacks) is counted once per change under
``numa.source="cdi"``, and its claim is then as if its device named nothing: a CPU claim's CPUs come from
its containers' effective cpusets, a memory claim's memory is unknown.
"""

from __future__ import annotations

from collections.abc import Mapping

from otel_numa.model import DraDriverRecord, KubeletState, Source, Topology
from otel_numa.snapshot.collectors.cdi_specs import CdiDevices
from otel_numa.snapshot.memo import LastResult
from otel_numa.snapshot.source_status import SourceRegistry
from otel_numa.sources.dra_drivers import CPU_AND_MEMORY_DRIVERS, CPU_DRIVER, claim_cpus, claim_memory
from otel_numa.sources.errors import SourceError

Records = Mapping[str, DraDriverRecord]


def cdi_names_in_use(state: KubeletState) -> frozenset[tuple[str, str]]:
    """(driver, CDI device name) of every CPU and memory claim podresources or the checkpoint names."""
    found: set[tuple[str, str]] = set()
    claims = [claim for claim in state.dra.claims] if state.dra is not None else []
    if state.podresources is not None:
        for pod in state.podresources.all_pods:
            for container in pod.containers:
                claims.extend(container.dynamic_resources)
    for claim in claims:
        for device in claim.devices:
            if device.driver in CPU_AND_MEMORY_DRIVERS:
                found.update((device.driver, name) for name in device.cdi_devices)
    return frozenset(found)


class DraRecords:
    def __init__(self, registry: SourceRegistry) -> None:
        self._tracker = registry.tracker(Source.CDI)
        self._inputs: tuple[object, ...] | None = None
        self._records: Records = {}
        self._in_use: LastResult[frozenset[tuple[str, str]]] = LastResult()

    def read(self, state: KubeletState, cdi: CdiDevices, topology: Topology) -> Records:
        """The record of each CPU and memory claim's CDI device that a spec defines and that can be trusted;
        the same mapping object while nothing changed."""
        in_use = self._in_use.get((state.podresources, state.dra), lambda: cdi_names_in_use(state))
        if not in_use:
            return {}
        inputs = (in_use, cdi, topology)
        if self._inputs is None or not all(
            a is b or a == b for a, b in zip(inputs, self._inputs, strict=True)
        ):
            records, errors = _records(in_use, cdi, topology)
            self._inputs = inputs
            if records != self._records:
                self._records = records
            for error in errors:  # counted once per change, as an unresolved device node is
                self._tracker.failed(error)
        return self._records


def _records(
    in_use: frozenset[tuple[str, str]], cdi: CdiDevices, topology: Topology
) -> tuple[Records, tuple[SourceError, ...]]:
    cpus = topology.online_cpus
    nodes = frozenset(topology.node_ids)
    records: dict[str, DraDriverRecord] = {}
    errors: list[SourceError] = []
    for driver, name in sorted(in_use):
        device = cdi.get(name)
        if device is None:
            continue  # no spec defines it (removed, or rejected and counted): as if it named nothing
        try:
            if driver == CPU_DRIVER:
                records[name] = DraDriverRecord(cpus=claim_cpus(device.env, cpus))
            else:
                records[name] = DraDriverRecord(memory=claim_memory(device.env, nodes))
        except SourceError as error:
            errors.append(type(error)(f"CDI device {name}: {error}", error_type=error.error_type))
    return records, tuple(errors)
