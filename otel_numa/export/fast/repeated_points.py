"""Patch ``repeated_points``: an instrument whose observations did not change gets its last points again.

The agent's instruments hand the SDK the very same observations object while their inputs are unchanged
(otel_numa.instruments.base). The SDK still turns every observation into a Measurement, aggregates it and
collects every aggregation into a new point, on every collection. With one reader collecting cumulatively
(the page's, which also feeds the pushes: ``shared_collection``), consuming the same Measurements again
gives the same points with a new time. So, for the agent's own provider only:

- each of its observable instruments' ``callback`` (an instance attribute shadowing the SDK's method)
  hands over no Measurements when the instrument's callback returned the same object as last time and
  its last points can be repeated, nor when it returned new values for the very same series in the same
  order (new cgroup readings: the instruments then keep their attributes tuple) whose last points were
  one per observation, with ``slim_series`` on;
- each of its view-instrument matches' ``collect`` then returns those points with this collection's time
  (and the new values), made only when something reads them (:class:`PointList`): the page's
  translation of the same series reads the attribute and value tuples only.

Anything else goes through the SDK's own code: more than one reader, another view, a series forgotten
(``forget_departed`` swaps the aggregations), new series, a non-finite value.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from time import time_ns
from typing import Any

from opentelemetry.sdk.metrics.export import AggregationTemporality

from otel_numa.export.fast.new_matches import on_new_matches
from otel_numa.export.fast.patch import Patch, Raising, point_summaries
from otel_numa.export.fast.point_list import PointList
from otel_numa.export.fast.slim_series import PLAIN_POINTS, SlimMeasurements, finite, slim_point
from otel_numa.instruments.observations import Observations

_CUMULATIVE = AggregationTemporality.CUMULATIVE


@dataclass
class _Collected:
    """An instrument's data points from one collection of the provider's only (cumulative) reader."""

    source: object  # the Measurements they were made from (held: compared by identity)
    match: object  # the SDK's view-instrument match that made them
    aggregations: object  # its aggregations then: the janitor swaps in another dict when it forgets any
    attributes: tuple[Any, ...]
    starts: tuple[int, ...]
    values: tuple[Any, ...]

    def points(self, time: int) -> PointList:
        """The points again, at ``time`` (made when first read: a scrape of the same series reads none)."""
        attributes, starts, values = self.attributes, self.starts, self.values

        def make(part: slice) -> list[Any]:
            return [
                slim_point(series, start, time, value)
                for series, start, value in zip(attributes[part], starts[part], values[part], strict=True)
            ]

        return PointList.made_later(make, attributes, values, starts, time)


class _Unchanged:
    """Which instruments hand the SDK the same Measurements as in their last collection (one provider)."""

    def __init__(self, storage: Any) -> None:
        self._storage = storage  # the provider's only reader storage
        self.handed: dict[object, object] = {}  # instrument -> the Measurements handed over now
        self.repeating: dict[object, _Collected] = {}  # instrument -> points to repeat now
        self.last: weakref.WeakKeyDictionary[object, _Collected] = weakref.WeakKeyDictionary()

    def hand_over(self, instrument: object, source: object) -> None:
        self.repeating.pop(instrument, None)
        self.handed[instrument] = source

    def repeat(self, instrument: object, source: object) -> bool:
        """Whether ``instrument``'s last points were made from ``source``; if so they are repeated in this
        collection."""
        last = self._collected_from(instrument, source)
        if last is None:
            return False
        self._repeat(instrument, last)
        return True

    def revalue(self, instrument: object, before: object, now: SlimMeasurements) -> bool:
        """Whether ``instrument``'s last points were made from ``before``, one point per observation in
        their order, and ``now`` has new values for the very same series in place; if so, the last points
        with the new values stand for this collection. That is what consuming ``now`` would give: an
        observable instrument's cumulative sum or gauge keeps no value between collections, only its
        start time."""
        last = self._collected_from(instrument, before)
        if last is None or last.attributes is not now.observations.attributes:
            return False
        values = tuple(now.observations.values)
        collected = _Collected(now, last.match, last.aggregations, last.attributes, last.starts, values)
        self.last[instrument] = collected
        self._repeat(instrument, collected)
        return True

    def _collected_from(self, instrument: object, source: object) -> _Collected | None:
        """The instrument's last points, when they were made from ``source`` by its only match, whose
        aggregations nobody replaced since."""
        last = self.last.get(instrument)
        if last is None or last.source is not source:
            return None
        if getattr(last.match, "_attributes_aggregation", None) is not last.aggregations:
            return None
        matches = self._storage._instrument_view_instrument_matches.get(instrument)
        if not isinstance(matches, list) or len(matches) != 1 or matches[0] is not last.match:
            return None
        return last

    def _repeat(self, instrument: object, collected: _Collected) -> None:
        self.handed.pop(instrument, None)
        self.repeating[instrument] = collected


class _ReusedMeasurements:
    """Stands in for one observable instrument's ``callback``."""

    def __init__(
        self, instrument: Any, callback: Callable[[Any], Iterable[Any]], unchanged: _Unchanged
    ) -> None:
        self._instrument = weakref.ref(instrument)
        self._callback = callback  # the SDK's, bound to the instrument
        self._unchanged = unchanged
        self._made: tuple[object, Iterable[Any]] | None = None  # the last observations and their Measurements

    def __call__(self, callback_options: Any) -> Iterable[Any]:
        instrument = self._instrument()
        callbacks = getattr(instrument, "_callbacks", None)
        unchanged = self._unchanged
        if instrument is None or not isinstance(callbacks, list) or len(callbacks) != 1:
            unchanged.hand_over(instrument, None)
            return self._callback(callback_options)
        (callback,) = callbacks
        try:
            observations = callback(callback_options)
        except Exception as error:  # handed to the SDK's loop, which logs it as it always does
            observations = Raising(error)
        made = self._made
        if made is not None and made[0] is observations:
            if not made[1]:  # still no series (half the agent's instruments on a node without pods)
                return ()
            if unchanged.repeat(instrument, made[1]):
                return ()
            unchanged.hand_over(instrument, made[1])
            return made[1]
        if (
            made is not None
            and type(made[1]) is SlimMeasurements
            and type(observations) is Observations
            and observations.attributes is made[1].observations.attributes  # the same series in place
            and finite(observations.values)
            and instrument._is_enabled()
        ):
            now = SlimMeasurements(instrument, observations, time_ns())
            if unchanged.revalue(instrument, made[1], now):
                self._made = (observations, now)
                return ()
        # the SDK's loop over these observations; collections run one at a time (the consumer's lock)
        instrument._callbacks = [lambda _options: observations]
        try:
            handed = self._callback(callback_options)
            # slim Measurements (``slim_series``) are made again from the observations when read
            measurements = handed if type(handed) is SlimMeasurements else list(handed)
        finally:
            instrument._callbacks = callbacks
        if isinstance(observations, (list, Observations)):
            self._made = (observations, measurements)
            unchanged.hand_over(instrument, measurements)
        else:
            self._made = None
            unchanged.hand_over(instrument, None)
        return measurements


class _RepeatedPoints:
    """Stands in for one view-instrument match's ``collect``."""

    def __init__(self, match: Any, collect: Callable[[Any, int], Any], unchanged: _Unchanged) -> None:
        self._match = weakref.ref(match)
        self._collect = collect  # the SDK's, bound to the match
        self._unchanged = unchanged

    def __call__(self, temporality: Any, collection_start_nanos: int) -> Any:
        match = self._match()
        instrument = getattr(match, "_instrument", None)
        unchanged = self._unchanged
        last = unchanged.repeating.pop(instrument, None)
        if last is not None and last.match is match:
            return last.points(collection_start_nanos)
        points = self._collect(temporality, collection_start_nanos)
        handed = unchanged.handed.pop(instrument, None)
        if (
            handed is not None
            and temporality is _CUMULATIVE
            and isinstance(points, list)
            and points
            and all(type(point) in PLAIN_POINTS and not point.exemplars for point in points)
        ):
            attributes = tuple([point.attributes for point in points])
            if type(handed) is SlimMeasurements and _same_items(handed.observations.attributes, attributes):
                attributes = handed.observations.attributes  # the same series in the same order: one tuple
            collected = _Collected(
                handed,
                match,
                getattr(match, "_attributes_aggregation", None),
                attributes,
                tuple([point.start_time_unix_nano for point in points]),
                tuple([point.value for point in points]),
            )
            unchanged.last[instrument] = collected
            return PointList(points, attributes, collected.values, starts=collected.starts)
        elif instrument is not None:
            unchanged.last.pop(instrument, None)
        return points


def _same_items(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def repeat_points(provider: Any) -> bool:
    """Apply the patch to ``provider``'s observable instruments and matches (after the instruments are
    made, before the first collection); False, and nothing changed, unless it has exactly one reader."""
    consumer = provider._measurement_consumer
    storages = consumer._reader_storages
    if len(storages) != 1:
        return False
    (storage,) = storages.values()
    unchanged = _Unchanged(storage)
    for instrument in list(consumer._async_instruments):
        instrument.callback = _ReusedMeasurements(instrument, instrument.callback, unchanged)

    def patch_match(match: Any) -> None:
        match.collect = _RepeatedPoints(match, match.collect, unchanged)

    on_new_matches(storage, consumer._async_instruments, patch_match)
    return True


def _check() -> str | None:
    """Three throwaway providers, one public, one patched, one patched after ``slim_series``: over
    collections with the same observations, new values for the same series in place, new series, and a
    series gone, the same points (but for their times)."""
    from opentelemetry.metrics import CallbackOptions
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_numa.export.fast.slim_series import slim_series
    from otel_numa.series_attributes import series_attributes

    both = (series_attributes({"a": "x"}), series_attributes({"a": "y"}))
    one = both[:1]
    first = Observations([1, 2], both)
    rounds = [
        first,
        first,
        Observations([3, 2], both),
        Observations([4, 2.5], both),
        Observations([4, 2.5], (series_attributes({"a": "y"}), series_attributes({"a": "x"}))),
        Observations([3], one),
        Observations([5], one),
    ]
    collected: list[list[object]] = []
    for patched in (False, True, "slim"):
        reader = InMemoryMetricReader()
        provider = MeterProvider(
            metric_readers=[reader], shutdown_on_exit=False, exemplar_filter=AlwaysOffExemplarFilter()
        )
        current: list[Observations] = [rounds[0]]

        def observe(_options: CallbackOptions, current: list[Observations] = current) -> Observations:
            return current[0]

        try:
            meter = provider.get_meter("otel_numa.check")
            meter.create_observable_counter("check_counter", callbacks=[observe])
            meter.create_observable_gauge("check_gauge", callbacks=[observe])
            if patched == "slim" and not slim_series(provider, None):
                return "the provider has another shape"
            if patched and not repeat_points(provider):
                return "the provider has another shape"
            seen: list[object] = []
            for current[0] in rounds:
                data = reader.get_metrics_data()
                seen.append(point_summaries(data))
            collected.append(seen)
        finally:
            provider.shutdown()
    return None if collected[0] == collected[1] == collected[2] else "the points differ from the SDK's"


PATCH = Patch(
    name="repeated_points",
    replaces=(
        "the SDK's measure and collect loop for an instrument whose observations did not change; its points"
        " are made only when read (a scrape of the same series reads none)"
    ),
    private_names=(
        "MeterProvider._measurement_consumer",
        "SynchronousMeasurementConsumer._reader_storages",
        "SynchronousMeasurementConsumer._async_instruments",
        "_Asynchronous.callback",
        "_Asynchronous._callbacks",
        "MetricReaderStorage._get_or_init_view_instrument_match",
        "MetricReaderStorage._instrument_view_instrument_matches",
        "_ViewInstrumentMatch.collect",
        "_ViewInstrumentMatch._instrument",
        "_ViewInstrumentMatch._attributes_aggregation",
    ),
    check=_check,
)
