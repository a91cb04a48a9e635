"""Real kubelet checkpoints (tests/fixtures/kubelet, see SOURCES.md there) are read as the kubelet reads them.

Every expected value below was written by hand from the JSON files, not computed by the reader.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from otel_numa.model import (
    CpuManagerState,
    DeviceEntry,
    DeviceManagerState,
    DraClaim,
    DraDevice,
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
    read_device_checkpoint,
    read_memory_manager_state,
)
from otel_numa.sources.checkpoints.gojson import STRING, UINT64, GoField, GoInt, GoMap, GoPointer, GoStruct
from otel_numa.sources.checkpoints.gospew import fnv1a_32, spew_text
from otel_numa.sources.errors import SourceCorrupt
from otel_numa.testing.checkpoints import fnv1a_32 as independent_fnv1a_32
from otel_numa.testing.dra_checkpoint import DraManagerState, parse_dra_checkpoint, read_dra_checkpoint
from tests.support import FIXTURES

KUBELET = FIXTURES / "kubelet"


def fixture(name: str) -> bytes:
    return (KUBELET / name).read_bytes()


CPU_EXPECTED = {
    "k8stest_cpu_v1_migration_container_ids.json": CpuManagerState(
        policy_name="none",
        default_cpu_set=frozenset({1, 2, 3}),
        entries={"containerID1": {"": frozenset({4, 5, 6})}, "containerID2": {"": frozenset({1, 2, 3})}},
        layout="v1",
        entries_keyed_by_container_id=True,
    ),
    "k8stest_cpu_v1_no_entries.json": CpuManagerState(
        "none", frozenset({1, 2, 3}), {}, layout="v1", entries_keyed_by_container_id=True
    ),
    "k8stest_cpu_v2_restore_valid_checkpoint.json": CpuManagerState(
        "none",
        frozenset({1, 2, 3}),
        {"pod": {"container1": frozenset({4, 5, 6}), "container2": frozenset({1, 2, 3})}},
    ),
    "k8stest_cpu_v2_restore_default_cpu_set.json": CpuManagerState("none", frozenset({4, 5, 6}), {}),
    # no podEntries member, but hashed as the v3 struct (with an empty PodEntries) under the V3 type name
    "k8stest_cpu_v2_migration_checksum_from_v3named_struct.json": CpuManagerState(
        "static",
        frozenset({7, 8, 9}),
        {"pod": {"container1": frozenset({4, 5, 6}), "container2": frozenset({1, 2, 3})}},
        layout="v3",
    ),
    "k8stest_cpu_v3_podentries.json": CpuManagerState(
        "static",
        frozenset({1, 2}),
        {"pod1": {"container1": frozenset({5, 6}), "container2": frozenset({3, 4})}},
        layout="v3",
        pod_entries={"pod2": frozenset({7, 8, 9})},
    ),
    # the data string decides: policy "static" and "1-3", not the "other"/"1-9" copies beside it
    "k8stest_cpu_v4_data_datachecksum.json": CpuManagerState(
        "static",
        frozenset({1, 2, 3}),
        {"pod": {"container1": frozenset({4, 5, 6}), "container2": frozenset({7, 8, 9})}},
        layout="v4",
        pod_entries={"pod": frozenset(range(4, 11))},
    ),
    "realworld_k8s109562_cpu_static_stale_entry.json": CpuManagerState(
        "static",
        frozenset({0, 1, 2, 4, 5, 6, 7}),
        {"499a37ae-89a8-4e73-a090-f86ea22a9f4c": {"cpu-qos2": frozenset({3})}},
    ),
    "realworld_lx1036_cpu_none_v1era.json": CpuManagerState(
        "none", frozenset(), {}, layout="v1", entries_keyed_by_container_id=True
    ),
    "realworld_lx1036_cpu_static.json": CpuManagerState(
        "static",
        frozenset({0, *range(2, 13), *range(14, 24)}),
        {"235148fe-393f-47a8-a17d-bd55bc1a836b": {"cgroup1-0": frozenset({1, 13})}},
    ),
    "realworld_talos_test_cpu_static.json": CpuManagerState(
        "static", frozenset({1, *range(3, 16), 17, *range(19, 32)}), {}
    ),
}

_NODE0 = NumaMemoryState(
    number_of_assignments=0,
    cells=(),
    memory_map={
        "memory": MemoryTable(total=2048, system_reserved=512, allocatable=1536, reserved=512, free=1024)
    },
)
_BLOCK = MemoryBlock(numa_affinity=(0,), resource="memory", size=512)

MEMORY_EXPECTED = {
    "k8stest_mem_v1.json": MemoryManagerState(
        "static", {0: _NODE0}, {"pod": {"container1": (_BLOCK,)}}, layout="v1"
    ),
    "k8stest_mem_v2_podentries.json": MemoryManagerState(
        "static", {0: _NODE0}, {"pod": {"container1": (_BLOCK,)}}, layout="v2", pod_entries={"pod": (_BLOCK,)}
    ),
    # the data string decides, not the numberOfAssignments 5 / total 1024 copies beside it
    "k8stest_mem_v3_data_datachecksum.json": MemoryManagerState(
        "static", {0: _NODE0}, {"pod": {"container1": (_BLOCK,)}}, layout="v3", pod_entries={"pod": (_BLOCK,)}
    ),
    "realworld_gengwg_mem_none.json": MemoryManagerState("None", {}, {}, layout="v1"),
}

DEVICE_EXPECTED = {
    "realworld_kind_device_checkpoint_numa_minus1.json": DeviceManagerState(
        entries=(
            DeviceEntry(
                pod_uid="bf52b2cd-b611-4e79-86b1-280b283185c3",
                container_name="check",
                resource_name="nvidia.com/gpu",
                devices_by_numa={-1: ("tegra",)},
            ),
        ),
        registered_devices={"nvidia.com/gpu": ("tegra",)},
        layout="v2",
    ),
    "realworld_alicloud_device_no_entries.json": DeviceManagerState(
        entries=(),
        registered_devices={"nvidia.com/gpu": ("GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0",)},
        layout="v2",
    ),
}

_DRA_CLAIM = DraClaim(
    name="example",
    namespace="default",
    devices=(
        DraDevice(
            driver="test-driver.cdi.k8s.io",
            pool="worker-1",
            device="dev-1",
            cdi_devices=("example.com/example=cdi-example",),
        ),
    ),
    uid="067798be-454e-4be4-9047-1aa06aea63f7",
    pod_uids=frozenset({"139cdb46-f989-4f17-9561-ca10cfb509a6"}),
)
DRA_EXPECTED = {
    "k8stest_dra_v1_crc32.json": DraManagerState(claims=(_DRA_CLAIM,)),
    "k8stest_dra_v1_crc32_entries.json": DraManagerState(claims=(_DRA_CLAIM,)),
}


def test_every_fixture_has_expectations() -> None:
    names = {path.name for path in KUBELET.glob("*.json")}
    assert names == set(CPU_EXPECTED) | set(MEMORY_EXPECTED) | set(DEVICE_EXPECTED) | set(DRA_EXPECTED)


@pytest.mark.parametrize("name", sorted(CPU_EXPECTED))
def test_cpu_manager_fixture(name: str) -> None:
    assert parse_cpu_manager_state(fixture(name)) == CPU_EXPECTED[name]


@pytest.mark.parametrize("name", sorted(MEMORY_EXPECTED))
def test_memory_manager_fixture(name: str) -> None:
    assert parse_memory_manager_state(fixture(name)) == MEMORY_EXPECTED[name]


@pytest.mark.parametrize("name", sorted(DEVICE_EXPECTED))
def test_device_fixture(name: str) -> None:
    assert parse_device_checkpoint(fixture(name)) == DEVICE_EXPECTED[name]


@pytest.mark.parametrize("name", sorted(DRA_EXPECTED))
def test_dra_fixture_is_recognised_and_verified(name: str) -> None:
    assert parse_dra_checkpoint(fixture(name)) == DRA_EXPECTED[name]


@pytest.mark.parametrize("name", sorted(DRA_EXPECTED))
def test_dra_fixture_is_not_mistaken_for_another_checkpoint(name: str) -> None:
    # "Data" matches the v4 "data" member case-insensitively; its FNV dataChecksum (absent: 0) then fails
    with pytest.raises(SourceCorrupt):
        parse_cpu_manager_state(fixture(name))
    with pytest.raises(SourceCorrupt):
        parse_memory_manager_state(fixture(name))
    with pytest.raises(SourceCorrupt):
        parse_device_checkpoint(fixture(name))


def test_read_functions_read_files(tmp_path: Path) -> None:
    expected: dict[str, object] = {**CPU_EXPECTED, **MEMORY_EXPECTED, **DEVICE_EXPECTED, **DRA_EXPECTED}
    cases: list[tuple[Callable[[Path], object], str]] = [
        (read_cpu_manager_state, "realworld_lx1036_cpu_static.json"),
        (read_memory_manager_state, "k8stest_mem_v1.json"),
        (read_device_checkpoint, "realworld_kind_device_checkpoint_numa_minus1.json"),
        (read_dra_checkpoint, "k8stest_dra_v1_crc32.json"),
    ]
    for read, name in cases:
        copy = tmp_path / name
        copy.write_bytes(fixture(name))
        assert read(copy) == expected[name]


# ------------------------------------------------------------------------------- the checksum algorithm

SOURCES_EXAMPLE = (
    "(*state.CPUManagerCheckpoint){PolicyName:(string)static DefaultCPUSet:(string)0,4-27 "
    "Entries:(map[string]map[string]string)map[39b37746-7f5e-4064-b8e1-eebd2bfaa003:map[app:1-3]] "
    "Checksum:(checksum.Checksum)0}"
)


def test_sources_worked_example_hashes_to_its_checksum() -> None:
    assert SOURCES_EXAMPLE in (KUBELET / "SOURCES.md").read_text()
    assert fnv1a_32(SOURCES_EXAMPLE.encode()) == 3300516549
    assert independent_fnv1a_32(SOURCES_EXAMPLE.encode()) == 3300516549


def test_fnv1a_32_reference_vectors() -> None:
    # from the FNV reference test suite
    assert fnv1a_32(b"") == 0x811C9DC5
    assert fnv1a_32(b"a") == 0xE40C292C
    assert fnv1a_32(b"foobar") == 0xBF9CF968
    assert fnv1a_32(b"foobar" * 100 + b"x") == independent_fnv1a_32(b"foobar" * 100 + b"x")


def test_spew_text_of_the_worked_example() -> None:
    container_cpus = GoMap("map[string]string", STRING, STRING)
    struct = GoStruct(
        "state.CPUManagerCheckpoint",
        (
            GoField("PolicyName", "policyName", STRING),
            GoField("DefaultCPUSet", "defaultCpuSet", STRING),
            GoField("Entries", "entries", GoMap("map[string]map[string]string", STRING, container_cpus)),
            GoField("Checksum", "checksum", GoInt("checksum.Checksum", signed=False)),
        ),
    )
    value = {
        "PolicyName": "static",
        "DefaultCPUSet": "0,4-27",
        "Entries": {"39b37746-7f5e-4064-b8e1-eebd2bfaa003": {"app": "1-3"}},
        "Checksum": 0,
    }
    assert spew_text(GoPointer("*state.CPUManagerCheckpoint", struct), value) == SOURCES_EXAMPLE


def test_spew_skips_the_type_after_a_nil_pointer_whose_type_was_skipped() -> None:
    # spew's formatPtr returns on such a nil without clearing ignoreNextType: the next value's type is lost
    table = GoStruct("state.T", (GoField("Size", "size", UINT64),))
    struct = GoStruct(
        "state.S",
        (
            GoField("Tables", "tables", GoMap("map[string]*state.T", STRING, GoPointer("*state.T", table))),
            GoField("Count", "count", GoInt("int")),
        ),
    )
    value = {"Tables": {"a": {"Size": 1}, "b": None}, "Count": 5}
    assert (
        spew_text(struct, value)
        == "(state.S){Tables:(map[string]*state.T)map[a:<*>{Size:(uint64)1} b:<nil>] Count:5}"
    )


# ------------------------------------------------------------------- encodings Go decodes to the same value


def _variants(text: str) -> list[str]:
    return [
        json.dumps(json.loads(text), indent=3),  # other whitespace
        text.replace('"policyName"', '"POLICYNAME"'),  # Go matches member names case-insensitively
        text.replace('"checksum"', '"chec\u212asum"'),  # ... folding the Kelvin sign onto k
        text.replace('"checksum"', '"\\u0063hecksum"'),  # escapes in member names
        text.replace("{", '{"unknown": [1, {"x": null}, "y"],', 1),  # unknown members are skipped
    ]


@pytest.mark.parametrize("name", ["realworld_lx1036_cpu_static.json", "k8stest_cpu_v3_podentries.json"])
def test_cpu_equivalent_encodings_are_accepted(name: str) -> None:
    for text in _variants(fixture(name).decode()):
        assert parse_cpu_manager_state(text.encode()) == CPU_EXPECTED[name], text


def test_memory_equivalent_encodings_are_accepted() -> None:
    name = "k8stest_mem_v2_podentries.json"
    for text in _variants(fixture(name).decode()):
        assert parse_memory_manager_state(text.encode()) == MEMORY_EXPECTED[name], text


def test_a_dotted_capital_i_does_not_fold_onto_i() -> None:
    # unlike the Kelvin sign, U+0130 is not a case variant of "i" for Go: policyName goes unread
    text = fixture("realworld_lx1036_cpu_static.json").decode().replace('"policyName"', '"pol\u0130cyName"')
    with pytest.raises(SourceCorrupt) as raised:
        parse_cpu_manager_state(text.encode())
    assert raised.value.error_type == "checksum_mismatch"


def _with_checksum(spew: str, body: str) -> bytes:
    return (body % independent_fnv1a_32(spew.encode())).encode()


def test_null_map_is_hashed_as_nil_and_a_missing_one_as_empty() -> None:
    nil_text = (
        "(*state.CPUManagerCheckpoint){PolicyName:(string)none DefaultCPUSet:(string)1-3 "
        "Entries:(map[string]map[string]string)<nil> Checksum:(checksum.Checksum)0}"
    )
    with_null = _with_checksum(
        nil_text, '{"policyName":"none","defaultCpuSet":"1-3","entries":null,"checksum":%d}'
    )
    assert parse_cpu_manager_state(with_null) == CpuManagerState("none", frozenset({1, 2, 3}), {})
    # the same checksum over a file without the member: the constructor's empty map prints map[], not <nil>
    without = with_null.replace(b'"entries":null,', b"")
    with pytest.raises(SourceCorrupt):
        parse_cpu_manager_state(without)


def test_invalid_utf8_in_strings_becomes_one_replacement_character_per_byte() -> None:
    spew = (
        "(*state.CPUManagerCheckpoint){PolicyName:(string)none DefaultCPUSet:(string)1-3 "
        "Entries:(map[string]map[string]string)map[p\ufffd\ufffd:map[c:4]] Checksum:(checksum.Checksum)0}"
    )
    body = _with_checksum(
        spew, '{"policyName":"none","defaultCpuSet":"1-3","entries":{"pXX":{"c":"4"}},"checksum":%d}'
    )
    data = body.replace(b"XX", b"\xe2\x82")  # a truncated 3-byte sequence: Go replaces each byte
    assert parse_cpu_manager_state(data).entries == {"p\ufffd\ufffd": {"c": frozenset({4})}}


def test_a_zero_checksum_is_accepted_unverified_as_by_the_kubelet() -> None:
    state = parse_cpu_manager_state(b'{"policyName":"static","defaultCpuSet":"0-3","checksum":0}')
    assert state == CpuManagerState("static", frozenset(range(4)), {}, checksum_verified=False)
    # but not by the device manager
    with pytest.raises(SourceCorrupt):
        parse_device_checkpoint(b'{"Data":{"PodDeviceEntries":[],"RegisteredDevices":{}},"Checksum":0}')


def test_kubernetes_test_vector_with_another_policy_is_accepted() -> None:
    # from the kubelet's state_checkpoint_test.go ("Restore checkpoint with invalid policy name"): the
    # checksum is valid, the policy mismatch is the kubelet's configuration concern, not the file's
    data = b'{"policyName": "other", "defaultCPUSet": "1-3", "entries": {}, "checksum": 1394507217}'
    assert parse_cpu_manager_state(data) == CpuManagerState("other", frozenset({1, 2, 3}), {})
