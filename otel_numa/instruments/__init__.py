"""OpenTelemetry observable instruments, registered from the catalogue; callbacks read the pinned snapshot."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from opentelemetry.metrics import Meter

from otel_numa.catalogue import BY_NAME
from otel_numa.instruments import allocation, compat, container_usage, enrichment, health, machine
from otel_numa.instruments.base import Instruments, Observe
from otel_numa.snapshot import SnapshotStore


def observers(node_name: str) -> Mapping[str, Observe]:
    """Every catalogue metric's callback body, by OTel name."""
    return {
        **machine.OBSERVERS,
        **allocation.OBSERVERS,
        **enrichment.OBSERVERS,
        **container_usage.OBSERVERS,
        **health.OBSERVERS,
        **compat.observers(node_name),
    }


def register_instruments(meter: Meter, store: SnapshotStore, metrics: Iterable[str], node_name: str) -> None:
    """One observable instrument per enabled metric, as the catalogue describes it."""
    instruments = Instruments(meter, store)
    bodies = observers(node_name)
    for name in metrics:
        instruments.add(BY_NAME[name], bodies[name])
