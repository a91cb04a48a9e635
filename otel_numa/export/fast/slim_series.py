"""Patch ``slim_series``: the agent's series kept in slots, keyed by the agent's own attribute mappings.

For every series of an observable instrument, the SDK keeps a copy of its attribute dict, a key made of
one tuple per attribute (``_hash_attributes``), and an aggregation object with a dict, a lock and a
reservoir; on every collection it makes a Measurement per observation, whose attributes it cleans
(``_clean_attribute_value``: another copy), and a data point with a dict. The agent already holds one
immutable, hashable mapping per series (:class:`~otel_numa.series_attributes.SeriesAttributes`), handed
again for as long as the series lives. So, for the agent's own provider only:

- each of its observable instruments' ``callback`` (an instance attribute shadowing the SDK's method)
  hands the SDK slotted Measurements that carry those mappings as they are, when the instrument's
  observations are all of that kind with finite values (what the SDK's cleaning would only copy);
- each of its view-instrument matches' ``consume_measurement`` keys such a Measurement's series by the
  mapping itself (a tuple of the sorted keys and the values, never equal to one of the SDK's keys, which
  start with a string) and keeps an observable counter's, up-down counter's or gauge's series in a
  slotted aggregation (:class:`ObservedSum`, :class:`ObservedLastValue`) with the SDK's arithmetic;
- those aggregations make slotted points (:class:`SlimPoint`, equal to the SDK's);
- the sum series an instrument makes new in one collection share one start time (the first one's), where
  the SDK reads the clock for each, microseconds apart.

Anything else goes through the SDK's own code: another kind of attributes or a non-finite value (the SDK
logs it), a view that keeps some keys only, a match that starts afresh at every collection, the overflow
series of the cardinality limit, a reservoir that keeps exemplars, an exemplar filter that samples.
Aggregations of one instrument are only consumed and collected under the SDK's consumer lock (one
collection at a time), so the slotted ones need no lock of their own.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable, Iterator
from time import time_ns
from typing import Any

from opentelemetry.sdk.metrics.export import AggregationTemporality, NumberDataPoint

from otel_numa.export.fast.new_matches import on_new_matches
from otel_numa.export.fast.patch import Patch, Raising, point_summaries
from otel_numa.instruments.observations import Observations
from otel_numa.series_attributes import SeriesAttributes

_DELTA = AggregationTemporality.DELTA
_CUMULATIVE = AggregationTemporality.CUMULATIVE


class SlimPoint(NumberDataPoint):
    """A ``NumberDataPoint`` in slots, with no exemplar list of its own (~110 bytes where the SDK's takes
    ~300). All of a collection's points exist at once, so they set how far memory rises while it runs.
    Equal to a ``NumberDataPoint`` with the same fields."""

    __slots__ = ("attributes", "exemplars", "start_time_unix_nano", "time_unix_nano", "value")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NumberDataPoint):
            return NotImplemented
        return _fields_of(self) == _fields_of(other)

    __hash__ = NumberDataPoint.__hash__


def _fields_of(point: NumberDataPoint) -> tuple[Any, ...]:
    return (
        point.attributes,
        point.start_time_unix_nano,
        point.time_unix_nano,
        point.value,
        list(point.exemplars),
    )


_NO_EXEMPLARS: tuple[()] = ()
_new_object = object.__new__
# a frozen dataclass's __init__ goes through object.__setattr__ per field: the slots are set directly
_set_attributes, _set_exemplars, _set_start, _set_time, _set_value = (
    SlimPoint.__dict__[name].__set__ for name in SlimPoint.__slots__
)
PLAIN_POINTS = frozenset({NumberDataPoint, SlimPoint})


def slim_point(attributes: Any, start: int | None, time: int, value: Any) -> NumberDataPoint:
    point = _new_object(SlimPoint)
    _set_attributes(point, attributes)
    _set_exemplars(point, _NO_EXEMPLARS)
    _set_start(point, start)
    _set_time(point, time)
    _set_value(point, value)
    return point


class ObservedSum:
    """An observable counter's or up-down counter's series as the SDK's ``_SumAggregation`` keeps it for an
    asynchronous instrument (cumulative input, no exemplars), in five slots; its points are the SDK's for a
    cumulative and for a delta collection alike."""

    __slots__ = ("_attributes", "_previous_start", "_previous_value", "_start", "_value")

    def __init__(self, attributes: Any, start_time_unix_nano: int) -> None:
        self._attributes = attributes
        self._start = start_time_unix_nano
        self._value: Any = None
        self._previous_value: Any = 0
        self._previous_start = start_time_unix_nano

    def aggregate(self, measurement: Any, should_sample_exemplar: bool = True) -> None:
        value = measurement.value  # one series observed twice in a collection adds up, as in the SDK
        self._value = value if self._value is None else self._value + value

    def collect(self, temporality: AggregationTemporality, start_nano: int) -> NumberDataPoint | None:
        value, self._value = self._value, None
        if value is None:
            return None
        start = self._start
        if temporality is _DELTA:
            value, self._previous_value = value - self._previous_value, value
            start, self._previous_start = self._previous_start, start_nano
        return slim_point(self._attributes, start, start_nano, value)


class ObservedLastValue:
    """An observable gauge's series as the SDK's ``_LastValueAggregation`` keeps it for an asynchronous
    instrument without exemplars, in two slots."""

    __slots__ = ("_attributes", "_value")

    def __init__(self, attributes: Any) -> None:
        self._attributes = attributes
        self._value: Any = None

    def aggregate(self, measurement: Any, should_sample_exemplar: bool = True) -> None:
        self._value = measurement.value

    def collect(self, temporality: AggregationTemporality, start_nano: int) -> NumberDataPoint | None:
        value, self._value = self._value, None
        if value is None:
            return None
        return slim_point(self._attributes, None, start_nano, value)


_SLOTTED = (ObservedSum, ObservedLastValue)


class SlimMeasurement:
    """What the SDK reads of a Measurement, in slots; the attributes are the agent's mapping as it is."""

    __slots__ = ("attributes", "context", "instrument", "time_unix_nano", "value")

    def __init__(self, value: Any, time_unix_nano: int, instrument: Any, attributes: Any) -> None:
        self.value = value
        self.time_unix_nano = time_unix_nano
        self.instrument = instrument
        self.context = None  # the exemplar filter is off: nothing samples in a context
        self.attributes = attributes


class SlimMeasurements:
    """One collection's Measurements of an instrument, made while they are read (none are kept)."""

    __slots__ = ("instrument", "observations", "time_unix_nano")

    def __init__(self, instrument: Any, observations: Observations, time_unix_nano: int) -> None:
        self.instrument = instrument
        self.observations = observations
        self.time_unix_nano = time_unix_nano

    def __len__(self) -> int:
        return len(self.observations)

    def __iter__(self) -> Iterator[SlimMeasurement]:
        observations, instrument, time = self.observations, self.instrument, self.time_unix_nano
        for value, attributes in zip(observations.values, observations.attributes, strict=True):
            yield SlimMeasurement(value, time, instrument, attributes)


class _SlimCallback:
    """Stands in for one observable instrument's ``callback``."""

    def __init__(self, instrument: Any, callback: Callable[[Any], Iterable[Any]]) -> None:
        self._instrument = weakref.ref(instrument)
        self._callback = callback  # the SDK's, bound to the instrument
        self._checked: object = None  # the last attributes tuple found to be all SeriesAttributes (held)

    def __call__(self, callback_options: Any) -> Iterable[Any]:
        instrument = self._instrument()
        callbacks = getattr(instrument, "_callbacks", None)
        if instrument is None or not isinstance(callbacks, list) or len(callbacks) != 1:
            return self._callback(callback_options)
        (callback,) = callbacks
        try:
            observations = callback(callback_options)
        except Exception as error:  # handed to the SDK's loop, which logs it as it always does
            observations = Raising(error)
        if type(observations) is Observations and self._slim(observations) and instrument._is_enabled():
            return SlimMeasurements(instrument, observations, time_ns())
        # the SDK's loop over these observations; collections run one at a time (the consumer's lock)
        instrument._callbacks = [lambda _options: observations]
        try:
            return list(self._callback(callback_options))
        finally:
            instrument._callbacks = callbacks

    def _slim(self, observations: Observations) -> bool:
        attributes = observations.attributes
        if attributes is not self._checked:
            if not all(type(each) is SeriesAttributes for each in attributes):
                return False
            self._checked = attributes
        return finite(observations.values)


def finite(values: Iterable[Any]) -> bool:
    """Whether every one of ``values`` is a finite number (what the SDK's loop takes as it is)."""
    try:
        return all(map(math.isfinite, values))
    except TypeError:  # not a number: the SDK's loop says what it makes of it
        return False


class _SlimConsume:
    """Stands in for one view-instrument match's ``consume_measurement``."""

    def __init__(self, match: Any, consume: Callable[..., None], slotted: Callable[[Any], Any]) -> None:
        self._match = weakref.ref(match)
        self._consume = consume  # the SDK's, bound to the match
        self._slotted = slotted
        # the time of the last Measurements that made a new sum series, and that series' start: the other
        # series new in the same collection take the same int (32 bytes a series, held for its life) where
        # the SDK reads the clock anew for each, a few microseconds apart
        self._first_start: tuple[object, int] | None = None

    def __call__(self, measurement: Any, should_sample_exemplar: bool = True) -> None:
        attributes = measurement.attributes
        match = self._match()
        if type(attributes) is not SeriesAttributes or match is None:
            self._consume(measurement, should_sample_exemplar)
            return
        aggregation = match._attributes_aggregation.get(attributes)
        if aggregation is None:
            with match._lock:
                aggregation = match._get_or_create_aggregation(attributes, attributes)
                aggregations = match._attributes_aggregation
                if aggregations.get(attributes) is aggregation:  # a new series (not the overflow series)
                    slotted = self._slotted(aggregation)
                    if type(slotted) is ObservedSum:
                        self._share_start(slotted, measurement.time_unix_nano)
                    if slotted is not None:
                        aggregations[attributes] = aggregation = slotted
        elif aggregation._attributes is not attributes and type(aggregation) in _SLOTTED:
            # the instrument made a new mapping for the same series: kept instead of the old one
            aggregation._attributes = attributes
        aggregation.aggregate(measurement, should_sample_exemplar)

    def _share_start(self, series: ObservedSum, collection: object) -> None:
        first = self._first_start
        if first is not None and first[0] is collection:
            series._start = series._previous_start = first[1]
        else:
            self._first_start = (collection, series._start)


def slim_series(provider: Any, stateless_reservoir: object) -> bool:
    """Apply the patch to ``provider``'s observable instruments and their matches (after the instruments are
    made, before the first collection); False, and nothing changed, where its exemplar filter samples.
    ``stateless_reservoir`` is the exemplar reservoir of the series that keep no exemplars."""
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter
    from opentelemetry.sdk.metrics._internal.aggregation import _LastValueAggregation, _SumAggregation

    consumer = provider._measurement_consumer
    if not isinstance(consumer._sdk_config.exemplar_filter, AlwaysOffExemplarFilter):
        return False

    def slotted(aggregation: Any) -> Any:
        """``aggregation`` (the SDK's, new) in slots, or None where the SDK's must stay."""
        if getattr(aggregation, "_reservoir", None) is not stateless_reservoir:
            return None
        kind = type(aggregation)
        if kind is _SumAggregation and aggregation._instrument_aggregation_temporality is _CUMULATIVE:
            return ObservedSum(aggregation._attributes, aggregation._start_time_unix_nano)
        if kind is _LastValueAggregation and aggregation._instrument_is_synchronous is False:
            return ObservedLastValue(aggregation._attributes)
        return None

    instruments = list(consumer._async_instruments)
    for instrument in instruments:
        instrument.callback = _SlimCallback(instrument, instrument.callback)

    def patch_match(match: Any) -> None:
        if match._view._attribute_keys is None and not match._reset_on_collect:
            match.consume_measurement = _SlimConsume(match, match.consume_measurement, slotted)

    for storage in consumer._reader_storages.values():
        on_new_matches(storage, instruments, patch_match)
    return True


class _KeepsNothing:
    """An exemplar reservoir that keeps nothing (the check's)."""

    def offer(self, *args: Any, **kwargs: Any) -> None:
        return None

    def collect(self, point_attributes: Any) -> list[Any]:
        return []


def _factory(builder: Callable[..., object]) -> Any:
    return lambda _aggregation: builder


def _check() -> str | None:
    """Two throwaway providers, one patched, each with a cumulative and a delta reader: over collections
    with the agent's mappings, new values, a series gone and back and another kind of attributes, the
    same points (but for their times), and the patched one keeps slotted series."""
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import (
        AlwaysOffExemplarFilter,
        MeterProvider,
        ObservableCounter,
        ObservableGauge,
        ObservableUpDownCounter,
    )
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.metrics.view import View

    from otel_numa.series_attributes import series_attributes

    x, y = series_attributes({"a": "x", "n": 1}), series_attributes({"a": "y", "n": 2})
    observable: list[type] = [ObservableCounter, ObservableUpDownCounter, ObservableGauge]
    rounds: list[object] = [
        Observations([1, 2], (x, y)),
        Observations([3, 2.5], (x, y)),
        Observations([4], (x,)),
        Observations([5, 6], (x, y)),
        [Observation(7, {"a": "z"}), Observation(1, {"b": True})],
        Observations([8, 9], (x, y)),
    ]
    reservoir = _KeepsNothing()

    def keeps_nothing(**_kwargs: Any) -> _KeepsNothing:
        return reservoir

    collected: list[list[object]] = []
    for patched in (False, True):
        readers = [
            InMemoryMetricReader(),
            InMemoryMetricReader(preferred_temporality=dict.fromkeys(observable, _DELTA)),
        ]
        provider = MeterProvider(
            metric_readers=readers,
            shutdown_on_exit=False,
            exemplar_filter=AlwaysOffExemplarFilter(),
            views=[View(instrument_name="*", exemplar_reservoir_factory=_factory(keeps_nothing))],
        )
        current: list[object] = [rounds[0]]

        def observe(_options: CallbackOptions, current: list[object] = current) -> Any:
            return current[0]

        try:
            meter = provider.get_meter("otel_numa.check")
            meter.create_observable_counter("check_counter", callbacks=[observe])
            meter.create_observable_up_down_counter("check_up_down", callbacks=[observe])
            meter.create_observable_gauge("check_gauge", callbacks=[observe])
            if patched and not slim_series(provider, reservoir):
                return "the provider has another shape"
            seen: list[object] = []
            for current[0] in rounds:
                for reader in readers:
                    data = reader.get_metrics_data()
                    seen.append(point_summaries(data))
            collected.append(seen)
            if patched:
                storages = provider._measurement_consumer._reader_storages.values()
                kinds = {
                    type(aggregation)
                    for storage in storages
                    for matches in storage._instrument_view_instrument_matches.values()
                    for match in matches
                    for key, aggregation in match._attributes_aggregation.items()
                    if type(key) is SeriesAttributes
                }
                if kinds != set(_SLOTTED):
                    return f"the series are kept as {sorted(kind.__name__ for kind in kinds)}"
        finally:
            provider.shutdown()
    return None if collected[0] == collected[1] else "the points differ from the SDK's"


PATCH = Patch(
    name="slim_series",
    replaces=(
        "the SDK's Measurements, attribute copies and keys, aggregations and points for the agent's series"
    ),
    private_names=(
        "MeterProvider._measurement_consumer",
        "SynchronousMeasurementConsumer._sdk_config",
        "SynchronousMeasurementConsumer._async_instruments",
        "SynchronousMeasurementConsumer._reader_storages",
        "_Asynchronous.callback",
        "_Asynchronous._callbacks",
        "_Asynchronous._is_enabled",
        "MetricReaderStorage._get_or_init_view_instrument_match",
        "_ViewInstrumentMatch.consume_measurement",
        "_ViewInstrumentMatch._attributes_aggregation",
        "_ViewInstrumentMatch._get_or_create_aggregation",
        "_ViewInstrumentMatch._lock",
        "_ViewInstrumentMatch._view",
        "_ViewInstrumentMatch._reset_on_collect",
        "View._attribute_keys",
        "_SumAggregation",
        "_SumAggregation._instrument_aggregation_temporality",
        "_SumAggregation._start_time_unix_nano",
        "_LastValueAggregation",
        "_LastValueAggregation._instrument_is_synchronous",
        "_Aggregation._attributes",
        "_Aggregation._reservoir",
    ),
    check=_check,
)
