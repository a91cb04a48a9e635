"""New times and values written into an encoded OTLP request are the encoder's own bytes for them."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData

from otel_numa.otlp_wire import ABSENT, number_point_places, write_points


class Node:
    """A meter with a gauge and a counter of two series each, whose values the test sets."""

    def __init__(self) -> None:
        self.values: dict[str, list[int | float]] = {"gauge": [1, 2.5], "counter": [3, 4]}
        self.reader = InMemoryMetricReader()
        meter = MeterProvider(metric_readers=[self.reader]).get_meter("wire")
        meter.create_observable_gauge("g", callbacks=[self._observe("gauge")])
        meter.create_observable_counter("c", callbacks=[self._observe("counter")])

    def _observe(self, name: str) -> Any:
        attributes = [{"series": "a"}, {"series": "b"}]

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(v, a) for v, a in zip(self.values[name], attributes, strict=True)]

        return observe

    def collect(self) -> MetricsData:
        data = self.reader.get_metrics_data()
        assert data is not None
        return data


def points_of(data: MetricsData) -> list[Any]:
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    ]


def test_new_values_written_in_place_are_the_encoders_bytes() -> None:
    node = Node()
    first = encode_metrics(node.collect()).SerializeToString()
    places = number_point_places(first)
    assert places is not None and len(places) == 12
    starts = list(places[0::3])
    assert starts[:2] == [ABSENT, ABSENT] and ABSENT not in starts[2:]  # gauges have no start time
    encoded = bytearray(first)
    values: list[dict[str, list[int | float]]] = [
        {"gauge": [2.5, 7], "counter": [5, 6]},  # int <-> double in both directions
        {"gauge": [0, 0.0], "counter": [0, -1]},  # zeros are still written: the value is a oneof
        {"gauge": [-(2**63), 2**63 - 1], "counter": [1e300, 0.5]},
    ]
    for new in values:
        node.values = new
        data = node.collect()
        assert write_points(encoded, places, points_of(data))
        assert bytes(encoded) == encode_metrics(data).SerializeToString(), new
        assert ExportMetricsServiceRequest.FromString(bytes(encoded)) == encode_metrics(data)


def test_points_that_do_not_fit_the_previous_encoding_are_refused() -> None:
    node = Node()
    data = node.collect()
    encoded = bytearray(encode_metrics(data).SerializeToString())
    places = number_point_places(bytes(encoded))
    assert places is not None
    points = points_of(data)
    assert write_points(encoded, places, points)
    assert not write_points(encoded, places, points[:3])  # other series
    started_gauge = [dataclasses.replace(points[0], start_time_unix_nano=5), *points[1:]]
    assert not write_points(encoded, places, started_gauge)
    unstarted_counter = [*points[:2], dataclasses.replace(points[2], start_time_unix_nano=0), *points[3:]]
    assert not write_points(encoded, places, unstarted_counter)
    too_large = [dataclasses.replace(points[0], value=2**63), *points[1:]]
    assert not write_points(encoded, places, too_large)


@pytest.mark.parametrize("cut", [1, 7, 40, -9, -1])
def test_a_damaged_request_has_no_places(cut: int) -> None:
    encoded = encode_metrics(Node().collect()).SerializeToString()
    assert number_point_places(encoded[:cut]) is None


def test_a_point_without_a_value_has_no_places() -> None:
    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add(name="m")
    metric.gauge.data_points.add(time_unix_nano=1)
    assert number_point_places(request.SerializeToString()) is None
    metric.gauge.data_points[0].as_int = 0
    encoded = request.SerializeToString()
    places = number_point_places(encoded)
    assert places is not None
    start, time, value = places
    assert start == ABSENT
    assert struct.unpack_from("<Q", encoded, time) == (1,)
    assert struct.unpack_from("<Bq", encoded, value) == (6 << 3 | 1, 0)  # as_int's tag, then zero
