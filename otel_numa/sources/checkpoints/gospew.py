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
FNV32_PRIME = 0x01000193


def fnv1a_32(data: bytes) -> int:
    """FNV-1a, 32 bits (Go's ``hash/fnv.New32a``)."""
    value = FNV32_OFFSET
    for byte in data:
        value = ((value ^ byte) * FNV32_PRIME) & 0xFFFFFFFF
    return value


class _SpewPrinter:
    def __init__(self) -> None:
        self.parts: list[str] = []
        # spew's formatState.ignoreNextType: set before map keys/values, slice elements and pointees
        self.ignore_next_type = False

    def format(self, go_type: GoType, value: GoValue) -> None:
        if isinstance(go_type, GoPointer):
            self._pointer(go_type, value)
            return
        if not self.ignore_next_type:
            self.parts.append(f"({go_type.name})")
        self.ignore_next_type = False
        if isinstance(go_type, GoString | GoInt):
            self.parts.append(str(value))
        elif isinstance(go_type, GoSlice):
            self._slice(go_type, value)
        elif isinstance(go_type, GoMap):
            self._map(go_type, value)
        else:
            self._struct(go_type, value)

    def _pointer(self, go_type: GoPointer, value: GoValue) -> None:
        if value is None:
            if not self.ignore_next_type:
                self.parts.append(f"({go_type.name})")
            self.parts.append("<nil>")
            return
        self.parts.append("<*>" if self.ignore_next_type else f"(*{go_type.elem.name})")
        self.ignore_next_type = True
        self.format(go_type.elem, value)

    def _slice(self, go_type: GoSlice, value: GoValue) -> None:
        if value is None:
            self.parts.append("<nil>")
            return
        assert isinstance(value, list)
        self.parts.append("[")
        for index, item in enumerate(value):
            if index:
                self.parts.append(" ")
            self.ignore_next_type = True
            self.format(go_type.elem, item)
        self.parts.append("]")

    def _map(self, go_type: GoMap, value: GoValue) -> None:
        if value is None:
            self.parts.append("<nil>")
            return
        assert isinstance(value, dict)
        self.parts.append("map[")
        # Python orders str by code point, which for valid Unicode is Go's bytewise UTF-8 order.
        for index, key in enumerate(sorted(value)):
            if index:
                self.parts.append(" ")
            self.ignore_next_type = True
            self.format(go_type.key, key)
            self.parts.append(":")
            self.ignore_next_type = True
            self.format(go_type.elem, value[key])
        self.parts.append("]")

    def _struct(self, go_type: GoStruct, value: GoValue) -> None:
        assert isinstance(value, dict)
        self.parts.append("{")
        for index, go_field in enumerate(go_type.fields):
            if index:
                self.parts.append(" ")
            self.parts.append(go_field.name)
            self.parts.append(":")
            self.format(go_field.type, value[go_field.name])
        self.parts.append("}")


def spew_text(go_type: GoType, value: GoValue) -> str:
    """``%#v`` of a value of ``go_type`` (pass a :class:`GoPointer` type for a pointer)."""
    printer = _SpewPrinter()
    printer.format(go_type, value)
    return "".join(printer.parts)


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
