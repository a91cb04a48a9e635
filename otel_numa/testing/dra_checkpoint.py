"""The kubelet's DRA manager checkpoint (``dra_manager_state``), verified as the kubelet does.

The agent does not read it (it carries no NUMA placement); the checkpoint tests use it to tell such files
from the ones the agent reads. It holds ``{"Data": "<JSON text>", "Checksum": N}`` where ``Checksum`` is
the CRC-32 (IEEE) of the Data text, and the text lists resource claims (``Entries``, or
``ClaimInfoStateList`` in early builds).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

from otel_numa.sources.checkpoints.common import (
    CHECKSUM_MISMATCH,
    UNSUPPORTED_LAYOUT,
    WRONG_TYPE,
    parse_top_object,
    read_checkpoint_bytes,
    with_path,
)
from otel_numa.sources.checkpoints.gojson import (
    PARSE_ERROR,
    STRING,
    GoField,
    GoInt,
    GoStruct,
    JsonObject,
    decode_document,
    find_member,
    parse_json,
)
from otel_numa.sources.errors import SourceCorrupt, SourceError

WHAT = "dra_manager_state"

_CHECKPOINT = GoStruct(
    "state.Checkpoint",
    (
        GoField("Data", "Data", STRING),
        GoField("Checksum", "Checksum", GoInt("uint32", signed=False, bits=32)),
    ),
)


@dataclass(frozen=True, slots=True)
class DraManagerState:
    """A verified DRA checkpoint: only how many resource claims it lists."""

    claim_count: int


def parse_dra_checkpoint(data: bytes) -> DraManagerState:
    """Verify a DRA checkpoint's CRC-32; raises SourceCorrupt when the kubelet would refuse it."""
    try:
        top = parse_top_object(data, WHAT)
        value, error = decode_document(_CHECKPOINT, top, {"Data": "", "Checksum": 0})
        if error is not None:
            raise SourceCorrupt(f"{WHAT}: {error}", error_type=WRONG_TYPE)
        assert isinstance(value, dict)
        text = str(value["Data"])
        if zlib.crc32(text.encode("utf-8", "surrogatepass")) != value["Checksum"]:
            raise SourceCorrupt(f"{WHAT}: CRC-32 does not match its data", error_type=CHECKSUM_MISMATCH)
        try:
            payload = parse_json(text)
        except SourceCorrupt as exc:
            raise SourceCorrupt(f"{WHAT}: data: {exc}", error_type=PARSE_ERROR) from exc
        if not isinstance(payload, JsonObject):
            raise SourceCorrupt(f"{WHAT}: data is not a JSON object", error_type=UNSUPPORTED_LAYOUT)
        claims = find_member(payload, "Entries")
        if claims is None:
            claims = find_member(payload, "ClaimInfoStateList")
        return DraManagerState(claim_count=len(claims) if isinstance(claims, list) else 0)
    except SourceError:
        raise
    except (ValueError, RecursionError) as exc:
        raise SourceCorrupt(f"{WHAT}: {exc}", error_type=PARSE_ERROR) from exc


def read_dra_checkpoint(path: Path) -> DraManagerState:
    """Read and verify ``path`` (read-only); SourceMissing when it does not exist."""
    data = read_checkpoint_bytes(path)
    try:
        return parse_dra_checkpoint(data)
    except SourceError as exc:
        raise with_path(path, exc) from exc
