"""Plumbing shared by the instrument modules."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.util.types import Attributes

from otel_numa.instruments.catalogue import NUMA_ID, MetricSpec
from otel_numa.instruments.observations import Observations
from otel_numa.series_attributes import (
    EMPTY_ATTRIBUTES,
    SeriesAttributes,
    same_attributes,
    series_attributes,
)
from otel_numa.snapshot.store import Snapshot, SnapshotStore

Point = tuple[float | int, Attributes]
Observe = Callable[[Snapshot], Iterable[Point]]
Part = Callable[[Snapshot], object]
__all__ = ["NUMA_ID", "Instruments", "Observe", "Part", "Point"]
log = logging.getLogger(__name__)
_failed_callbacks: set[str] = set()  # logged once each
# OTLP encodes integer points as int64: one value beyond it would fail the whole export.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class Instruments:
    """Creates observable instruments whose callbacks turn the current snapshot into observations."""

    def __init__(self, meter: Meter, store: SnapshotStore) -> None:
        self._meter = meter
        self._store = store

    def add(self, spec: MetricSpec, observe: Observe, part: Part | None = None) -> None:
        """``part``: the piece of the snapshot the points depend on only. While a snapshot carries the same
        piece (collectors hand back the same object while nothing changed), the same observations, with
        the same attribute dicts, are handed to the SDK again instead of being built anew."""
        store = self._store
        no_part = object()
        cache: tuple[object, Observations] = (no_part, Observations([], ()))

        previous = cache[1]  # the last observations made, one per series

        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            nonlocal cache, previous
            try:
                snapshot = store.current()
                key = part(snapshot) if part is not None else no_part
                cached_key, cached = cache  # one tuple: a concurrent reader sees a whole pair
                if key is cached_key and key is not no_part:
                    return cached
                observations = _stable_observations(observe(snapshot), previous)
                previous = observations
                if part is not None:
                    cache = (key, observations)
                return observations
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


def _exportable(value: float) -> bool:
    """Whether OTLP can carry ``value``: an integer beyond int64 is left out (its series with it)."""
    return not isinstance(value, int) or INT64_MIN <= value <= INT64_MAX


def _identity(attributes: Attributes) -> object:
    if type(attributes) is SeriesAttributes:
        return attributes  # hashable and equal for equal sets
    return (tuple(attributes), tuple(attributes.values())) if attributes else ()


def _stable_observations(points: Iterable[Point], previous: Observations) -> Observations:
    """``points`` as observations that hold the same attributes object for a series as long as it exists,
    whatever its value: last time's, found in place (one comparison a series: a pod that came or went
    shifts the rest by its series only) or else looked up among last time's. When every series is last
    time's, in last time's order (new values, as after a cgroup round), they keep last time's attributes
    tuple, which tells the export path that the series are the same."""
    kept = previous.attributes
    values: list[float | int] = []
    series: list[Attributes] = []
    position, in_place = 0, True
    where: dict[object, int] | None = None  # last time's series -> position, made at the first one moved
    for value, attributes in points:
        if not _exportable(value):
            in_place = False
            continue
        stable = kept[position] if position < len(kept) else None
        if stable is not None and (attributes is stable or same_attributes(stable, attributes)):
            position += 1
        else:
            in_place = False
            made = _series(attributes)
            if where is None:
                where = {_identity(old): index for index, old in enumerate(kept)}
            found = where.get(_identity(made))
            if found is None:
                stable = made
            else:
                stable, position = kept[found], found + 1
        values.append(value)
        series.append(stable)
    if in_place and position == len(kept):
        return Observations(values, kept)
    return Observations(values, tuple(series))


def _series(attributes: Attributes) -> Attributes:
    if type(attributes) is SeriesAttributes:
        return attributes
    return series_attributes(attributes) if attributes else EMPTY_ATTRIBUTES
