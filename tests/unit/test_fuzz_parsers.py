"""Hostile input for every file parser: nothing but SourceError escapes, and a rejected file yields no series.

What tests/unit/test_sysfs_synthetic.py already fuzzes (short text in a node's cpulist, cpumap, distance,
meminfo and numastat) is not repeated. Here: raw bytes and kernel-shaped text for the remaining sysfs files
(online masks, hugepage counts), procfs, the three checkpoint formats (structure-aware: a real document with
values, types and keys mutated, then either left with its old checksum or signed again so that the mutated
values get past verification), cgroup files and the log directory names; then, through an in-process agent,
that a checkpoint or meminfo the source rejects contributes no series while everything else stays.
"""

from __future__ import annotations

import json
import string
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

from otel_numa.export.pipeline import build_pipeline
from otel_numa.model import DeviceEntry, MemoryBlock, MemoryTable, NumaMemoryState, Topology
from otel_numa.sources import cgroups, files, procfs, sysfs
from otel_numa.sources.cdi import parse_cdi_spec
from otel_numa.sources.checkpoints import (
    parse_cpu_manager_state,
    parse_device_checkpoint,
    parse_memory_manager_state,
)
from otel_numa.sources.container_logs import parse_container_log_name, read_container_identities
from otel_numa.sources.errors import SourceCorrupt, SourceError
from otel_numa.sources.pod_logs import parse_pod_log_dir_name, read_pod_identities
from otel_numa.testing.cgroup_tree import (
    FakeContainer,
    FakePod,
    container_dir,
    read_all_usage,
    write_cgroup_tree,
)
from otel_numa.testing.checkpoints import (
    cpu_manager_state_bytes,
    device_checkpoint_bytes,
    fnv1a_32,
    memory_manager_state_bytes,
)
from otel_numa.testing.dra_checkpoint import parse_dra_checkpoint
from otel_numa.testing.kubelet_scenario import (
    KubeletScenario,
    Labels,
    ScenarioPod,
    build_scenario,
    counted_errors,
    series,
)
from otel_numa.testing.sysfs_tree import NodeSpec, write_file, write_machine
from tests.support import FIXTURES, InProcessExporter

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FEW = settings(FUZZ, max_examples=60)
# each example of these runs a whole in-process collection
AGENT_LEVEL = settings(FUZZ, max_examples=30)

KIB, MIB, GIB = 1024, 1 << 20, 1 << 30
NODE_DIR = "devices/system/node"


def source_result(parse: Callable[[], object]) -> object | SourceError:
    """The parser's value, or the SourceError it raised; any other exception fails the test."""
    try:
        return parse()
    except SourceError as error:
        return error


# --- strategies -----------------------------------------------------------------------------------

# Text built from what kernel files are made of, so that fuzzing gets past the first character.
KERNEL_ALPHABET = string.digits + "abcdefxABCDEF-,:=_ \t\n\x00" + "NodeMmTtlFrUsdHugPakB"
kernel_text = st.text(alphabet=KERNEL_ALPHABET, max_size=120)
any_text = st.text(max_size=120)
any_bytes = st.binary(max_size=200)
numbers = st.one_of(
    st.integers(min_value=-5, max_value=70_000),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(["", "-", "+1", " 7", "1_0", "0x10", "1e3", "٣", "9" * 30]),
).map(str)


@st.composite
def cpulist_items(draw: st.DrawFn) -> tuple[str, set[int] | None]:
    """A kernel-style list and the set it means (None when some item is not a valid, bounded range)."""
    parts: list[str] = []
    meant: set[int] | None = set()
    for _ in range(draw(st.integers(0, 6))):
        low = draw(st.integers(-3, 70_000))
        if draw(st.booleans()):
            high = low + draw(st.integers(-2, 40))
            parts.append(f"{low}-{high}")
            valid = 0 <= low <= high <= files.MAX_CPU_ID
            cpus = set(range(low, high + 1)) if valid else set()
        else:
            parts.append(str(low))
            valid = 0 <= low <= files.MAX_CPU_ID
            cpus = {low}
        if meant is not None:
            meant = meant | cpus if valid else None
    return ",".join(parts), meant


# --- pure parsers ---------------------------------------------------------------------------------


@FUZZ
@given(item=cpulist_items(), junk=st.sampled_from(["", "\n", "\x00", " \n"]))
def test_cpulist_means_what_its_ranges_say(item: tuple[str, set[int] | None], junk: str) -> None:
    text, meant = item
    result = source_result(lambda: files.parse_cpulist(text + junk))
    if meant is None:
        assert isinstance(result, SourceCorrupt), (text, result)
    else:
        assert result == frozenset(meant)


@FUZZ
@given(text=st.one_of(any_text, kernel_text))
def test_cpu_list_and_mask_parsers_only_raise_source_errors(text: str) -> None:
    for parse in (files.parse_cpulist, files.parse_cpumask):
        result = source_result(lambda parse=parse: parse(text))  # type: ignore[misc]
        assert isinstance(result, frozenset | SourceError)
        if isinstance(result, frozenset):
            assert all(0 <= cpu <= files.MAX_CPU_ID for cpu in result)


def test_a_huge_cpu_mask_is_rejected_quickly() -> None:
    # a cpumap far longer than any kernel's NR_CPUS would make: refused, not expanded bit by bit
    started = time.monotonic()
    result = source_result(lambda: files.parse_cpumask(",".join(["ffffffff"] * 50_000)))
    assert isinstance(result, SourceCorrupt)
    assert time.monotonic() - started < 1.0


@FUZZ
@given(text=st.one_of(any_text, kernel_text, st.lists(numbers, max_size=12).map(" ".join)))
def test_procfs_stat_only_raises_source_errors(text: str) -> None:
    per_cpu = procfs.NodeCpuTimes({cpu: (cpu,) for cpu in range(8)})
    for body in (text, "cpu0 " + text, "cpu  1 2 3 4\ncpu3 " + text):
        result = source_result(lambda body=body: per_cpu.parse(body))  # type: ignore[misc]
        if isinstance(result, dict):
            assert all(set(modes) <= set(procfs.CPU_MODES) for modes in result.values())
            assert all(time_s >= 0 for modes in result.values() for time_s in modes.values()), result


@FUZZ
@given(
    text=st.lists(
        st.tuples(
            st.sampled_from(["MemTotal", "MemFree", "MemUsed", "HugePages_Total", "Node 1 MemTotal", ""]),
            st.sampled_from([":", ": ", ":\t", " ", ""]),
            numbers,
            st.sampled_from([" kB", "", " MB", " kB kB", "kB"]),
        ).map("".join),
        max_size=6,
    ).map("\n".join)
    | any_text
    | kernel_text
)
def test_meminfo_only_raises_source_errors_and_never_goes_negative(text: str) -> None:
    result = source_result(lambda: procfs.parse_meminfo(text))
    if isinstance(result, dict):
        assert all(value >= 0 for value in result.values()), result


@FUZZ
@given(text=st.one_of(any_text, kernel_text))
def test_numastat_and_cgroup_numa_stat_only_raise_source_errors(text: str) -> None:
    for parse in (
        lambda: sysfs.parse_numastat(text, Path("numastat")),
        lambda: cgroups.parse_numa_stat_v1(text, page_size=4096),
        lambda: cgroups.parse_numa_stat_v2(text),
    ):
        source_result(parse)


@FUZZ
@given(
    name=st.one_of(
        any_text,
        st.lists(st.text(alphabet="abz09-._AZ", max_size=12), min_size=1, max_size=5).map("_".join),
    )
)
def test_pod_log_directory_names_split_back_into_the_name(name: str) -> None:
    identity = parse_pod_log_dir_name(name)
    if identity is not None:
        assert f"{identity.namespace}_{identity.name}_{identity.uid}" == name
        assert "_" not in identity.namespace + identity.name + identity.uid


@FUZZ
@given(
    name=st.one_of(
        any_text,
        st.tuples(
            st.lists(st.text(alphabet="ab0-._", min_size=1, max_size=8), min_size=1, max_size=4).map(
                "_".join
            ),
            st.sampled_from(["a" * 64, "0123456789abcdef" * 4, "F" * 64, "a" * 63, ""]),
            st.sampled_from([".log", ".log.1", ""]),
        ).map(lambda parts: f"{parts[0]}-{parts[1]}{parts[2]}"),
    )
)
def test_container_log_names_split_back_into_the_name(name: str) -> None:
    identity = parse_container_log_name(name)
    if identity is not None:
        rebuilt = (
            f"{identity.pod_name}_{identity.namespace}_{identity.container_name}-{identity.container_id}.log"
        )
        assert rebuilt == name
        assert len(identity.container_id) == 64


# --- files on disk: raw bytes in every sysfs/procfs file the machine reader opens ------------------

TWO_NODES = (
    NodeSpec(0, cpus=range(0, 2), mem_total_kib=4_000_000, mem_free_kib=3_000_000, hugepages={2048: (8, 4)}),
    NodeSpec(1, cpus=range(2, 4), mem_total_kib=2_000_000, mem_free_kib=1_000_000, hugepages={2048: (4, 4)}),
)
MACHINE_FILES = (
    f"{NODE_DIR}/online",
    f"{NODE_DIR}/possible",
    "devices/system/cpu/online",
    f"{NODE_DIR}/node1/hugepages/hugepages-2048kB/nr_hugepages",
    f"{NODE_DIR}/node1/hugepages/hugepages-2048kB/free_hugepages",
    f"{NODE_DIR}/node1/cpulist",
    f"{NODE_DIR}/node1/meminfo",
    f"{NODE_DIR}/node1/numastat",
    f"{NODE_DIR}/node1/distance",
)


@pytest.fixture
def machine(tmp_path: Path) -> tuple[Path, Path]:
    return write_machine(tmp_path, TWO_NODES)


def read_everything(sysfs_root: Path, procfs_root: Path) -> None:
    topology = sysfs.read_topology(sysfs_root)
    memory = sysfs.NodeFiles(sysfs_root, topology, procfs_root).memory()
    pools = sysfs.NodeFiles(sysfs_root, topology, procfs_root).hugepages()
    sysfs.NodeFiles(sysfs_root, topology).numastat()
    procfs.NodeCpuTimes({cpu: (cpu,) for cpu in range(8)}).read(procfs_root)
    procfs.read_meminfo(procfs_root)
    for m in memory.values():
        assert all(value is None or value >= 0 for value in (m.total_bytes, m.free_bytes, m.used_bytes)), m
    for node_pools in pools.values():
        for pool in node_pools:
            assert all(count is None or count >= 0 for count in (pool.total_pages, pool.free_pages)), pool


@FUZZ
@given(
    relative=st.sampled_from([*MACHINE_FILES, "proc:stat", "proc:meminfo"]),
    content=st.one_of(any_bytes, kernel_text.map(str.encode), numbers.map(str.encode)),
)
def test_machine_files_with_any_content_only_raise_source_errors(
    machine: tuple[Path, Path], relative: str, content: bytes
) -> None:
    sysfs_root, procfs_root = machine
    path = procfs_root / relative[5:] if relative.startswith("proc:") else sysfs_root / relative
    original = path.read_bytes()
    path.write_bytes(content)
    try:
        source_result(lambda: read_everything(sysfs_root, procfs_root))
    finally:
        path.write_bytes(original)


@FEW
@given(content=st.one_of(any_bytes, kernel_text.map(str.encode), numbers.map(str.encode)))
def test_per_cpu_online_files_with_any_content(
    tmp_path_factory: pytest.TempPathFactory, content: bytes
) -> None:
    root = tmp_path_factory.mktemp("cpu-online")
    sysfs_root, _procfs_root = write_machine(root, TWO_NODES, cpu_online_file=False)
    (sysfs_root / "devices/system/cpu/cpu3/online").write_bytes(content)
    result = source_result(lambda: sysfs.read_topology(sysfs_root))
    if isinstance(result, Topology):
        assert result.online_cpus in (frozenset({0, 1, 2}), frozenset({0, 1, 2, 3}))


# --- cgroup files ---------------------------------------------------------------------------------

POD_UID = "0b5e4d1c-1111-2222-3333-444455556666"
CONTAINER = "c" * 64
CGROUP_FILES = {
    "v2": ("memory.numa_stat", "cpuset.cpus.effective", "cpuset.mems.effective", "cpu.stat"),
    "v1": ("memory.numa_stat",),
}


@FUZZ
@given(
    layout=st.sampled_from(["v1", "v2"]),
    file_index=st.integers(0, 3),
    content=st.one_of(any_bytes, kernel_text.map(str.encode)),
)
def test_cgroup_files_with_any_content_only_raise_source_errors(
    tmp_path_factory: pytest.TempPathFactory, layout: str, file_index: int, content: bytes
) -> None:
    root = tmp_path_factory.mktemp("cgroup")
    pod = FakePod(POD_UID, "guaranteed", (FakeContainer(CONTAINER, {"anon": {0: 4096}}),))
    write_cgroup_tree(root, layout, "cgroupfs", [pod])  # type: ignore[arg-type]
    names = CGROUP_FILES[layout]
    name = names[file_index % len(names)]
    if layout == "v1" and file_index % 2:
        directory, name = (
            container_dir(root, "v1", "cgroupfs", pod, CONTAINER, controller="cpuset"),
            "cpuset.cpus",
        )
        (directory / "cpuset.effective_cpus").unlink()
    else:
        directory = container_dir(root, layout, "cgroupfs", pod, CONTAINER)  # type: ignore[arg-type]
    (directory / name).write_bytes(content)
    result = source_result(lambda: read_all_usage(root))
    if isinstance(result, tuple):
        assert [usage.container_id for usage in result] == [CONTAINER]


# --- directory listings with hostile names --------------------------------------------------------

file_names = st.text(
    alphabet=st.characters(exclude_characters="/\x00", exclude_categories=["Cs"]),
    min_size=1,
    max_size=60,
).filter(lambda name: name not in (".", "..") and len(name.encode()) < 255)


@FEW
@given(names=st.lists(file_names, max_size=8, unique=True))
def test_log_directories_with_any_names(tmp_path_factory: pytest.TempPathFactory, names: list[str]) -> None:
    root = tmp_path_factory.mktemp("logs")
    for index, name in enumerate(names):
        (root / name).mkdir() if index % 2 else (root / name).write_bytes(b"")
    pods = read_pod_identities(root)
    assert all(parse_pod_log_dir_name(f"{p.namespace}_{p.name}_{p.uid}") == p for p in pods.values())
    assert set(read_container_identities(root)) <= {
        identity.container_id for identity in map(parse_container_log_name, names) if identity is not None
    }


# --- checkpoints: structure-aware mutation --------------------------------------------------------

UID_A = "6a1f9c1e-0000-4000-8000-00000000000a"
UID_B = "6a1f9c1e-0000-4000-8000-00000000000b"


def _table(total: int, reserved: int) -> MemoryTable:
    return MemoryTable(total, 0, total, reserved, total - reserved)


MACHINE_STATE = {
    0: NumaMemoryState(
        1, (0,), {"memory": _table(4 * GIB, 1 * GIB), "hugepages-2Mi": _table(16 * MIB, 8 * MIB)}
    ),
    1: NumaMemoryState(0, (1,), {"memory": _table(2 * GIB, 0), "hugepages-2Mi": _table(8 * MIB, 0)}),
}
MEMORY_ENTRIES = {
    UID_A: {"app": [MemoryBlock((0,), "memory", 1 * GIB), MemoryBlock((0,), "hugepages-2Mi", 8 * MIB)]}
}
CPU_ENTRIES = {UID_A: {"app": {1}}, UID_B: {"side": {3}}}
DEVICE_ENTRIES = [DeviceEntry(UID_A, "app", "example.com/gpu", {0: ("gpu0",), -1: ("vf0",)})]
REGISTERED = {"example.com/gpu": ["gpu0", "gpu1"]}


def cpu_seeds() -> list[bytes]:
    return [
        cpu_manager_state_bytes("static", {0, 2}, CPU_ENTRIES, layout=layout, pod_entries=pods)
        for layout, pods in (("v2", None), ("v3", {UID_A: {1}}), ("v4", {UID_A: {1}}))
    ]


def memory_seeds() -> list[bytes]:
    return [
        memory_manager_state_bytes("Static", MACHINE_STATE, MEMORY_ENTRIES, layout=v) for v in ("v2", "v3")
    ]


def device_seeds() -> list[bytes]:
    return [device_checkpoint_bytes(DEVICE_ENTRIES, REGISTERED)]


def dra_seeds() -> list[bytes]:
    data = json.dumps({"Entries": [{"ClaimUID": "x"}]})
    return [json.dumps({"Data": data, "Checksum": _crc32(data)}).encode()]


def _crc32(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode())


def _real_files(prefix: str) -> list[bytes]:
    directory = FIXTURES / "kubelet"
    return [path.read_bytes() for path in sorted(directory.glob(f"*_{prefix}_*.json"))]


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["0-3", "3-0", "0-999999999", "", "-1", "18446744073709551615", "1,,2", "٣"]),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _containers(document: Any) -> list[Any]:
    """Every dict and list inside ``document`` (itself included), in a stable order."""
    found = [document]
    children = document.values() if isinstance(document, dict) else document
    for child in children:
        if isinstance(child, dict | list):
            found.extend(_containers(child))
    return found


@st.composite
def mutated_json(draw: st.DrawFn, document: Any) -> Any:
    """``document`` with one to four edits: a value replaced, a key dropped, renamed or added."""
    document = json.loads(json.dumps(document))
    for _ in range(draw(st.integers(1, 4))):
        target: Any = draw(st.sampled_from(_containers(document)))
        if isinstance(target, list):
            overwrite: bool = draw(st.booleans())
            if target and overwrite:
                target[draw(st.integers(0, len(target) - 1))] = draw(json_values)
            else:
                target.append(draw(json_values))
            continue
        keys = sorted(target)
        action = draw(st.sampled_from(["replace", "drop", "rename", "add"] if keys else ["add"]))
        if action == "add":
            target[draw(st.text(max_size=12))] = draw(json_values)
            continue
        key = draw(st.sampled_from(keys))
        if action == "replace":
            target[key] = draw(json_values)
        elif action == "drop":
            del target[key]
        else:
            renamed = draw(
                st.sampled_from([key.upper(), key.lower(), key.swapcase(), key + "x", "\u212a" + key])
            )
            target[renamed] = target.pop(key)
    return document


def resign(document: dict[str, Any]) -> bytes:
    """Put ``document`` in a v4 (cpu) / v3 (memory) ``data`` member with a matching ``dataChecksum``."""
    data = json.dumps(document, separators=(",", ":"))
    return json.dumps({"data": data, "dataChecksum": fnv1a_32(("(string)" + data).encode())}).encode()


def _document(seed: bytes) -> Any:
    document = json.loads(seed)
    if isinstance(document, dict) and isinstance(document.get("data"), str):
        return json.loads(document["data"])  # mutate the signed inner document of the newer layouts
    if isinstance(document, dict) and isinstance(document.get("Data"), str):
        return json.loads(document["Data"])  # the DRA checkpoint's claims, signed by a CRC-32
    return document


def resign_dra(document: Any) -> bytes:
    data = json.dumps(document, separators=(",", ":"))
    return json.dumps({"Data": data, "Checksum": _crc32(data)}).encode()


CHECKPOINT_PARSERS: dict[str, tuple[Callable[[bytes], object], Callable[[], list[bytes]]]] = {
    "cpu": (parse_cpu_manager_state, lambda: cpu_seeds() + _real_files("cpu")),
    "mem": (parse_memory_manager_state, lambda: memory_seeds() + _real_files("mem")),
    "device": (parse_device_checkpoint, lambda: device_seeds() + _real_files("device")),
    "dra": (parse_dra_checkpoint, lambda: dra_seeds() + _real_files("dra")),
}

CDI_SEED = {
    "cdiVersion": "0.6.0",
    "kind": "example.com/gpu",
    "devices": [
        {
            "name": "gpu0",
            "containerEdits": {"deviceNodes": [{"path": "/dev/gpu0", "type": "c", "major": 195}]},
        }
    ],
    "containerEdits": {"deviceNodes": [{"path": "/dev/gpuctl"}]},
}


@FUZZ
@given(data=st.data(), suffix=st.sampled_from([".json", ".yaml"]))
def test_cdi_specs_only_raise_source_errors(data: st.DataObject, suffix: str) -> None:
    if data.draw(st.booleans()):
        content = data.draw(any_bytes)
    else:
        content = json.dumps(data.draw(mutated_json(CDI_SEED))).encode()
    source_result(lambda: parse_cdi_spec(content, Path(f"spec{suffix}")))


@st.composite
def hostile_checkpoint(draw: st.DrawFn, kind: str) -> bytes:
    seed = draw(st.sampled_from(CHECKPOINT_PARSERS[kind][1]()))
    how = draw(st.sampled_from(["mutate", "resign", "flip", "truncate", "raw"]))
    if how == "raw":
        return draw(any_bytes)
    if how == "truncate":
        return seed[: draw(st.integers(0, len(seed)))]
    if how == "flip":
        data = bytearray(seed)
        for _ in range(draw(st.integers(1, 3))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    document = draw(mutated_json(_document(seed)))
    if how == "resign" and kind in ("cpu", "mem") and isinstance(document, dict):
        return resign(document)
    if kind == "dra":
        return resign_dra(document) if how == "resign" else json.dumps({"Data": document}).encode()
    return json.dumps(document).encode()


@FUZZ
@given(data=st.data(), kind=st.sampled_from(sorted(CHECKPOINT_PARSERS)))
def test_checkpoints_only_raise_source_errors(data: st.DataObject, kind: str) -> None:
    content = data.draw(hostile_checkpoint(kind))
    source_result(lambda: CHECKPOINT_PARSERS[kind][0](content))


@pytest.mark.parametrize("kind", sorted(CHECKPOINT_PARSERS))
def test_checkpoint_seeds_are_accepted(kind: str) -> None:
    # the mutations start from files the parser accepts; otherwise the fuzzing above proves little
    parse, seeds = CHECKPOINT_PARSERS[kind]
    for seed in seeds():
        parse(seed)
    if kind in ("cpu", "mem"):
        parse(resign(_document(seeds()[-1 if kind == "mem" else 2])))


# --- through the agent: a rejected file contributes no series, the others stay ---------------------

CPU_SERIES = ("numa_cpu_allocated", "numa_container_cpu_allocated")
MEMORY_SERIES = (
    "numa_memory_allocatable_bytes",
    "numa_memory_allocated_bytes",
    "numa_hugepages_allocatable_bytes",
    "numa_hugepages_allocated_bytes",
    "numa_container_memory_allocated_bytes",
    "numa_container_hugepages_allocated_bytes",
)
DEVICE_SERIES = ("numa_device_allocated", "numa_container_device_allocated")
KUBELET_FILES = {
    "cpu": ("cpu_manager", CPU_SERIES, "cpu_manager_path", parse_cpu_manager_state),
    "mem": ("memory_manager", MEMORY_SERIES, "memory_manager_path", parse_memory_manager_state),
    "device": ("device_manager", DEVICE_SERIES, "device_checkpoint_path", parse_device_checkpoint),
}
MACHINE_SERIES = ("numa_cpu_capacity", "numa_memory_capacity_bytes", "numa_hugepages_capacity_bytes")


VALID_CHECKPOINTS = {
    "cpu_manager_path": cpu_seeds()[0],
    "memory_manager_path": memory_seeds()[0],
    "device_checkpoint_path": device_seeds()[0],
}


def write_valid_checkpoints(scenario: KubeletScenario) -> None:
    # plain writes (no fsync): every collection below is made by a fresh agent, which reads every file
    for path_name, content in VALID_CHECKPOINTS.items():
        getattr(scenario, path_name).write_bytes(content)


_baselines: dict[Path, str] = {}


def baseline(scenario: KubeletScenario) -> str:
    """The exposition of the intact node (the same for every example of a test)."""
    if scenario.kubelet_root not in _baselines:
        _baselines[scenario.kubelet_root] = scenario.exposition()
    return _baselines[scenario.kubelet_root]


@pytest.fixture
def kubelet_node(tmp_path: Path) -> KubeletScenario:
    scenario = build_scenario(tmp_path, TWO_NODES, [ScenarioPod(UID_A, "web", "shop"), ScenarioPod(UID_B)])
    write_valid_checkpoints(scenario)
    return scenario


def errors_of(text: str, source: str) -> dict[Labels, float]:
    found = counted_errors(text)
    return {key: value for key, value in found.items() if ("numa_source", source) in key}


def test_the_valid_node_exports_every_series(kubelet_node: KubeletScenario) -> None:
    text = kubelet_node.exposition()
    for name in (*CPU_SERIES, *MEMORY_SERIES, *DEVICE_SERIES, *MACHINE_SERIES):
        assert series(text, name), name
    assert counted_errors(text) == {}


@AGENT_LEVEL
@given(data=st.data(), kind=st.sampled_from(sorted(KUBELET_FILES)))
def test_a_rejected_checkpoint_yields_no_series_from_it(
    kubelet_node: KubeletScenario, data: st.DataObject, kind: str
) -> None:
    source, own_series, path_name, parse = KUBELET_FILES[kind]
    content = data.draw(hostile_checkpoint(kind))
    verdict = source_result(lambda: parse(content))
    assume(isinstance(verdict, SourceError))
    intact = baseline(kubelet_node)
    path: Path = getattr(kubelet_node, path_name)
    path.write_bytes(content)
    try:
        text = kubelet_node.exposition()
    finally:
        write_valid_checkpoints(kubelet_node)
    for name in own_series:
        assert not series(text, name), name
    assert errors_of(text, source), "the rejection is counted"
    # what other files give is untouched
    others = [names for other, (_, names, _, _) in KUBELET_FILES.items() if other != kind]
    for name in (*MACHINE_SERIES, *(name for names in others for name in names)):
        assert series(text, name) == series(intact, name), name


@AGENT_LEVEL
@given(
    content=st.one_of(
        any_bytes,
        kernel_text.map(str.encode),
        st.tuples(
            st.sampled_from(["Node 1 MemTotal:", "Node 1 MemFree:", "Node 1 MemUsed:", "MemTotal:"]), numbers
        ).map(lambda pair: f"{pair[0]} {pair[1]} kB\nNode 1 MemFree: 10 kB\n".encode()),
    )
)
def test_a_rejected_node_meminfo_yields_only_what_its_good_lines_say(
    kubelet_node: KubeletScenario, content: bytes
) -> None:
    """Each meminfo field stands alone: node 1's memory series are what its good lines give (a line cut
    short is not one), nothing else moves, and the bad lines are counted."""
    meminfo = kubelet_node.sysfs_root / NODE_DIR / "node1" / "meminfo"
    verdict = source_result(lambda: procfs.parse_meminfo(content.rstrip(b"\x00").decode(errors="replace")))
    assume(isinstance(verdict, SourceError))
    original = meminfo.read_bytes()
    intact = baseline(kubelet_node)
    meminfo.write_bytes(content)
    try:
        text = kubelet_node.exposition()
    finally:
        meminfo.write_bytes(original)
    node1 = ("numa_node_id", "1")
    exported = {
        (name, dict(key).get("system_memory_state", "")): value
        for name in ("numa_memory_capacity_bytes", "numa_memory_usage_bytes")
        for key, value in series(text, name).items()
        if node1 in key
    }
    assert exported == expected_node_memory(content)
    assert errors_of(text, "sysfs"), "the bad lines are counted under numa_source=sysfs"
    for name in ("numa_cpu_capacity", "numa_hugepages_capacity_bytes", "numa_memory_page_allocations_total"):
        assert series(text, name) == series(intact, name), name
    for name in (*CPU_SERIES, *MEMORY_SERIES, *DEVICE_SERIES):
        assert series(text, name) == series(intact, name), name
    for name in ("numa_memory_capacity_bytes", "numa_memory_usage_bytes"):
        others = {key: value for key, value in series(text, name).items() if node1 not in key}
        assert others == {key: value for key, value in series(intact, name).items() if node1 not in key}


def expected_node_memory(content: bytes) -> dict[tuple[str, str], float]:
    """The node's memory series by hand: every whole line judged alone (the kernel ends each line with a
    newline, so text after the last one was cut short), then MemUsed else MemTotal - MemFree."""
    text = content.rstrip(b"\x00").decode(errors="replace")
    fields: dict[str, int] = {}
    for line in text[: text.rfind("\n") + 1].splitlines():
        verdict = source_result(lambda line=line: procfs.parse_meminfo(line + "\n"))  # type: ignore[misc]
        if isinstance(verdict, dict):
            fields.update(verdict)
    total, free, used = fields.get("MemTotal"), fields.get("MemFree"), fields.get("MemUsed")
    if used is None and total is not None and free is not None:
        used = max(total - free, 0)
    elif free is None and total is not None and used is not None:
        free = max(total - used, 0)
    found = {
        ("numa_memory_capacity_bytes", ""): total,
        ("numa_memory_usage_bytes", "used"): used,
        ("numa_memory_usage_bytes", "free"): free,
    }
    return {key: float(value) for key, value in found.items() if value is not None}


def test_a_rejected_node_meminfo_leaves_the_other_nodes_memory(kubelet_node: KubeletScenario) -> None:
    """One corrupt ``node1/meminfo`` is one file: node 0's memory comes from its own file and should stay."""
    write_file(kubelet_node.sysfs_root / NODE_DIR / "node1" / "meminfo", "Node 1 MemTotal: lots\n")
    text = kubelet_node.exposition()
    assert series(text, "numa_memory_capacity_bytes") == {frozenset({("numa_node_id", "0")}): 4_000_000 * KIB}


def test_out_of_range_values_do_not_reach_the_exposition_as_numbers(kubelet_node: KubeletScenario) -> None:
    """A meminfo amount no machine can have (beyond 2**63 bytes) is corrupt, not a number to export."""
    write_file(
        kubelet_node.sysfs_root / NODE_DIR / "node1" / "meminfo",
        f"Node 1 MemTotal: {10**22} kB\nNode 1 MemFree: 10 kB\n",
    )
    text = kubelet_node.exposition()
    assert not [key for key in series(text, "numa_memory_capacity_bytes") if ("numa_node_id", "1") in key]
    assert errors_of(text, "sysfs")


class EncodingExporter(InProcessExporter):
    """Encodes each export as the OTLP exporters do (protobuf), and keeps what failed."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: list[Exception] = []
        self.exports = 0

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.exports += 1
        try:
            encode_metrics(metrics_data).SerializeToString()
        except Exception as exc:
            self.failures.append(exc)
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS


def test_a_verified_checkpoint_with_amounts_beyond_int64_does_not_break_the_otlp_export(
    kubelet_node: KubeletScenario,
) -> None:
    """The memory manager stores uint64; a (corrupt but checksummed) size of 2**64-1 must not cost every
    other series of the OTLP export: int64 is what OTLP carries."""
    huge = (1 << 64) - 1
    state = {0: NumaMemoryState(1, (0,), {"memory": MemoryTable(huge, 0, huge, 1 * GIB, huge - GIB)})}
    entries = {UID_A: {"app": [MemoryBlock((0,), "memory", huge)]}}
    kubelet_node.memory_manager_path.write_bytes(memory_manager_state_bytes("Static", state, entries))
    exporter = EncodingExporter()
    agent = kubelet_node.agent(exporters=["otlp"])
    pipeline = build_pipeline(agent.options, agent.store, otlp_exporter_factory=lambda _settings: exporter)
    try:
        pipeline.push(timeout_s=5)
    finally:
        pipeline.shutdown(timeout_s=1)
    assert exporter.exports == 1
    assert exporter.failures == []
