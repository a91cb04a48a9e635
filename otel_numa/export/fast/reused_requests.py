"""Patch ``reused_requests``: the agent's gRPC OTLP exporter writes new numbers into its last request.

The OTLP exporters encode every data point again on every push: its attributes into protobuf KeyValues,
which is most of a push's cost. Between two pushes a node's series are nearly always the same (the agent
hands the same attribute mapping per series, and the SDK's aggregations keep it); only values and times
move, and in the encoding those are fixed-width fields (otel_numa.export.otlp_wire). So the gRPC
exporter's ``_translate_data`` (an instance attribute on the agent's own exporter, shadowing the class's
method) keeps the last request it encoded, and while a push has the same resources, scopes, metrics and
series in the same order, writes the new times and values into a copy of its bytes, which it parses into
the request handed to gRPC. Anything else (a series more or less, a histogram, exemplars, a number that
does not fit in place) is encoded by the exporter's own translation, whose request becomes the one kept.

The HTTP exporter encodes inside ``export`` itself (the module's ``encode_metrics``, then
``SerializeToString``), with no method of its own in between: reusing its request for one exporter only
would mean replacing its ``export`` with a copy of the library's, so it keeps the public encoding.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import zlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics.export import Gauge, Sum

from otel_numa.export.fast.patch import Patch
from otel_numa.export.fast.point_list import PointList
from otel_numa.export.otlp_wire import number_point_places, write_points

# zlib's fastest level for the request kept between pushes: compressed when the series change,
# decompressed at each push
KEPT_COMPRESSION_LEVEL = 1
_GRPC_EXPORTER_MODULE = "opentelemetry.exporter.otlp.proto.grpc.metric_exporter"
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _KeptRequest:
    # the request as it was encoded, compressed: its attribute strings repeat from series to series, so
    # it takes a sixteenth of its bytes (a parsed request would take ~4.5x them)
    compressed: bytes
    places: array[int]  # where its numbers lie in the decompressed bytes (otel_numa.export.otlp_wire)
    layout: list[object]  # held, so that the ids compared with it cannot be reused
    parse: Callable[[bytes], Any]


class _ReusedRequests:
    """Stands in for one gRPC metric exporter's ``_translate_data``."""

    def __init__(self, translate: Callable[[Any], Any]) -> None:
        self._translate = translate  # the exporter's, bound to it
        self._lock = threading.Lock()
        self._kept: _KeptRequest | None = None
        self.reused = 0  # how many requests were the kept one with new numbers

    def __call__(self, data: Any) -> Any:
        layout: list[object] = []
        points: list[Any] = []
        for resource_metrics in data.resource_metrics:
            layout.append(resource_metrics.resource)
            for scope_metrics in resource_metrics.scope_metrics:
                layout.append(scope_metrics.scope)
                for metric in scope_metrics.metrics:
                    numbers = metric.data
                    if not isinstance(numbers, Sum | Gauge):  # histograms: the exporter's own path
                        return self._translate(data)
                    layout.append(
                        (
                            metric.name,
                            metric.description,
                            metric.unit,
                            type(numbers),
                            getattr(numbers, "aggregation_temporality", None),
                            getattr(numbers, "is_monotonic", None),
                            len(numbers.data_points),
                        )
                    )
                    if type(numbers.data_points) is PointList:  # plain points; one tuple of mappings
                        layout.append(numbers.data_points.attributes)
                        points += numbers.data_points
                        continue
                    for point in numbers.data_points:
                        if point.exemplars:
                            return self._translate(data)
                        layout.append(point.attributes)
                        points.append(point)
        with self._lock:
            kept = self._kept
            # every time and value is written, start times too: a delta sum starts anew at every push, and
            # a series forgotten and observed again comes back with a new start
            if kept is not None and _same_layout(layout, kept.layout):
                encoded = bytearray(zlib.decompress(kept.compressed))
                if write_points(encoded, kept.places, points):
                    self.reused += 1
                    return kept.parse(bytes(encoded))
            request = self._translate(data)
            self._kept = None
            serialized = request.SerializeToString()
            places = number_point_places(serialized)
            # kept only when it has one encoded point per data point, in the same order
            if places is not None and len(places) == 3 * len(points):
                compressed = zlib.compress(serialized, KEPT_COMPRESSION_LEVEL)
                self._kept = _KeptRequest(compressed, places, layout, type(request).FromString)
            return request


def _same_layout(now: list[object], before: list[object]) -> bool:
    # resources, scopes and attribute mappings by identity (the same objects while the series are the
    # same; held by the kept request, so never reused for others); the metrics' descriptions by value
    return len(now) == len(before) and all(
        a is b or (type(a) is tuple and a == b) for a, b in zip(now, before, strict=True)
    )


def reuse_requests(exporter: object) -> bool:
    """Apply the patch to ``exporter`` when it is the gRPC OTLP metric exporter with the library's own
    translation and the check passes; False, and nothing changed, otherwise."""
    if type(exporter).__module__ != _GRPC_EXPORTER_MODULE:
        return False  # not imported for another exporter
    problem = _checked()  # checked now if it was not at start: gRPC was not loaded then
    if problem is not None:
        _log.warning("the gRPC exporter encodes every push anew: %s", problem)
        return False
    return _patch(exporter)


def _patch(exporter: object) -> bool:
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    if type(exporter) is not OTLPMetricExporter or "_translate_data" in vars(exporter):
        return False
    translate = exporter._translate_data
    if not callable(translate):
        return False
    exporter._translate_data = _ReusedRequests(translate)  # type: ignore[method-assign]
    return True


def _check() -> str | None:
    """Two throwaway gRPC exporters (never connected), one patched: over pushes with new values, a new
    start time, a number that switches between integer and float, a series more and a series less, the
    same requests."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Metric,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    resource, scope = Resource({"r": "1"}), InstrumentationScope("otel_numa.check")
    x, y, z = {"a": "x"}, {"a": "y"}, {"a": "z"}
    pushes: list[list[tuple[dict[str, str], int, float]]] = [
        [(x, 1, 1.0), (y, 1, 2)],
        [(x, 1, 3.5), (y, 1, 4)],
        [(x, 2, 5), (y, 1, 6.25)],
        [(x, 2, 5), (y, 1, 6.25), (z, 3, 1)],
        [(x, 2, 7), (z, 3, 2)],
        [(x, 2, 2**62), (z, 3, -2)],
    ]

    def data(push: list[tuple[dict[str, str], int, float]], time: int) -> MetricsData:
        sums = Sum(
            [NumberDataPoint(a, start, time, value) for a, start, value in push],
            AggregationTemporality.CUMULATIVE,
            True,
        )
        # a gauge's points have no start time (the SDK's are None, whatever the annotation says)
        no_start: Any = None
        gauge = Gauge([NumberDataPoint(a, no_start, time, value) for a, _start, value in push])
        metrics = [Metric("s", "a sum", "1", sums), Metric("g", "a gauge", "By", gauge)]
        return MetricsData([ResourceMetrics(resource, [ScopeMetrics(scope, metrics, "")], "")])

    plain = OTLPMetricExporter(endpoint="localhost:1", insecure=True)
    patched = OTLPMetricExporter(endpoint="localhost:1", insecure=True)
    try:
        if not _patch(patched):
            return "the exporter has another shape"
        for time, push in enumerate(pushes, start=100):
            metrics = data(push, time)
            if plain._translate_data(metrics) != patched._translate_data(metrics):
                return "the requests differ from the exporter's own"
        if not isinstance(patched._translate_data, _ReusedRequests) or patched._translate_data._kept is None:
            return "no request was kept"
        return None
    finally:
        plain.shutdown(timeout_millis=100)
        patched.shutdown(timeout_millis=100)


_checked = functools.cache(_check)


def _check_if_loaded() -> str | None:
    """The check, where the agent pushes over gRPC; an agent without an OTLP gRPC exporter never loads gRPC
    (about 13 MB) for it, and its exporter, if one is made later, is checked before it is patched."""
    return _checked() if _GRPC_EXPORTER_MODULE in sys.modules else None


PATCH = Patch(
    name="reused_requests",
    replaces="the gRPC OTLP exporter's encoding of every data point on every push",
    private_names=("OTLPExporterMixin._translate_data",),
    check=_check_if_loaded,
)
