"""The instruments' shared callback (otel_numa/instruments/base.py): each series hands the SDK one attribute
dict for life, whatever its value and wherever it is listed, and numbers OTLP cannot carry are left out."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, cast

from opentelemetry.metrics import CallbackOptions, Observation

from otel_numa.instruments import health
from otel_numa.instruments.base import Instruments, Point
from otel_numa.instruments.catalogue import BY_NAME, METRICS
from otel_numa.instruments.observations import Observations
from otel_numa.model import Allocation, Source
from otel_numa.series_attributes import SeriesAttributes, series_maker
from otel_numa.snapshot.source_status import SourceRegistry
from otel_numa.snapshot.store import Snapshot, SnapshotStore
from otel_numa.sources.errors import SourceCorrupt

Callback = Callable[[CallbackOptions], Iterable[Observation]]


class RecordingMeter:
    """Keeps the callbacks an Instruments object registers (the SDK's meter would call them)."""

    def __init__(self) -> None:
        self.callbacks: list[Callback] = []

    def create_observable_gauge(self, name: str, callbacks: list[Callback], **_kwargs: Any) -> None:
        self.callbacks.extend(callbacks)

    create_observable_up_down_counter = create_observable_gauge
    create_observable_counter = create_observable_gauge


class NoStore:
    def current(self) -> Snapshot:
        return cast(Snapshot, None)


def test_each_series_keeps_its_first_attribute_dict_in_place_reordered_and_beside_new_ones() -> None:
    current: list[Point] = []
    meter = RecordingMeter()
    Instruments(cast(Any, meter), cast(SnapshotStore, NoStore())).add(
        METRICS[0], lambda _snapshot: iter(current)
    )
    (callback,) = meter.callbacks

    def observe(*points: tuple[int, str]) -> list[Observation]:
        """The observations as the instrument keeps them (iterated, they carry plain copies for the SDK)."""
        current[:] = [(value, {"pod": pod, "numa": 0}) for value, pod in points]  # new dicts every time
        made = callback(CallbackOptions())
        assert isinstance(made, Observations)
        pairs = zip(made.values, made.attributes, strict=True)
        return [Observation(value, attributes) for value, attributes in pairs]

    first = observe((1, "a"), (2, "b"))
    dicts = {str(o.attributes["pod"]): o.attributes for o in first if o.attributes is not None}
    for points in (
        ((3, "a"), (4, "b")),  # the same series in place, new values
        ((5, "b"), (6, "a")),  # another order
        ((7, "c"), (8, "a"), (9, "b")),  # a new series first
        ((2**70, "c"), (10, "a"), (11, "b")),  # an int64 overflow: left out
        ((12, "a"), (13, "b")),
    ):
        observed = observe(*points)
        expected = [(value, pod) for value, pod in points if value < 2**63]
        assert [(o.value, o.attributes["pod"] if o.attributes else None) for o in observed] == expected
        for o in observed:
            assert o.attributes is not None
            kept = dicts.setdefault(str(o.attributes["pod"]), o.attributes)
            assert o.attributes is kept
    assert set(dicts) == {"a", "b", "c"}


def test_the_same_series_in_place_keep_last_times_attributes_tuple() -> None:
    """New values for the same series, in the same order, come as Observations with the very tuple of
    attribute mappings of last time (one comparison for the SDK path to know the series are the same); a
    series more or fewer makes a new tuple."""
    from otel_numa.instruments.observations import Observations

    current: list[Point] = []
    meter = RecordingMeter()
    Instruments(cast(Any, meter), cast(SnapshotStore, NoStore())).add(
        METRICS[0], lambda _snapshot: iter(current)
    )
    (callback,) = meter.callbacks

    def observe(*points: tuple[int, str]) -> Observations:
        current[:] = [(value, {"pod": pod, "numa": 0}) for value, pod in points]
        observed = callback(CallbackOptions())
        assert type(observed) is Observations
        return observed

    first = observe((1, "a"), (2, "b"))
    again = observe((3, "a"), (4, "b"))
    assert again.attributes is first.attributes and again.values == [3, 4]
    more = observe((5, "a"), (6, "b"), (7, "c"))
    assert more.attributes is not first.attributes and more.attributes[:2] == first.attributes
    fewer = observe((8, "a"), (9, "b"))
    assert fewer.attributes is not more.attributes and fewer.attributes == first.attributes


def test_series_made_by_a_series_maker_keep_their_first_mapping_when_one_in_the_middle_goes() -> None:
    """Series as the container instruments make them (SeriesAttributes, new tuples every time): after one
    container's series went from the middle, or came back, each of the others still has its first
    mapping; every one in place again gives last time's tuple."""
    current: list[Point] = []
    meter = RecordingMeter()
    Instruments(cast(Any, meter), cast(SnapshotStore, NoStore())).add(
        METRICS[0], lambda _snapshot: iter(current)
    )
    (callback,) = meter.callbacks

    def observe(*pods: str) -> Observations:
        current[:] = []
        for value, pod in enumerate(pods):
            series = series_maker({"k8s.pod.uid": pod}, ("numa.node.id",))
            current.extend((value, series(node)) for node in (0, 1))
        observed = callback(CallbackOptions())
        assert type(observed) is Observations
        return observed

    last = observe("a", "b", "c", "d")
    for pods in (("a", "c", "d"), ("a", "b", "c", "d"), ("d", "c", "b", "a"), ("b", "x", "c")):
        observed = observe(*pods)
        assert [(o["k8s.pod.uid"], o["numa.node.id"]) for o in observed.attributes] == [
            (pod, node) for pod in pods for node in (0, 1)
        ]
        before = {(o["k8s.pod.uid"], o["numa.node.id"]): o for o in last.attributes}
        for o in observed.attributes:
            assert o is before.get((o["k8s.pod.uid"], o["numa.node.id"]), o)
        last = observed
    again = observe("b", "x", "c")
    assert again.attributes is observe("b", "x", "c").attributes


class FixedStore:
    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def current(self) -> Snapshot:
        return self._snapshot


def test_the_health_series_of_every_source_are_flat_attribute_tuples() -> None:
    """Sources are named by an enum; a member as an attribute value is not a plain string: the series would
    be copied by the SDK's own code at every collection instead of kept as one tuple."""
    registry = SourceRegistry()
    for source in Source:
        tracker = registry.tracker(source)
        with tracker.timed():
            tracker.failed(SourceCorrupt("bad"))
        tracker.succeeded()
    snapshot = Snapshot(time.monotonic(), None, Allocation(), registry.reports())
    meter = RecordingMeter()
    instruments = Instruments(cast(Any, meter), cast(SnapshotStore, FixedStore(snapshot)))
    names = ("numa.agent.source.errors", "numa.agent.source.age", "numa.agent.source.duration")
    for name in (*names, "numa.agent.source.success"):
        instruments.add(BY_NAME[name], health.OBSERVERS[name])
    for callback in meter.callbacks:
        made = callback(CallbackOptions())
        assert isinstance(made, Observations)
        assert len(made.attributes) >= len(Source)
        assert {type(attributes) for attributes in made.attributes} == {SeriesAttributes}
        values = {value for attributes in made.attributes for value in attributes.values()}
        assert {type(value) for value in values} == {str}  # exactly: not the enum's members
        assert {str(source) for source in Source} <= values
