"""Properties of the checkpoint readers under random damage, and round trips through the test writer.

- Whatever the bytes, a reader returns a state or raises SourceCorrupt, nothing else.
- A damaged file is never accepted with a meaning other than the original's while its checksum counts as
  verified: only encodings Go decodes to the same value (whitespace, member case, escapes, unknown
  members, the untrusted copies beside v4 data) survive. The kubelet's one loophole, a zero or missing
  checksum, is reported as ``checksum_verified=False``; the device manager has no such loophole.
- The writer in otel_numa/testing/checkpoints.py, which spells out its own spew text and FNV, produces files
  the reader accepts with exactly the allocations written.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_numa.model import (
    CpuManagerState,
    DeviceEntry,
    DeviceManagerState,
    MemoryBlock,
    MemoryManagerState,
    MemoryTable,
    NumaMemoryState,
)
from otel_numa.sources.checkpoints import (
    parse_cpu_manager_state,
    parse_device_checkpoint,
    parse_memory_manager_state,
    read_cpu_manager_state,
)
from otel_numa.sources.errors import SourceCorrupt
from otel_numa.testing.checkpoints import (
    cpu_manager_state_bytes,
    device_checkpoint_bytes,
    memory_manager_state_bytes,
    write_cpu_manager_state,
    write_device_checkpoint,
    write_memory_manager_state,
)
from otel_numa.testing.dra_checkpoint import parse_dra_checkpoint
from tests.support import FIXTURES

KUBELET = FIXTURES / "kubelet"
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Parser = Callable[[bytes], object]
PARSERS: dict[str, Parser] = {
    "cpu": parse_cpu_manager_state,
    "mem": parse_memory_manager_state,
    "device": parse_device_checkpoint,
    "dra": parse_dra_checkpoint,
}

_BLOCK = MemoryBlock((0, 1), "hugepages-1Gi", 2 << 30)
_NODES = {
    0: NumaMemoryState(2, (0, 1), {"memory": MemoryTable(64 << 30, 1 << 30, 63 << 30, 5 << 30, 58 << 30)}),
    1: NumaMemoryState(1, (0, 1), {"hugepages-1Gi": MemoryTable(8 << 30, 0, 8 << 30, 2 << 30, 6 << 30)}),
}
WRITTEN = [
    ("cpu", cpu_manager_state_bytes("static", {0, 1, 8}, {"pod-a": {"app": {2, 3}, "side": {9}}})),
    (
        "cpu",
        cpu_manager_state_bytes(
            "static", {0}, {"pod-a": {"app": {2}}}, pod_entries={"pod-a": {2, 3}}, layout="v3"
        ),
    ),
    (
        "cpu",
        cpu_manager_state_bytes(
            "static", {0}, {"pod-a": {"app": {2}}}, pod_entries={"pod-a": {2}}, layout="v4"
        ),
    ),
    ("mem", memory_manager_state_bytes("Static", _NODES, {"pod-b": {"db": (_BLOCK,)}})),
    ("mem", memory_manager_state_bytes("Static", _NODES, {"pod-b": {"db": (_BLOCK,)}}, layout="v3")),
    (
        "device",
        device_checkpoint_bytes(
            [DeviceEntry("pod-c", "train", "nvidia.com/gpu", {0: ("GPU-0",), 1: ("GPU-1", "GPU-2")})],
            {"nvidia.com/gpu": ("GPU-0", "GPU-1", "GPU-2", "GPU-3")},
        ),
    ),
]


def kind_of(name: str) -> str:
    return next(kind for kind in PARSERS if f"_{kind}_" in name)


BASES = [*WRITTEN, *((kind_of(path.name), path.read_bytes()) for path in sorted(KUBELET.glob("*.json")))]


def meaning(state: object) -> object:
    """What a consumer uses from a state: everything but the layout label and the verification flag."""
    if isinstance(state, CpuManagerState | MemoryManagerState | DeviceManagerState):
        return dataclasses.replace(state, layout="")
    return state


def checksum_verified(state: object) -> bool:
    return bool(getattr(state, "checksum_verified", True))


def parse_or_none(kind: str, data: bytes) -> object | None:
    """The parsed state, None when rejected; any exception other than SourceCorrupt fails the test."""
    try:
        return PARSERS[kind](data)
    except SourceCorrupt:
        return None


def assert_same_meaning_unless_unverified(kind: str, original: bytes, damaged: bytes) -> None:
    expected = PARSERS[kind](original)
    state = parse_or_none(kind, damaged)
    if state is None or not checksum_verified(state):
        return
    if getattr(state, "layout", None) != getattr(expected, "layout", None) and kind == "mem":
        # a memory v3 file whose data and dataChecksum names are both damaged falls back, as in the
        # kubelet, on the v1 copy beside them, which carries its own valid checksum but no pod entries
        expected = dataclasses.replace(expected, pod_entries={})  # type: ignore[type-var]
    assert meaning(state) == meaning(expected), damaged


# --------------------------------------------------------------------------------------- byte damage

_byte_edit = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 1 << 20), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 20), st.integers(1, 8)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=8)),
)


def apply_byte_edit(data: bytes, edit: tuple[str, int, object]) -> bytes:
    kind, position, argument = edit
    position %= len(data) + 1
    if kind == "set" and position < len(data):
        assert isinstance(argument, int)
        return data[:position] + bytes([argument]) + data[position + 1 :]
    if kind == "delete":
        assert isinstance(argument, int)
        return data[:position] + data[position + argument :]
    if kind == "insert":
        assert isinstance(argument, bytes)
        return data[:position] + argument + data[position:]
    return data


@PROPERTY
@given(base=st.sampled_from(BASES), edits=st.lists(_byte_edit, min_size=1, max_size=3))
def test_byte_damage_is_rejected_or_harmless(
    base: tuple[str, bytes], edits: list[tuple[str, int, object]]
) -> None:
    kind, original = base
    damaged = original
    for edit in edits:
        damaged = apply_byte_edit(damaged, edit)
    assert_same_meaning_unless_unverified(kind, original, damaged)


# --------------------------------------------------------------------------------------- JSON damage

_json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 70), 1 << 70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
_json_value = st.recursive(
    _json_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def _paths(node: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, child in node.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found += _paths(child, (*prefix, index))
    return found


def _get(node: object, path: tuple[object, ...]) -> object:
    for step in path:
        node = node[step]  # type: ignore[index]
    return node


@st.composite
def json_damage(draw: st.DrawFn) -> tuple[str, bytes, bytes]:
    """A base checkpoint, and a copy with one node replaced, one member renamed or dropped, or one added."""
    kind, original = draw(st.sampled_from(BASES))
    document = json.loads(original)
    paths = _paths(document)
    path = draw(st.sampled_from(paths))
    action = draw(st.sampled_from(["replace", "rename", "drop", "add", "recase"]))
    parent = _get(document, path[:-1]) if path else None
    if action == "replace" or not path:
        if not path:
            document = draw(_json_value)
        else:
            parent[path[-1]] = draw(_json_value)  # type: ignore[index]
    elif isinstance(parent, dict):
        key = path[-1]
        assert isinstance(key, str)
        if action == "rename":
            parent[draw(st.text(max_size=10))] = parent.pop(key)
        elif action == "drop":
            del parent[key]
        elif action == "recase":
            parent[key.swapcase()] = parent.pop(key)
        else:
            parent[draw(st.text(max_size=10))] = draw(_json_value)
    elif isinstance(parent, list):
        index = path[-1]
        assert isinstance(index, int)
        if action == "drop":
            del parent[index]
        else:
            parent.insert(index, draw(_json_value))
    return kind, original, json.dumps(document, ensure_ascii=draw(st.booleans())).encode()


@PROPERTY
@given(case=json_damage())
def test_json_damage_is_rejected_or_harmless(case: tuple[str, bytes, bytes]) -> None:
    kind, original, damaged = case
    assert_same_meaning_unless_unverified(kind, original, damaged)


@PROPERTY
@given(data=st.binary(max_size=512))
def test_arbitrary_bytes_never_raise_anything_else(data: bytes) -> None:
    for kind in PARSERS:
        parse_or_none(kind, data)


# --------------------------------------------------------------------------------------- round trips

_names = st.text(min_size=1, max_size=12)
_cpus = st.frozensets(st.integers(0, 511), max_size=12)


@PROPERTY
@given(
    policy=st.sampled_from(["static", "none"]),
    default=_cpus,
    entries=st.dictionaries(_names, st.dictionaries(_names, _cpus, max_size=4), max_size=6),
    pod_cpus=st.dictionaries(_names, _cpus, max_size=3),
    layout=st.sampled_from(["v2", "v3", "v4"]),
)
def test_cpu_round_trip(
    policy: str,
    default: frozenset[int],
    entries: dict[str, dict[str, frozenset[int]]],
    pod_cpus: dict[str, frozenset[int]],
    layout: str,
) -> None:
    pod_entries = pod_cpus if layout != "v2" else {}
    data = cpu_manager_state_bytes(policy, default, entries, pod_entries=pod_entries, layout=layout)
    assert parse_cpu_manager_state(data) == CpuManagerState(
        policy, default, entries, layout=layout, pod_entries=pod_entries
    )


_sizes = st.integers(0, (1 << 63) - 1)  # the reader rejects amounts beyond int64: no machine has them
_resources = st.sampled_from(["memory", "hugepages-2Mi", "hugepages-1Gi"])
_blocks = st.lists(
    st.builds(MemoryBlock, st.lists(st.integers(0, 7), max_size=3).map(tuple), _resources, _sizes), max_size=3
).map(tuple)
_numa_states = st.builds(
    NumaMemoryState,
    st.integers(0, 1000),
    st.lists(st.integers(0, 7), max_size=4).map(tuple),
    st.dictionaries(_resources, st.builds(MemoryTable, _sizes, _sizes, _sizes, _sizes, _sizes), max_size=3),
)


@PROPERTY
@given(
    machine_state=st.dictionaries(st.integers(0, 15), _numa_states, max_size=4),
    entries=st.dictionaries(_names, st.dictionaries(_names, _blocks, max_size=3), max_size=4),
    pod_entries=st.dictionaries(_names, _blocks, max_size=3),
    layout=st.sampled_from(["v2", "v3"]),
)
def test_memory_round_trip(
    machine_state: dict[int, NumaMemoryState],
    entries: dict[str, dict[str, tuple[MemoryBlock, ...]]],
    pod_entries: dict[str, tuple[MemoryBlock, ...]],
    layout: str,
) -> None:
    data = memory_manager_state_bytes(
        "Static", machine_state, entries, pod_entries=pod_entries, layout=layout
    )
    assert parse_memory_manager_state(data) == MemoryManagerState(
        "Static", machine_state, entries, layout=layout, pod_entries=pod_entries
    )


_device_entries = st.lists(
    st.builds(
        DeviceEntry,
        _names,
        _names,
        st.sampled_from(["nvidia.com/gpu", "amd.com/gpu", "intel.com/sriov"]),
        st.dictionaries(st.integers(-1, 7), st.lists(_names, max_size=3).map(tuple), max_size=3),
    ),
    max_size=5,
).map(tuple)


@PROPERTY
@given(
    entries=_device_entries,
    registered=st.dictionaries(_names, st.lists(_names, max_size=4).map(tuple), max_size=3),
)
def test_device_round_trip(entries: tuple[DeviceEntry, ...], registered: dict[str, tuple[str, ...]]) -> None:
    data = device_checkpoint_bytes(entries, registered)
    assert parse_device_checkpoint(data) == DeviceManagerState(entries, registered, layout="v2")


def test_writer_replaces_files_atomically_with_mode_0600(tmp_path: Path) -> None:
    target = tmp_path / "cpu_manager_state"
    write_cpu_manager_state(target, "static", {0}, {"pod": {"app": {1}}})
    first = target.stat().st_ino
    write_cpu_manager_state(target, "static", {0, 1}, {})
    assert target.stat().st_ino != first  # renamed over, not rewritten in place
    assert target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu_manager_state"]
    assert read_cpu_manager_state(target) == CpuManagerState("static", frozenset({0, 1}), {})
    write_memory_manager_state(tmp_path / "memory_manager_state", "Static", _NODES, {})
    write_device_checkpoint(tmp_path / "kubelet_internal_checkpoint", [], {})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cpu_manager_state",
        "kubelet_internal_checkpoint",
        "memory_manager_state",
    ]


def test_parsing_250_pods_of_4_containers_is_fast() -> None:
    entries = {
        f"{p:08d}-0000-4000-8000-000000000000": {f"c{c}": {p * 4 + c} for c in range(4)} for p in range(250)
    }
    cpu = cpu_manager_state_bytes("static", set(range(1000, 1064)), entries)
    blocks = {
        pod: {name: (MemoryBlock((0,), "memory", 1 << 30),) for name in c} for pod, c in entries.items()
    }
    memory = memory_manager_state_bytes("Static", _NODES, blocks)
    timings = []
    for parse, data in ((parse_cpu_manager_state, cpu), (parse_memory_manager_state, memory)):
        best = min(_elapsed(parse, data) for _ in range(3))
        timings.append(best)
    # well under 100 ms on an idle machine; the bound leaves room for a loaded test runner
    assert max(timings) < 0.5, timings


def _elapsed(parse: Parser, data: bytes) -> float:
    start = time.perf_counter()
    parse(data)
    return time.perf_counter() - start
