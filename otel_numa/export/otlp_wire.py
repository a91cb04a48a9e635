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
