"""The kubelet's DRA manager checkpoint (``dra_manager_state``), verified as the kubelet verifies it.

It holds ``{"Data": "<JSON text>", "Checksum": N}``: ``Checksum`` is the CRC-32 (IEEE) of the Data text,
which lists the prepared resource claims (``Entries``, ``ClaimInfoStateList`` in early builds). Each claim
names the pods that use it (``PodUIDs``) and, per driver (``DriverState``), its devices: ``PoolName``,
``DeviceName``, ``ShareID`` (shared allocations), ``CDIDeviceIDs``. It names no container and no NUMA node:
the agent places the devices itself and uses the file for per-NUMA totals when podresources is absent.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from otel_numa.model import DraClaim, DraDevice, DraManagerState, shared_name
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
    go_string,
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


def _wrong(what: str) -> SourceCorrupt:
    return SourceCorrupt(f"{WHAT}: {what}", error_type=WRONG_TYPE)


def _text(obj: JsonObject, name: str) -> str:
    value = find_member(obj, name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _wrong(f"{name} is not a string")
    return shared_name(go_string(value))


def _list(obj: JsonObject, name: str) -> list[object]:
    value = find_member(obj, name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _wrong(f"{name} is not a list")
    return value


def _object(value: object, what: str) -> JsonObject:
    if not isinstance(value, JsonObject):
        raise _wrong(f"{what} is not an object")
    return value


def _device(driver: str, node: object) -> DraDevice:
    device = _object(node, "a device")
    cdi = tuple(go_string(item) for item in _list(device, "CDIDeviceIDs") if isinstance(item, str))
    share = find_member(device, "ShareID")
    if share is not None and not isinstance(share, str):
        raise _wrong("ShareID is not a string")
    return DraDevice(
        driver=shared_name(driver),
        pool=_text(device, "PoolName"),
        device=_text(device, "DeviceName"),
        cdi_devices=cdi,
        share_id=go_string(share) if share else None,
    )


def _claim(node: object) -> DraClaim:
    claim = _object(node, "a claim")
    pods = find_member(claim, "PodUIDs")
    pod_uids = (
        frozenset(shared_name(go_string(key)) for key, _ in pods.members)
        if isinstance(pods, JsonObject)
        else frozenset()
    )
    drivers = find_member(claim, "DriverState")
    devices: list[DraDevice] = []
    if drivers is not None:
        for driver, state in _object(drivers, "DriverState").members:
            devices.extend(
                _device(go_string(driver), item)
                for item in _list(_object(state, "a driver state"), "Devices")
            )
    return DraClaim(
        name=_text(claim, "ClaimName"),
        namespace=_text(claim, "Namespace"),
        devices=tuple(devices),
        uid=_text(claim, "ClaimUID"),
        pod_uids=pod_uids,
    )


def parse_dra_checkpoint(data: bytes) -> DraManagerState:
    """Verify a DRA checkpoint's CRC-32 and read its claims; SourceCorrupt when the kubelet would refuse it
    or a claim is not shaped as the kubelet writes it (the whole file is rejected then)."""
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
        if claims is not None and not isinstance(claims, list):
            raise _wrong("Entries is not a list")
        return DraManagerState(claims=tuple(_claim(claim) for claim in claims or ()))
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
