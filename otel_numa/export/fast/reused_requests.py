"""Patch ``reused_requests``: the agent's gRPC OTLP exporter writes new numbers into its last request.

The OTLP exporters encode every data point again on every push: its attributes into protobuf KeyValues,
which is most of a push's cost. Between two pushes a node's series are nearly always the same (the agent
hands the same attribute mapping per series, and the SDK's aggregations keep it); only values and times
move, and in the encoding those are fixed-width fields (otel_numa.export.otlp_wire). So the gRPC
exporter's ``_translate_data`` (an instance attribute on the agent's own exporter, shadowing the class's
method) keeps the last request it encoded, and while a push has the same resources, scopes, metrics and
series in the same order, writes the new times and values into a copy of its bytes (repeated points from
their tuples of numbers, without making the points; only their time where those are the tuples the request
was encoded from), and hands gRPC those bytes: the exporter's stub (``_stub``, and the ``_client`` made
from it on the exporter's ``_channel``) sends a request that is bytes as it is, and serializes any other as
the library does. Anything else (a series more or less, a histogram, exemplars, a number that does not fit
in place) is encoded by the exporter's own translation, whose request becomes the one kept.

The OTLP/HTTP exporter encodes inside ``export`` (the library's ``encode_metrics``) and posts the request
its ``_export_batch`` is given (serialized there, sized, counted, compressed and retried by the library).
So its ``export`` (an instance attribute on the agent's own exporter) makes the request the same way and
hands ``_export_batch`` the written bytes parsed back into a request, which serializes to those bytes: a
parse and a serialization of the request instead of the encoding of every point. A shut-down exporter, or
one that splits pushes itself (``max_export_batch_size``), runs the library's ``export``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import threading
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics.export import Gauge, Sum

from otel_numa.export.fast.patch import Patch
from otel_numa.export.fast.point_list import PointList
from otel_numa.export.otlp_wire import (
    PointRun,
    RequestShape,
    assemble,
    number_point_places,
    point_of,
    point_run,
    request_shape,
    write_numbers,
    write_points,
    write_times,
)

# zlib's fastest level for the request kept between pushes: compressed when the series change,
# decompressed at each push
KEPT_COMPRESSION_LEVEL = 1
# requests kept, one per batch: pushes of up to this many batches are each written into their own
KEPT_BATCHES = 16
_GRPC_EXPORTER_MODULE = "opentelemetry.exporter.otlp.proto.grpc.metric_exporter"
_HTTP_EXPORTER_MODULE = "opentelemetry.exporter.otlp.proto.http.metric_exporter"
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _KeptRequest:
    # the request as it was encoded, compressed: its attribute strings repeat from series to series, so
    # it takes a sixteenth of its bytes (a parsed request would take ~4.5x them)
    compressed: bytes
    places: array[int]  # where its numbers lie in the decompressed bytes (otel_numa.export.otlp_wire)
    layout: list[object]  # held, so that the ids compared with it cannot be reused
    # the start times and values of each metric's point list it was encoded from (held: compared by
    # identity; None for a metric of plain points)
    numbers: list[tuple[object, object]]
    # its parts, when it is one resource with one scope (otel_numa.export.otlp_wire.request_shape), and each
    # metric's attribute mappings in order: a push with other series reuses the points it still has
    shape: RequestShape | None = None
    series: list[Sequence[object]] | None = None
    # each metric's name, description, unit, kind, temporality and monotonicity: what its encoding's
    # fields but its points are made from
    described: list[tuple[object, ...]] | None = None


class _ReusedRequests:
    """Stands in for one gRPC metric exporter's ``_translate_data``."""

    def __init__(self, translate: Callable[[Any], Any]) -> None:
        self._translate = translate  # the exporter's, bound to it
        self._lock = threading.Lock()
        # one kept request per batch (a push of more points than a request holds goes as several:
        # otel_numa.export.batches), by the batch's first metric and series; the most recently used last
        self._kept: OrderedDict[tuple[object, int], _KeptRequest] = OrderedDict()
        self.reused = 0  # how many requests were the kept one with new numbers
        self.spliced = 0  # how many were put together from the kept one's points and new ones

    def __call__(self, data: Any) -> Any:
        layout: list[object] = []
        points: list[Any] = []
        # repeated points as their numbers, without making the points: (first point's index, its list, its
        # metric's place in the push)
        numbers_of: list[tuple[int, PointList, int]] = []
        lists: list[tuple[object, object]] = []  # each metric's point list's start times and values
        series: list[Sequence[object]] = []  # each metric's attribute mappings, in order
        described: list[tuple[object, ...]] = []
        count = 0
        for resource_metrics in data.resource_metrics:
            layout.append(resource_metrics.resource)
            for scope_metrics in resource_metrics.scope_metrics:
                layout.append(scope_metrics.scope)
                for metric in scope_metrics.metrics:
                    numbers = metric.data
                    if not isinstance(numbers, Sum | Gauge):  # histograms: the exporter's own path
                        return self._translate(data)
                    description = (
                        metric.name,
                        metric.description,
                        metric.unit,
                        type(numbers),
                        getattr(numbers, "aggregation_temporality", None),
                        getattr(numbers, "is_monotonic", None),
                    )
                    described.append(description)
                    layout.append((*description, len(numbers.data_points)))
                    listed = numbers.data_points
                    lists.append(
                        (listed.starts, listed.values) if type(listed) is PointList else (None, None)
                    )
                    if type(listed) is PointList:  # plain points; one tuple of mappings
                        layout.append(listed.attributes)
                        series.append(listed.attributes)
                        if listed.starts is not None and listed.time is not None:
                            numbers_of.append((count, listed, len(lists) - 1))
                            points.append(None)  # a place holder: written below from the numbers
                            count += len(listed)
                            continue
                        points += listed
                        count += len(listed)
                        continue
                    for point in listed:
                        if point.exemplars:
                            return self._translate(data)
                        layout.append(point.attributes)
                        points.append(point)
                    series.append(tuple([point.attributes for point in listed]))
                    count += len(listed)
        key = _batch_key(layout)
        with self._lock:
            kept, replaced = self._kept.pop(key, None), None
            if kept is None:  # a batch whose first series changed: put together from one of its metrics
                replaced, kept = self._same_metrics(described)
            # every time and value is written, start times too: a delta sum starts anew at every push, and
            # a series forgotten and observed again comes back with a new start
            if kept is not None and _same_layout(layout, kept.layout):
                encoded = bytearray(zlib.decompress(kept.compressed))
                if _write(encoded, kept, points, numbers_of):
                    self._keep(key, kept)
                    self.reused += 1
                    return bytes(encoded)  # sent as they are (_PassingBytes)
            if kept is not None and kept.shape is not None and kept.series is not None:
                spliced = self._spliced(data, kept, series, described, points, numbers_of, count)
                if spliced is not None:
                    together, parts = spliced
                    compressed = zlib.compress(together, KEPT_COMPRESSION_LEVEL)
                    if replaced is not None:
                        self._kept.pop(replaced, None)
                    self._keep(
                        key, _KeptRequest(compressed, parts.places, layout, lists, parts, series, described)
                    )
                    self.spliced += 1
                    return together
            request = self._translate(data)
            serialized = request.SerializeToString()
            shape = request_shape(serialized)
            places = shape.places if shape is not None else number_point_places(serialized)
            # kept only when it has one encoded point per data point, in the same order
            if places is not None and len(places) == 3 * count:
                compressed = zlib.compress(serialized, KEPT_COMPRESSION_LEVEL)
                self._keep(key, _KeptRequest(compressed, places, layout, lists, shape, series, described))
            return request

    def _same_metrics(
        self, described: list[tuple[object, ...]]
    ) -> tuple[tuple[object, int] | None, _KeptRequest | None]:
        """The kept request of the same metrics used least recently, and its key: the batch in the same place
        in the last push (this push's earlier batches were used since), which a batch not seen before then
        replaces (a pod replaced shifts the later batches' first series)."""
        for key, kept in self._kept.items():  # least recently used first
            if kept.described == described:
                return key, kept
        return None, None

    def _keep(self, key: tuple[object, int], kept: _KeptRequest) -> None:
        self._kept[key] = kept
        self._kept.move_to_end(key)
        while len(self._kept) > KEPT_BATCHES:
            self._kept.popitem(last=False)

    @property
    def kept(self) -> int:
        """How many requests are kept (one per batch of the last pushes)."""
        return len(self._kept)

    def _spliced(
        self,
        data: Any,
        kept: _KeptRequest,
        series: list[Sequence[object]],
        described: list[tuple[object, ...]],
        points: list[Any],
        numbers_of: list[tuple[int, PointList, int]],
        count: int,
    ) -> tuple[bytes, RequestShape] | None:
        """The request for ``data`` when only series changed since ``kept`` (the same resource, scope and
        metrics): the kept encoding of each series it still has, and the exporter's encoding of the new
        ones (one request of only the metrics that have new series), put together; its numbers written.
        None otherwise."""
        shape, kept_series = kept.shape, kept.series
        assert shape is not None and kept_series is not None
        (resource_metrics,) = data.resource_metrics
        (scope_metrics,) = resource_metrics.scope_metrics
        metrics = scope_metrics.metrics
        if len(metrics) != len(shape.metrics) or len(series) != len(metrics) or described != kept.described:
            return None  # other metrics (names, descriptions, units, kinds) than the kept request's
        if len(kept_series) != len(metrics) or len(kept.numbers) != len(metrics):
            return None
        # a metric with the very tuple of series of the kept request's (its instrument's series unchanged)
        # takes its points over whole, one run
        same = [now is old for now, old in zip(series, kept_series, strict=True)]
        # where each kept series' point is: (metric, its index there) by its attribute mapping
        before: list[dict[int, int]] = [
            {} if unchanged else {id(each): at for at, each in enumerate(old)}
            for old, unchanged in zip(kept_series, same, strict=True)
        ]
        new_points: list[list[int]] = []  # per metric, the indexes of the series that are new
        partial: list[Any] = []
        encoded_at: dict[int, int] = {}  # metric -> its place in the request of the new series
        for index, (metric, now, known, old) in enumerate(
            zip(metrics, series, before, kept_series, strict=True)
        ):
            fresh = [
                at
                for at, each in ([] if same[index] else enumerate(now))
                if known.get(id(each)) is None or old[known[id(each)]] is not each
            ]
            new_points.append(fresh)
            if not fresh and (partial or index < len(metrics) - 1):
                continue  # its fields but its points are the kept request's (the same description)
            # a PointList makes only these; with no new series at all, the last metric is encoded with its
            # first point (not used), for the resource's and scope's fields
            listed = metric.data.data_points
            made = [point for at in fresh or [0] for point in listed[at : at + 1]]
            encoded_at[index] = len(partial)
            partial.append(
                dataclasses.replace(metric, data=dataclasses.replace(metric.data, data_points=made))
            )
        only_new = dataclasses.replace(
            data,
            resource_metrics=[
                dataclasses.replace(
                    resource_metrics, scope_metrics=[dataclasses.replace(scope_metrics, metrics=partial)]
                )
            ],
        )
        encoded_new = self._translate(only_new).SerializeToString()
        new_shape = request_shape(encoded_new)
        if new_shape is None or len(new_shape.metrics) != len(partial):
            return None
        if any(
            (new_shape.metrics[at].before, new_shape.metrics[at].data_field)
            != (shape.metrics[index].before, shape.metrics[index].data_field)
            for index, at in encoded_at.items()
        ):
            return None  # encoded otherwise than the kept request's metrics of the same description
        # the new request's resource and scope fields, each metric's fields as the kept request has them
        framing = dataclasses.replace(new_shape, metrics=shape.metrics)
        old_bytes = zlib.decompress(kept.compressed)
        first = 0  # the kept request's index of its metric's first point
        parts: list[list[tuple[bytes, int, int, int] | PointRun]] = []
        for index, (now, known, fresh) in enumerate(zip(series, before, new_points, strict=True)):
            its: list[tuple[bytes, int, int, int] | PointRun] = []
            if same[index]:
                if now:
                    its.append(point_run(old_bytes, shape, index, first, 0, len(now) - 1))
                parts.append(its)
                first += len(shape.metrics[index].points) // 2
                continue
            fresh_at = {at: k for k, at in enumerate(fresh)}
            run: list[int] = []  # a run of the kept request's points, one after the other: its first, last
            for at, each in enumerate(now):
                k = fresh_at.get(at)
                j = known[id(each)] if k is None else -1
                if run and j == run[1] + 1:
                    run[1] = j
                    continue
                if run:
                    its.append(point_run(old_bytes, shape, index, first, run[0], run[1]))
                run = [j, j] if k is None else []
                if k is not None:
                    its.append(point_of(encoded_new, new_shape, encoded_at[index], k))
            if run:
                its.append(point_run(old_bytes, shape, index, first, run[0], run[1]))
            parts.append(its)
            first += len(shape.metrics[index].points) // 2
        encoded, assembled = assemble(framing, parts)
        if len(assembled.places) != 3 * count:
            return None
        written = bytearray(encoded)
        # a metric taken over whole holds the kept numbers: its new time only, where its point list has the
        # start times and values the kept request was encoded from; every other number written
        numbers = [
            pair if unchanged else (None, None) for pair, unchanged in zip(kept.numbers, same, strict=True)
        ]
        if not _write(written, _KeptRequest(b"", assembled.places, [], numbers), points, numbers_of):
            return None
        return bytes(written), assembled


def _write(
    encoded: bytearray, kept: _KeptRequest, points: list[Any], numbers_of: list[tuple[int, PointList, int]]
) -> bool:
    """The points' numbers written into ``encoded``, the kept request's bytes: the lists of ``numbers_of``
    from their numbers (only their time where their start times and values are the very tuples the request
    was encoded from), the other points (``points`` without the ``None`` that stand for those lists) a run
    of them at a time."""
    places = kept.places
    if not numbers_of:
        return write_points(encoded, places, points)
    index = 0
    numbered = iter(numbers_of)
    plain: list[Any] = []  # points one after the other, written together
    for point in [*points, None]:  # the last None ends the last run
        if point is not None:
            plain.append(point)
            continue
        if plain:
            if not write_points(encoded, places[3 * index : 3 * (index + len(plain))], plain):
                return False
            index += len(plain)
            plain.clear()
        following = next(numbered, None)
        if following is None:
            break
        first, listed, place = following
        starts, time, values = listed.starts, listed.time, listed.values
        assert starts is not None and time is not None
        if first != index:
            return False
        encoded_starts, encoded_values = kept.numbers[place]
        if starts is encoded_starts and values is encoded_values:
            written = write_times(encoded, places, first, len(values), time)
        else:
            written = write_numbers(encoded, places, first, starts, time, values)
        if not written:
            return False
        index += len(listed)
    return 3 * index == len(places)


def _batch_key(layout: list[object]) -> tuple[object, int]:
    """Which batch of a push a request is: its first metric's name and the identity of its first series'
    attributes (a batch of a split push starts where the one before it ended, in the same place from one
    push to the next while the series stay). The layout is resource, scope, metric, its series, ..."""
    if len(layout) < 4 or type(layout[2]) is not tuple:
        return None, 0
    return layout[2][0], id(layout[3])


def _same_layout(now: list[object], before: list[object]) -> bool:
    # resources, scopes and attribute mappings by identity (the same objects while the series are the
    # same; held by the kept request, so never reused for others); the metrics' descriptions by value
    return len(now) == len(before) and all(
        a is b or (type(a) is tuple and a == b) for a, b in zip(now, before, strict=True)
    )


def reuse_requests(exporter: object) -> bool:
    """Apply the patch to ``exporter`` when it is the gRPC or HTTP OTLP metric exporter of the library's own
    shape and the check passes; False, and nothing changed, otherwise."""
    module = type(exporter).__module__
    if module not in _CHECKS:
        return False  # not imported for another exporter
    problem = _CHECKS[module]()  # checked now if it was not at start: the exporter was not loaded then
    if problem is not None:
        _log.warning("the OTLP exporter encodes every push anew: %s", problem)
        return False
    return _patch(exporter) if module == _GRPC_EXPORTER_MODULE else _patch_http(exporter)


class _PassingBytes:
    """A gRPC channel as the exporter's stub sees it: its calls send a request that is bytes already as it
    is, and serialize any other with the stub's own serializer."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel

    def unary_unary(self, method: str, request_serializer: Any = None, **kwargs: Any) -> Any:
        serialize = request_serializer

        def serialize_unless_bytes(request: Any) -> Any:
            return request if type(request) is bytes else serialize(request)

        return self._channel.unary_unary(method, request_serializer=serialize_unless_bytes, **kwargs)


class _PassingStub:
    """Stands in for the exporter's ``_stub``: the library's stub, made on a :class:`_PassingBytes` channel
    (the exporter makes its client again after it reconnects)."""

    def __init__(self, stub: Callable[[Any], Any]) -> None:
        self._stub = stub

    def __call__(self, channel: Any) -> Any:
        return self._stub(_PassingBytes(channel))


def _patch(exporter: object) -> bool:
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    if type(exporter) is not OTLPMetricExporter or "_translate_data" in vars(exporter):
        return False
    translate = exporter._translate_data
    stub, channel = vars(exporter).get("_stub"), vars(exporter).get("_channel")
    if not callable(translate) or not isinstance(stub, type) or channel is None:
        return False
    if not isinstance(vars(exporter).get("_client"), stub):
        return False
    exporter._stub = _PassingStub(stub)
    exporter._client = exporter._stub(channel)
    exporter._translate_data = _ReusedRequests(translate)  # type: ignore[method-assign]
    return True


class _HttpExport:
    """Stands in for one OTLP/HTTP metric exporter's ``export``."""

    def __init__(
        self,
        exporter: Any,
        export: Callable[..., Any],
        encode: Callable[[Any], Any],
        parse: Callable[[bytes], Any],
    ) -> None:
        self._exporter = exporter
        self._export = export  # the library's, bound to the exporter
        self._parse = parse  # bytes to the request message the library's encoding makes
        self.requests = _ReusedRequests(encode)

    def __call__(self, metrics_data: Any, timeout_millis: float | None = 10_000, **kwargs: Any) -> Any:
        exporter = self._exporter
        if exporter._shutdown or exporter._max_export_batch_size is not None:
            return self._export(metrics_data, timeout_millis, **kwargs)
        try:
            request = self.requests(metrics_data)
            if type(request) is bytes:
                request = self._parse(request)
        except Exception:  # the library's export encodes it again and reports what fails as it does
            return self._export(metrics_data, timeout_millis, **kwargs)
        return exporter._export_batch(request)


def _patch_http(exporter: object) -> bool:
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    if type(exporter) is not OTLPMetricExporter or "export" in vars(exporter):
        return False
    own = vars(exporter)
    if not callable(getattr(exporter, "_export_batch", None)) or type(own.get("_shutdown")) is not bool:
        return False
    if "_max_export_batch_size" not in own:
        return False
    parse = ExportMetricsServiceRequest.FromString
    exporter.export = _HttpExport(exporter, exporter.export, encode_metrics, parse)  # type: ignore[method-assign]
    return True


class _Recording:
    """A channel for the check: each call's request as its serializer makes it, never sent."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def unary_unary(self, method: str, request_serializer: Any = None, **kwargs: Any) -> Any:
        def call(request: Any, **call_kwargs: Any) -> None:
            self.sent.append(request_serializer(request))

        return call


def _check_pushes() -> tuple[list[Any], list[list[Any]]]:
    """What the checks push: pushes with new values, a new start time, a number that switches between
    integer and float, a series more and a series less (the kept series' points put together with the
    new ones), series in another order, and repeated points given as their numbers (the same tuples
    again, then new values); then pushes split in batches, one metric each."""
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
    same, new = (4.5, 8), (9, -1.5)
    pushes: list[list[tuple[dict[str, str], int, float]] | tuple[float, ...]] = [
        [(x, 1, 1.0), (y, 1, 2)],
        [(x, 1, 3.5), (y, 1, 4)],
        [(x, 2, 5), (y, 1, 6.25)],
        [(x, 2, 5), (y, 1, 6.25), (z, 3, 1)],
        [(x, 2, 7), (z, 3, 2)],
        [(x, 2, 2**62), (z, 3, -2)],
        same,
        same,
        new,
        same,
        [(x, 2, 7), (y, 5, 1), (z, 3, 2)],
        [(z, 3, 2.5), (x, 2, 7)],
        [(y, 6, 1), (z, 3, 2.5)],
    ]

    # a gauge's points have no start time (the SDK's are None, whatever the annotation says)
    no_start: Any = None
    attributes: tuple[dict[str, str], ...] = (x, z)
    starts, gauge_starts = (2, 3), (no_start, no_start)

    def repeated(starts: tuple[Any, ...], values: tuple[float, ...], time: int) -> PointList:
        def make(part: slice) -> list[Any]:
            return [
                NumberDataPoint(a, start, time, value)
                for a, start, value in zip(attributes[part], starts[part], values[part], strict=True)
            ]

        return PointList.made_later(make, attributes, values, starts, time)

    def metrics_of(push: list[tuple[dict[str, str], int, float]] | tuple[float, ...], time: int) -> list[Any]:
        if isinstance(push, tuple):  # repeated points: the same tuples from one push to the next
            sums = Sum(repeated(starts, push, time), AggregationTemporality.CUMULATIVE, True)
            gauge = Gauge(repeated(gauge_starts, push, time))
        else:
            sums = Sum(
                [NumberDataPoint(a, start, time, value) for a, start, value in push],
                AggregationTemporality.CUMULATIVE,
                True,
            )
            gauge = Gauge([NumberDataPoint(a, no_start, time, value) for a, _start, value in push])
        return [Metric("s", "a sum", "1", sums), Metric("g", "a gauge", "By", gauge)]

    def data(metrics: list[Any]) -> MetricsData:
        return MetricsData([ResourceMetrics(resource, [ScopeMetrics(scope, metrics, "")], "")])

    whole = [data(metrics_of(push, time)) for time, push in enumerate(pushes, start=100)]
    batched = [
        [data([metric]) for metric in metrics_of(values, time)]
        for time, values in enumerate([same, new, same, new], start=200)
    ]
    return whole, batched


def _check() -> str | None:
    """Two throwaway gRPC exporters (never connected), one patched: over the pushes of
    :func:`_check_pushes`, the same requests, and each batch of a split push written from its own."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    whole, batched = _check_pushes()
    plain = OTLPMetricExporter(endpoint="localhost:1", insecure=True)
    patched = OTLPMetricExporter(endpoint="localhost:1", insecure=True)
    try:
        if not _patch(patched):
            return "the exporter has another shape"
        wire = _Recording()
        client = patched._stub(wire)  # the patched exporter's client, on a channel that records
        for metrics in whole:
            client.Export(request=patched._translate_data(metrics), metadata=None, timeout=1)
            if wire.sent[-1] != plain._translate_data(metrics).SerializeToString():
                return "the requests differ from the exporter's own"
        reused = patched._translate_data
        if not isinstance(reused, _ReusedRequests) or not reused.kept:
            return "no request was kept"
        # a push split in batches (the exporter's max_export_batch_size): each batch reuses its own request
        before = reused.reused
        for batches in batched:
            for batch in batches:
                client.Export(request=patched._translate_data(batch), metadata=None, timeout=1)
                if wire.sent[-1] != plain._translate_data(batch).SerializeToString():
                    return "the batches' requests differ from the exporter's own"
        if reused.reused - before < 6:
            return "the batches of a split push did not reuse their requests"
        return None
    finally:
        plain.shutdown(timeout_millis=100)
        patched.shutdown(timeout_millis=100)


def _check_http() -> str | None:
    """Two throwaway OTLP/HTTP exporters (never connected), one patched, each posting through its
    ``_export_batch`` to a recorder: over the pushes of :func:`_check_pushes`, the same requests; the
    patched one's written from its kept ones."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult

    whole, batched = _check_pushes()
    plain = OTLPMetricExporter(endpoint="http://localhost:1/v1/metrics")
    patched = OTLPMetricExporter(endpoint="http://localhost:1/v1/metrics")
    try:
        if not _patch_http(patched):
            return "the exporter has another shape"
        sent: list[list[bytes]] = [[], []]
        for exporter, requests in zip((plain, patched), sent, strict=True):

            def post(request: Any, requests: list[bytes] = requests) -> MetricExportResult:
                requests.append(request.SerializeToString())
                return MetricExportResult.SUCCESS

            exporter._export_batch = post  # type: ignore[method-assign,assignment]
        for metrics in [*whole, *(batch for batches in batched for batch in batches)]:
            for exporter in (plain, patched):
                if exporter.export(metrics) is not MetricExportResult.SUCCESS:
                    return "a push failed"
            if sent[0][-1] != sent[1][-1]:
                return "the requests differ from the exporter's own"
        export = vars(patched).get("export")
        if not isinstance(export, _HttpExport) or export.requests.reused + export.requests.spliced < 8:
            return "the requests were not written from the kept ones"
        return None
    finally:
        plain.shutdown()
        patched.shutdown()


_CHECKS: dict[str, Callable[[], str | None]] = {
    _GRPC_EXPORTER_MODULE: functools.cache(_check),
    _HTTP_EXPORTER_MODULE: functools.cache(_check_http),
}


def _check_if_loaded() -> str | None:
    """The check of each OTLP exporter the process loaded; an agent without an OTLP gRPC exporter never
    loads gRPC (about 13 MB) for it, and an exporter made later is checked before it is patched."""
    for module, check in _CHECKS.items():
        problem = check() if module in sys.modules else None
        if problem is not None:
            return problem
    return None


PATCH = Patch(
    name="reused_requests",
    replaces=(
        "the OTLP exporters' encoding of every data point on every push (the gRPC exporter's translation,"
        " the HTTP exporter's export)"
    ),
    private_names=(
        "OTLPExporterMixin._translate_data",
        "OTLPExporterMixin._stub",
        "OTLPExporterMixin._client",
        "OTLPExporterMixin._channel",
        "OTLPMetricExporter._export_batch",
        "OTLPMetricExporter._shutdown",
        "OTLPMetricExporter._max_export_batch_size",
    ),
    check=_check_if_loaded,
)
