"""What the checkpoint readers share: reading a file, the error words, Go's CPU set syntax, and trying
each layout a kubelet may have written until one decodes and verifies."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from otel_numa.sources.checkpoints.gojson import (
    PARSE_ERROR,
    FieldCache,
    GoStruct,
    GoType,
    GoValue,
    JsonObject,
    StructValue,
    decode_document,
    decode_fields,
    fold_name,
    parse_json,
)
from otel_numa.sources.checkpoints.gospew import string_checksum, struct_checksum
from otel_numa.sources.errors import SourceCorrupt, SourceError
from otel_numa.sources.files import MAX_CPU_ID, OUT_OF_RANGE, read_bytes

# error_type words of SourceCorrupt (low cardinality: they become a metric attribute)
WRONG_TYPE = "wrong_type"  # valid JSON whose types fit no layout
CHECKSUM_MISMATCH = "checksum_mismatch"
UNSUPPORTED_LAYOUT = "unsupported_layout"  # valid JSON, but not a checkpoint of this kind
INVALID_VALUE = "invalid_value"  # verified, but a value the kubelet itself would refuse

# Real checkpoints are kilobytes (a node of 110 pods: ~10 KB of CPU sets, ~60 KB of memory blocks, devices
# with their allocate responses up to ~1 MB). Parsing costs ~25 bytes of heap per byte of JSON of small
# objects, so the cap keeps a runaway file's parse (~55 MB at most) inside the chart's 128 Mi limit
# (docs/decisions/hostile-input.md).
MAX_CHECKPOINT_BYTES = 2 * 1024 * 1024


def read_checkpoint_bytes(path: Path) -> bytes:
    """The file's bytes, opened read-only (nothing is ever created, locked or written); a larger file than
    :data:`MAX_CHECKPOINT_BYTES` is rejected whole (``too_large``)."""
    return read_bytes(path, limit=MAX_CHECKPOINT_BYTES)


def with_path(path: Path, error: SourceError) -> SourceError:
    """The same error with the file named in its message."""
    return type(error)(f"{path}: {error}", error_type=error.error_type)


_ATOI = re.compile(r"[+-]?[0-9]{1,19}")


def _atoi(text: str, whole: str) -> int:
    if _ATOI.fullmatch(text) is None:
        raise SourceCorrupt("bad CPU set", error_type=INVALID_VALUE)
    return int(text)


def parse_go_cpuset(text: str, limit: int = MAX_CPU_ID) -> frozenset[int]:
    """Parse a CPU set as the kubelet's ``cpuset.Parse`` does (``0-3,8``; empty is the empty set).

    Stricter than the kernel's list syntax, like Go: no blanks, no empty items, ``strconv.Atoi`` numbers.
    A CPU above ``limit`` (the machine's highest, when known) is ``out_of_range``, found before the set is
    expanded.
    """
    if text == "":
        return frozenset()
    cpus: set[int] = set()
    for item in text.split(","):
        low_text, dash, high_text = item.partition("-")
        low = _atoi(low_text, text)
        high = _atoi(high_text, text) if dash else low
        if low > high:
            raise SourceCorrupt("bad CPU range in CPU set", error_type=INVALID_VALUE)
        if low < 0 or high > MAX_CPU_ID:
            raise SourceCorrupt("CPU id out of range in CPU set", error_type=INVALID_VALUE)
        if high > limit:
            raise SourceCorrupt("a CPU the machine does not have", error_type=OUT_OF_RANGE)
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def parse_top_object(data: bytes, what: str) -> JsonObject:
    """Parse a checkpoint file; anything but a JSON object (or null, which Go decodes as nothing) fails."""
    try:
        node = parse_json(data)
    except SourceCorrupt as exc:
        raise SourceCorrupt(f"{what}: {exc}", error_type=exc.error_type) from exc
    if node is None:
        return JsonObject([])
    if not isinstance(node, JsonObject):
        raise SourceCorrupt(f"{what}: not a JSON object", error_type=WRONG_TYPE)
    return node


@dataclass(frozen=True, slots=True)
class Layout:
    """One on-disk generation of a checkpoint.

    ``go_type`` is the struct the file is decoded into, starting from ``make_initial()`` (the kubelet's
    constructor, whose maps are empty rather than nil). ``hashed`` gives the type and value the checksum
    covers, with the checksum field zeroed. Each of ``hash_variants`` is a list of ``strings.Replace``
    renames (old, new, count) applied to the spew text: kubelet builds differ in the type name they hash.
    """

    name: str
    go_type: GoStruct
    make_initial: Callable[[], StructValue]
    hashed: Callable[[StructValue], tuple[GoType, GoValue]]
    hash_variants: tuple[tuple[tuple[str, str, int], ...], ...] = ((),)
    checksum_field: str = "Checksum"
    zero_checksum_accepted: bool = True


@dataclass(frozen=True, slots=True)
class Verified:
    layout: str
    value: StructValue
    checksum_verified: bool


def verify_layouts(top: JsonObject, layouts: Sequence[Layout], what: str) -> Verified:
    """The first layout whose decoding succeeds and whose checksum matches one of its name variants."""
    decode_errors: list[str] = []
    mismatched: list[str] = []
    decoded_fields: FieldCache = {}
    for layout in layouts:
        value, error = decode_fields(layout.go_type, top, layout.make_initial(), decoded_fields)
        if error is not None:
            decode_errors.append(f"{layout.name}: {error}")
            continue
        stored = value[layout.checksum_field]
        if stored == 0 and layout.zero_checksum_accepted:
            # the kubelet accepts a zero checksum, for files from its old file backend
            return Verified(layout.name, value, checksum_verified=False)
        hashed_type, hashed_value = layout.hashed(value)
        for replacements in layout.hash_variants:
            if struct_checksum(hashed_type, hashed_value, replacements) == stored:
                return Verified(layout.name, value, checksum_verified=True)
        mismatched.append(layout.name)
    if mismatched:
        raise SourceCorrupt(
            f"{what}: checksum matches no layout (tried {', '.join(mismatched)})",
            error_type=CHECKSUM_MISMATCH,
        )
    raise SourceCorrupt(
        f"{what}: JSON types fit no layout ({'; '.join(decode_errors)})", error_type=WRONG_TYPE
    )


def verify_data_layout(
    top: JsonObject,
    top_type: GoStruct,
    data_type: GoStruct,
    make_initial: Callable[[GoStruct], StructValue],
    layout: str,
    what: str,
) -> Verified | None:
    """The verdict on a layout that keeps its data as a JSON string (``data``) checked by ``dataChecksum``.

    None when the file has neither a non-empty ``data`` nor a non-zero ``dataChecksum``: older layouts then
    decide. Otherwise those two alone decide, as in the kubelet, which never falls back on the copies of the
    members beside them (whose ``checksum`` it leaves 0 or stale).
    """
    if not any(fold_name(key) in ("data", "datachecksum") for key, _ in top.members):
        return None  # the common case, decided without decoding the whole file
    value, error = decode_document(top_type, top, make_initial(top_type))
    assert isinstance(value, dict)
    data, data_checksum = str(value["Data"]), value["DataChecksum"]
    if data == "" and data_checksum == 0:
        return None
    if error is not None:
        raise SourceCorrupt(f"{what}: {layout} layout: {error}", error_type=WRONG_TYPE)
    try:
        data_node = parse_json(data)
    except SourceCorrupt as exc:
        raise SourceCorrupt(f"{what}: {layout} data: {exc}", error_type=PARSE_ERROR) from exc
    decoded, error = decode_document(data_type, data_node, make_initial(data_type))
    if error is not None:
        raise SourceCorrupt(f"{what}: {layout} data: {error}", error_type=WRONG_TYPE)
    if string_checksum(data) != data_checksum:
        raise SourceCorrupt(f"{what}: dataChecksum does not match its data", error_type=CHECKSUM_MISMATCH)
    assert isinstance(decoded, dict)
    return Verified(layout, decoded, checksum_verified=True)
