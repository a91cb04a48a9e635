"""The kubelet's device manager checkpoint (``<kubelet-root>/device-plugins/kubelet_internal_checkpoint``),
verified as the kubelet does.

The file is ``{"Data": {"PodDeviceEntries": [...], "RegisteredDevices": {...}}, "Checksum": N}`` (Go field
names, no JSON tags). Each entry has ``PodUID``, ``ContainerName``, ``ResourceName``, ``DeviceIDs`` and
``AllocResp`` (base64 of the device plugin's protobuf answer, kept only for the checksum). Layouts:

- v1 (Kubernetes <= 1.19): ``DeviceIDs`` is a flat list, with no NUMA information;
- v2 (1.20+): ``DeviceIDs`` maps a NUMA node id (a decimal string, ``-1`` for no affinity) to a list.

The checksum is FNV-1a 32 of the spew text of ``Data`` alone (a v1 file is hashed under the 1.19 type
names ``checkpointData`` and ``PodDevicesEntry``). Unlike the CPU and memory managers, the device manager
does not accept a zero checksum.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from otel_numa.model import DeviceEntry, DeviceManagerState, shared_name
from otel_numa.sources.checkpoints.common import (
    Layout,
    Verified,
    parse_top_object,
    read_checkpoint_bytes,
    verify_layouts,
    with_path,
)
from otel_numa.sources.checkpoints.gojson import (
    BYTES,
    PARSE_ERROR,
    STRING,
    GoField,
    GoInt,
    GoMap,
    GoSlice,
    GoStruct,
    GoType,
    GoValue,
    StructValue,
)
from otel_numa.sources.errors import SourceCorrupt, SourceError

WHAT = "device manager checkpoint"

NO_NUMA_AFFINITY = -1


# ----------------------------------------------------------------------------------------- Go types

_CHECKSUM = GoInt("checksum.Checksum", signed=False)
_STRINGS = GoSlice("[]string", STRING)
_REGISTERED = GoMap("map[string][]string", STRING, _STRINGS)


def _entry_type(name: str, device_ids: GoType) -> GoStruct:
    return GoStruct(
        f"checkpoint.{name}",
        (
            GoField("PodUID", "PodUID", STRING),
            GoField("ContainerName", "ContainerName", STRING),
            GoField("ResourceName", "ResourceName", STRING),
            GoField("DeviceIDs", "DeviceIDs", device_ids),
            GoField("AllocResp", "AllocResp", BYTES),
        ),
    )


def _layout(name: str, data_name: str, entry: GoStruct, renames: tuple[tuple[str, str, int], ...]) -> Layout:
    data = GoStruct(
        f"checkpoint.{data_name}",
        (
            GoField("PodDeviceEntries", "PodDeviceEntries", GoSlice(f"[]{entry.name}", entry)),
            GoField("RegisteredDevices", "RegisteredDevices", _REGISTERED),
        ),
    )
    top = GoStruct(
        "checkpoint.Data", (GoField("Data", "Data", data), GoField("Checksum", "Checksum", _CHECKSUM))
    )

    def hashed(value: StructValue) -> tuple[GoType, GoValue]:
        return data, value["Data"]

    return Layout(
        name=name,
        go_type=top,
        # the device manager reads into checkpoint.New(make([]PodDevicesEntry, 0), make(map[string][]string))
        make_initial=lambda: {"Data": {"PodDeviceEntries": [], "RegisteredDevices": {}}, "Checksum": 0},
        hashed=hashed,
        hash_variants=(renames,),
        zero_checksum_accepted=False,
    )


_V2 = _layout(
    "v2",
    "checkpointData",
    _entry_type("PodDevicesEntry", GoMap("checkpoint.DevicesPerNUMA", GoInt("int64"), _STRINGS)),
    (),
)
_V1 = _layout(
    "v1",
    "checkpointDataV1",
    _entry_type("PodDevicesEntryV1", _STRINGS),
    (("checkpointDataV1", "checkpointData", 1), ("PodDevicesEntryV1", "PodDevicesEntry", -1)),
)


# ----------------------------------------------------------------------------------------- reading


def _strings(value: object) -> tuple[str, ...]:
    return tuple(cast(list[str], value)) if isinstance(value, list) else ()


def _entry(raw: StructValue, flat: bool) -> DeviceEntry:
    device_ids = raw["DeviceIDs"]
    if flat:
        ids = _strings(device_ids)
        by_numa = {NO_NUMA_AFFINITY: ids} if ids else {}
    else:
        by_numa = {
            numa: _strings(ids) for numa, ids in sorted(cast(dict[int, object], device_ids or {}).items())
        }
    return DeviceEntry(
        pod_uid=shared_name(str(raw["PodUID"])),
        container_name=shared_name(str(raw["ContainerName"])),
        resource_name=shared_name(str(raw["ResourceName"])),
        devices_by_numa=by_numa,
    )


def _state(verified: Verified) -> DeviceManagerState:
    data = cast(StructValue, verified.value["Data"])
    raw_entries = cast(list[StructValue], data["PodDeviceEntries"] or [])
    registered = cast(dict[str, object], data["RegisteredDevices"] or {})
    return DeviceManagerState(
        entries=tuple(_entry(raw, flat=verified.layout == "v1") for raw in raw_entries),
        registered_devices={shared_name(resource): _strings(ids) for resource, ids in registered.items()},
        layout=verified.layout,
    )


def parse_device_checkpoint(data: bytes) -> DeviceManagerState:
    """Decode and verify a device checkpoint; raises SourceCorrupt when the kubelet would refuse it."""
    try:
        return _state(verify_layouts(parse_top_object(data, WHAT), (_V2, _V1), WHAT))
    except SourceError:
        raise
    except (ValueError, RecursionError) as exc:
        raise SourceCorrupt(f"{WHAT}: {exc}", error_type=PARSE_ERROR) from exc


def read_device_checkpoint(path: Path) -> DeviceManagerState:
    """Read and verify ``path`` (read-only); SourceMissing when it does not exist."""
    data = read_checkpoint_bytes(path)
    try:
        return parse_device_checkpoint(data)
    except SourceError as exc:
        raise with_path(path, exc) from exc


def nodes_beyond(state: DeviceManagerState, node_ids: frozenset[int]) -> bool:
    """Whether ``state`` files a device under a NUMA node that is not among ``node_ids`` (the machine's) nor
    ``-1``: the file is then not this machine's, and rejected whole."""
    known = node_ids | {NO_NUMA_AFFINITY}
    return any(not known.issuperset(entry.devices_by_numa) for entry in state.entries)
