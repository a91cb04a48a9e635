"""OpenTelemetry observable instruments, registered from the catalogue; callbacks read the pinned snapshot."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from opentelemetry.metrics import Meter

from otel_numa.instruments import allocation, compat, container_usage, enrichment, health, machine
from otel_numa.instruments.base import Instruments, Observe, Part
from otel_numa.instruments.catalogue import BY_NAME, EXPORT_METRICS
from otel_numa.snapshot.store import Snapshot, SnapshotStore


def _allocation(snapshot: Snapshot) -> object:
    return snapshot.allocation


def _container_usage(snapshot: Snapshot) -> object:
    return snapshot.container_usage


def _cpu_pinned(snapshot: Snapshot) -> object:
    return snapshot.cpu_pinned


def observers(
    node_name: str, fast_path: bool = False, pushes: health.Pushes | None = None
) -> Mapping[str, tuple[Observe, Part | None]]:
    """Every catalogue metric's callback body, by OTel name, with the snapshot part it depends on only
    (``None``: it changes with every collection); ``fast_path``: whether the accelerated export path
    serves; ``pushes``: what the OTLP pushes did (none: no export series)."""
    found: dict[str, tuple[Observe, Part | None]] = dict(machine.OBSERVERS)
    pushed: list[tuple[Mapping[str, Observe], Part | None]] = []
    if pushes is not None:
        pushed = [
            (health.export_observers(pushes), lambda _snapshot: pushes.generation),
            (health.export_age_observers(pushes), None),
        ]
    for bodies, part in (
        (allocation.OBSERVERS, _allocation),
        (enrichment.OBSERVERS, _allocation),
        (container_usage.OBSERVERS, _container_usage),
        (container_usage.PINNED_OBSERVERS, _cpu_pinned),
        (health.OBSERVERS, None),
        (health.fast_path_observers(fast_path), None),
        *pushed,
        (compat.observers(node_name), None),
    ):
        found.update((name, (body, part)) for name, body in bodies.items())
    return found


def register_instruments(
    meter: Meter,
    store: SnapshotStore,
    metrics: Iterable[str],
    node_name: str,
    *,
    fast_path: bool = False,
    pushes: health.Pushes | None = None,
) -> None:
    """One observable instrument per enabled metric, as the catalogue describes it; the export series only
    where ``pushes`` is given (the otlp exporter is on)."""
    instruments = Instruments(meter, store)
    bodies = observers(node_name, fast_path, pushes)
    for name in metrics:
        if name in EXPORT_METRICS and pushes is None:
            continue
        observe, part = bodies[name]
        instruments.add(BY_NAME[name], observe, part)
