"""Every use of the OpenTelemetry SDK's private attributes, in one module owned by the pipeline.

Each use is listed in the README with the reason no public route exists; the SDK is pinned to the minor
version the tests prove (``~=`` in pyproject.toml), and tests/agent/test_sdk_private.py fails when a shape
changes.

Forgetting the attribute sets of departed pods, so that pod churn neither leaks nor overflows.

What the OpenTelemetry SDK (1.45) does with an observable instrument: every reader keeps one aggregation
per attribute set it was ever given, for the life of the MeterProvider. An attribute set that a callback
no longer reports is not exported (a cumulative sum or a gauge with no new value yields no point), so a
removed pod's series does disappear; but its aggregation stays, and counts towards the cardinality limit.
Once the limit is reached, every new attribute set lands in one ``otel.metric.overflow=true`` series:
after enough churn, new pods would lose their series and memory would grow with every pod ever seen.

The SDK has no public call to forget an attribute set, and the public alternative, a new MeterProvider or
readers removed and added again (``MeterProvider.remove_metric_reader``/``add_metric_reader``), forgets
everything: every cumulative counter of every series would restart with a new start time, and scrapes during
the swap would see no series or two copies of each. So :class:`DepartedSeriesJanitor` removes, from each
reader's storage, exactly the aggregations whose ``k8s.pod.uid`` belongs to no live pod, holding the
collection lock the SDK itself takes, so it never runs while a reader collects. Series of live pods keep
their state and start time.

This reaches into the SDK's private storage. It checks the shape it expects first; if a future SDK differs, it
logs one warning and does nothing (the cardinality limit then bounds memory, and the churn test fails, which
is how an SDK upgrade that changes the internals is caught).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import sys
import threading
import weakref
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics._internal.aggregation import _LastValueAggregation, _SumAggregation
from opentelemetry.sdk.metrics._internal.measurement import Measurement as _Measurement
from opentelemetry.sdk.metrics.export import AggregationTemporality, Gauge, NumberDataPoint, Sum
from prometheus_client.metrics_core import Metric as PrometheusMetric
from prometheus_client.utils import floatToGoString

from otel_numa.otlp_wire import number_point_places, write_points
from otel_numa.series_attributes import FLAT_VALUE_TYPES, SeriesAttributes, series_attributes

log = logging.getLogger(__name__)

POD_UID = "k8s.pod.uid"


class DepartedSeriesJanitor:
    def __init__(self, provider: MeterProvider) -> None:
        self._provider = provider
        self._warned = False
        # per view-instrument match, its aggregations when they were all of live pods, and how many there
        # were: the SDK only ever adds to that dict, so while it and the live pods stay the same, only a
        # longer dict has anything to forget
        self._live: frozenset[str] = frozenset()
        self._all_live: weakref.WeakKeyDictionary[Any, tuple[dict[Any, Any], int]] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def supported(self) -> bool:
        """Whether this SDK has the shape :meth:`forget` relies on (checked on the live provider)."""
        consumer = getattr(self._provider, "_measurement_consumer", None)
        storages = getattr(consumer, "_reader_storages", None)
        if getattr(consumer, "_lock", None) is None or not isinstance(storages, dict):
            return False
        for storage in storages.values():
            matches_by_instrument = getattr(storage, "_instrument_view_instrument_matches", None)
            if not isinstance(matches_by_instrument, dict):
                return False
            for matches in matches_by_instrument.values():
                for match in matches:
                    if not isinstance(getattr(match, "_attributes_aggregation", None), dict):
                        return False
                    if getattr(match, "_lock", None) is None:
                        return False
        return not self._warned

    def forget(self, live_pods: frozenset[str]) -> int:
        """Forget every attribute set whose ``k8s.pod.uid`` is not in ``live_pods``; returns how many were
        forgotten."""
        if live_pods != self._live:
            self._live = live_pods
            self._all_live.clear()
        consumer = getattr(self._provider, "_measurement_consumer", None)
        lock = getattr(consumer, "_lock", None)
        storages = getattr(consumer, "_reader_storages", None)
        if lock is None or not isinstance(storages, dict):
            self._unsupported("no measurement consumer")
            return 0
        forgotten = 0
        with lock:  # the lock held for a whole collection: no reader is collecting now
            for storage in list(storages.values()):
                matches_by_instrument = getattr(storage, "_instrument_view_instrument_matches", None)
                if not isinstance(matches_by_instrument, dict):
                    self._unsupported("no view-instrument matches")
                    return forgotten
                for matches in list(matches_by_instrument.values()):
                    for match in matches:
                        forgotten += self._forget_in(match, live_pods)
        return forgotten

    def _forget_in(self, match: Any, live_pods: frozenset[str]) -> int:
        aggregations = getattr(match, "_attributes_aggregation", None)
        match_lock = getattr(match, "_lock", None)
        if not isinstance(aggregations, dict) or match_lock is None:
            self._unsupported("no attribute aggregations")
            return 0
        with match_lock:
            aggregations = match._attributes_aggregation
            checked = self._all_live.get(match)
            if checked is not None and checked[0] is aggregations and checked[1] == len(aggregations):
                return 0
            kept = {}
            for key, aggregation in aggregations.items():
                attributes = getattr(aggregation, "_attributes", None)
                uid = attributes.get(POD_UID) if isinstance(attributes, Mapping) else None
                if not isinstance(uid, str) or uid in live_pods:
                    kept[key] = aggregation
            forgotten = len(aggregations) - len(kept)
            if forgotten:
                # a new dict swapped in whole: a reader that looks an aggregation up without the lock sees one
                # or the other, never a dict being changed
                match._attributes_aggregation = kept
            self._all_live[match] = (match._attributes_aggregation, len(kept))
            return forgotten

    def _unsupported(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "cannot forget departed pods' series with this OpenTelemetry SDK (%s); "
                "the cardinality limit bounds them instead",
                why,
            )


# Cheaper per-series paths ---------------------------------------------------------------------------
#
# The instruments hand the SDK the same attribute dict objects for a series from one collection to the
# next (otel_numa.instruments.base), flat dicts of string keys and string or integer values. The SDK
# copies and re-checks them and builds a nested key per series on every collection, and the Prometheus
# libraries sanitise the same label names again and again; these stand-ins skip the work that cannot
# change anything for such attributes and remember label names. Each wraps the original function and
# hands anything else to it; each is installed only when the module attribute it replaces has the
# expected shape (tests/agent/test_sdk_private.py).

_MEASUREMENT_MODULE = "opentelemetry.sdk.metrics._internal.measurement"
_MATCH_MODULE = "opentelemetry.sdk.metrics._internal._view_instrument_match"
_INSTRUMENT_MODULE = "opentelemetry.sdk.metrics._internal.instrument"
_PROMETHEUS_EXPORTER_MODULE = "opentelemetry.exporter.prometheus"
_OPENMETRICS_MODULE = "prometheus_client.openmetrics.exposition"


class _FlatAttributesKept:
    """``_clean_attribute_value`` for a Measurement's attributes: a flat dict of non-empty string keys and
    string/integer values, which the SDK's cleaning would only copy, is passed on as it is (the agent never
    changes an attribute dict it has handed over), and so is the agent's immutable :class:`SeriesAttributes`;
    anything else is cleaned by the SDK."""

    def __init__(self, clean: Callable[..., Any]) -> None:
        self._clean = clean

    def __call__(self, value: Any, max_length: int | None) -> Any:
        if max_length is None and type(value) is SeriesAttributes:
            return value
        if (
            max_length is None
            and type(value) is dict
            and "" not in value
            and _KEY_TYPES.issuperset(map(type, value))
            and FLAT_VALUE_TYPES.issuperset(map(type, value.values()))
        ):
            return value
        return self._clean(value, max_length)


class _CompactAttributeKeys:
    """The SDK's attribute-set key, in a smaller form for flat string/integer attributes (the agent's): the
    :class:`SeriesAttributes` tuple of the sorted keys (shared by every series with those keys), then the
    values in that order. Equal attribute sets give equal keys whatever their dict order; anything else
    (floats, booleans, sequences) takes the SDK's own form, whose first item is a string, so the two never
    collide. Each series' key, held by the SDK for its life, is then one tuple instead of one tuple per
    attribute, and the agent's own :class:`SeriesAttributes` are their own key."""

    def __init__(self, hash_attributes: Callable[[Any], Any]) -> None:
        self._hash = hash_attributes

    def __call__(self, attributes: Any) -> Any:
        if type(attributes) is SeriesAttributes:
            return attributes
        if type(attributes) is dict:
            key = series_attributes(attributes)
            if type(key) is SeriesAttributes:
                return key
        return self._hash(attributes)


_KEY_TYPES = frozenset({str})


class SlimPoint(NumberDataPoint):
    """A ``NumberDataPoint`` in slots, with no exemplar list of its own: ~110 bytes where the SDK's takes
    ~300 with its dict and list. The agent makes one per series at every collection, and all of a
    collection's exist at once, so they set how far memory rises while it runs. Equal to a
    ``NumberDataPoint`` with the same fields."""

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
_set_attributes, _set_exemplars, _set_start, _set_time, _set_value = (
    SlimPoint.__dict__[name].__set__ for name in SlimPoint.__slots__
)


def slim_point(attributes: Any, start: Any, time: int, value: Any) -> NumberDataPoint:
    """A :class:`SlimPoint` (set through its slots: a frozen dataclass's ``__init__`` costs more)."""
    point = _new_object(SlimPoint)
    _set_attributes(point, attributes)
    _set_exemplars(point, _NO_EXEMPLARS)
    _set_start(point, start)
    _set_time(point, time)
    _set_value(point, value)
    return point


_PLAIN_POINTS = frozenset({NumberDataPoint, SlimPoint})


class SlimObservation:
    """An observation in two slots, for the SDK's loop over an observable instrument's callback, which
    reads only its ``value``, ``attributes`` and ``context``: the API's ``Observation`` keeps a dict
    (~100 bytes), this takes 48."""

    __slots__ = ("attributes", "value")
    context = None  # no exemplars, so no context to sample them in

    def __init__(self, value: float | int, attributes: Any) -> None:
        self.value = value
        self.attributes = attributes


def slim_observation(value: float | int, attributes: Any) -> Observation:
    """A :class:`SlimObservation`, typed as the API's ``Observation`` it stands for."""
    return cast(Observation, SlimObservation(value, attributes))


class Observations:
    """An instrument's observations of one collection as two columns: the values, and the series'
    attribute mappings. The agent's instruments keep their last observations for as long as their inputs
    do not change, and hand the same attributes tuple again while their series are the same, with new
    values: 16 bytes a series where a list of observations takes 56, and "the same series in place" is
    one comparison. Iterated, it gives observations (made then), as the SDK's loop reads them."""

    __slots__ = ("attributes", "values")

    def __init__(self, values: list[float | int], attributes: tuple[Any, ...]) -> None:
        self.values = values
        self.attributes = attributes

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[Observation]:
        return map(slim_observation, self.values, self.attributes)


def _attributes_of(observations: Iterable[Any]) -> Iterable[Any]:
    if type(observations) is Observations:
        return observations.attributes
    return [observation.attributes for observation in observations]


def _values_of(observations: Iterable[Any]) -> Sequence[Any]:
    if type(observations) is Observations:
        return observations.values
    return [observation.value for observation in observations]


class _ReusedMeasurements:
    """Stands in for ``_Asynchronous.callback``, the SDK's loop that turns an observable instrument's
    observations into Measurements: while the instrument's callback hands back the very same list of
    observations (the agent's instruments do while their inputs are unchanged, and never change a list they
    handed over), none are handed on when the instrument's last points can be repeated
    (:class:`_RepeatedPoints`), or else the Measurements the SDK would make from it. A new list with last
    time's attribute dicts in place and finite numbers (new cgroup readings) gets its last points with the
    new values, and no Measurements at all, or else copies of a Measurement of the instrument with the new
    values. A Measurement's time and context serve only exemplars, which the agent switches off; the rest
    is the observation's. Anything else goes through the SDK's own loop."""

    def __init__(self, callback: Callable[..., Iterable[Any]], unchanged: _UnchangedInstruments) -> None:
        self._callback = callback
        self._unchanged = unchanged
        self._made: dict[object, _Made] = {}

    def __get__(self, instrument: Any, owner: type | None = None) -> Any:
        return self if instrument is None else functools.partial(self.__call__, instrument)

    def __call__(self, instrument: Any, callback_options: Any) -> Iterable[Any]:
        callbacks = instrument._callbacks
        if len(callbacks) != 1 or not instrument._is_enabled():
            self._unchanged.hand_over(instrument, None)
            return self._callback(instrument, callback_options)
        (callback,) = callbacks
        try:
            observations = callback(callback_options)
        except Exception as error:  # handed to the SDK's loop, which logs it as it always does
            observations = _Raising(error)
        made = self._made.get(instrument)
        if made is not None and made.observations is observations:
            if self._unchanged.repeat(instrument, made.source()):
                return ()
            self._unchanged.hand_over(instrument, made.source())
            return made.measured()
        measurements: list[Any] | None = None
        if made is not None and made.in_place(observations):
            if self._unchanged.revalue(instrument, made.source(), observations):
                self._made[instrument] = _Made(observations, made.template)
                return ()
            measurements = _copies(observations, made.template)
        if measurements is None:
            # the SDK's loop over these observations; collections run one at a time (the SDK's consumer lock)
            instrument._callbacks = [lambda _options: observations]
            try:
                measurements = list(self._callback(instrument, callback_options))
            finally:
                instrument._callbacks = callbacks
        if isinstance(observations, (list, Observations)):
            made = _Made.of(observations, measurements)
            self._made[instrument] = made
            self._unchanged.hand_over(instrument, made.source())
        else:
            self._unchanged.hand_over(instrument, None)
        return measurements


@dataclass
class _Made:
    """An instrument's last list of observations and how the SDK's Measurements are made from it."""

    observations: list[Any] | Observations
    # one of the instrument's Measurements, made by the SDK from an observation whose attribute dict it
    # kept as it is: the others are copies of it, made when needed and not kept (a Measurement per series
    # for nothing). None when the SDK's Measurements were not one per observation with the same dicts.
    template: Any
    measurements: list[Any] | None = None  # the SDK's, kept only when there is no template

    @classmethod
    def of(cls, observations: list[Any] | Observations, measurements: list[Any]) -> _Made:
        same = len(observations) == len(measurements) > 0 and all(
            m.attributes is a for a, m in zip(_attributes_of(observations), measurements, strict=True)
        )
        return cls(observations, measurements[0]) if same else cls(observations, None, measurements)

    def source(self) -> object:
        """What the instrument's points are made from (compared by identity): the observations, or the
        SDK's Measurements when they are not one per observation."""
        return self.observations if self.template is not None else self.measurements

    def measured(self) -> list[Any]:
        """The Measurements the SDK's loop would make from the observations."""
        if self.template is None:
            assert self.measurements is not None
            return self.measurements
        return _copies(self.observations, self.template)

    def in_place(self, observations: object) -> bool:
        """Whether ``observations`` have last time's attribute dicts, place by place, and finite numbers."""
        before = self.observations
        if self.template is None:
            return False
        if type(observations) is Observations:
            return (
                type(before) is Observations
                and observations.attributes is before.attributes
                and all(_finite_number(value) for value in observations.values)
            )
        if type(observations) is not list or type(before) is not list or len(observations) != len(before):
            return False
        for observation, previous in zip(observations, before, strict=True):
            if (
                observation.attributes is not previous.attributes
                or observation.context is not None
                or not _finite_number(observation.value)
            ):
                return False
        return True


def _copies(observations: list[Any] | Observations, template: Any) -> list[Any]:
    """Measurements for ``observations`` that the SDK's loop would make: copies of ``template`` (the
    instrument's, whose time and context serve only exemplars) with each observation's value and dict."""
    new = object.__new__
    base = template.__dict__
    result = []
    for value, attributes in zip(_values_of(observations), _attributes_of(observations), strict=True):
        copied = new(_Measurement)
        fields = copied.__dict__
        fields.update(base)
        fields["value"] = value
        fields["attributes"] = attributes
        result.append(copied)
    return result


_NUMBER_TYPES = frozenset({int, float})


def _finite_number(value: object) -> bool:
    return type(value) in _NUMBER_TYPES and math.isfinite(value)  # type: ignore[arg-type]


@dataclass
class _Collected:
    """An instrument's data points from one collection of the provider's only (cumulative) reader."""

    # what they came from (:meth:`_Made.source`): the observations, or the SDK's Measurements when these
    # were not one per observation (held: compared by identity)
    source: object
    match: object  # the SDK's view-instrument match that made them
    aggregations: object  # its aggregations then: the janitor swaps in another dict when it forgets any
    # per data point, in the SDK's order: its attributes, start time and value
    attributes: tuple[Any, ...]
    starts: tuple[int, ...]
    values: tuple[Any, ...]
    # for each point, the place of what it came from in ``source``, once asked for (:meth:`order`); an
    # empty tuple when the points are not one per item
    places: Sequence[int] | None = None

    def points(self, time: int) -> _Points:
        """The points again, at ``time``."""
        made = [
            slim_point(attributes, start, time, value)
            for attributes, start, value in zip(self.attributes, self.starts, self.values, strict=True)
        ]
        return _Points(made, self.attributes, self.values)

    def order(self, key_of: Callable[[Any], Any]) -> Sequence[int]:
        """Where each point's observation (or Measurement) is in the source, found by the SDK's own
        attribute-set key (the points' order is the SDK's aggregations', not the observations'). Empty when
        one made no point of its own (an attribute set twice, a view that drops keys, the cardinality
        limit's overflow point)."""
        if self.places is None:
            places: dict[Any, int] = {}
            source: Any = self.source
            for place, attributes in enumerate(_attributes_of(source)):
                places.setdefault(key_of(attributes), place)
            found = tuple(places.get(key_of(attributes), -1) for attributes in self.attributes)
            whole = len(places) == len(source) == len(found) and -1 not in found
            in_order = range(len(found))
            # usually the source's own order (the SDK keeps its series in the order they came): a range
            # then, not a tuple and an int per series
            self.places = (in_order if found == tuple(in_order) else found) if whole else ()
        return self.places


class _UnchangedInstruments:
    """Which instruments hand the SDK the same Measurements as in their last collection, shared by the two
    stand-ins that skip the work for them. With one reader collecting cumulatively, consuming the same
    Measurements again and collecting the aggregations gives the same points with a new time, so the
    points are made from the last ones instead; with more readers, each has its own aggregations and the
    SDK's path is taken."""

    def __init__(self, key_of: Callable[[Any], Any]) -> None:
        self.key_of = key_of  # the SDK's attribute-set key
        self.handed: dict[object, object] = {}  # instrument -> the source handed over in this collection
        self.repeating: dict[object, _Collected] = {}  # instrument -> points to repeat in this collection
        self.last: weakref.WeakKeyDictionary[object, _Collected] = weakref.WeakKeyDictionary()

    def hand_over(self, instrument: object, source: object) -> None:
        """The SDK consumes Measurements made from ``source`` (:meth:`_Made.source`) in this collection."""
        self.repeating.pop(instrument, None)
        self.handed[instrument] = source

    def repeat(self, instrument: Any, source: object) -> bool:
        """Whether ``instrument``'s last points were made from ``source``; if so they are repeated."""
        last = self._collected_from(instrument, source)
        if last is None:
            return False
        self._repeat(instrument, last)
        return True

    def revalue(self, instrument: Any, before: object, observations: list[Any] | Observations) -> bool:
        """Whether ``instrument``'s last points were made from ``before``, one point per element, and
        ``observations`` carry new values for the same attribute dicts in place (:meth:`_Made.in_place`);
        if so, the last points with the new values stand for this collection. That is what consuming them
        would give: an asynchronous instrument's cumulative sum or gauge keeps no value between
        collections, only its start time."""
        last = self._collected_from(instrument, before)
        if last is None:
            return False
        order = last.order(self.key_of)
        if not order:
            return False
        new = _values_of(observations)
        values = tuple(new) if type(order) is range else tuple([new[place] for place in order])
        collected = _Collected(
            observations, last.match, last.aggregations, last.attributes, last.starts, values, order
        )
        self.last[instrument] = collected
        self._repeat(instrument, collected)
        return True

    def _collected_from(self, instrument: Any, source: object) -> _Collected | None:
        """The instrument's last points, when they were made from ``source`` by its only view of the
        provider's only reader, whose aggregations the janitor has not replaced since."""
        last = self.last.get(instrument)
        if (
            last is None
            or last.source is not source
            or getattr(last.match, "_attributes_aggregation", None) is not last.aggregations
        ):
            return None
        storages = getattr(getattr(instrument, "_measurement_consumer", None), "_reader_storages", None)
        if not isinstance(storages, dict) or len(storages) != 1:
            return None
        (storage,) = storages.values()
        matches = getattr(storage, "_instrument_view_instrument_matches", {}).get(instrument)
        if not isinstance(matches, list) or len(matches) != 1 or matches[0] is not last.match:
            return None
        return last

    def _repeat(self, instrument: object, collected: _Collected) -> None:
        self.handed.pop(instrument, None)
        self.repeating[instrument] = collected


class _RepeatedPoints:
    """Stands in for ``_ViewInstrumentMatch.collect``: an instrument whose Measurements were not handed
    over because they are those of its last collection gets its last points again, with this collection's
    time; every other collection is the SDK's, and its points are remembered when they can be repeated
    (plain number points without exemplars, collected cumulatively from Measurements handed over whole)."""

    def __init__(self, collect: Callable[..., Any], unchanged: _UnchangedInstruments) -> None:
        self._collect = collect
        self._unchanged = unchanged

    def __get__(self, match: Any, owner: type | None = None) -> Any:
        return self if match is None else functools.partial(self.__call__, match)

    def __call__(self, match: Any, temporality: Any, collection_start_nanos: int) -> Any:
        instrument = getattr(match, "_instrument", None)
        unchanged = self._unchanged
        last = unchanged.repeating.pop(instrument, None)
        if last is not None and last.match is match:
            return last.points(collection_start_nanos)
        points = self._collect(match, temporality, collection_start_nanos)
        handed = unchanged.handed.pop(instrument, None)
        if (
            handed is not None
            and temporality is AggregationTemporality.CUMULATIVE
            and points
            and all(type(point) in _PLAIN_POINTS and not point.exemplars for point in points)
        ):
            attributes = tuple([point.attributes for point in points])
            if type(handed) is Observations and _same_items(handed.attributes, attributes):
                attributes = handed.attributes  # the same series in the same order: one tuple for both
            collected = _Collected(
                handed,
                match,
                getattr(match, "_attributes_aggregation", None),
                attributes,
                tuple([point.start_time_unix_nano for point in points]),
                tuple([point.value for point in points]),
            )
            unchanged.last[instrument] = collected
            return _Points(points, attributes, collected.values)
        if instrument is not None:
            unchanged.last.pop(instrument, None)
        return points


class _Points(list[Any]):
    """An instrument's points as the SDK hands them on (a list), with the tuples of their attribute mappings
    and of their values that :class:`_Collected` keeps: the translation for the page and the kept OTLP
    request take those instead of a tuple and a list of their own, and compare them by identity (the same
    tuple while the instrument's series are the same)."""

    __slots__ = ("attributes", "values")

    def __init__(self, points: Iterable[Any], attributes: tuple[Any, ...], values: tuple[Any, ...]) -> None:
        super().__init__(points)
        self.attributes = attributes
        self.values = values


def _same_items(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


class _UnreportedSeriesForgotten:
    """Stands in for ``_ViewInstrumentMatch.collect`` under :class:`_RepeatedPoints`: after the SDK collects
    one of the agent's observable instruments cumulatively, the aggregations that made no point (their
    attribute set was not observed in this collection) are forgotten. The SDK keeps them for the life of
    the provider, and only the janitor's departed pods would ever let them go: a live pod whose attribute
    set changes (a new placement, a memory type that went to zero on a node) left its old sets behind
    for as long as it lived. Such a set exports nothing either way; if it is observed again it starts
    afresh, with a new start time, as any new series does."""

    def __init__(self, collect: Callable[..., Any], own_meters: set[str]) -> None:
        self._collect = collect
        self._own_meters = own_meters

    def __get__(self, match: Any, owner: type | None = None) -> Any:
        return self if match is None else functools.partial(self.__call__, match)

    def __call__(self, match: Any, temporality: Any, collection_start_nanos: int) -> Any:
        points = self._collect(match, temporality, collection_start_nanos)
        aggregations = match._attributes_aggregation
        reported = len(points) if points else 0
        if reported >= len(aggregations) or temporality is not AggregationTemporality.CUMULATIVE:
            return points
        instrument = match._instrument
        if (
            getattr(instrument, "_callbacks", None) is None  # a synchronous instrument's sets stay
            or instrument.instrumentation_scope.name not in self._own_meters
        ):
            return points
        kept_attributes = {id(point.attributes) for point in points or ()}
        with match._lock:
            # a new dict swapped in whole, as the janitor does
            match._attributes_aggregation = {
                key: aggregation
                for key, aggregation in match._attributes_aggregation.items()
                if id(aggregation._attributes) in kept_attributes
            }
        return points


_LOCK_TYPE = type(threading.Lock())
_OWN_ATTRIBUTE_TYPES = frozenset({dict, SeriesAttributes})
# One lock for every aggregation of the agent's own instruments instead of one each (~90 bytes a series):
# their measurements are consumed and their points collected one collection at a time, under the SDK's
# consumer lock, so a lock per series never spares anyone a wait. Re-entrant, so that an SDK that ever took
# two aggregations' locks on one thread would still not wait on itself.
_OWN_AGGREGATIONS_LOCK = threading.RLock()


class _SharedAttributeDicts:
    """Stands in for ``_ViewInstrumentMatch.consume_measurement``. The SDK copies a measurement's attribute
    dict on every measurement, because a caller may change it later, and a new series' aggregation keeps
    the copy for life. The agent's own instruments (its meter's, ``own_meters``) hand one flat mapping per
    series that nothing ever changes (a :class:`SeriesAttributes`, or a dict; otel_numa.instruments.base),
    so a new series' aggregation keeps that mapping: a copy less per series. Their aggregations share one
    lock. Any other meter, a view that keeps only some attribute keys, or a match that starts afresh at
    every collection takes the SDK's path."""

    def __init__(
        self,
        consume: Callable[..., Any],
        own_meters: set[str],
        stateless_reservoirs: list[object],
        key_of: Callable[[Any], Any],
    ) -> None:
        self._consume = consume
        self._own_meters = own_meters
        self._stateless_reservoirs = stateless_reservoirs
        self._key_of = key_of
        # per match, the start time of its first series made in its first collection: the SDK reads the
        # clock anew for each series there (an int of 32 bytes each), where later collections give every new
        # series the one start of the last collection
        self._first_starts: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    def __get__(self, match: Any, owner: type | None = None) -> Any:
        return self if match is None else functools.partial(self.__call__, match)

    def __call__(self, match: Any, measurement: Any, should_sample_exemplar: bool = True) -> None:
        attributes = measurement.attributes
        if (
            type(attributes) not in _OWN_ATTRIBUTE_TYPES
            or not attributes
            or match._view._attribute_keys is not None
            or match._reset_on_collect
            or measurement.instrument.instrumentation_scope.name not in self._own_meters
        ):
            self._consume(match, measurement, should_sample_exemplar)
            return
        key = self._key_of(attributes)
        aggregation = match._attributes_aggregation.get(key)
        if aggregation is None:
            with match._lock:
                aggregation = match._get_or_create_aggregation(key, attributes)
                aggregation = _observed_series(match, key, aggregation, self._stateless_reservoirs)
                first_collection = getattr(match, "_previous_collection_start_nanos", 0) is None
                if first_collection and type(aggregation) is _ObservedSum:
                    aggregation._start = aggregation._previous_start = self._first_starts.setdefault(
                        match, aggregation._start
                    )
                if type(getattr(aggregation, "_lock", None)) is _LOCK_TYPE:
                    aggregation._lock = _OWN_AGGREGATIONS_LOCK
        elif aggregation._attributes is not attributes:
            # a series observed with a new dict of the same attributes: the aggregation takes the dict
            # the instrument now holds, so the old one is not kept beside it
            aggregation._attributes = attributes
        aggregation.aggregate(measurement, should_sample_exemplar)


class _ObservedSum:
    """An observable counter's or up-down counter's series as the SDK's ``_SumAggregation`` keeps it for an
    asynchronous instrument (cumulative values, no exemplars), in five slots: the SDK's object carries a
    dict of ten attributes, a reservoir and a lock (~200 bytes a series where this takes 72). Its points are
    the SDK's, for a cumulative and for a delta collection alike."""

    __slots__ = ("_attributes", "_previous_start", "_previous_value", "_start", "_value")

    def __init__(self, attributes: Any, start_time_unix_nano: int) -> None:
        self._attributes = attributes
        self._start = start_time_unix_nano
        self._value: Any = None
        self._previous_value: Any = 0
        self._previous_start = start_time_unix_nano

    def aggregate(self, measurement: Any, should_sample_exemplar: bool = True) -> None:
        # one series observed twice in a collection adds up, as in the SDK
        value = measurement.value
        self._value = value if self._value is None else self._value + value

    def collect(self, temporality: AggregationTemporality, start_nano: int) -> NumberDataPoint | None:
        value, self._value = self._value, None
        if value is None:
            return None
        start = self._start
        if temporality is AggregationTemporality.DELTA:
            value, self._previous_value = value - self._previous_value, value
            start, self._previous_start = self._previous_start, start_nano
        return slim_point(self._attributes, start, start_nano, value)


class _ObservedLastValue:
    """An observable gauge's series as the SDK's ``_LastValueAggregation`` keeps it for an asynchronous
    instrument without exemplars, in two slots (the SDK's object: a dict of six attributes, a reservoir
    and a lock)."""

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


def _observed_series(match: Any, key: Any, aggregation: Any, stateless_reservoirs: list[object]) -> Any:
    """The series the SDK has just made for ``key``, as an :class:`_ObservedSum` or an
    :class:`_ObservedLastValue` when it is an asynchronous instrument's sum or last value without
    exemplars (the agent's instruments): put in the SDK's place for it and returned; otherwise
    ``aggregation`` as it is (a synchronous instrument, a histogram, the cardinality limit's overflow
    series, a reservoir that keeps exemplars)."""
    reservoir = getattr(aggregation, "_reservoir", None)
    if match._attributes_aggregation.get(key) is not aggregation or not any(
        reservoir is stateless for stateless in stateless_reservoirs
    ):
        return aggregation
    kind = type(aggregation)
    observed: _ObservedSum | _ObservedLastValue
    if kind is _SumAggregation and aggregation._instrument_aggregation_temporality is _CUMULATIVE:
        observed = _ObservedSum(aggregation._attributes, aggregation._start_time_unix_nano)
    elif kind is _LastValueAggregation and aggregation._instrument_is_synchronous is False:
        observed = _ObservedLastValue(aggregation._attributes)
    else:
        return aggregation
    match._attributes_aggregation[key] = observed
    return observed


_CUMULATIVE = AggregationTemporality.CUMULATIVE


class _Raising:
    def __init__(self, error: Exception) -> None:
        self._error = error

    def __iter__(self) -> Any:
        raise self._error


class FastPaths:
    """The cheaper stand-ins, installed once per process."""

    def __init__(self) -> None:
        self.installed: list[str] = []
        self.own_meters: set[str] = set()  # meters whose instruments hand attribute dicts nothing changes
        # exemplar reservoirs that keep nothing, shared by every series (otel_numa.pipeline.NoExemplars): a
        # series with one needs no reservoir of its own
        self.stateless_reservoirs: list[object] = []

    def install(self, own_meter: str | None = None, stateless_reservoir: object | None = None) -> None:
        if own_meter is not None:
            self.own_meters.add(own_meter)
        if stateless_reservoir is not None and stateless_reservoir not in self.stateless_reservoirs:
            self.stateless_reservoirs.append(stateless_reservoir)
        if self.installed:
            return
        import importlib

        measurement = importlib.import_module(_MEASUREMENT_MODULE)
        match = importlib.import_module(_MATCH_MODULE)
        exporter = importlib.import_module(_PROMETHEUS_EXPORTER_MODULE)
        openmetrics = importlib.import_module(_OPENMETRICS_MODULE)
        self._replace(measurement, "_clean_attribute_value", _FlatAttributesKept)
        self._replace(match, "_hash_attributes", _CompactAttributeKeys)
        instrument = importlib.import_module(_INSTRUMENT_MODULE)
        unchanged = _UnchangedInstruments(match._hash_attributes)
        if self._replace(instrument._Asynchronous, "callback", lambda f: _ReusedMeasurements(f, unchanged)):
            self._replace(
                match._ViewInstrumentMatch,
                "collect",
                lambda f: _RepeatedPoints(_UnreportedSeriesForgotten(f, self.own_meters), unchanged),
            )
        self._replace(
            match._ViewInstrumentMatch,
            "consume_measurement",
            lambda f: _SharedAttributeDicts(
                f, self.own_meters, self.stateless_reservoirs, match._hash_attributes
            ),
        )
        self._replace(exporter, "sanitize_attribute", lambda f: functools.lru_cache(maxsize=4096)(f))
        self._replace(openmetrics, "escape_label_name", lambda f: functools.lru_cache(maxsize=4096)(f))

    def _replace(self, module: Any, name: str, wrap: Callable[[Any], Any]) -> Any:
        owner = f"{module.__module__}.{module.__qualname__}" if isinstance(module, type) else module.__name__
        original = getattr(module, name, None)
        if not callable(original) or getattr(original, "__module__", "").startswith("otel_numa"):
            log.warning("cannot speed up %s.%s with this library version", owner, name)
            return None
        replacement = wrap(original)
        setattr(module, name, replacement)
        self.installed.append(f"{owner}.{name}")
        return replacement


FAST_PATHS = FastPaths()


# Unchanged families: translated and rendered once ------------------------------------------------------
#
# The OTel Prometheus exporter translates every metric into a prometheus_client family on every scrape,
# and prometheus_client renders every sample again. Most of a node's series (allocation, per-container
# usage between cgroup rounds) do not change from one scrape to the next. The translation of a metric is
# reused while its data points have the same attribute dicts (the SDK keeps one per series) and the same
# values; a reused family's rendered text is reused too. Both go through the libraries' own code for
# anything that changed, so the page stays byte for byte what they would write.
#
# A family of one sample per data point (gauges, counters) is kept as its values and a recipe
# (:class:`_SeriesRecipe`): its samples, a name and a label dict per series (~450 bytes each), are made
# again by the exporter's translation only when something reads them. The page needs them only when a
# family's series change or a scraper asks for the other format; otherwise its text gets the new values.
# Such a family is translated and rendered a slice of series at a time (SERIES_PER_SLICE), so a scrape that
# renders it needs the samples of one slice at once, not of the whole family: the samples of the page's
# largest family (every container's memory per node and type) made the first scrape the process's
# high-water mark, and Python's allocator keeps the pages it touched (~0.8 MB on the 2x32 node).

_EOF = b"# EOF\n"
# zlib's fastest level for the text and requests kept between scrapes and pushes: compressed when they change,
# decompressed each time they are used
KEPT_COMPRESSION_LEVEL = 1
SERIES_PER_SLICE = 128  # ~80 KB of samples and text at once


@dataclass(eq=False)
class _SeriesRecipe:
    """What a family of one sample per data point is made from, but its values: the exporter's own
    translation of the metric (without its data points) with these attribute dicts. The same object while
    the series are the same (compared by identity)."""

    translate: Callable[..., None]  # the exporter's, unwrapped
    metric: Any  # the SDK's Metric, with no data points
    family_id: str
    attributes: tuple[Any, ...]  # the data points' attribute dicts, in order
    scope_attrs: Any
    resource_attrs: Any
    # whether every series has the same attribute keys: the exporter labels each sample with every key
    # of the metric's points ("" where a point lacks one), so only then is a slice's text the whole's
    sliced: bool

    def family(self, values: tuple[Any, ...], start: int = 0) -> Any:
        """The family the exporter makes from these series with ``values``, or from the ones from ``start``
        on, as many as ``values``."""
        attributes = self.attributes[start : start + len(values)]
        points = [slim_point(each, 0, 0, value) for each, value in zip(attributes, values, strict=True)]
        families: dict[str, Any] = {}
        self.translate(_with_points(self.metric, points), self.scope_attrs, self.resource_attrs, families)
        return families[self.family_id]

    def render(self, values: tuple[Any, ...], render: Callable[[_OneFamily], bytes]) -> bytes | None:
        """The family's text, rendered a slice of series at a time: the first slice's whole, the sample
        lines of the others. None if a slice is not one plain sample per series."""
        parts: list[bytes] = []
        step = SERIES_PER_SLICE if self.sliced else len(values)
        for start in range(0, len(values), step):
            some = values[start : start + step]
            family = self.family(some, start)
            if not _one_sample_per_point(((self.family_id, family),), some):
                return None
            text = render(_OneFamily(family))
            parts.append(text if start == 0 else _sample_lines(text))
        return b"".join(parts)


def _with_points(metric: Any, points: list[Any]) -> Any:
    return dataclasses.replace(metric, data=dataclasses.replace(metric.data, data_points=points))


def _sample_lines(text: bytes) -> bytes:
    """``text`` without its leading comment lines (a family's HELP, TYPE and UNIT)."""
    at = 0
    while text.startswith(b"#", at):
        at = text.index(b"\n", at) + 1
    return text[at:]


class _ValuesFamily(PrometheusMetric):
    """A family of one sample per data point, kept as its values and its recipe; its samples are made
    anew whenever they are read (and not kept)."""

    def __init__(self, family: Any, recipe: _SeriesRecipe, values: tuple[object, ...]) -> None:
        # no Metric.__init__: the names were checked when ``family`` was made
        self.name = family.name
        self.documentation = family.documentation
        self.unit = family.unit
        self.type = family.type
        self.recipe = recipe
        self.values = values

    @property
    def samples(self) -> list[Any]:
        return list(self.whole().samples)

    @samples.setter  # Metric's samples are a plain attribute; these cannot be set
    def samples(self, _samples: list[Any]) -> None:
        raise AttributeError("a family made from its recipe has no samples of its own")

    def whole(self) -> Any:
        """The family the exporter makes from the recipe and these values, samples and all."""
        return self.recipe.family(self.values)


@dataclass
class _Translation:
    attributes: tuple[object, ...]  # held, so that their ids cannot be reused while remembered
    values: tuple[object, ...]
    families: tuple[tuple[str, object], ...]  # (family id, prometheus_client family) as handed over
    # set for one family whose samples are the data points' values in order: new values only need a new
    # _ValuesFamily
    recipe: _SeriesRecipe | None = None


def _one_sample_per_point(families: tuple[tuple[str, Any], ...], values: tuple[object, ...]) -> bool:
    if len(families) != 1:
        return False
    samples = families[0][1].samples
    return len(samples) == len(values) and all(
        _plain(sample) and sample.value is value for sample, value in zip(samples, values, strict=True)
    )


def _same_keys(attributes: tuple[Any, ...]) -> bool:
    """Whether every series has the same attribute keys: the exporter then puts them in one family."""
    first = attributes[0]
    if type(first) is SeriesAttributes:
        keys = tuple.__getitem__(first, 0)
        return all(
            type(each) is SeriesAttributes and ((of := tuple.__getitem__(each, 0)) is keys or of == keys)
            for each in attributes
        )
    names = set(first or ())
    return all(set(each or ()) == names for each in attributes)


class _TranslatedMetrics:
    """Wraps the exporter collector's ``_translate_metric``."""

    def __init__(self, translate: Callable[..., None]) -> None:
        self._translate = translate
        self._known: dict[str, _Translation] = {}

    def __call__(
        self,
        metric: Any,
        scope_attrs: Any,
        resource_attrs: Any,
        metric_family_id_metric_family: dict[str, object],
    ) -> None:
        points = getattr(metric.data, "data_points", ())
        if type(points) is _Points:
            attributes, values = points.attributes, points.values
        else:
            # tuples from lists, made at their length: one from a generator is resized, and a scrape's worth
            # of them then moves from one of the interpreter's free lists to another (otel_numa.daemon.heap)
            attributes = tuple([point.attributes for point in points])
            values = tuple([getattr(point, "value", None) for point in points])
        key = f"{metric.name}|{metric.description}|{metric.unit}|{type(metric.data).__name__}"
        known = self._known.get(key)
        if (
            known is not None
            and len(known.attributes) == len(attributes)
            and all(a is b for a, b in zip(known.attributes, attributes, strict=True))
            and not any(family_id in metric_family_id_metric_family for family_id, _ in known.families)
        ):
            if known.values == values:
                metric_family_id_metric_family.update(known.families)
                return
            if known.recipe is not None and None not in values:
                ((family_id, family),) = known.families
                families = ((family_id, _ValuesFamily(family, known.recipe, values)),)
                metric_family_id_metric_family.update(families)
                self._known[key] = _Translation(known.attributes, values, families, known.recipe)
                return
        by_recipe = self._by_recipe(
            metric, attributes, values, scope_attrs, resource_attrs, metric_family_id_metric_family
        )
        if by_recipe is not None:
            metric_family_id_metric_family.update(by_recipe.families)
            self._known[key] = by_recipe
            return
        before = set(metric_family_id_metric_family)
        self._translate(metric, scope_attrs, resource_attrs, metric_family_id_metric_family)
        added = tuple((fid, fam) for fid, fam in metric_family_id_metric_family.items() if fid not in before)
        if None in values or any(fid in before for fid, _ in added) or not added:
            self._known.pop(key, None)  # histograms, merged families: translated every time
        else:
            self._known[key] = _Translation(attributes, values, added)

    def _by_recipe(
        self,
        metric: Any,
        attributes: tuple[Any, ...],
        values: tuple[object, ...],
        scope_attrs: Any,
        resource_attrs: Any,
        families: dict[str, object],
    ) -> _Translation | None:
        """A gauge's or counter's translation as a recipe, when the exporter makes one family of one plain
        sample per data point of it. Seen on its first slice of points, the only ones translated here, when
        its series have the same attribute keys: the whole family's samples then never exist at once (the
        page renders it slice by slice)."""
        if type(metric.data) not in (Gauge, Sum) or not values or None in values:
            return None
        sliced = _same_keys(attributes)
        first = values[:SERIES_PER_SLICE] if sliced else values
        translated: dict[str, object] = {}
        head = _with_points(metric, metric.data.data_points[: len(first)])
        self._translate(head, scope_attrs, resource_attrs, translated)
        probe = tuple(translated.items())
        if not _one_sample_per_point(probe, first) or probe[0][0] in families:
            return None  # not one plain sample per point, or merged into another metric's family
        ((family_id, family),) = probe
        without_points = _with_points(metric, [])
        recipe = _SeriesRecipe(
            self._translate, without_points, family_id, attributes, scope_attrs, resource_attrs, sliced
        )
        kept = ((family_id, _ValuesFamily(family, recipe, values)),)
        return _Translation(attributes, values, kept, recipe)


class _OneFamily:
    def __init__(self, family: object) -> None:
        self._family = family

    def collect(self) -> list[object]:
        return [self._family]


@dataclass
class _RenderedFamily:
    # the family's text, compressed (its label sets repeat from line to line: a twentieth of the bytes); a
    # scrape decompresses it, which costs a fraction of rendering or compressing it
    compressed: bytes
    # where each sample's value starts in ``text`` (it ends at the line's end); None when the family's
    # lines are not one plain "<series> <value>" line per sample
    value_starts: array[int] | None
    # what the text was rendered from: a recipe and values, or else the family itself (held)
    recipe: _SeriesRecipe | None
    values: tuple[object, ...] | None
    family: Any

    @property
    def text(self) -> bytes:
        return zlib.decompress(self.compressed)


def _kept(data: bytes) -> bytes:
    """The compressed form in which text and requests are kept between scrapes and pushes."""
    return zlib.compress(data, KEPT_COMPRESSION_LEVEL)


class RenderedFamilies:
    """A stand-in for prometheus_client's text and OpenMetrics encoders that, for registries that ask for
    it, reuses the previous scrape's text of a family with the same series and values, writes only the new
    values into it for a family with the same series, and renders the rest through the library."""

    def __init__(self, text_encoder: Callable[..., bytes], openmetrics_encoder: Callable[..., bytes]) -> None:
        self.text_encoder = text_encoder
        self.openmetrics_encoder = openmetrics_encoder
        self._form: tuple[object, ...] = ()
        self._last: dict[str, _RenderedFamily] = {}  # by family name, for the last form asked for

    def text(self, registry: Any, **options: str) -> bytes:
        if not getattr(registry, "renders_by_family", False):
            return self.text_encoder(registry, **options)
        form = ("text", *sorted(options.items()))
        return self._render(registry, form, lambda one: self.text_encoder(one, **options))

    def openmetrics(self, registry: Any, **options: str) -> bytes:
        if not getattr(registry, "renders_by_family", False):
            return self.openmetrics_encoder(registry, **options)

        def render(one: _OneFamily) -> bytes:
            return self.openmetrics_encoder(one, **options).removesuffix(_EOF)

        return self._render(registry, ("openmetrics", *sorted(options.items())), render) + _EOF

    def _render(
        self, registry: Any, form: tuple[object, ...], render: Callable[[_OneFamily], bytes]
    ) -> bytes:
        # one form kept: a Prometheus server asks for the same one every time
        last = self._last if form == self._form else {}
        now: dict[str, _RenderedFamily] = {}
        parts: list[bytes] = []
        for family in registry.collect():
            known = last.get(family.name)
            rendered = _again(known, family) if known is not None else None
            if rendered is None:
                rendered = _rendered(family, render)
            now[family.name] = rendered
            parts.append(rendered.text)
        self._form, self._last = form, now
        return b"".join(parts)


def _again(known: _RenderedFamily, family: Any) -> _RenderedFamily | None:
    """``known``'s text for ``family``, with the new values written in; None when the series differ."""
    if isinstance(family, _ValuesFamily):
        if family.recipe is not known.recipe:
            return None
        if family.values == known.values:
            return known
        return _with_new_values(known, family.values) if known.value_starts is not None else None
    if known.family is family:
        return known
    if known.value_starts is not None and known.family is not None and _same_series(known.family, family):
        return _with_new_values(known, tuple([sample.value for sample in family.samples]), family)
    return None


def _rendered(family: Any, render: Callable[[_OneFamily], bytes]) -> _RenderedFamily:
    """``family`` rendered through the library (a recipe's family slice by slice, not kept)."""
    if isinstance(family, _ValuesFamily):
        text = family.recipe.render(family.values, render)
        if text is not None:
            starts = _value_starts(text, len(family.values))
            return _RenderedFamily(_kept(text), starts, family.recipe, family.values, None)
        whole = family.whole()  # a slice that is not one plain sample per series: the whole, as it is
        text = render(_OneFamily(whole))
        return _RenderedFamily(_kept(text), _plain_starts(text, whole), family.recipe, family.values, None)
    text = render(_OneFamily(family))
    return _RenderedFamily(_kept(text), _plain_starts(text, family), None, None, family)


def _plain_starts(text: bytes, family: Any) -> array[int] | None:
    if not all(_plain(sample) for sample in family.samples):
        return None
    return _value_starts(text, len(family.samples))


def _plain(sample: Any) -> bool:
    return (
        sample.value is not None
        and sample.timestamp is None
        and sample.exemplar is None
        and getattr(sample, "native_histogram", None) is None
    )


def _value_starts(text: bytes, samples: int) -> array[int] | None:
    """Where each of the ``samples`` plain samples' value starts, when each is one line after the comment
    lines."""
    lines = text.split(b"\n")
    if lines[-1]:  # not one line each
        return None
    starts = array("i")  # 4 bytes an offset: a family's text is far below 2 GiB
    offset = 0
    for line in lines[:-1]:
        if not line.startswith(b"#"):
            space = line.rfind(b" ")
            if space < 0:
                return None
            starts.append(offset + space + 1)
        offset += len(line) + 1
    return starts if len(starts) == samples else None


def _same_series(before: Any, now: Any) -> bool:
    return (
        before.type == now.type
        and before.documentation == now.documentation
        and before.unit == now.unit
        and len(before.samples) == len(now.samples)
        and all(
            a.name == b.name and (a.labels is b.labels or a.labels == b.labels) and _plain(b)
            for a, b in zip(before.samples, now.samples, strict=True)
        )
    )


def _with_new_values(
    known: _RenderedFamily, values: tuple[object, ...], family: Any = None
) -> _RenderedFamily:
    """``known``'s text with each sample's value replaced by ``values``' (prometheus_client's own number
    format); ``family`` is held when the family has no recipe."""
    text = known.text
    parts: list[bytes] = []
    starts = array("i")  # 4 bytes an offset: a family's text is far below 2 GiB
    written = 0  # length of the new text so far
    copied_to = 0  # how far the old text has been copied
    for start, value in zip(known.value_starts or (), values, strict=True):
        end = text.index(b"\n", start)
        head = text[copied_to:start]
        number = floatToGoString(value).encode()  # type: ignore[no-untyped-call]
        parts += (head, number)
        written += len(head)
        starts.append(written)
        written += len(number)
        copied_to = end
    parts.append(text[copied_to:])
    return _RenderedFamily(_kept(b"".join(parts)), starts, known.recipe, values, family)


def speed_up_prometheus_reader(reader: Any) -> bool:
    """Reuse unchanged metrics' translations in this reader; False when the exporter's shape differs."""
    collector = getattr(reader, "_collector", None)
    translate = getattr(collector, "_translate_metric", None)
    if collector is None or not callable(translate):
        log.warning("cannot reuse unchanged translations with this Prometheus exporter version")
        return False
    collector._translate_metric = _TranslatedMetrics(translate)
    return True


def install_family_rendering() -> RenderedFamilies | None:
    """Route prometheus_client's encoders through :class:`RenderedFamilies` (once per process)."""
    import prometheus_client.exposition as exposition
    import prometheus_client.openmetrics.exposition as openmetrics

    current = exposition.generate_latest
    owner = getattr(current, "__self__", None)
    if isinstance(owner, RenderedFamilies):
        return owner
    if not callable(current) or not callable(getattr(openmetrics, "generate_latest", None)):
        log.warning("cannot reuse rendered families with this prometheus_client version")
        return None
    rendered = RenderedFamilies(current, openmetrics.generate_latest)
    setattr(exposition, "generate_latest", rendered.text)  # noqa: B010  (a module global, replaced)
    setattr(openmetrics, "generate_latest", rendered.openmetrics)  # noqa: B010
    return rendered


# OTLP pushes: the previous request, with the new values written in -----------------------------------
#
# The OTLP exporters encode every data point again on every push: its attributes into protobuf KeyValues,
# which is most of a push's cost. Between two pushes a node's series are nearly always the same (the SDK
# hands the same attribute dict per series); only values and times move. So the request of the previous
# push is kept, encoded, and while a collection has the same resources, scopes, metrics and series in the
# same order, the new values and times are written into its bytes (otel_numa.otlp_wire), which are parsed
# into the request handed to the exporter. Anything else is encoded by the exporter's own
# ``encode_metrics``, whose request becomes the one kept.

_OTLP_EXPORTER_MODULES = {
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.metric_exporter",
}


class _ReusedRequests:
    """Wraps an OTLP exporter module's ``encode_metrics``."""

    def __init__(self, encode: Callable[[Any], Any]) -> None:
        self._encode = encode
        self._lock = threading.Lock()
        self._kept: _KeptRequest | None = None

    def __call__(self, data: Any) -> Any:
        layout: list[object] = []
        points: list[Any] = []
        for resource_metrics in data.resource_metrics:
            layout.append(resource_metrics.resource)
            for scope_metrics in resource_metrics.scope_metrics:
                layout.append(scope_metrics.scope)
                for metric in scope_metrics.metrics:
                    sums = metric.data
                    if not isinstance(sums, Sum | Gauge):  # histograms: the exporter's own path
                        return self._encode(data)
                    layout.append(
                        (
                            metric.name,
                            metric.description,
                            metric.unit,
                            type(sums),
                            getattr(sums, "aggregation_temporality", None),
                            getattr(sums, "is_monotonic", None),
                            len(sums.data_points),
                        )
                    )
                    if type(sums.data_points) is _Points:  # no exemplars; one tuple of their attributes
                        layout.append(sums.data_points.attributes)
                        points += sums.data_points
                        continue
                    for point in sums.data_points:
                        if point.exemplars:
                            return self._encode(data)
                        layout.append(point.attributes)
                        points.append(point)
        with self._lock:
            kept = self._kept
            # every time and value is written, start times too: a delta sum starts anew at every push,
            # and a series the janitor forgot comes back with the same attribute dict but a new start
            if kept is not None and _same_layout(layout, kept.layout):
                encoded = bytearray(zlib.decompress(kept.compressed))
                if write_points(encoded, kept.places, points):
                    return kept.parse(bytes(encoded))
            request = self._encode(data)
            self._kept = None
            serialized = request.SerializeToString()
            places = number_point_places(serialized)
            # kept only when it has one encoded point per data point, in the same order
            if places is not None and len(places) == 3 * len(points):
                self._kept = _KeptRequest(_kept(serialized), places, layout, type(request).FromString)
            return request


@dataclass(frozen=True)
class _KeptRequest:
    # the request as it was first encoded, compressed: its attribute strings repeat from series to series,
    # so it takes a sixteenth of its bytes (a parsed request would take ~4.5x them); every push writes all
    # its numbers anew into a decompressed copy
    compressed: bytes
    places: array[int]  # where its numbers lie in the decompressed bytes (otel_numa.otlp_wire)
    layout: list[object]  # held, so that the ids compared with it cannot be reused
    parse: Callable[[bytes], Any]


def _same_layout(now: list[object], before: list[object]) -> bool:
    # resources, scopes and attribute dicts by identity; the metrics' descriptions and the tuples of their
    # points' attribute mappings (the same tuple while the series are the same) by value
    return len(now) == len(before) and all(
        a is b or (type(a) is tuple and a == b) for a, b in zip(now, before, strict=True)
    )


def reuse_otlp_requests(protocol: str) -> bool:
    """Have the OTLP exporter of ``protocol`` (already imported) reuse its previous request; False when its
    module's shape differs."""
    module = sys.modules.get(_OTLP_EXPORTER_MODULES.get(protocol, ""))
    encode = getattr(module, "encode_metrics", None)
    if isinstance(encode, _ReusedRequests):
        return True
    if module is None or not callable(encode):
        log.warning("cannot reuse OTLP requests with this exporter version")
        return False
    setattr(module, "encode_metrics", _ReusedRequests(encode))  # noqa: B010  (a module global, replaced)
    return True
