"""A push split into requests by the agent: the exporters' own requests, with the metrics that fit handed on
whole."""

from __future__ import annotations

import random
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_numa.export.batches import BatchingExporter, batches
from otel_numa.export.fast.point_list import PointList
from otel_numa.export.temporality import preferred_temporality
from tests.support import InProcessExporter


def metric(name: str, points: int, lazy: bool = False) -> Metric:
    attributes = tuple({"k8s.pod.uid": f"{name}-{index}"} for index in range(points))
    values = tuple(float(index) for index in range(points))

    def make(part: slice) -> list[NumberDataPoint]:
        return [NumberDataPoint(a, 1, 2, v) for a, v in zip(attributes[part], values[part], strict=True)]

    data_points: Any = (
        PointList.made_later(make, attributes, values, (1,) * points, 2) if lazy else make(slice(None))
    )
    if name.startswith("g"):
        return Metric(name, "", "1", Gauge(data_points))
    return Metric(name, "", "1", Sum(data_points, AggregationTemporality.CUMULATIVE, True))


def push(shape: list[list[list[int]]], lazy: bool = False) -> MetricsData:
    """Resources of scopes of metrics with the given numbers of points."""
    return MetricsData(
        [
            ResourceMetrics(
                Resource({"r": str(r)}),
                [
                    ScopeMetrics(
                        InstrumentationScope(f"scope{s}"),
                        [metric(f"{'gs'[m % 2]}{r}.{s}.{m}", n, lazy) for m, n in enumerate(metrics)],
                        "",
                    )
                    for s, metrics in enumerate(scopes)
                ],
                "",
            )
            for r, scopes in enumerate(shape)
        ]
    )


def exporters_own(data: MetricsData, batch_points: int) -> list[bytes]:
    """The requests the gRPC exporter makes of ``data`` when given ``batch_points`` as its batch size."""
    exporter = OTLPMetricExporter(endpoint="localhost:1", insecure=True, max_export_batch_size=batch_points)
    try:
        return [encode_metrics(each).SerializeToString() for each in exporter._split_metrics_data(data)]
    finally:
        exporter.shutdown(timeout_millis=100)


def requests(data: MetricsData, batch_points: int) -> list[bytes]:
    return [encode_metrics(each).SerializeToString() for each in batches(data, batch_points)]


SHAPES = [
    [[[5]]],
    [[[3, 4, 5]]],
    [[[10], [0, 7]], [[2, 2, 2, 2]]],
    [[[1, 0, 1], []], [[25], [3]]],
    [[[4, 4], [4]], [[4, 4]]],
]


@pytest.mark.parametrize("shape", SHAPES, ids=[str(shape) for shape in SHAPES])
@pytest.mark.parametrize("batch_points", [1, 2, 3, 4, 5, 8, 12, 100])
def test_the_requests_are_the_exporters_own(shape: list[list[list[int]]], batch_points: int) -> None:
    data = push(shape)
    assert requests(data, batch_points) == exporters_own(data, batch_points)
    assert requests(push(shape, lazy=True), batch_points) == exporters_own(data, batch_points)


def test_random_pushes_are_split_as_the_exporter_splits_them() -> None:
    rng = random.Random(5)
    for _ in range(60):
        shape = [
            [[rng.randrange(0, 30) for _ in range(rng.randrange(0, 5))] for _ in range(rng.randrange(1, 3))]
            for _ in range(rng.randrange(1, 3))
        ]
        batch_points = rng.randrange(1, 60)
        assert requests(push(shape), batch_points) == exporters_own(push(shape), batch_points), shape


def test_a_push_that_fits_is_handed_on_as_it_is() -> None:
    data = push([[[300, 200], [400]]], lazy=True)
    assert list(batches(data, 10_000)) == [data]
    assert list(batches(data, 900)) == [data]
    assert [b is data for b in batches(data, 899)] == [False, False]


def test_the_metrics_that_fit_in_a_request_are_handed_on_whole() -> None:
    """A metric cut across two requests is the only one whose points are made anew; the others keep their
    point lists (the repeated points' tuples that the kept request recognises)."""
    data = push([[[300, 200, 400, 100]]], lazy=True)
    whole = data.resource_metrics[0].scope_metrics[0].metrics
    first, second = batches(data, 600)
    first_metrics = first.resource_metrics[0].scope_metrics[0].metrics
    second_metrics = second.resource_metrics[0].scope_metrics[0].metrics
    assert first_metrics[0] is whole[0] and first_metrics[1] is whole[1]
    assert [len(m.data.data_points) for m in first_metrics] == [300, 200, 100]
    assert [len(m.data.data_points) for m in second_metrics] == [300, 100]
    assert second_metrics[1] is whole[3]
    assert type(first_metrics[2].data.data_points) is list


class Recording(InProcessExporter):
    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__(preferred_temporality=preferred_temporality())
        self.received: list[MetricsData] = []
        self.fail_at = fail_at

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        self.received.append(metrics_data)
        if len(self.received) == self.fail_at:
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS


def test_a_push_fails_at_its_first_failed_request_and_sends_no_more() -> None:
    data = push([[[10, 10, 10]]])
    recording = Recording()
    assert BatchingExporter(recording, 10, preferred_temporality()).export(data) == MetricExportResult.SUCCESS
    assert len(recording.received) == 3
    failing = Recording(fail_at=2)
    assert BatchingExporter(failing, 10, preferred_temporality()).export(data) == MetricExportResult.FAILURE
    assert len(failing.received) == 2
