"""Writes kubelet checkpoint files the way the kubelet does, for scenario tests, demo data and benchmarks.

Layouts written: CPU manager v2, v3 (``podEntries``) and v4 (``data`` + ``dataChecksum``), memory manager v2
and v3, device manager 1.20+ (device ids per NUMA node). The JSON is what Go's ``json.Marshal`` emits for
the kubelet's structs (fields in declaration order, ``omitempty`` honoured, map keys sorted, no blanks).

The checksums are computed here from go-spew text spelled out layout by layout, deliberately without the
reader's generic renderer, so that a round trip checks one implementation against the other. Files are
written like the kubelet's file store: a ``.``-prefixed temporary file in the same directory, fsync'ed,
mode 0600, then renamed over the target.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from otel_numa.model import DeviceEntry, MemoryBlock, NumaMemoryState
from otel_numa.sources.files import format_cpulist


def fnv1a_32(data: bytes) -> int:
    value = 2166136261
    for byte in data:
        value = ((value ^ byte) * 16777619) % (1 << 32)
    return value


def _hash(text: str) -> int:
    return fnv1a_32(text.encode())


def _go_json(value: object) -> bytes:
    # json.Marshal escapes <, > and & (and U+2028/2029) even with non-ASCII text left as is
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028")):
        text = text.replace(char, escape)
    return text.replace("\u2029", "\\u2029").encode()


def _by_key(mapping: Mapping[str, object]) -> dict[str, object]:
    # json.Marshal writes map members sorted by key
    return {key: mapping[key] for key in sorted(mapping)}


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` as the kubelet does: temp file, fsync, rename (0600)."""
    temporary = path.parent / f".{path.name}.{secrets.token_hex(4)}"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


# ----------------------------------------------------------------------------------------------- CPU


def _cpuset_text(cpus: Iterable[int]) -> str:
    return format_cpulist(frozenset(cpus))


def _spew_cpu_entries(entries: Mapping[str, Mapping[str, str]]) -> str:
    pods = " ".join(
        f"{pod}:map[{' '.join(f'{name}:{cpus}' for name, cpus in sorted(containers.items()))}]"
        for pod, containers in sorted(entries.items())
    )
    return f"Entries:(map[string]map[string]string)map[{pods}]"


def _spew_cpu_pod_entries(pod_entries: Mapping[str, frozenset[int]]) -> str:
    def pod_entry(cpus: frozenset[int]) -> str:
        elems = " ".join(f"{cpu}:{{}}" for cpu in sorted(cpus))
        return f"{{CPUSet:(cpuset.CPUSet){{elems:(map[int]struct {{}})map[{elems}]}}}}"

    pods = " ".join(f"{pod}:{pod_entry(cpus)}" for pod, cpus in sorted(pod_entries.items()))
    return f"PodEntries:(state.PodCPUAssignments)map[{pods}]"


def cpu_manager_state_bytes(
    policy: str,
    default_cpus: Iterable[int],
    entries: Mapping[str, Mapping[str, Iterable[int]]],
    *,
    pod_entries: Mapping[str, Iterable[int]] | None = None,
    layout: str = "v2",
) -> bytes:
    """A CPU manager checkpoint: ``entries`` is pod UID -> container -> CPUs; ``layout`` v2, v3 or v4."""
    if layout not in ("v2", "v3", "v4"):
        raise ValueError(f"unknown layout {layout}")
    if pod_entries and layout == "v2":
        raise ValueError("pod entries need layout v3 or v4")
    default = _cpuset_text(default_cpus)
    text_entries = {pod: {name: _cpuset_text(cpus) for name, cpus in c.items()} for pod, c in entries.items()}
    json_entries = _by_key({pod: _by_key(containers) for pod, containers in text_entries.items()})
    pods = {pod: frozenset(cpus) for pod, cpus in (pod_entries or {}).items()}
    members: dict[str, object] = {"policyName": policy, "defaultCpuSet": default}
    if text_entries:
        members["entries"] = json_entries
    if pods:
        members["podEntries"] = _by_key(
            {pod: ({"cpuSet": _cpuset_text(c)} if c else {}) for pod, c in pods.items()}
        )
    if layout == "v4":
        data = _go_json(members).decode()
        return _go_json({**members, "checksum": 0, "data": data, "dataChecksum": _hash("(string)" + data)})
    spew = f"(*state.CPUManagerCheckpoint){{PolicyName:(string){policy} DefaultCPUSet:(string){default} "
    spew += _spew_cpu_entries(text_entries)
    if layout == "v3":
        spew += " " + _spew_cpu_pod_entries(pods)
    spew += " Checksum:(checksum.Checksum)0}"
    return _go_json({**members, "checksum": _hash(spew)})


def write_cpu_manager_state(
    path: Path,
    policy: str,
    default_cpus: Iterable[int],
    entries: Mapping[str, Mapping[str, Iterable[int]]],
    *,
    pod_entries: Mapping[str, Iterable[int]] | None = None,
    layout: str = "v2",
) -> bytes:
    """Write a CPU manager checkpoint to ``path`` (see :func:`cpu_manager_state_bytes`); returns its bytes."""
    data = cpu_manager_state_bytes(policy, default_cpus, entries, pod_entries=pod_entries, layout=layout)
    write_atomically(path, data)
    return data


# ----------------------------------------------------------------------------------------------- memory

_TABLE_FIELDS = (
    ("TotalMemSize", "total", "total"),
    ("SystemReserved", "systemReserved", "system_reserved"),
    ("Allocatable", "allocatable", "allocatable"),
    ("Reserved", "reserved", "reserved"),
    ("Free", "free", "free"),
)


def _spew_ints(values: Sequence[int]) -> str:
    return "[" + " ".join(str(v) for v in values) + "]"


def _spew_block(block: MemoryBlock) -> str:
    affinity = _spew_ints(block.numa_affinity)
    return (
        f"{{NUMAAffinity:([]int){affinity} Type:(v1.ResourceName){block.resource} Size:(uint64){block.size}}}"
    )


def _spew_blocks(blocks: Sequence[MemoryBlock]) -> str:
    return "[" + " ".join(_spew_block(b) for b in blocks) + "]"


def _spew_numa(state: NumaMemoryState) -> str:
    tables = " ".join(
        f"{resource}:<*>{{"
        + " ".join(f"{go}:(uint64){getattr(table, attr)}" for go, _, attr in _TABLE_FIELDS)
        + "}"
        for resource, table in sorted(state.memory_map.items())
    )
    return (
        f"<*>{{NumberOfAssignments:(int){state.number_of_assignments} "
        f"MemoryMap:(map[v1.ResourceName]*state.MemoryTable)map[{tables}] "
        f"Cells:([]int){_spew_ints(state.cells)}}}"
    )


def _spew_memory(
    policy: str,
    machine_state: Mapping[int, NumaMemoryState],
    entries: Mapping[str, Mapping[str, Sequence[MemoryBlock]]],
    pod_entries: Mapping[str, Sequence[MemoryBlock]] | None,
) -> str:
    numa = " ".join(f"{node}:{_spew_numa(state)}" for node, state in sorted(machine_state.items()))

    def containers_text(containers: Mapping[str, Sequence[MemoryBlock]]) -> str:
        return " ".join(f"{name}:{_spew_blocks(blocks)}" for name, blocks in sorted(containers.items()))

    pods = " ".join(
        f"{pod}:map[{containers_text(containers)}]" for pod, containers in sorted(entries.items())
    )
    text = (
        f"(*state.MemoryManagerCheckpoint){{PolicyName:(string){policy} "
        f"MachineState:(state.NUMANodeMap)map[{numa}] Entries:(state.ContainerMemoryAssignments)map[{pods}]"
    )
    if pod_entries is not None:
        # an empty list is omitted from the JSON (omitempty), so the kubelet reads it back as nil
        pod_blocks = " ".join(
            f"{pod}:{{MemoryBlocks:([]state.Block){_spew_blocks(blocks) if blocks else '<nil>'}}}"
            for pod, blocks in sorted(pod_entries.items())
        )
        text += f" PodEntries:(state.PodMemoryAssignments)map[{pod_blocks}]"
    return text + " Checksum:(checksum.Checksum)0}"


def _json_block(block: MemoryBlock) -> dict[str, object]:
    return {"numaAffinity": list(block.numa_affinity), "type": block.resource, "size": block.size}


def _json_machine_state(machine_state: Mapping[int, NumaMemoryState]) -> dict[str, object]:
    return _by_key(
        {
            str(node): {
                "numberOfAssignments": state.number_of_assignments,
                "memoryMap": _by_key(
                    {
                        resource: {json_name: getattr(table, attr) for _, json_name, attr in _TABLE_FIELDS}
                        for resource, table in state.memory_map.items()
                    }
                ),
                "cells": list(state.cells),
            }
            for node, state in machine_state.items()
        }
    )


def memory_manager_state_bytes(
    policy: str,
    machine_state: Mapping[int, NumaMemoryState],
    entries: Mapping[str, Mapping[str, Sequence[MemoryBlock]]],
    *,
    pod_entries: Mapping[str, Sequence[MemoryBlock]] | None = None,
    layout: str = "v2",
) -> bytes:
    """A memory manager checkpoint (``layout`` v2 or v3); sizes are bytes, as the kubelet stores them."""
    if layout not in ("v2", "v3"):
        raise ValueError(f"unknown layout {layout}")
    legacy: dict[str, object] = {"policyName": policy, "machineState": _json_machine_state(machine_state)}
    if entries:
        legacy["entries"] = _by_key(
            {
                pod: _by_key({name: [_json_block(b) for b in blocks] for name, blocks in containers.items()})
                for pod, containers in entries.items()
            }
        )
    pods = dict(pod_entries or {})
    json_pods = _by_key(
        {
            pod: ({"memoryBlocks": [_json_block(b) for b in blocks]} if blocks else {})
            for pod, blocks in pods.items()
        }
    )
    if layout == "v3":
        data = _go_json({**legacy, **({"podEntries": json_pods} if json_pods else {})}).decode()
        # the members beside data are a v1 copy for older kubelets, with the v1 checksum
        legacy_checksum = _hash(_spew_memory(policy, machine_state, entries, None))
        return _go_json(
            {**legacy, "checksum": legacy_checksum, "data": data, "dataChecksum": _hash("(string)" + data)}
        )
    members = {**legacy, **({"podEntries": json_pods} if json_pods else {})}
    return _go_json({**members, "checksum": _hash(_spew_memory(policy, machine_state, entries, pods))})


def write_memory_manager_state(
    path: Path,
    policy: str,
    machine_state: Mapping[int, NumaMemoryState],
    entries: Mapping[str, Mapping[str, Sequence[MemoryBlock]]],
    *,
    pod_entries: Mapping[str, Sequence[MemoryBlock]] | None = None,
    layout: str = "v2",
) -> bytes:
    """Write a memory manager checkpoint to ``path``; returns its bytes."""
    data = memory_manager_state_bytes(policy, machine_state, entries, pod_entries=pod_entries, layout=layout)
    write_atomically(path, data)
    return data


# ----------------------------------------------------------------------------------------------- devices


def _alloc_response(entry: DeviceEntry) -> bytes:
    # stands in for the device plugin's protobuf answer: a few bytes that differ per entry
    return (
        f"{entry.resource_name}={','.join(i for ids in entry.devices_by_numa.values() for i in ids)}".encode()
    )


def device_checkpoint_bytes(
    entries: Sequence[DeviceEntry], registered_devices: Mapping[str, Sequence[str]]
) -> bytes:
    """A device checkpoint in the 1.20+ layout (``devices_by_numa`` keys are NUMA ids, -1 for none)."""
    spew_entries = " ".join(
        f"{{PodUID:(string){e.pod_uid} ContainerName:(string){e.container_name} "
        f"ResourceName:(string){e.resource_name} DeviceIDs:(checkpoint.DevicesPerNUMA)map["
        + " ".join(f"{numa}:[{' '.join(ids)}]" for numa, ids in sorted(e.devices_by_numa.items()))
        + f"] AllocResp:([]uint8)[{' '.join(str(b) for b in _alloc_response(e))}]}}"
        for e in entries
    )
    registered = " ".join(f"{name}:[{' '.join(ids)}]" for name, ids in sorted(registered_devices.items()))
    spew = (
        f"(checkpoint.checkpointData){{PodDeviceEntries:([]checkpoint.PodDevicesEntry)[{spew_entries}] "
        f"RegisteredDevices:(map[string][]string)map[{registered}]}}"
    )
    data = {
        "PodDeviceEntries": [
            {
                "PodUID": e.pod_uid,
                "ContainerName": e.container_name,
                "ResourceName": e.resource_name,
                "DeviceIDs": _by_key({str(numa): list(ids) for numa, ids in e.devices_by_numa.items()}),
                "AllocResp": base64.b64encode(_alloc_response(e)).decode(),
            }
            for e in entries
        ],
        "RegisteredDevices": _by_key({name: list(ids) for name, ids in registered_devices.items()}),
    }
    return _go_json({"Data": data, "Checksum": _hash(spew)})


def write_device_checkpoint(
    path: Path, entries: Sequence[DeviceEntry], registered_devices: Mapping[str, Sequence[str]]
) -> bytes:
    """Write a device manager checkpoint to ``path``; returns its bytes."""
    data = device_checkpoint_bytes(entries, registered_devices)
    write_atomically(path, data)
    return data
