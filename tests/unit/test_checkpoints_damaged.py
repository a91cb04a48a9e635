"""Damaged copies of the real checkpoints are rejected with SourceCorrupt, and nothing else escapes.

The fixtures are only read; every damaged file is a copy written under tmp_path.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from otel_numa.sources.checkpoints import (
    parse_cpu_manager_state,
    parse_device_checkpoint,
    parse_memory_manager_state,
    read_cpu_manager_state,
    read_device_checkpoint,
    read_memory_manager_state,
)
from otel_numa.sources.errors import SourceCorrupt, SourceMissing, SourceUnavailable
from otel_numa.testing.dra_checkpoint import parse_dra_checkpoint, read_dra_checkpoint
from tests.support import FIXTURES

KUBELET = FIXTURES / "kubelet"

Reader = Callable[[Path], object]
Parser = Callable[[bytes], object]

READERS: dict[str, tuple[Reader, Parser]] = {
    "cpu": (read_cpu_manager_state, parse_cpu_manager_state),
    "mem": (read_memory_manager_state, parse_memory_manager_state),
    "device": (read_device_checkpoint, parse_device_checkpoint),
    "dra": (read_dra_checkpoint, parse_dra_checkpoint),
}


def kind_of(name: str) -> str:
    return next(kind for kind in READERS if f"_{kind}_" in name)


ALL_FIXTURES = sorted(path.name for path in KUBELET.glob("*.json"))

# (file, stored checksum as written, the same with one digit changed)
CHECKSUM_DIGIT = {
    "k8stest_cpu_v1_migration_container_ids.json": ("3680390589", "3680390588"),
    "k8stest_cpu_v1_no_entries.json": ("1694838852", "1694838851"),
    "k8stest_cpu_v2_migration_checksum_from_v3named_struct.json": ("1942532442", "1942532443"),
    "k8stest_cpu_v2_restore_default_cpu_set.json": ("354655845", "354655846"),
    "k8stest_cpu_v2_restore_valid_checkpoint.json": ("3610638499", "3610638409"),
    "k8stest_cpu_v3_podentries.json": ("766259872", "766259972"),
    "k8stest_cpu_v4_data_datachecksum.json": ("1032795074", "1032795075"),
    "k8stest_dra_v1_crc32.json": ("1656016162", "1656016163"),
    "k8stest_dra_v1_crc32_entries.json": ("1597924435", "1597924436"),
    "k8stest_mem_v1.json": ("4215593881", "4215593882"),
    "k8stest_mem_v2_podentries.json": ("1278640530", "1278640531"),
    "k8stest_mem_v3_data_datachecksum.json": ("637296054", "637296055"),
    "realworld_alicloud_device_no_entries.json": ("3952659280", "3952659281"),
    "realworld_gengwg_mem_none.json": ("4236770233", "4236770234"),
    "realworld_k8s109562_cpu_static_stale_entry.json": ("1515081781", "1515081782"),
    "realworld_kind_device_checkpoint_numa_minus1.json": ("3660592824", "3660592825"),
    "realworld_lx1036_cpu_none_v1era.json": ("3242152201", "3242152202"),
    "realworld_lx1036_cpu_static.json": ("1552716370", "1552716371"),
    "realworld_talos_test_cpu_static.json": ("1902567528", "1902567529"),
}

# (file, a value as written, the same value changed): JSON and types stay valid, only the checksum can tell
VALUE_CHANGE = {
    "k8stest_cpu_v1_migration_container_ids.json": ('"containerID1": "4-6"', '"containerID1": "4-7"'),
    "k8stest_cpu_v1_no_entries.json": ('"defaultCPUSet": "1-3"', '"defaultCPUSet": "1-4"'),
    "k8stest_cpu_v2_migration_checksum_from_v3named_struct.json": (
        '"container2": "1-3"',
        '"container2": "1-2"',
    ),
    "k8stest_cpu_v2_restore_default_cpu_set.json": ('"defaultCPUSet": "4-6"', '"defaultCPUSet": "4-5"'),
    "k8stest_cpu_v2_restore_valid_checkpoint.json": ('"container1": "4-6"', '"container1": "5-6"'),
    "k8stest_cpu_v3_podentries.json": ('"cpuSet":"7-9"', '"cpuSet":"7-8"'),
    "k8stest_cpu_v4_data_datachecksum.json": (
        '\\"defaultCPUSet\\":\\"1-3\\"',
        '\\"defaultCPUSet\\":\\"1-2\\"',
    ),
    "k8stest_dra_v1_crc32.json": ("dev-1", "dev-2"),
    "k8stest_dra_v1_crc32_entries.json": ("dev-1", "dev-3"),
    "k8stest_mem_v1.json": ('"free":1024', '"free":1025'),
    "k8stest_mem_v2_podentries.json": (
        '"memoryBlocks":[{"numaAffinity":[0]',
        '"memoryBlocks":[{"numaAffinity":[1]',
    ),
    "k8stest_mem_v3_data_datachecksum.json": ('\\"free\\":1024', '\\"free\\":1023'),
    "realworld_alicloud_device_no_entries.json": ("GPU-0650a168", "GPU-0650a169"),
    "realworld_gengwg_mem_none.json": ('"policyName":"None"', '"policyName":"Nona"'),
    "realworld_k8s109562_cpu_static_stale_entry.json": ('"cpu-qos2":"3"', '"cpu-qos2":"4"'),
    "realworld_kind_device_checkpoint_numa_minus1.json": ('"DeviceIDs":{"-1"', '"DeviceIDs":{"0"'),
    "realworld_lx1036_cpu_none_v1era.json": ('"policyName":"none"', '"policyName":"nonf"'),
    "realworld_lx1036_cpu_static.json": ('"cgroup1-0":"1,13"', '"cgroup1-0":"1,12"'),
    "realworld_talos_test_cpu_static.json": ("19-31", "19-30"),
}

# (file, a member as written, the same member with a JSON type Go cannot decode into its field)
WRONG_TYPE = {
    "realworld_lx1036_cpu_static.json": ('"policyName":"static"', '"policyName":5'),
    "k8stest_cpu_v2_restore_valid_checkpoint.json": ('"container1": "4-6"', '"container1": 46'),
    "k8stest_cpu_v3_podentries.json": ('"container1": "5-6"', '"container1": ["5-6"]'),
    "realworld_talos_test_cpu_static.json": ('"checksum":1902567528', '"checksum":"1902567528"'),
    "k8stest_mem_v1.json": ('"numaAffinity":[0]', '"numaAffinity":0'),
    "k8stest_mem_v2_podentries.json": ('"numberOfAssignments":0', '"numberOfAssignments":0.0'),
    "realworld_gengwg_mem_none.json": ('"machineState":{}', '"machineState":[]'),
    "k8stest_mem_v3_data_datachecksum.json": ('"dataChecksum": 637296054', '"dataChecksum": -637296054'),
    "realworld_kind_device_checkpoint_numa_minus1.json": ('"DeviceIDs":{"-1"', '"DeviceIDs":{"x"'),
    "realworld_alicloud_device_no_entries.json": ('"PodDeviceEntries":null', '"PodDeviceEntries":{}'),
    "k8stest_dra_v1_crc32.json": ('"Checksum":1656016162', '"Checksum":16560161620'),
}

GARBAGE = [
    b"",
    b"   \n",
    bytes(range(256)),
    b"\x00" * 64,
    b"\xef\xbb\xbf{}",  # a byte-order mark: Go's decoder refuses it
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
    b'{"policyName": NaN}',
    b"[" * 5000 + b"]" * 5000,
    b'{"a":' * 3000 + b"1" + b"}" * 3000,
    b"1" * 5000 + b"x",
    b"{} {}",
]


def damaged_copy(tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = (KUBELET / name).read_text()
    assert text.count(old) == 1, f"{old!r} must occur once in {name}"
    copy = tmp_path / name
    copy.write_text(text.replace(old, new))
    return copy


def assert_rejected(kind: str, path: Path, error_type: str | None = None) -> None:
    reader, _ = READERS[kind]
    with pytest.raises(SourceCorrupt) as raised:
        reader(path)
    assert path.name in str(raised.value)
    if error_type is not None:
        assert raised.value.error_type == error_type, raised.value


def test_every_fixture_gets_each_damage() -> None:
    assert set(CHECKSUM_DIGIT) == set(ALL_FIXTURES)
    assert set(VALUE_CHANGE) == set(ALL_FIXTURES)


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_changed_checksum_digit(tmp_path: Path, name: str) -> None:
    old, new = CHECKSUM_DIGIT[name]
    assert_rejected(kind_of(name), damaged_copy(tmp_path, name, old, new), "checksum_mismatch")


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_changed_value(tmp_path: Path, name: str) -> None:
    old, new = VALUE_CHANGE[name]
    assert_rejected(kind_of(name), damaged_copy(tmp_path, name, old, new), "checksum_mismatch")


@pytest.mark.parametrize("name", sorted(WRONG_TYPE))
def test_wrong_json_type(tmp_path: Path, name: str) -> None:
    old, new = WRONG_TYPE[name]
    assert_rejected(kind_of(name), damaged_copy(tmp_path, name, old, new), "wrong_type")


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_every_truncation(tmp_path: Path, name: str) -> None:
    data = (KUBELET / name).read_bytes()
    copy = tmp_path / name
    for length in range(len(data.rstrip())):
        copy.write_bytes(data[:length])
        assert_rejected(kind_of(name), copy, "parse_error")


@pytest.mark.parametrize("kind", sorted(READERS))
@pytest.mark.parametrize("garbage", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_and_empty_files(tmp_path: Path, kind: str, garbage: bytes) -> None:
    copy = tmp_path / "checkpoint"
    copy.write_bytes(garbage)
    assert_rejected(kind, copy, "parse_error")


@pytest.mark.parametrize("kind", sorted(READERS))
def test_json_that_is_not_an_object(kind: str) -> None:
    _, parse = READERS[kind]
    for data in (b"[]", b'"text"', b"42", b"1" * 5000, b"true"):
        with pytest.raises(SourceCorrupt) as raised:
            parse(data)
        assert raised.value.error_type == "wrong_type"


def test_legacy_members_beside_v4_data_are_not_trusted(tmp_path: Path) -> None:
    # the kubelet ignores the copies next to "data": changing one changes nothing
    name = "k8stest_cpu_v4_data_datachecksum.json"
    state = read_cpu_manager_state(
        damaged_copy(tmp_path, name, '"defaultCPUSet": "1-9"', '"defaultCPUSet": "0"')
    )
    assert state.default_cpu_set == frozenset({1, 2, 3})
    # but they must still decode, as for the kubelet
    assert_rejected(
        "cpu", damaged_copy(tmp_path, name, '"defaultCPUSet": "1-9"', '"defaultCPUSet": 9'), "wrong_type"
    )


def test_v4_data_that_is_not_json(tmp_path: Path) -> None:
    name = "k8stest_cpu_v4_data_datachecksum.json"
    assert_rejected("cpu", damaged_copy(tmp_path, name, '"data": "{', '"data": "{{'), "parse_error")


@pytest.mark.parametrize(
    ("data", "where", "value"),
    [
        # the kubelet's own test vectors: valid checksums over values its cpuset parser refuses
        (
            b'{"policyName": "none", "defaultCPUSet": "1.3", "entries": {}, "checksum": 3021697696}',
            "defaultCpuSet",
            "1.3",
        ),
        (
            b'{"policyName": "none", "defaultCPUSet": "1-3", "entries": {"pod": '
            b'{"container1": "4-6", "container2": "asd"}}, "checksum": 962272150}',
            "container2",
            "asd",
        ),
    ],
)
def test_verified_but_invalid_cpu_sets(data: bytes, where: str, value: str) -> None:
    """The error names the entry, never the value (a file may hold anything)."""
    with pytest.raises(SourceCorrupt) as raised:
        parse_cpu_manager_state(data)
    assert raised.value.error_type == "invalid_value"
    assert where in str(raised.value)
    assert value not in str(raised.value)


def test_missing_file_is_source_missing(tmp_path: Path) -> None:
    for reader, _ in READERS.values():
        with pytest.raises(SourceMissing):
            reader(tmp_path / "absent")
        with pytest.raises(SourceMissing):
            reader(tmp_path / "absent" / "deeper")


def test_directory_is_source_unavailable(tmp_path: Path) -> None:
    for reader, _ in READERS.values():
        with pytest.raises(SourceUnavailable):
            reader(tmp_path)


def test_reading_changes_nothing_in_a_read_only_directory(tmp_path: Path) -> None:
    state_dir = tmp_path / "kubelet"
    state_dir.mkdir()
    shutil.copy(KUBELET / "realworld_lx1036_cpu_static.json", state_dir / "cpu_manager_state")
    shutil.copy(KUBELET / "k8stest_mem_v1.json", state_dir / "memory_manager_state")
    before = {p.name: p.stat() for p in state_dir.iterdir()}
    state_dir.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        read_cpu_manager_state(state_dir / "cpu_manager_state")
        read_memory_manager_state(state_dir / "memory_manager_state")
        with pytest.raises(SourceMissing):
            read_device_checkpoint(state_dir / "kubelet_internal_checkpoint")
    finally:
        state_dir.chmod(stat.S_IRWXU)
    after = {p.name: p.stat() for p in state_dir.iterdir()}
    assert after.keys() == before.keys()
    for name, st in after.items():
        assert (st.st_mtime_ns, st.st_size, st.st_mode) == (
            before[name].st_mtime_ns,
            before[name].st_size,
            before[name].st_mode,
        )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_source_unavailable(tmp_path: Path) -> None:
    copy = tmp_path / "cpu_manager_state"
    shutil.copy(KUBELET / "realworld_lx1036_cpu_static.json", copy)
    copy.chmod(0)
    with pytest.raises(SourceUnavailable):
        read_cpu_manager_state(copy)
