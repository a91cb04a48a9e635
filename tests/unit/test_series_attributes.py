"""The agent's per-series attributes: one immutable tuple that is a mapping, and the SDK's key for its set."""

from __future__ import annotations

import sys
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.util.types import AttributeValue

from otel_numa.series_attributes import SeriesAttributes, same_attributes, series_attributes, series_maker

POD: dict[str, AttributeValue] = {
    "k8s.pod.uid": "uid-1",
    "k8s.container.name": "app",
    "k8s.pod.name": "web-0",
    "k8s.namespace.name": "shop",
    "numa.node.id": 1,
    "numa.memory.type": "anon",
}


def test_flat_attributes_become_one_mapping_equal_to_the_dict_whatever_the_order() -> None:
    attributes = series_attributes(POD)
    backwards = series_attributes(dict(reversed(POD.items())))
    assert type(attributes) is SeriesAttributes
    assert attributes == backwards and hash(attributes) == hash(backwards)
    assert attributes == POD
    assert POD == attributes  # noqa: SIM300 (the dict's side: its comparison hands over to the mapping)
    assert (attributes != POD) is False
    assert dict(attributes) == POD and {**attributes} == POD and len(attributes) == 6
    assert attributes["numa.node.id"] == 1 and attributes.get("absent") is None
    assert "k8s.pod.uid" in attributes and "uid-1" not in attributes
    assert list(attributes) == sorted(POD)
    assert list(attributes.items()) == sorted(POD.items())
    assert list(attributes.values()) == [POD[key] for key in sorted(POD)]
    assert attributes != {**POD, "numa.node.id": 0}
    assert series_attributes(attributes) is attributes
    assert sys.getsizeof(attributes) < sys.getsizeof(POD) / 2


def test_attributes_that_are_not_flat_stay_as_they_are() -> None:
    for other in ({"ratio": 0.5}, {"on": True}, {"ids": (1, 2)}, {1: "x"}, {}):
        assert series_attributes(other) is other  # type: ignore[arg-type]


def test_same_attributes_compares_an_instruments_new_dict_with_the_kept_mapping() -> None:
    kept = series_attributes(POD)
    assert same_attributes(kept, dict(POD))
    assert not same_attributes(kept, {**POD, "numa.memory.type": "file"})
    assert not same_attributes(kept, {key: value for key, value in POD.items() if key != "numa.node.id"})
    assert not same_attributes(kept, {**POD, "numa.node.id": "1"})  # a string is another attribute value
    assert same_attributes(kept, dict(reversed(POD.items())))  # the keys in another order
    assert not same_attributes(kept, {**POD, "k8s.pod.name": 7})
    one = series_attributes({"numa.node.id": 1})
    assert same_attributes(one, {"numa.node.id": 1}) and not same_attributes(one, {"numa.node.id": 2})
    assert not same_attributes(one, {"numa.node.id": 1.5})  # not flat: compared as mappings


def test_a_series_maker_gives_the_mapping_of_the_base_and_the_added_keys() -> None:
    base = {
        key: POD[key] for key in ("k8s.pod.uid", "k8s.container.name", "k8s.pod.name", "k8s.namespace.name")
    }
    memory = series_maker(base, ("numa.node.id", "numa.memory.type"))
    made = memory(1, "anon")
    assert isinstance(made, SeriesAttributes)
    assert made == series_attributes(POD) and hash(made) == hash(series_attributes(POD)) and made == POD
    kept = series_attributes(POD)
    assert isinstance(kept, SeriesAttributes)
    assert tuple.__getitem__(made, 0) is tuple.__getitem__(kept, 0)  # one keys tuple for both
    assert memory(0, "file") == {**POD, "numa.node.id": 0, "numa.memory.type": "file"}
    assert same_attributes(series_attributes(POD), made)
    assert not same_attributes(series_attributes(POD), memory(1, "file"))
    assert same_attributes(POD, made) and not same_attributes({**POD, "numa.node.id": 0}, made)
    assert series_maker(base, ())() == base and series_maker({"a": "x"}, ("b",))(2) == {"a": "x", "b": 2}
    assert series_maker({}, ("numa.node.id",))(3) == {"numa.node.id": 3}
    # not flat, or a key given twice: a dict, as the instrument would have made it
    ratio = series_maker({"ratio": 0.5}, ("numa.node.id",))(1)
    assert type(ratio) is dict and ratio == {"ratio": 0.5, "numa.node.id": 1}
    twice = series_maker(base, ("k8s.pod.name",))("other")
    assert type(twice) is dict and twice == {**base, "k8s.pod.name": "other"}


def test_observations_hand_the_sdk_the_series_items_as_a_plain_mapping() -> None:
    """The SDK would read a SeriesAttributes (a tuple) as a sequence: the instruments' observations carry
    its items in a dict, and the same set built either way is one series."""
    from otel_numa.instruments.observations import Observations

    attributes = series_attributes(POD)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    provider.get_meter("t").create_observable_gauge(
        "g", callbacks=[lambda _options: Observations([7, 8], (attributes, dict(POD)))]
    )
    data = reader.get_metrics_data()
    assert data is not None
    points: list[Any] = list(data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points)
    assert [(dict(point.attributes), point.value) for point in points] == [(POD, 8)]  # one series
    provider.shutdown()
