"""Go types, and JSON decoded into them the way Go's ``encoding/json`` fills a typed value.

The kubelet's checksums cover the Go value that ``json.Unmarshal`` produced, not the bytes, so a reader
that verifies them must decode the same value. The rules reproduced here:

- object members match struct fields by JSON name, exactly or else case-insensitively (Go folds the
  Kelvin sign to ``k`` and the long s to ``s``); unknown members are skipped unchecked;
- ``null`` sets a map, slice or pointer to nil and leaves anything else untouched;
- an object decoded into a non-nil map adds to it (a member repeated in a struct merges maps), while a
  map element is decoded from its zero value; an array decoded into a slice reuses its elements;
- a number must fit the integer type exactly (no fraction, no exponent, no sign on unsigned types);
  integer map keys are decimal strings with an optional sign;
- ``[]byte`` comes from standard padded base64 (CR and LF ignored);
- invalid UTF-8 and lone surrogates become U+FFFD, one per bad byte or surrogate.

A type mismatch does not stop decoding (Go goes on too); :class:`GoDecoder` records the first one and the
caller rejects the file. Syntax errors never reach it: :func:`parse_json` raises first. Nesting deeper than
Python's recursion limit (about 1000, where Go allows 10000) is rejected as a syntax error.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from otel_numa.sources.errors import SourceCorrupt

# Values: str for strings, int for integers, list or None for slices, dict or None for maps, StructValue
# or None for pointers, StructValue (Go field name -> value) for structs.
GoValue = object
StructValue = dict[str, object]

PARSE_ERROR = "parse_error"


# ---------------------------------------------------------------------------------------------- types


@dataclass(frozen=True, slots=True)
class GoString:
    """A string kind; ``name`` is how reflect prints the type (``string``, ``v1.ResourceName``)."""

    name: str = "string"


@dataclass(frozen=True, slots=True)
class GoInt:
    """An integer kind of the given width and signedness."""

    name: str = "int"
    signed: bool = True
    bits: int = 64


@dataclass(frozen=True, slots=True)
class GoSlice:
    name: str
    elem: GoType


@dataclass(frozen=True, slots=True)
class GoMap:
    name: str
    key: GoString | GoInt
    elem: GoType


@dataclass(frozen=True, slots=True)
class GoPointer:
    """A pointer to a struct; ``name`` is the pointer's type name (``*state.MemoryTable``)."""

    name: str
    elem: GoStruct


@dataclass(frozen=True, slots=True)
class GoField:
    name: str
    json_name: str
    type: GoType


# A struct with a custom UnmarshalJSON: called with the decoder, the JSON node (None for null) and the
# current value; returns the new value.
JsonHook = Callable[["GoDecoder", object, StructValue], StructValue]


@dataclass(frozen=True, slots=True)
class GoStruct:
    name: str
    fields: tuple[GoField, ...]
    json_hook: JsonHook | None = field(default=None, compare=False)


GoType = GoString | GoInt | GoSlice | GoMap | GoPointer | GoStruct

STRING = GoString()
INT = GoInt()
UINT64 = GoInt("uint64", signed=False)
UINT8 = GoInt("uint8", signed=False, bits=8)
BYTES = GoSlice("[]uint8", UINT8)


def zero_value(go_type: GoType) -> GoValue:
    """Go's zero value: empty string, 0, nil (None) for slices, maps and pointers, zeroed fields."""
    if isinstance(go_type, GoString):
        return ""
    if isinstance(go_type, GoInt):
        return 0
    if isinstance(go_type, GoStruct):
        return {f.name: zero_value(f.type) for f in go_type.fields}
    return None


# ---------------------------------------------------------------------------------------------- parsing


class JsonObject:
    """A JSON object with its members in file order, duplicates kept (Go processes each in turn)."""

    __slots__ = ("members",)

    def __init__(self, members: list[tuple[str, object]]) -> None:
        self.members = members


class JsonNumber:
    """A JSON number kept as its literal: Go converts it only once the target type is known."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _go_replace_bad_bytes(error: UnicodeError) -> tuple[str, int]:
    # Go's utf8.DecodeRune consumes one byte per invalid sequence, so each bad byte becomes one U+FFFD.
    if not isinstance(error, UnicodeDecodeError):
        raise error
    return "\ufffd", error.start + 1


_ERROR_HANDLER = "otel_numa.go_utf8_replace"
codecs.register_error(_ERROR_HANDLER, _go_replace_bad_bytes)

_SURROGATE = re.compile("[\ud800-\udfff]")


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def parse_json(data: bytes | str) -> object:
    """Parse JSON text into nodes: JsonObject, list, str, JsonNumber, bool, None.

    Raises SourceCorrupt("parse_error") for anything Go's scanner rejects: bad syntax, trailing data, a
    byte-order mark, NaN/Infinity, an empty input.
    """
    text = data.decode("utf-8", _ERROR_HANDLER) if isinstance(data, bytes) else data
    try:
        return json.loads(
            text,
            object_pairs_hook=JsonObject,
            parse_int=JsonNumber,
            parse_float=JsonNumber,
            parse_constant=_reject_constant,
        )
    except json.JSONDecodeError as exc:
        raise SourceCorrupt(f"not valid JSON: {exc.msg} at offset {exc.pos}", error_type=PARSE_ERROR) from exc
    except (ValueError, RecursionError) as exc:
        raise SourceCorrupt(f"not valid JSON: {exc}", error_type=PARSE_ERROR) from exc


def go_string(text: str) -> str:
    """A JSON string as Go holds it: lone surrogates (from ``\\ud800`` escapes) become U+FFFD."""
    if _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub("\ufffd", text)


# Go's case folding of field names; only these two non-ASCII runes fold onto ASCII letters.
_FOLD = {**{c: c + 32 for c in range(ord("A"), ord("Z") + 1)}, 0x212A: ord("k"), 0x017F: ord("s")}


def fold_name(name: str) -> str:
    return name.translate(_FOLD)


@functools.cache
def _field_index(struct: GoStruct) -> tuple[dict[str, GoField], dict[str, GoField]]:
    exact: dict[str, GoField] = {}
    folded: dict[str, GoField] = {}
    for f in struct.fields:
        exact.setdefault(f.json_name, f)
        folded.setdefault(fold_name(f.json_name), f)
    return exact, folded


def find_member(obj: JsonObject, json_name: str) -> object | None:
    """The last member matching ``json_name`` the way a struct field would (None when absent)."""
    wanted = fold_name(json_name)
    found: object | None = None
    for key, node in obj.members:
        if key == json_name or fold_name(go_string(key)) == wanted:
            found = node
    return found


_INT_KEY = re.compile(r"[+-]?[0-9]+")
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")


def _node_kind(node: object) -> str:
    if node is None:
        return "null"
    if isinstance(node, bool):
        return "bool"
    if isinstance(node, JsonNumber):
        return "number " + node.text[:32]
    if isinstance(node, str):
        return "string"
    if isinstance(node, list):
        return "array"
    return "object"


class GoDecoder:
    """Decodes parsed JSON nodes into Go values of a given type, remembering the first type error."""

    def __init__(self) -> None:
        self.first_error: str | None = None

    def error(self, message: str) -> None:
        if self.first_error is None:
            self.first_error = message

    def _mismatch(self, node: object, go_type: GoType) -> None:
        self.error(f"cannot decode {_node_kind(node)} into Go value of type {go_type.name}")

    def decode(self, go_type: GoType, node: object, current: GoValue) -> GoValue:
        """The value ``current`` becomes when ``node`` is decoded into it."""
        if isinstance(go_type, GoStruct):
            return self._struct(go_type, node, _as_struct(current))
        if node is None:
            return current if isinstance(go_type, GoString | GoInt) else None
        if isinstance(go_type, GoString):
            if isinstance(node, str):
                return go_string(node)
            self._mismatch(node, go_type)
            return current
        if isinstance(go_type, GoInt):
            return self._integer(go_type, node, current)
        if isinstance(go_type, GoSlice):
            return self._slice(go_type, node, current)
        if isinstance(go_type, GoMap):
            return self._map(go_type, node, current)
        target = _as_struct(current) if current is not None else _as_struct(zero_value(go_type.elem))
        return self._struct(go_type.elem, node, target)

    def _integer(self, go_type: GoInt, node: object, current: GoValue) -> GoValue:
        if not isinstance(node, JsonNumber):
            self._mismatch(node, go_type)
            return current
        value = self.parse_integer(node.text, go_type)
        if value is None:
            self._mismatch(node, go_type)
            return current
        return value

    @staticmethod
    def parse_integer(text: str, go_type: GoInt) -> int | None:
        """strconv.ParseInt/ParseUint base 10 plus the type's range check; None when Go would fail."""
        if _INT_KEY.fullmatch(text) is None or len(text) > 24:
            return None
        if not go_type.signed and text.startswith("-"):
            return None
        value = int(text)
        if go_type.signed:
            limit = 1 << (go_type.bits - 1)
            return value if -limit <= value < limit else None
        return value if value < (1 << go_type.bits) else None

    def _slice(self, go_type: GoSlice, node: object, current: GoValue) -> GoValue:
        if go_type.elem == UINT8 and isinstance(node, str):
            return self._base64(node, current)
        if not isinstance(node, list):
            self._mismatch(node, go_type)
            return current
        existing = current if isinstance(current, list) else []
        result: list[GoValue] = []
        for index, item in enumerate(node):
            base = existing[index] if index < len(existing) else zero_value(go_type.elem)
            result.append(self.decode(go_type.elem, item, base))
        return result

    def _base64(self, text: str, current: GoValue) -> GoValue:
        compact = text.replace("\r", "").replace("\n", "")
        if _BASE64.fullmatch(compact) is None:
            self.error("illegal base64 data in a []byte field")
            return current
        try:
            return list(base64.b64decode(compact, validate=True))
        except binascii.Error:
            self.error("illegal base64 data in a []byte field")
            return current

    def _map(self, go_type: GoMap, node: object, current: GoValue) -> GoValue:
        if not isinstance(node, JsonObject):
            self._mismatch(node, go_type)
            return current
        result = current if isinstance(current, dict) else {}
        for raw_key, item in node.members:
            value = self.decode(go_type.elem, item, zero_value(go_type.elem))
            key = go_string(raw_key)
            if isinstance(go_type.key, GoInt):
                number = self.parse_integer(key, go_type.key)
                if number is None:
                    self.error(f"cannot decode map key {key[:32]!r} into Go type {go_type.key.name}")
                    continue
                result[number] = value
            else:
                result[key] = value
        return result

    def _struct(self, go_type: GoStruct, node: object, current: StructValue) -> StructValue:
        if go_type.json_hook is not None:
            return go_type.json_hook(self, node, current)
        if node is None:
            return current
        if not isinstance(node, JsonObject):
            self._mismatch(node, go_type)
            return current
        exact, folded = _field_index(go_type)
        for raw_key, item in node.members:
            target = exact.get(raw_key)
            if target is None:
                target = folded.get(fold_name(go_string(raw_key)))
                if target is None:
                    continue
            current[target.name] = self.decode(target.type, item, current[target.name])
        return current


def _as_struct(value: GoValue) -> StructValue:
    if not isinstance(value, dict):
        raise TypeError("a struct value must be a dict")
    return value


def decode_document(go_type: GoType, node: object, initial: GoValue) -> tuple[GoValue, str | None]:
    """Decode a whole parsed document into ``initial``; returns the value and the first type error."""
    decoder = GoDecoder()
    value = decoder.decode(go_type, node, initial)
    return value, decoder.first_error
