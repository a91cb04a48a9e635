"""The kubelet's memory manager checkpoint (``<kubelet-root>/memory_manager_state``), verified as the kubelet
does.

Layouts, all JSON objects:

- v1 (Kubernetes 1.21+): ``policyName``, ``machineState`` (NUMA id -> ``numberOfAssignments``,
  ``memoryMap`` of resource -> ``total``/``systemReserved``/``allocatable``/``reserved``/``free``, ``cells``),
  ``entries`` (pod UID -> container -> blocks of ``numaAffinity``, ``type``, ``size``), ``checksum``;
- v2: v1 plus ``podEntries`` (pod UID -> ``{"memoryBlocks": [...]}``);
- v3: a ``data`` string holding the v2 members as JSON, and ``dataChecksum``, which alone decide.

v1 and v2 carry ``checksum`` (FNV-1a 32 of the spew text, type named ``MemoryManagerCheckpoint`` or, for some
builds, ``MemoryManagerCheckpointV1``/``V2``). A stored checksum of 0 is accepted, as by the kubelet.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from otel_numa.model import MemoryBlock, MemoryManagerState, MemoryTable, NumaMemoryState, shared_name
from otel_numa.sources.checkpoints.common import (
    INVALID_VALUE,
    Layout,
    Verified,
    parse_top_object,
    read_checkpoint_bytes,
    verify_data_layout,
    verify_layouts,
    with_path,
)
from otel_numa.sources.checkpoints.gojson import (
    INT,
    PARSE_ERROR,
    STRING,
    UINT64,
    GoField,
    GoInt,
    GoMap,
    GoPointer,
    GoSlice,
    GoString,
    GoStruct,
    GoType,
    GoValue,
    StructValue,
    zero_value,
)
from otel_numa.sources.errors import SourceCorrupt, SourceError

WHAT = "memory_manager_state"


# ----------------------------------------------------------------------------------------- Go types

_CHECKSUM = GoInt("checksum.Checksum", signed=False)
_RESOURCE = GoString("v1.ResourceName")
_INTS = GoSlice("[]int", INT)
_MEMORY_TABLE = GoStruct(
    "state.MemoryTable",
    (
        GoField("TotalMemSize", "total", UINT64),
        GoField("SystemReserved", "systemReserved", UINT64),
        GoField("Allocatable", "allocatable", UINT64),
        GoField("Reserved", "reserved", UINT64),
        GoField("Free", "free", UINT64),
    ),
)
_NUMA_NODE_STATE = GoStruct(
    "state.NUMANodeState",
    (
        GoField("NumberOfAssignments", "numberOfAssignments", INT),
        GoField(
            "MemoryMap",
            "memoryMap",
            GoMap(
                "map[v1.ResourceName]*state.MemoryTable",
                _RESOURCE,
                GoPointer("*state.MemoryTable", _MEMORY_TABLE),
            ),
        ),
        GoField("Cells", "cells", _INTS),
    ),
)
_NUMA_NODE_MAP = GoMap("state.NUMANodeMap", INT, GoPointer("*state.NUMANodeState", _NUMA_NODE_STATE))
_BLOCK = GoStruct(
    "state.Block",
    (
        GoField("NUMAAffinity", "numaAffinity", _INTS),
        GoField("Type", "type", _RESOURCE),
        GoField("Size", "size", UINT64),
    ),
)
_BLOCKS = GoSlice("[]state.Block", _BLOCK)
_CONTAINER_ASSIGNMENTS = GoMap(
    "state.ContainerMemoryAssignments", STRING, GoMap("map[string][]state.Block", STRING, _BLOCKS)
)
_POD_ASSIGNMENTS = GoMap(
    "state.PodMemoryAssignments",
    STRING,
    GoStruct("state.PodEntry", (GoField("MemoryBlocks", "memoryBlocks", _BLOCKS),)),
)

_POLICY = GoField("PolicyName", "policyName", STRING)
_MACHINE_STATE = GoField("MachineState", "machineState", _NUMA_NODE_MAP)
_ENTRIES = GoField("Entries", "entries", _CONTAINER_ASSIGNMENTS)
_POD_ENTRIES = GoField("PodEntries", "podEntries", _POD_ASSIGNMENTS)
_CHECKSUM_FIELD = GoField("Checksum", "checksum", _CHECKSUM)

_V3_TOP = GoStruct(
    "state.MemoryManagerCheckpoint",
    (
        _POLICY,
        _MACHINE_STATE,
        _ENTRIES,
        _CHECKSUM_FIELD,
        GoField("Data", "data", STRING),
        GoField("DataChecksum", "dataChecksum", _CHECKSUM),
    ),
)
_V3_DATA = GoStruct("state.MemoryManagerCheckpointData", (_POLICY, _MACHINE_STATE, _ENTRIES, _POD_ENTRIES))


def _with_empty_maps(go_type: GoStruct) -> StructValue:
    # the kubelet's constructors start with empty (not nil) maps
    value = cast(StructValue, zero_value(go_type))
    for name in ("MachineState", "Entries", "PodEntries"):
        if name in value:
            value[name] = {}
    return value


def _layout(name: str, version_type: str, pod_entries: bool) -> Layout:
    fields = (
        (_POLICY, _MACHINE_STATE, _ENTRIES, _POD_ENTRIES)
        if pod_entries
        else (_POLICY, _MACHINE_STATE, _ENTRIES)
    )
    struct = GoStruct(f"state.{version_type}", (*fields, _CHECKSUM_FIELD))
    pointer = GoPointer(f"*state.{version_type}", struct)

    def hashed(value: StructValue) -> tuple[GoType, GoValue]:
        return pointer, {**value, "Checksum": 0}

    # the kubelet renames the type before hashing; some builds hash v2/v3 under the versioned name
    renamed = ((version_type, "MemoryManagerCheckpoint", 1),)
    return Layout(
        name=name,
        go_type=struct,
        make_initial=lambda: _with_empty_maps(struct),
        hashed=hashed,
        hash_variants=(renamed,) if name == "v1" else (renamed, ()),
    )


_V1 = _layout("v1", "MemoryManagerCheckpointV1", pod_entries=False)
_V2 = _layout("v2", "MemoryManagerCheckpointV2", pod_entries=True)


# ----------------------------------------------------------------------------------------- reading


def _invalid(message: str) -> SourceCorrupt:
    return SourceCorrupt(f"{WHAT}: {message}", error_type=INVALID_VALUE)


# Amounts are uint64 in the kubelet; no machine has 8 EiB, and OTLP carries int64.
MAX_AMOUNT = 2**63 - 1


def _int(value: object) -> int:
    # the decoder only ever stores an int in a Go integer field
    amount = cast(int, value)
    if amount > MAX_AMOUNT:
        raise _invalid(f"amount {amount} is beyond any machine")
    return amount


def _ints(value: object) -> tuple[int, ...]:
    return tuple(cast(list[int], value)) if isinstance(value, list) else ()


def _blocks(value: object) -> tuple[MemoryBlock, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(
        MemoryBlock(
            numa_affinity=_ints(block["NUMAAffinity"]), resource=str(block["Type"]), size=_int(block["Size"])
        )
        for block in cast(list[StructValue], value)
    )


def _numa_state(numa: int, raw: object) -> NumaMemoryState:
    if numa < 0:
        raise _invalid(f"negative NUMA node id {numa}")
    if not isinstance(raw, dict):
        raise _invalid(f"NUMA node {numa} has no state")
    tables: dict[str, MemoryTable] = {}
    for resource, table in cast(dict[str, StructValue | None], raw["MemoryMap"] or {}).items():
        if table is None:
            raise _invalid(f"NUMA node {numa} has no table for {resource}")
        tables[resource] = MemoryTable(
            total=_int(table["TotalMemSize"]),
            system_reserved=_int(table["SystemReserved"]),
            allocatable=_int(table["Allocatable"]),
            reserved=_int(table["Reserved"]),
            free=_int(table["Free"]),
        )
    return NumaMemoryState(
        number_of_assignments=_int(raw["NumberOfAssignments"]), cells=_ints(raw["Cells"]), memory_map=tables
    )


def _state(verified: Verified) -> MemoryManagerState:
    value = verified.value
    policy = str(value["PolicyName"])
    if not policy:
        raise _invalid("no policy name")
    machine = cast(dict[int, object], value["MachineState"] or {})
    entries = cast(dict[str, dict[str, object] | None], value["Entries"] or {})
    pods = cast(dict[str, StructValue], value.get("PodEntries") or {})
    return MemoryManagerState(
        policy_name=policy,
        machine_state={numa: _numa_state(numa, raw) for numa, raw in sorted(machine.items())},
        entries={
            shared_name(pod): {shared_name(name): _blocks(raw) for name, raw in (containers or {}).items()}
            for pod, containers in entries.items()
        },
        layout=verified.layout,
        pod_entries={pod: _blocks(entry["MemoryBlocks"]) for pod, entry in pods.items()},
        checksum_verified=verified.checksum_verified,
    )


def parse_memory_manager_state(data: bytes) -> MemoryManagerState:
    """Decode and verify a memory checkpoint; raises SourceCorrupt when the kubelet would refuse it."""
    try:
        top = parse_top_object(data, WHAT)
        verified = verify_data_layout(top, _V3_TOP, _V3_DATA, _with_empty_maps, "v3", WHAT)
        if verified is None:
            has_pod_entries = any(key.lower() == "podentries" for key, _ in top.members)
            verified = verify_layouts(top, (_V2, _V1) if has_pod_entries else (_V1, _V2), WHAT)
        return _state(verified)
    except SourceError:
        raise
    except (ValueError, RecursionError) as exc:
        raise SourceCorrupt(f"{WHAT}: {exc}", error_type=PARSE_ERROR) from exc


def read_memory_manager_state(path: Path) -> MemoryManagerState:
    """Read and verify ``path`` (read-only); SourceMissing when it does not exist."""
    data = read_checkpoint_bytes(path)
    try:
        return parse_memory_manager_state(data)
    except SourceError as exc:
        raise with_path(path, exc) from exc


def nodes_beyond(state: MemoryManagerState, node_ids: frozenset[int]) -> bool:
    """Whether ``state`` names a NUMA node that is not among ``node_ids`` (the machine's): the file is then
    not this machine's, and rejected whole."""
    blocks = [
        block for containers in state.entries.values() for found in containers.values() for block in found
    ]
    blocks += [block for found in state.pod_entries.values() for block in found]
    return not node_ids.issuperset(state.machine_state) or any(
        not node_ids.issuperset(block.numa_affinity) for block in blocks
    )
