"""Plumbing shared by the instrument modules."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.util.types import Attributes

from otel_numa.catalogue import NUMA_ID, MetricSpec
from otel_numa.snapshot import Snapshot, SnapshotStore

Point = tuple[float | int, Attributes]
Observe = Callable[[Snapshot], Iterable[Point]]
__all__ = ["NUMA_ID", "Instruments", "Observe", "Point"]
log = logging.getLogger(__name__)
_failed_callbacks: set[str] = set()  # logged once each
# OTLP encodes integer points as int64: one value beyond it would fail the whole export.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class Instruments:
    """Creates observable instruments whose callbacks turn the current snapshot into observations."""

    def __init__(self, meter: Meter, store: SnapshotStore) -> None:
        self._meter = meter
        self._store = store

    def add(self, spec: MetricSpec, observe: Observe) -> None:
        store = self._store

        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            try:
                return [
                    Observation(value, attributes)
                    for value, attributes in observe(store.current())
                    if not isinstance(value, int) or INT64_MIN <= value <= INT64_MAX
                ]
            except Exception:  # a bug here costs this instrument's series, never the page
                if spec.name not in _failed_callbacks:
                    _failed_callbacks.add(spec.name)
                    log.exception("internal error observing %s; its series are left out", spec.name)
                return []

        create = {
            # additive amounts sum correctly when a NUMA id is aggregated away
            "updown": self._meter.create_observable_up_down_counter,
            "gauge": self._meter.create_observable_gauge,
            "counter": self._meter.create_observable_counter,
        }[spec.kind]
        create(spec.name, callbacks=[callback], unit=spec.unit, description=spec.description)
