"""OpenTelemetry observable instruments whose callbacks read the pinned snapshot."""

from __future__ import annotations

from opentelemetry.metrics import Meter

from otel_numa.collectors.cgroups import container_usage_enabled
from otel_numa.instruments import allocation, compat, container_usage, enrichment, health, machine
from otel_numa.instruments.base import Instruments
from otel_numa.settings import MetricGroup, Settings
from otel_numa.snapshot import SnapshotStore


def register_instruments(meter: Meter, store: SnapshotStore, settings: Settings) -> None:
    instruments = Instruments(meter, store)
    if settings.enabled(MetricGroup.TOPOLOGY):
        machine.register_topology(instruments)
    if settings.enabled(MetricGroup.DISTANCES):
        machine.register_distances(instruments)
    if settings.enabled(MetricGroup.USAGE):
        machine.register_usage(instruments)
    if settings.enabled(MetricGroup.ALLOCATION):
        allocation.register_allocation(instruments)
    if settings.enabled(MetricGroup.CONTAINERS):
        allocation.register_containers(instruments)
        if settings.cri_socket.lower() != "none" and settings.enrich_mode == "info":
            enrichment.register_enrichment(instruments)
    if container_usage_enabled(settings):
        container_usage.register_container_usage(instruments)
    if settings.enabled(MetricGroup.HEALTH):
        health.register_health(instruments)
    if settings.compat == "numainfo":
        compat.register_numainfo(instruments, settings.node_name)
