"""A push split into requests of at most a number of data points, each metric whole where it fits.

The OTLP exporters split a push themselves when given ``max_export_batch_size``, but they walk every data
point of every push to do it, even of a push that fits in one request, and hand each request new lists of
the points: the agent's repeated points (``otel_numa.export.fast.point_list``) would be made as objects at
every push, and its kept request (``reused_requests``) could not recognise them. The agent's exporters are
made without a batch size and the push is split here instead: a push that fits is handed on as it is, and a
larger one is cut where the exporters would cut it (requests of exactly the batch size, in order, a metric
cut only where it straddles two requests, no metric, scope or resource left without points), with every
metric that fits in its request handed on whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk.metrics.export import (
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)

from otel_numa.export.temporality import Temporality


def _fits(metrics_data: MetricsData, batch_points: int) -> bool:
    """Whether the push is one request as it is: at most ``batch_points`` points, and no metric, scope or
    resource in it empty."""
    points = 0
    for resource_metrics in metrics_data.resource_metrics:
        if not resource_metrics.scope_metrics:
            return False
        for scope_metrics in resource_metrics.scope_metrics:
            if not scope_metrics.metrics:
                return False
            for metric in scope_metrics.metrics:
                count = len(metric.data.data_points)
                if not count:
                    return False
                points += count
    return points <= batch_points


def batches(metrics_data: MetricsData, batch_points: int) -> Iterator[MetricsData]:
    """The requests of a push of ``metrics_data``, each of at most ``batch_points`` points."""
    if _fits(metrics_data, batch_points):
        yield metrics_data
        return
    room = batch_points
    resources: list[ResourceMetrics] = []
    for resource_metrics in metrics_data.resource_metrics:
        scopes: list[ScopeMetrics] = []
        for scope_metrics in resource_metrics.scope_metrics:
            metrics: list[Metric] = []
            for metric in scope_metrics.metrics:
                points: Any = metric.data.data_points
                start = 0
                while start < len(points):  # as much of it as the request has room for
                    taken = min(room, len(points) - start)
                    whole = taken == len(points)
                    metrics.append(metric if whole else _with_points(metric, points[start : start + taken]))
                    start += taken
                    room -= taken
                    if room == 0:  # the request is full
                        scopes.append(dataclasses.replace(scope_metrics, metrics=metrics))
                        resources.append(dataclasses.replace(resource_metrics, scope_metrics=scopes))
                        yield MetricsData(resource_metrics=resources)
                        room, resources, scopes, metrics = batch_points, [], [], []
            if metrics:
                scopes.append(dataclasses.replace(scope_metrics, metrics=metrics))
        if scopes:
            resources.append(dataclasses.replace(resource_metrics, scope_metrics=scopes))
    if resources:
        yield MetricsData(resource_metrics=resources)


def _with_points(metric: Metric, points: Any) -> Metric:
    data: Any = metric.data  # a Sum, Gauge or histogram: each has its data points
    return dataclasses.replace(metric, data=dataclasses.replace(data, data_points=list(points)))


class BatchingExporter(MetricExporter):
    """``exporter`` (made without a batch size, preferring ``temporality``) sending each push as requests
    of at most ``batch_points`` points, one after the other; the push fails at its first failed request,
    as the exporters' own batches do."""

    def __init__(self, exporter: MetricExporter, batch_points: int, temporality: Temporality) -> None:
        super().__init__(preferred_temporality=temporality)
        self.exporter = exporter
        self.batch_points = batch_points

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        for batch in batches(metrics_data, self.batch_points):
            if (
                self.exporter.export(batch, timeout_millis=timeout_millis, **kwargs)
                != MetricExportResult.SUCCESS
            ):
                return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.exporter.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.exporter.shutdown(timeout_millis=timeout_millis, **kwargs)
