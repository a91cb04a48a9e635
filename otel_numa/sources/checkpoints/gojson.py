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
from dataclasses import dataclass

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
    json_hook: JsonHook | None = None


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


def parse_json(data: bytes | bytearray | str) -> object:
    """Parse JSON text into nodes: JsonObject, list, str, JsonNumber, bool, None.

    Raises SourceCorrupt("parse_error") for anything Go's scanner rejects: bad syntax, trailing data, a
    byte-order mark, NaN/Infinity, an empty input.
    """
    # decoded here, not by json.loads, which would also guess UTF-16 and UTF-32
    text = data if isinstance(data, str) else bytes(data).decode("utf-8", _ERROR_HANDLER)
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


def find_member(obj: JsonObject, json_name: str) -> object | None:
    """The last member matching ``json_name`` the way a struct field would (None when absent)."""
    wanted = fold_name(json_name)
    found: object | None = None
    for key, node in obj.members:
        if key == json_name or fold_name(go_string(key)) == wanted:
            found = node
    return found


_INT_LITERAL = re.compile(r"[+-]?[0-9]+")
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


def parse_integer(text: str, go_type: GoInt) -> int | None:
    """``strconv.ParseInt``/``ParseUint`` in base 10 plus the type's range check; None where Go fails."""
    if len(text) > 24 or _INT_LITERAL.fullmatch(text) is None:
        return None
    if not go_type.signed and text[0] == "-":
        return None
    value = int(text)
    if go_type.signed:
        limit = 1 << (go_type.bits - 1)
        return value if -limit <= value < limit else None
    return value if value < (1 << go_type.bits) else None


class GoDecoder:
    """Decodes parsed JSON nodes into Go values, remembering the first type error (as Go does)."""

    __slots__ = ("first_error",)

    def __init__(self) -> None:
        self.first_error: str | None = None

    def error(self, message: str) -> None:
        if self.first_error is None:
            self.first_error = message

    def mismatch(self, node: object, go_type: GoType) -> None:
        self.error(f"cannot decode {_node_kind(node)} into Go value of type {go_type.name}")

    def decode(self, go_type: GoType, node: object, current: GoValue) -> GoValue:
        """The value ``current`` becomes when ``node`` is decoded into it."""
        return decoder_for(go_type)(self, node, current)


# A compiled decoder for one Go type: (decoder, JSON node, current value) -> new value.
Decode = Callable[[GoDecoder, object, GoValue], GoValue]


def zero_factory(go_type: GoType) -> Callable[[], GoValue]:
    """Makes fresh zero values of ``go_type`` (structs are mutable dicts, so each needs its own)."""
    if isinstance(go_type, GoStruct):
        return lambda: zero_value(go_type)
    constant = zero_value(go_type)
    return lambda: constant


@functools.cache
def decoder_for(go_type: GoType) -> Decode:
    """The decoding function of a type, built once: dispatching on the type per node is too slow."""
    if isinstance(go_type, GoString):
        return _string_decoder(go_type)
    if isinstance(go_type, GoInt):
        return _integer_decoder(go_type)
    if isinstance(go_type, GoSlice):
        return _slice_decoder(go_type)
    if isinstance(go_type, GoMap):
        return _map_decoder(go_type)
    if isinstance(go_type, GoPointer):
        return _pointer_decoder(go_type)
    return _struct_decoder(go_type)


def _string_decoder(go_type: GoString) -> Decode:
    def decode_string(decoder: GoDecoder, node: object, current: GoValue) -> GoValue:
        if type(node) is str:
            return go_string(node)
        if node is not None:
            decoder.mismatch(node, go_type)
        return current

    return decode_string


def _integer_decoder(go_type: GoInt) -> Decode:
    def decode_integer(decoder: GoDecoder, node: object, current: GoValue) -> GoValue:
        if type(node) is JsonNumber:
            text = node.text
            # a JSON number is an integer literal unless it has a fraction or an exponent
            if "." not in text and "e" not in text and "E" not in text:
                value = parse_integer(text, go_type)
                if value is not None:
                    return value
        elif node is None:
            return current
        decoder.mismatch(node, go_type)
        return current

    return decode_integer


def _slice_decoder(go_type: GoSlice) -> Decode:
    decode_elem = decoder_for(go_type.elem)
    make_zero = zero_factory(go_type.elem)
    is_bytes = go_type.elem == UINT8

    def decode_slice(decoder: GoDecoder, node: object, current: GoValue) -> GoValue:
        if type(node) is list:
            # Go decodes into the slice's existing elements, then into zero values
            existing = current if type(current) is list else []
            count = len(existing)
            return [
                decode_elem(decoder, item, existing[index] if index < count else make_zero())
                for index, item in enumerate(node)
            ]
        if node is None:
            return None
        if is_bytes and type(node) is str:
            return _decode_base64(decoder, node, current)
        decoder.mismatch(node, go_type)
        return current

    return decode_slice


def _decode_base64(decoder: GoDecoder, text: str, current: GoValue) -> GoValue:
    compact = text.replace("\r", "").replace("\n", "")
    if _BASE64.fullmatch(compact) is None:
        decoder.error("illegal base64 data in a []byte field")
        return current
    try:
        return list(base64.b64decode(compact, validate=True))
    except binascii.Error:
        decoder.error("illegal base64 data in a []byte field")
        return current


def _map_decoder(go_type: GoMap) -> Decode:
    decode_elem = decoder_for(go_type.elem)
    make_zero = zero_factory(go_type.elem)
    key_type = go_type.key

    def decode_map(decoder: GoDecoder, node: object, current: GoValue) -> GoValue:
        if type(node) is not JsonObject:
            if node is None:
                return None
            decoder.mismatch(node, go_type)
            return current
        # an object adds to an existing map; each element starts from its zero value
        result = current if type(current) is dict else {}
        for raw_key, item in node.members:
            value = decode_elem(decoder, item, make_zero())
            key = go_string(raw_key)
            if isinstance(key_type, GoInt):
                number = parse_integer(key, key_type)
                if number is None:
                    decoder.error(f"cannot decode a map key into Go type {key_type.name}")
                    continue
                result[number] = value
            else:
                result[key] = value
        return result

    return decode_map


def _pointer_decoder(go_type: GoPointer) -> Decode:
    decode_elem = decoder_for(go_type.elem)

    def decode_pointer(decoder: GoDecoder, node: object, current: GoValue) -> GoValue:
        if node is None:
            return None
        # a nil pointer gets a new zero struct; a non-nil one is decoded into
        return decode_elem(decoder, node, current if current is not None else zero_value(go_type.elem))

    return decode_pointer


def _struct_decoder(go_type: GoStruct) -> Decode:
    hook = go_type.json_hook
    exact: dict[str, tuple[str, Decode]] = {}
    folded: dict[str, tuple[str, Decode]] = {}
    for go_field in go_type.fields:
        target = (go_field.name, decoder_for(go_field.type))
        exact.setdefault(go_field.json_name, target)
        folded.setdefault(fold_name(go_field.json_name), target)

    def decode_struct(decoder: GoDecoder, node: object, current: GoValue) -> GoValue:
        value = _as_struct(current)
        if hook is not None:
            return hook(decoder, node, value)
        if type(node) is not JsonObject:
            if node is not None:
                decoder.mismatch(node, go_type)
            return value
        for raw_key, item in node.members:
            target = exact.get(raw_key) or folded.get(fold_name(go_string(raw_key)))
            if target is not None:
                name, decode_field = target
                value[name] = decode_field(decoder, item, value[name])
        return value

    return decode_struct


def _as_struct(value: GoValue) -> StructValue:
    if not isinstance(value, dict):
        raise TypeError("a struct value must be a dict")
    return value


FieldCache = dict[tuple[str, GoType], tuple[GoValue, str | None]]


def decode_fields(
    go_type: GoStruct, obj: JsonObject, initial: StructValue, cache: FieldCache
) -> tuple[StructValue, str | None]:
    """Decode an object into a struct field by field, reusing fields already decoded into another struct.

    Equivalent to decoding the object at once: each member goes to one field, so fields do not interact.
    Layouts of one checkpoint share most fields; decoding those once saves most of the work. The cache
    assumes that a field with the same name and type starts from the same initial value in every layout.
    """
    value = dict(initial)
    first_error: str | None = None
    for go_field in go_type.fields:
        key = (go_field.json_name, go_field.type)
        if key not in cache:
            decoder = GoDecoder()
            decode_field = decoder_for(go_field.type)
            wanted = fold_name(go_field.json_name)
            field_value = initial[go_field.name]
            for raw_key, item in obj.members:
                if raw_key == go_field.json_name or fold_name(go_string(raw_key)) == wanted:
                    field_value = decode_field(decoder, item, field_value)
            cache[key] = (field_value, decoder.first_error)
        value[go_field.name], error = cache[key]
        first_error = first_error or error
    return value, first_error


def decode_document(go_type: GoType, node: object, initial: GoValue) -> tuple[GoValue, str | None]:
    """Decode a whole parsed document into ``initial``; returns the value and the first type error."""
    decoder = GoDecoder()
    value = decoder.decode(go_type, node, initial)
    return value, decoder.first_error
