"""Plumbing shared by the instrument modules."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.util.types import Attributes

from otel_numa.snapshot import Snapshot, SnapshotStore

Point = tuple[float | int, Attributes]
Observe = Callable[[Snapshot], Iterable[Point]]
Kind = Literal["updown", "gauge", "counter"]

NUMA_ID = "numa.node.id"
# OTLP encodes integer points as int64: one value beyond it would fail the whole export.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class Instruments:
    """Creates observable instruments whose callbacks turn the current snapshot into observations."""

    def __init__(self, meter: Meter, store: SnapshotStore) -> None:
        self._meter = meter
        self._store = store

    def add(self, kind: Kind, name: str, unit: str, description: str, observe: Observe) -> None:
        store = self._store

        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(value, attributes)
                for value, attributes in observe(store.current())
                if not isinstance(value, int) or INT64_MIN <= value <= INT64_MAX
            ]

        create = {
            # additive amounts sum correctly when a NUMA id is aggregated away
            "updown": self._meter.create_observable_up_down_counter,
            "gauge": self._meter.create_observable_gauge,
            "counter": self._meter.create_observable_counter,
        }[kind]
        create(name, callbacks=[callback], unit=unit, description=description)
