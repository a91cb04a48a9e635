"""Where the numbers of an encoded OTLP metrics request lie, and how new ones are written in.

A push whose series are those of the previous push differs from it only in its data points' times and
values. In the protobuf encoding those are fixed-width fields of ``NumberDataPoint``: the times are
``fixed64``, the value a ``double`` or an ``sfixed64`` (one ``oneof``, so even a zero is written). A new
value or time therefore never changes the length of the encoding, and the previous request's bytes take
the new numbers in place: 8 bytes each, and the value's tag byte when it switches between int and double.

Field numbers, from opentelemetry-proto's ``collector/metrics/v1/metrics_service.proto`` and
``metrics/v1/metrics.proto``: ``ExportMetricsServiceRequest.resource_metrics`` 1,
``ResourceMetrics.scope_metrics`` 2, ``ScopeMetrics.metrics`` 2, ``Metric.gauge`` 5 and ``Metric.sum`` 7,
``Gauge.data_points`` and ``Sum.data_points`` 1, and in ``NumberDataPoint`` ``start_time_unix_nano`` 2,
``time_unix_nano`` 3, ``as_double`` 4 and ``as_int`` 6.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5

_RESOURCE_METRICS, _SCOPE_METRICS, _METRICS = 1, 2, 2
_GAUGE, _SUM, _DATA_POINTS = 5, 7, 1
_START_TIME, _TIME, _AS_DOUBLE, _AS_INT = 2, 3, 4, 6
_DOUBLE_TAG = _AS_DOUBLE << 3 | _FIXED64
_INT_TAG = _AS_INT << 3 | _FIXED64

ABSENT = -1  # a point's place for a start time it does not have

_pack_time = struct.Struct("<Q").pack_into
_pack_int = struct.Struct("<Bq").pack_into
_pack_double = struct.Struct("<Bd").pack_into


class NumberPoint(Protocol):
    """What is written of a data point (the SDK's ``NumberDataPoint``)."""

    @property
    def start_time_unix_nano(self) -> int | None: ...
    @property
    def time_unix_nano(self) -> int: ...
    @property
    def value(self) -> int | float: ...


def number_point_places(request: bytes) -> array[int] | None:
    """For each data point of the request's gauges and sums, in order, three offsets: its start time's
    8 bytes (:data:`ABSENT` when it has none), its time's 8 bytes, and its value's tag byte. None when a
    point lacks a time or a value, or the bytes are not a well-formed request."""
    places = array("i")
    try:
        for point_start, point_end in _number_points(request):
            start = time = value = ABSENT
            for number, wire, begin, _end in _fields(request, point_start, point_end):
                if wire != _FIXED64:
                    continue
                if number == _START_TIME:
                    start = begin
                elif number == _TIME:
                    time = begin
                elif number in (_AS_DOUBLE, _AS_INT):
                    value = begin - 1  # the tag is one byte: field numbers below 16
            if time == ABSENT or value == ABSENT:
                return None
            places.extend((start, time, value))
    except (IndexError, ValueError):
        return None
    return places


def write_points(encoded: bytearray, places: array[int], points: Sequence[NumberPoint]) -> bool:
    """Write the points' times and values into ``encoded`` at ``places`` (from :func:`number_point_places`
    for the same series). False when a point cannot be written in place: a start time that is there in
    one and not in the other, or an integer out of ``sfixed64``'s range; ``encoded`` is then partly
    written and must be encoded anew."""
    if len(places) != 3 * len(points):
        return False
    try:
        offsets = iter(places)
        for point, start, time, value in zip(points, offsets, offsets, offsets, strict=True):
            start_time = point.start_time_unix_nano
            if start_time:
                if start == ABSENT:
                    return False
                _pack_time(encoded, start, start_time)
            elif start != ABSENT:
                return False
            _pack_time(encoded, time, point.time_unix_nano)
            number = point.value
            if isinstance(number, int):
                _pack_int(encoded, value, _INT_TAG, number)
            else:
                _pack_double(encoded, value, _DOUBLE_TAG, number)
    except struct.error:
        return False
    return True


def write_numbers(
    encoded: bytearray,
    places: array[int],
    first: int,
    starts: Sequence[int | None],
    time: int,
    values: Sequence[int | float],
) -> bool:
    """:func:`write_points` for the points ``first``, ``first + 1``, ... of the request, given as their start
    times, their one time and their values (no point objects); False where it would be."""
    if 3 * (first + len(values)) > len(places) or len(starts) != len(values):
        return False
    try:
        offsets = iter(places[3 * first : 3 * (first + len(values))])
        for start_time, number, start, time_place, value in zip(
            starts, values, offsets, offsets, offsets, strict=True
        ):
            if start_time:
                if start == ABSENT:
                    return False
                _pack_time(encoded, start, start_time)
            elif start != ABSENT:
                return False
            _pack_time(encoded, time_place, time)
            if isinstance(number, int):
                _pack_int(encoded, value, _INT_TAG, number)
            else:
                _pack_double(encoded, value, _DOUBLE_TAG, number)
    except struct.error:
        return False
    return True


def write_times(encoded: bytearray, places: array[int], first: int, count: int, time: int) -> bool:
    """Only the time of the points ``first`` to ``first + count - 1``: their start times and values are
    those written already."""
    if 3 * (first + count) > len(places):
        return False
    for place in places[3 * first + 1 : 3 * (first + count) : 3]:
        _pack_time(encoded, place, time)
    return True


@dataclass(frozen=True)
class MetricShape:
    """One metric of an encoded request as the parts it is put together from: its fields before and after
    its data (a gauge or a sum), the data's fields before and after its points, and where each point's
    encoding lies in the request (``points``: start and end, two a point)."""

    before: bytes
    data_field: int
    data_before: bytes
    data_after: bytes
    after: bytes
    points: array[int]


@dataclass(frozen=True)
class RequestShape:
    """An encoded request of one resource and one scope of gauges and sums, as the parts it is put together
    from: the resource's fields (but its scope metrics) and the scope's (but its metrics), and its metrics;
    ``places`` as :func:`number_point_places` gives them."""

    resource_before: bytes
    resource_after: bytes
    scope_before: bytes
    scope_after: bytes
    metrics: list[MetricShape]
    places: array[int]


def request_shape(request: bytes) -> RequestShape | None:
    """The parts of ``request``; None unless it holds one resource with one scope of gauges and sums, each
    metric's points one after the other, each with a time and a value."""
    try:
        (resource,) = list(_keyed_fields(request, 0, len(request)))
        if resource[:2] != (_RESOURCE_METRICS, _LENGTH_DELIMITED):
            return None
        resource_before, scope, resource_after = _around(request, resource[3], resource[4], _SCOPE_METRICS)
        if scope is None:
            return None
        scope_before, metric_fields, scope_after = _split(request, scope[0], scope[1], _METRICS)
        metrics: list[MetricShape] = []
        places = array("i")
        for start, end in metric_fields:
            before, data, after = _around(request, start, end, _GAUGE, _SUM)
            if data is None:
                return None
            data_start, data_end, data_field = data
            data_before, points, data_after = _split(request, data_start, data_end, _DATA_POINTS)
            spans = array("i")
            for point_start, point_end in points:
                numbers = _point_numbers(request, point_start, point_end)
                if numbers is None:
                    return None
                places.extend(numbers)
                spans.extend((point_start, point_end))
            metrics.append(MetricShape(before, data_field, data_before, data_after, after, spans))
    except (IndexError, ValueError):
        return None
    return RequestShape(resource_before, resource_after, scope_before, scope_after, metrics, places)


@dataclass(frozen=True, slots=True)
class PointRun:
    """Points that follow one another in an encoded request, taken over whole: ``data`` is their encoding
    (each point's field key and length, then the point), which began at ``origin`` there, and ``spans``
    and ``places`` are where they and their numbers lay there (as :class:`MetricShape` and
    :func:`number_point_places` give them)."""

    data: bytes
    origin: int
    spans: Sequence[int]
    places: Sequence[int]


def point_run(
    request: bytes, shape: RequestShape, metric: int, before: int, first: int, last: int
) -> PointRun:
    """Points ``first`` to ``last`` (both included) of metric ``metric`` of ``request`` (of ``shape``), whose
    metrics before it have ``before`` points."""
    spans = shape.metrics[metric].points
    start, end = spans[2 * first], spans[2 * last + 1]
    origin = start - 1 - len(_length(spans[2 * first + 1] - start))  # the first point's key and length
    return PointRun(
        request[origin:end],
        origin,
        spans[2 * first : 2 * last + 2],
        shape.places[3 * (before + first) : 3 * (before + last + 1)],
    )


def assemble(
    shape: RequestShape, points: Sequence[Sequence[tuple[bytes, int, int, int] | PointRun]]
) -> tuple[bytes, RequestShape]:
    """A request of ``shape``'s resource, scope and metric fields with ``points``: for each metric, each
    point's encoding and where its start time (:data:`ABSENT` when none), time and value tag lie in it, or
    a run of points of another request (:class:`PointRun`). Returns the request and its shape.

    The lengths come first (every message's length is written before its content), so each point's
    places are shifted once, to where they end up."""
    point_head = _key(_DATA_POINTS)
    # each metric's points as bytes, and each piece's offset within them
    metric_pieces: list[list[bytes]] = []
    metric_data_lengths: list[int] = []
    for metric, its_points in zip(shape.metrics, points, strict=True):
        pieces: list[bytes] = []
        for piece in its_points:
            if isinstance(piece, PointRun):
                pieces.append(piece.data)
            else:
                pieces.append(point_head + _length(len(piece[0])) + piece[0])
        metric_pieces.append(pieces)
        metric_data_lengths.append(len(metric.data_before) + sum(map(len, pieces)) + len(metric.data_after))
    data_heads = [
        metric.before + _key(metric.data_field) + _length(length)
        for metric, length in zip(shape.metrics, metric_data_lengths, strict=True)
    ]
    metric_lengths = [
        len(head) + length + len(metric.after)
        for metric, head, length in zip(shape.metrics, data_heads, metric_data_lengths, strict=True)
    ]
    metric_heads = [_key(_METRICS) + _length(length) for length in metric_lengths]
    scope_length = (
        len(shape.scope_before)
        + sum(len(head) + length for head, length in zip(metric_heads, metric_lengths, strict=True))
        + len(shape.scope_after)
    )
    scope_head = shape.resource_before + _key(_SCOPE_METRICS) + _length(scope_length)
    resource_length = len(scope_head) + scope_length + len(shape.resource_after)
    request_head = _key(_RESOURCE_METRICS) + _length(resource_length)
    parts: list[bytes] = [request_head, scope_head, shape.scope_before]
    at = len(request_head) + len(scope_head) + len(shape.scope_before)
    metrics: list[MetricShape] = []
    places = array("i")
    for metric, its_points, pieces, data_head, metric_head in zip(
        shape.metrics, points, metric_pieces, data_heads, metric_heads, strict=True
    ):
        parts += (metric_head, data_head, metric.data_before)
        at += len(metric_head) + len(data_head) + len(metric.data_before)
        spans = array("i")
        for piece, encoded in zip(its_points, pieces, strict=True):
            if isinstance(piece, PointRun):
                shift = at - piece.origin
                spans.extend([offset + shift for offset in piece.spans])
                places.extend([o if o == ABSENT else o + shift for o in piece.places])
            else:
                point, start, time, value = piece
                content = at + len(encoded) - len(point)
                spans.extend((content, at + len(encoded)))
                places.extend(
                    (ABSENT if start == ABSENT else content + start, content + time, content + value)
                )
            at += len(encoded)
        parts += pieces
        parts += (metric.data_after, metric.after)
        at += len(metric.data_after) + len(metric.after)
        metrics.append(
            MetricShape(
                metric.before, metric.data_field, metric.data_before, metric.data_after, metric.after, spans
            )
        )
    parts += (shape.scope_after, shape.resource_after)
    new_shape = RequestShape(
        shape.resource_before, shape.resource_after, shape.scope_before, shape.scope_after, metrics, places
    )
    return b"".join(parts), new_shape


def point_of(request: bytes, shape: RequestShape, metric: int, index: int) -> tuple[bytes, int, int, int]:
    """Point ``index`` of metric ``metric`` of ``request`` (of ``shape``), as :func:`assemble` takes it."""
    spans = shape.metrics[metric].points
    start, end = spans[2 * index], spans[2 * index + 1]
    numbers = _point_numbers(request, start, end)
    if numbers is None:
        raise ValueError("a point without its numbers")
    first, time, value = numbers
    return request[start:end], ABSENT if first == ABSENT else first - start, time - start, value - start


def _point_numbers(request: bytes, start: int, end: int) -> tuple[int, int, int] | None:
    """Where a point's start time (:data:`ABSENT` when none), time and value tag lie; None without a time or
    a value."""
    first = time = value = ABSENT
    for number, wire, begin, _end in _fields(request, start, end):
        if wire != _FIXED64:
            continue
        if number == _START_TIME:
            first = begin
        elif number == _TIME:
            time = begin
        elif number in (_AS_DOUBLE, _AS_INT):
            value = begin - 1  # the tag is one byte: field numbers below 16
    if time == ABSENT or value == ABSENT:
        return None
    return first, time, value


def _keyed_fields(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, key start, content start, end) of each field of ``data[start:end]``."""
    position = start
    for number, wire, begin, finish in _fields(data, start, end):
        yield number, wire, position, begin, finish
        position = finish


def _around(
    data: bytes, start: int, end: int, *wanted: int
) -> tuple[bytes, tuple[int, int, int] | None, bytes]:
    """A message's bytes before and after its one length-delimited field numbered one of ``wanted``, and
    that field's content (start, end, number); None for the field when there is not exactly one."""
    found = [
        (key, begin, finish, number)
        for number, wire, key, begin, finish in _keyed_fields(data, start, end)
        if number in wanted and wire == _LENGTH_DELIMITED
    ]
    if len(found) != 1:
        return b"", None, b""
    key, begin, finish, number = found[0]
    return data[start:key], (begin, finish, number), data[finish:end]


def _split(data: bytes, start: int, end: int, wanted: int) -> tuple[bytes, list[tuple[int, int]], bytes]:
    """A message's bytes before and after its fields numbered ``wanted`` (one after the other, else
    ValueError), and those fields' contents."""
    fields = list(_keyed_fields(data, start, end))
    indexes = [
        i for i, (number, wire, *_rest) in enumerate(fields) if number == wanted and wire == _LENGTH_DELIMITED
    ]
    if not indexes:
        return data[start:end], [], b""
    first, last = indexes[0], indexes[-1]
    if last - first + 1 != len(indexes):
        raise ValueError("repeated fields apart")
    before = data[start : fields[first][2]]
    after = data[fields[last][4] : end]
    return before, [(fields[i][3], fields[i][4]) for i in indexes], after


def _key(number: int) -> bytes:
    return bytes((number << 3 | _LENGTH_DELIMITED,))


def _length(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _number_points(request: bytes) -> Iterator[tuple[int, int]]:
    """(start, end) of every NumberDataPoint of a gauge or a sum, in order."""
    for resource in _embedded(request, 0, len(request), _RESOURCE_METRICS):
        for scope in _embedded(request, *resource, _SCOPE_METRICS):
            for metric in _embedded(request, *scope, _METRICS):
                for number, wire, begin, end in _fields(request, *metric):
                    if wire == _LENGTH_DELIMITED and number in (_GAUGE, _SUM):
                        yield from _embedded(request, begin, end, _DATA_POINTS)


def _embedded(data: bytes, start: int, end: int, wanted: int) -> Iterator[tuple[int, int]]:
    for number, wire, begin, finish in _fields(data, start, end):
        if number == wanted and wire == _LENGTH_DELIMITED:
            yield begin, finish


def _fields(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, start, end) of each field of the message in ``data[start:end]``."""
    position = start
    while position < end:
        key, position = _varint(data, position)
        number, wire = key >> 3, key & 7
        begin = position
        if wire == _VARINT:
            _, position = _varint(data, position)
        elif wire == _FIXED64:
            position += 8
        elif wire == _LENGTH_DELIMITED:
            length, begin = _varint(data, position)
            position = begin + length
        elif wire == _FIXED32:
            position += 4
        else:
            raise ValueError(f"wire type {wire} at {position}")
        if position > end:
            raise ValueError(f"field {number} runs past its message")
        yield number, wire, begin, position


def _varint(data: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
