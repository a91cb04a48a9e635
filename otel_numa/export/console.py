"""The console exporter: the SDK's own, writing each push as the SDK's JSON, on either export path.

The SDK renders a push with :func:`dataclasses.asdict` and :mod:`json`, which take any tuple for a list.
The accelerated path keeps each series' attributes as an immutable mapping stored in a tuple
(:class:`otel_numa.series_attributes.SeriesAttributes`), so the points are handed to the SDK's rendering
with their attributes as plain dicts: the output is the public path's, byte for byte.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import IO, Any

from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricsData


def console_exporter(out: IO[str] | None = None) -> ConsoleMetricExporter:
    """The SDK's console exporter, writing to ``out`` (default: the standard output of the moment)."""
    formatter: Callable[[MetricsData], str] = _as_json
    return ConsoleMetricExporter(out if out is not None else sys.stdout, formatter)


def _as_json(data: MetricsData) -> str:
    """The SDK's own rendering of ``data`` (its default formatter's), with plain dict attributes."""
    return with_dict_attributes(data).to_json() + os.linesep


def with_dict_attributes(data: MetricsData) -> MetricsData:
    return replace(
        data,
        resource_metrics=[
            replace(
                resource,
                scope_metrics=[
                    replace(scope, metrics=[_metric(metric) for metric in scope.metrics])
                    for scope in resource.scope_metrics
                ],
            )
            for resource in data.resource_metrics
        ],
    )


def _metric(metric: Any) -> Any:
    points = [replace(point, attributes=dict(point.attributes or {})) for point in metric.data.data_points]
    return replace(metric, data=replace(metric.data, data_points=points))
