"""How many values the bytes of a protobuf message hold, counted from the wire format before it is parsed.

Parsing a message costs memory per value, not per byte: an 8 MiB answer of 500,000 tiny submessages takes
~190 MB once parsed (~23 bytes a byte; a real answer ~3). So the values are counted first, within a budget:
each field of each message (submessages walked into, by the message's descriptor), a packed repeated field
as many as its bytes (an upper bound: an element takes at least one).
Written from the published wire format (varint keys, wire types 0, 1, 2 and 5).
"""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from otel_numa.sources.errors import SourceCorrupt

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5
MessageDescriptor = Descriptor | Any  # a generated message's DESCRIPTOR (the upb or the Python class)


class TooManyValues(Exception):
    """The message holds more values than the budget."""


@functools.cache
def _fields(descriptor: MessageDescriptor) -> tuple[dict[int, Descriptor], frozenset[int]]:
    """The message-typed fields (number -> their type), and the numeric ones."""
    submessages = {
        field.number: field.message_type
        for field in descriptor.fields
        if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None
    }
    # a number, enum or bool delimited by length can only be a packed repeated field
    numbers = frozenset(
        field.number
        for field in descriptor.fields
        if field.type
        not in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES)
    )
    return submessages, numbers


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise SourceCorrupt("a varint longer than 10 bytes")


def check_values(data: bytes, descriptor: MessageDescriptor, budget: int) -> None:
    """:class:`TooManyValues` when the message ``data`` of type ``descriptor`` holds more than ``budget``
    values. Every value takes a byte at least, so a message no longer than the budget is not walked."""
    if len(data) > budget:
        count_values(data, descriptor, budget)


def count_values(data: bytes, descriptor: MessageDescriptor, budget: int) -> int:
    """The values of the message ``data`` of type ``descriptor``; :class:`TooManyValues` past ``budget``,
    :class:`SourceCorrupt` when the bytes are not a message."""
    values = 0
    stack = [(0, len(data), descriptor)]
    try:
        while stack:
            pos, end, message = stack.pop()
            submessages, packed = _fields(message)
            while pos < end:
                key, pos = _varint(data, pos)
                wire_type = key & 7
                if wire_type == _VARINT:
                    _, pos = _varint(data, pos)
                    values += 1
                elif wire_type == _LENGTH_DELIMITED:
                    length, pos = _varint(data, pos)
                    number = key >> 3
                    submessage = submessages.get(number)
                    if submessage is not None:
                        stack.append((pos, pos + length, submessage))
                    # a packed field holds at most one element a byte; a string or bytes is one value
                    values += length if number in packed else 1
                    pos += length
                elif wire_type == _FIXED64:
                    pos += 8
                    values += 1
                elif wire_type == _FIXED32:
                    pos += 4
                    values += 1
                else:
                    raise SourceCorrupt(f"wire type {wire_type}")
                if values > budget:
                    raise TooManyValues(f"more than {budget} values")
            if pos != end:
                raise SourceCorrupt("a field runs past its message")
    except IndexError as exc:
        raise SourceCorrupt("cut short") from exc
    return values
