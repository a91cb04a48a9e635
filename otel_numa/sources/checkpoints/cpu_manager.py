"""The kubelet's CPU manager checkpoint (``<kubelet-root>/cpu_manager_state``), verified as the kubelet does.

Layouts, all JSON objects:

- v1 (Kubernetes <= 1.17): ``entries`` maps a container id to its CPU set;
- v2 (1.18+): ``entries`` maps pod UID -> container name -> CPU set;
- v3: v2 plus ``podEntries`` (pod UID -> ``{"cpuSet": ...}``, pod-level resources);
- v4: a ``data`` string holding the v3 members as JSON, and ``dataChecksum``; the v3 members beside it
  are a copy for older kubelets and are not trusted. A file with a non-empty ``data`` or a non-zero
  ``dataChecksum`` is judged by them alone, as the kubelet does.

v1 to v3 carry ``checksum``: FNV-1a 32 of the spew text of the decoded struct (see :mod:`.gospew`), under
the type name ``CPUManagerCheckpoint`` or, for some kubelet builds, ``CPUManagerCheckpointV2``/``V3``;
each is tried. A stored checksum of 0 is accepted, as by the kubelet (``checksum_verified`` is then False).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from otel_numa.model import CpuManagerState, shared_name
from otel_numa.sources.checkpoints.common import (
    INVALID_VALUE,
    Layout,
    Verified,
    parse_go_cpuset,
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
    GoDecoder,
    GoField,
    GoInt,
    GoMap,
    GoPointer,
    GoStruct,
    GoType,
    GoValue,
    StructValue,
    zero_value,
)
from otel_numa.sources.errors import SourceCorrupt, SourceError
from otel_numa.sources.files import MAX_CPU_ID, OUT_OF_RANGE

WHAT = "cpu_manager_state"


# ----------------------------------------------------------------------------------------- Go types

_CHECKSUM = GoInt("checksum.Checksum", signed=False)
_CONTAINER_CPUS = GoMap("map[string]string", STRING, STRING)
_ENTRIES_V2 = GoMap("map[string]map[string]string", STRING, _CONTAINER_CPUS)
_CPUSET = GoStruct(
    "cpuset.CPUSet", (GoField("elems", "elems", GoMap("map[int]struct {}", INT, GoStruct("struct {}", ()))),)
)
_POD_ENTRY_JSON = GoStruct("state.podEntryJSON", (GoField("CPUSet", "cpuSet", STRING),))


def _decode_pod_entry(decoder: GoDecoder, node: object, current: StructValue) -> StructValue:
    # PodEntry.UnmarshalJSON: the JSON holds a CPU set string, the struct a parsed cpuset.CPUSet
    # (called for null too, which yields the empty set).
    raw = decoder.decode(_POD_ENTRY_JSON, node, zero_value(_POD_ENTRY_JSON))
    assert isinstance(raw, dict)
    try:
        cpus = _charged_cpuset(str(raw["CPUSet"]))
    except SourceCorrupt as exc:
        if exc.error_type == OUT_OF_RANGE:
            raise
        decoder.error(f"pod entry: {exc}")
        return current
    return {"CPUSet": {"elems": {cpu: {} for cpu in cpus}}}


_POD_ENTRY = GoStruct("state.PodEntry", (GoField("CPUSet", "cpuSet", _CPUSET),), json_hook=_decode_pod_entry)
_POD_ENTRIES = GoMap("state.PodCPUAssignments", STRING, _POD_ENTRY)

_POLICY = GoField("PolicyName", "policyName", STRING)
_DEFAULT = GoField("DefaultCPUSet", "defaultCpuSet", STRING)
_ENTRIES_FIELD = GoField("Entries", "entries", _ENTRIES_V2)
_POD_ENTRIES_FIELD = GoField("PodEntries", "podEntries", _POD_ENTRIES)
_CHECKSUM_FIELD = GoField("Checksum", "checksum", _CHECKSUM)

_V4_TOP = GoStruct(
    "state.CPUManagerCheckpoint",
    (
        _POLICY,
        _DEFAULT,
        _ENTRIES_FIELD,
        _POD_ENTRIES_FIELD,
        _CHECKSUM_FIELD,
        GoField("Data", "data", STRING),
        GoField("DataChecksum", "dataChecksum", _CHECKSUM),
    ),
)
_V4_DATA = GoStruct("state.CPUManagerCheckpointData", (_POLICY, _DEFAULT, _ENTRIES_FIELD, _POD_ENTRIES_FIELD))


def _with_empty_maps(go_type: GoStruct) -> StructValue:
    # the kubelet's constructors make Entries (and PodEntries) empty maps, so a missing member is map[]
    value = zero_value(go_type)
    assert isinstance(value, dict)
    for name in ("Entries", "PodEntries"):
        if name in value:
            value[name] = {}
    return value


def _layout(name: str, version_type: str, entries: GoType, pod_entries: bool) -> Layout:
    fields: tuple[GoField, ...] = (_POLICY, _DEFAULT, GoField("Entries", "entries", entries))
    fields += (_POD_ENTRIES_FIELD, _CHECKSUM_FIELD) if pod_entries else (_CHECKSUM_FIELD,)
    struct = GoStruct(f"state.{version_type}", fields)
    pointer = GoPointer(f"*state.{version_type}", struct)

    def hashed(value: StructValue) -> tuple[GoType, GoValue]:
        return pointer, {**value, "Checksum": 0}

    # the kubelet renames the type before hashing; some builds hash v2/v3 under the versioned name
    renamed = ((version_type, "CPUManagerCheckpoint", 1),)
    return Layout(
        name=name,
        go_type=struct,
        make_initial=lambda: _with_empty_maps(struct),
        hashed=hashed,
        hash_variants=(renamed,) if name == "v1" else (renamed, ()),
    )


_V1 = _layout("v1", "CPUManagerCheckpointV1", _CONTAINER_CPUS, pod_entries=False)
_V2 = _layout("v2", "CPUManagerCheckpointV2", _ENTRIES_V2, pod_entries=False)
_V3 = _layout("v3", "CPUManagerCheckpointV3", _ENTRIES_V2, pod_entries=True)


# ----------------------------------------------------------------------------------------- reading


# CPU ids a whole file may list, summed over its sets (and over the layouts tried): the kubelet's sets are
# disjoint slices of one machine (v3/v4 pod pools repeat their containers' CPUs), so a valid file lists each
# CPU a few times at most. A 3.6 KB file of 200 sets "0-65535" would otherwise expand to 13 million ids.
LISTED_PER_CPU = 8


@dataclass(slots=True)
class _Budget:
    highest_cpu: int  # the machine's highest CPU id (MAX_CPU_ID when not known)
    listed_left: int


_budget: ContextVar[_Budget] = ContextVar("cpu_manager_budget")


def _charged_cpuset(text: str) -> frozenset[int]:
    """``parse_go_cpuset`` bounded by the machine, and charged to this file's budget of listed CPU ids."""
    budget = _budget.get(None)
    cpus = parse_go_cpuset(text, budget.highest_cpu if budget is not None else MAX_CPU_ID)
    if budget is not None:
        budget.listed_left -= len(cpus)
        if budget.listed_left < 0:
            raise SourceCorrupt(
                f"{WHAT}: its CPU sets list more CPUs than the machine has", error_type=OUT_OF_RANGE
            )
    return cpus


def _cpus(text: object, where: str) -> frozenset[int]:
    try:
        return _charged_cpuset(str(text))
    except SourceCorrupt as exc:
        if exc.error_type == OUT_OF_RANGE:
            raise
        raise SourceCorrupt(f"{WHAT}: {where}: {exc}", error_type=INVALID_VALUE) from exc


def cpus_beyond(state: CpuManagerState, highest_cpu: int) -> bool:
    """Whether ``state`` names a CPU above ``highest_cpu`` (the machine's highest): the file is then not
    this machine's, and rejected whole."""
    sets = [state.default_cpu_set, *state.pod_entries.values()]
    sets += [cpus for containers in state.entries.values() for cpus in containers.values()]
    return any(cpus and max(cpus) > highest_cpu for cpus in sets)


def _state(verified: Verified) -> CpuManagerState:
    value = verified.value
    policy = str(value["PolicyName"])
    if not policy:
        raise SourceCorrupt(f"{WHAT}: no policy name", error_type=INVALID_VALUE)
    raw_entries = value["Entries"]
    entries: dict[str, dict[str, frozenset[int]]] = {}
    if isinstance(raw_entries, dict):
        for entry_key, inner in raw_entries.items():
            key = shared_name(entry_key)  # a pod UID (a container ID in v1)
            if verified.layout == "v1":
                entries[key] = {"": _cpus(inner, f"container {key}")}
            elif isinstance(inner, dict):
                entries[key] = {
                    shared_name(name): _cpus(cpus, f"pod {key} container {name}")
                    for name, cpus in inner.items()
                }
            else:
                entries[key] = {}
    pod_entries: dict[str, frozenset[int]] = {}
    raw_pods = value.get("PodEntries")
    if isinstance(raw_pods, dict):
        for pod, entry in raw_pods.items():
            elems = entry["CPUSet"]["elems"]
            pod_entries[pod] = frozenset(elems) if isinstance(elems, dict) else frozenset()
    return CpuManagerState(
        policy_name=policy,
        default_cpu_set=_cpus(value["DefaultCPUSet"], "defaultCpuSet"),
        entries=entries,
        layout=verified.layout,
        entries_keyed_by_container_id=verified.layout == "v1",
        pod_entries=pod_entries,
        checksum_verified=verified.checksum_verified,
    )


def parse_cpu_manager_state(data: bytes) -> CpuManagerState:
    """Decode and verify a CPU manager checkpoint; raises SourceCorrupt when the kubelet would refuse it."""
    return parse_cpu_manager_state_within(data, MAX_CPU_ID)


def parse_cpu_manager_state_within(data: bytes, highest_cpu: int) -> CpuManagerState:
    """:func:`parse_cpu_manager_state`, with ``out_of_range`` for a CPU above ``highest_cpu`` (the machine's
    highest), found before any CPU set is expanded."""
    token = _budget.set(_Budget(highest_cpu, LISTED_PER_CPU * (highest_cpu + 1)))
    try:
        return _parse(data)
    finally:
        _budget.reset(token)


def _parse(data: bytes) -> CpuManagerState:
    try:
        top = parse_top_object(data, WHAT)
        verified = verify_data_layout(top, _V4_TOP, _V4_DATA, _with_empty_maps, "v4", WHAT)
        if verified is None:
            has_pod_entries = any(key.lower() == "podentries" for key, _ in top.members)
            layouts = (_V3, _V2, _V1) if has_pod_entries else (_V2, _V3, _V1)
            verified = verify_layouts(top, layouts, WHAT)
        return _state(verified)
    except SourceError:
        raise
    except (ValueError, RecursionError) as exc:
        raise SourceCorrupt(f"{WHAT}: {exc}", error_type=PARSE_ERROR) from exc


def read_cpu_manager_state(path: Path, highest_cpu: int = MAX_CPU_ID) -> CpuManagerState:
    """Read and verify ``path`` (read-only); SourceMissing when it does not exist."""
    data = read_checkpoint_bytes(path)
    try:
        return parse_cpu_manager_state_within(data, highest_cpu)
    except SourceError as exc:
        raise with_path(path, exc) from exc
