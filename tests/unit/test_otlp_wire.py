"""The numbers of an encoded OTLP request, found and written in place: the request the OTLP encoder makes
for the new numbers, byte for byte, or a refusal."""

from __future__ import annotations

from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.util.types import Attributes

from otel_numa.export.otlp_wire import (
    ABSENT,
    PointRun,
    assemble,
    number_point_places,
    point_of,
    point_run,
    request_shape,
    write_numbers,
    write_points,
    write_times,
)

NO_START: Any = None  # a gauge's points carry no start time


def request(values: list[float], start: int = 5, time: int = 9) -> MetricsData:
    attributes: list[Attributes] = [
        {"k8s.pod.uid": f"pod-{index}", "numa.node": index} for index in range(len(values))
    ]
    sums = Sum(
        [NumberDataPoint(a, start, time, v) for a, v in zip(attributes, values, strict=True)],
        AggregationTemporality.CUMULATIVE,
        True,
    )
    gauge = Gauge([NumberDataPoint(a, NO_START, time, v) for a, v in zip(attributes, values, strict=True)])
    metrics = [Metric("s", "", "1", sums), Metric("g", "", "By", gauge)]
    scope = ScopeMetrics(InstrumentationScope("otel_numa"), metrics, "")
    return MetricsData([ResourceMetrics(Resource({"k8s.node.name": "n"}), [scope], "")])


def points_of(data: MetricsData) -> list[Any]:
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    ]


def test_new_numbers_written_in_place_are_the_encoders_request() -> None:
    before = encode_metrics(request([1, 2.5, 3])).SerializeToString()
    places = number_point_places(before)
    assert places is not None and len(places) == 3 * 6
    assert [places[i] for i in range(0, 18, 3)][3:] == [ABSENT] * 3  # the gauge's points have no start
    after = request([7.25, -4, 2**40], start=11, time=13)
    encoded = bytearray(before)
    assert write_points(encoded, places, points_of(after))
    assert bytes(encoded) == encode_metrics(after).SerializeToString()


def test_numbers_without_points_are_the_encoders_request() -> None:
    """Points given as their start times, one time and values; or their time alone, their start times and
    values being those written already."""
    before = encode_metrics(request([1, 2.5, 3])).SerializeToString()
    places = number_point_places(before)
    assert places is not None
    encoded = bytearray(before)
    assert write_numbers(encoded, places, 0, (11, 11, 11), 13, (7.25, -4, 2**40))
    assert write_numbers(encoded, places, 3, (None, None, None), 13, (7.25, -4, 2**40))
    assert bytes(encoded) == encode_metrics(request([7.25, -4, 2**40], start=11, time=13)).SerializeToString()
    encoded = bytearray(before)
    assert write_times(encoded, places, 0, 6, 13)
    assert bytes(encoded) == encode_metrics(request([1, 2.5, 3], time=13)).SerializeToString()
    # beyond the request's points, a start time where the gauge has none, a number beyond sfixed64
    assert not write_numbers(bytearray(before), places, 4, (None, None, None), 1, (1, 2, 3))
    assert not write_times(bytearray(before), places, 4, 3, 1)
    assert not write_numbers(bytearray(before), places, 3, (5, 5, 5), 1, (1, 2, 3))
    assert not write_numbers(bytearray(before), places, 0, (5,), 1, (2**63,))


def test_a_request_put_together_from_its_points_is_the_encoders() -> None:
    """The points of one request, put together in another order and without one, with their numbers in
    the new places: the encoder's request for those points."""
    data = request([1, 2.5, 3])
    encoded = encode_metrics(data).SerializeToString()
    shape = request_shape(encoded)
    assert shape is not None and list(shape.places) == list(number_point_places(encoded) or [])
    points = [[point_of(encoded, shape, metric, index) for index in range(3)] for metric in range(2)]
    again, same = assemble(shape, points)
    assert again == encoded and list(same.places) == list(shape.places)
    together, parts = assemble(shape, [points[0][::-1], points[1][:2]])
    sums, gauge = (metric.data for metric in data.resource_metrics[0].scope_metrics[0].metrics)
    sums.data_points[:] = sums.data_points[::-1]  # type: ignore[index]
    gauge.data_points[:] = gauge.data_points[:2]  # type: ignore[index]
    assert together == encode_metrics(data).SerializeToString()
    assert request_shape(together) == parts
    # runs of points taken over whole, around a point of their own: the same request
    runs: list[list[tuple[bytes, int, int, int] | PointRun]] = [
        [point_run(encoded, shape, 0, 0, 0, 1), points[0][2]],
        [points[1][0], point_run(encoded, shape, 1, 3, 1, 2)],
    ]
    again, same = assemble(shape, runs)
    assert again == encoded and list(same.places) == list(shape.places)
    assert request_shape(again) == same


def test_what_cannot_be_written_in_place_is_refused() -> None:
    encoded = encode_metrics(request([1, 2])).SerializeToString()
    places = number_point_places(encoded)
    assert places is not None
    # a start time where the encoded point has none, and one point too few
    no_starts = [NumberDataPoint({}, NO_START, 1, 1) for _ in range(4)]
    assert not write_points(bytearray(encoded), places, no_starts)
    assert not write_points(bytearray(encoded), places, points_of(request([1, 2]))[:3])
    assert not write_points(bytearray(encoded), places, points_of(request([2**63, 2])))  # beyond sfixed64


def test_bytes_that_are_not_a_request_have_no_places() -> None:
    encoded = encode_metrics(request([1, 2])).SerializeToString()
    assert number_point_places(encoded[:-3]) is None
    assert number_point_places(b"\x0f\x01") is None
