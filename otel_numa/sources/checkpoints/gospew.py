"""go-spew's ``%#v`` text of a Go value, and the FNV-1a 32 hash the kubelet takes of it.

The kubelet's checksum is FNV-1a 32 over ``spew.ConfigState{Indent: " ", SortKeys: true,
DisableMethods: true, SpewKeys: true}.Sprintf("%#v", value)``. With those settings the text is:

- a value's type in parentheses, ``(map[string]string)``, except where spew skips it: map keys, map
  values, slice elements and whatever a non-nil pointer points to;
- a pointer as ``(*pkg.T){...}``, or ``<*>{...}`` where the type is skipped; a nil pointer whose type is
  skipped is a bare ``<nil>`` that, as in spew, leaves the next value's type skipped too;
- strings raw (no quotes), integers in decimal, nil maps and slices ``<nil>``;
- ``map[k1:v1 k2:v2]`` with keys sorted (strings bytewise, integers numerically), ``[a b]`` for
  slices, ``{Field1:... Field2:...}`` for structs in declaration order.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable

from otel_numa.sources.checkpoints.gojson import (
    GoInt,
    GoMap,
    GoPointer,
    GoSlice,
    GoString,
    GoStruct,
    GoType,
    GoValue,
)

FNV32_OFFSET = 0x811C9DC5


def fnv1a_32(data: bytes) -> int:
    """FNV-1a, 32 bits (Go's ``hash/fnv.New32a``).

    Eight bytes per loop turn, masking once per turn: the low 32 bits of a product or of an XOR with a
    byte depend only on the low 32 bits of the operands, so the mask can wait.
    """
    prime, mask = 0x01000193, 0xFFFFFFFF
    value = FNV32_OFFSET
    whole = len(data) - len(data) % 8
    for a, b, c, d, e, f, g, h in struct.iter_unpack("8B", memoryview(data)[:whole]):
        value = (
            (((((((value ^ a) * prime ^ b) * prime ^ c) * prime ^ d) * prime ^ e) * prime ^ f) * prime ^ g)
            * prime
            ^ h
        ) * prime & mask
    for byte in data[whole:]:
        value = ((value ^ byte) * prime) & mask
    return value


class _SpewState:
    __slots__ = ("ignore_next_type", "parts")

    def __init__(self) -> None:
        self.parts: list[str] = []
        # spew's formatState.ignoreNextType: set before map keys/values, slice elements and pointees
        self.ignore_next_type = False


Render = Callable[[_SpewState, GoValue], None]


@functools.cache
def _renderer_for(go_type: GoType) -> Render:
    """The rendering function of a type, built once (dispatching on the type per value is too slow)."""
    if isinstance(go_type, GoPointer):
        return _pointer_renderer(go_type)
    type_prefix = f"({go_type.name})"
    if isinstance(go_type, GoString | GoInt):

        def render_scalar(state: _SpewState, value: GoValue) -> None:
            if state.ignore_next_type:
                state.ignore_next_type = False
            else:
                state.parts.append(type_prefix)
            state.parts.append(str(value))

        return render_scalar
    render_body = (
        _slice_body(go_type)
        if isinstance(go_type, GoSlice)
        else _map_body(go_type)
        if isinstance(go_type, GoMap)
        else _struct_body(go_type)
    )

    def render_composite(state: _SpewState, value: GoValue) -> None:
        if state.ignore_next_type:
            state.ignore_next_type = False
        else:
            state.parts.append(type_prefix)
        render_body(state, value)

    return render_composite


def _pointer_renderer(go_type: GoPointer) -> Render:
    render_elem = _renderer_for(go_type.elem)
    typed = f"(*{go_type.elem.name})"
    typed_nil = f"({go_type.name})<nil>"

    def render_pointer(state: _SpewState, value: GoValue) -> None:
        if value is None:
            # a skipped type stays skipped for whatever comes next, as in spew
            state.parts.append("<nil>" if state.ignore_next_type else typed_nil)
            return
        state.parts.append("<*>" if state.ignore_next_type else typed)
        state.ignore_next_type = True
        render_elem(state, value)

    return render_pointer


def _slice_body(go_type: GoSlice) -> Render:
    render_elem = _renderer_for(go_type.elem)
    scalar = isinstance(go_type.elem, GoString | GoInt)

    def render_slice(state: _SpewState, value: GoValue) -> None:
        if value is None:
            state.parts.append("<nil>")
            return
        assert isinstance(value, list)
        if scalar:
            state.parts.append("[" + " ".join(map(str, value)) + "]")
            return
        state.parts.append("[")
        for index, item in enumerate(value):
            if index:
                state.parts.append(" ")
            state.ignore_next_type = True
            render_elem(state, item)
        state.parts.append("]")

    return render_slice


def _map_body(go_type: GoMap) -> Render:
    render_elem = _renderer_for(go_type.elem)
    scalar = isinstance(go_type.elem, GoString | GoInt)

    def render_map(state: _SpewState, value: GoValue) -> None:
        if value is None:
            state.parts.append("<nil>")
            return
        assert isinstance(value, dict)
        # keys print without type; Python orders str by code point, i.e. Go's bytewise UTF-8 order
        keys = sorted(value)
        if scalar:
            state.parts.append("map[" + " ".join(f"{key}:{value[key]}" for key in keys) + "]")
            return
        parts = state.parts
        parts.append("map[")
        for index, key in enumerate(keys):
            parts.append(f" {key}:" if index else f"{key}:")
            state.ignore_next_type = True
            render_elem(state, value[key])
        parts.append("]")

    return render_map


def _struct_body(go_type: GoStruct) -> Render:
    fields = [
        (f" {go_field.name}:" if index else f"{go_field.name}:", go_field.name, _renderer_for(go_field.type))
        for index, go_field in enumerate(go_type.fields)
    ]

    def render_struct(state: _SpewState, value: GoValue) -> None:
        assert isinstance(value, dict)
        parts = state.parts
        parts.append("{")
        for label, name, render_field in fields:
            parts.append(label)
            render_field(state, value[name])
        parts.append("}")

    return render_struct


def spew_text(go_type: GoType, value: GoValue) -> str:
    """``%#v`` of a value of ``go_type`` (pass a :class:`GoPointer` type for a pointer)."""
    state = _SpewState()
    _renderer_for(go_type)(state, value)
    return "".join(state.parts)


def hash_text(text: str) -> int:
    """FNV-1a 32 of a Go string's bytes."""
    return fnv1a_32(text.encode("utf-8", "surrogatepass"))


def struct_checksum(
    go_type: GoType, value: GoValue, replacements: tuple[tuple[str, str, int], ...] = ()
) -> int:
    """The kubelet's checksum of a value, after its ``strings.Replace(text, old, new, count)`` renames."""
    text = spew_text(go_type, value)
    for old, new, count in replacements:
        text = text.replace(old, new, count)
    return hash_text(text)


def string_checksum(data: str) -> int:
    """The checksum of a Go string value (cpu v4 / memory v3 ``dataChecksum``): it hashes ``(string)data``."""
    return hash_text("(string)" + data)
