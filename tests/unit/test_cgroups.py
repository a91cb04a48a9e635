"""Per-container cgroup usage: the real cgroup files of this machine, and synthetic kubelet trees."""

from __future__ import annotations

import os
import re
import resource
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_numa.sources.cgroups import (
    ContainerCgroup,
    detect_cgroup_layout,
    find_container_cgroups,
    parse_numa_stat_v1,
    parse_numa_stat_v2,
    read_container_usage,
)
from otel_numa.sources.errors import SourceCorrupt, SourceMissing
from otel_numa.testing.cgroup_tree import (
    FakeContainer,
    FakePod,
    fake_container_id,
    make_pods,
    read_all_usage,
    write_cgroup_tree,
)

PAGE = resource.getpagesize()
REAL_ROOT = Path("/sys/fs/cgroup")

UID_G = "3f1c2a9e-7b44-4d1e-9c55-0a1b2c3d4e5f"
UID_B = "81d2e6c0-1111-4a2b-8c3d-abcdefabcdef"
UID_BE = "0c9e8f7a-2222-4b3c-9d4e-123456789abc"
ID_G = "a" * 64
ID_B = "b" * 64
ID_BE = "c" * 64


def _three_pods(memory: dict[str, dict[int, int]]) -> list[FakePod]:
    return [
        FakePod(
            UID_G,
            "guaranteed",
            (FakeContainer(ID_G, memory, cpus="2-3", mems="1", cpu_usage_usec=1_500_000),),
        ),
        FakePod(
            UID_B, "burstable", (FakeContainer(ID_B, memory, cpus="0-7", mems="0-1", cpu_usage_usec=250),)
        ),
        FakePod(UID_BE, "besteffort", (FakeContainer(ID_BE, memory, cpus="0-7", mems="0-1"),)),
    ]


# --- this machine's real cgroup files --------------------------------------------------------------


def _real_memory_cgroup() -> tuple[Path, str]:
    """A real memory cgroup directory with a memory.numa_stat, and the layout it belongs to."""
    if (REAL_ROOT / "cgroup.controllers").is_file():
        for child in sorted(REAL_ROOT.iterdir()):  # v2 has numa_stat only below the root
            if (child / "memory.numa_stat").is_file():
                return child, "v2"
    elif (REAL_ROOT / "memory" / "memory.numa_stat").is_file():
        return REAL_ROOT / "memory", "v1"
    pytest.skip("no memory.numa_stat on this machine")


def _simple_pairs(line: str) -> dict[int, int]:
    return {int(node): int(value) for node, value in re.findall(r"\bN(\d+)=(\d+)", line)}


def test_real_numa_stat_parses_like_an_independent_reading(tmp_path: Path) -> None:
    directory, layout = _real_memory_cgroup()
    text = (directory / "memory.numa_stat").read_text()
    lines = {re.split(r"[ =]", line, maxsplit=1)[0]: line for line in text.splitlines() if line}
    if layout == "v1":
        parsed = parse_numa_stat_v1(text)
        # The kernel documents total = file + anon + unevictable; the hierarchical lines win.
        total_pages = _simple_pairs(lines["hierarchical_total"])
        assert set(parsed) == {"file", "anon", "unevictable"}
        for node, pages in total_pages.items():
            assert sum(parsed[kind][node] for kind in parsed) == pages * PAGE
        for kind in parsed:
            assert parsed[kind] == {
                n: v * PAGE for n, v in _simple_pairs(lines["hierarchical_" + kind]).items()
            }
    else:
        parsed = parse_numa_stat_v2(text)
        assert set(parsed) == set(lines)
        for kind, line in lines.items():
            assert parsed[kind] == _simple_pairs(line)
        wanted = {"anon", "file", "unevictable", "no_such_type"}
        assert parse_numa_stat_v2(text, wanted) == {k: v for k, v in parsed.items() if k in wanted}
    assert parsed, "a real numa_stat has at least one type"


def test_real_cgroup_read_live(tmp_path: Path) -> None:
    directory, layout = _real_memory_cgroup()
    if layout == "v1":
        cpu_files = (
            REAL_ROOT / "cpuset" / "cpuset.effective_cpus",
            REAL_ROOT / "cpuset" / "cpuset.effective_mems",
        )
        usage_file, usage_scale, usage_key = REAL_ROOT / "cpuacct" / "cpuacct.usage", 1e-9, None
    else:
        cpu_files = (directory / "cpuset.cpus.effective", directory / "cpuset.mems.effective")
        usage_file, usage_scale, usage_key = directory / "cpu.stat", 1e-6, "usage_usec"

    def cpu_seconds() -> float:
        text = usage_file.read_text()
        if usage_key is not None:
            text = next(line.split()[1] for line in text.splitlines() if line.startswith(usage_key + " "))
        return int(text) * usage_scale

    before = cpu_seconds()
    usage = read_container_usage(ContainerCgroup("pod", "ctr", "guaranteed", str(directory)), layout)  # type: ignore[arg-type]
    after = cpu_seconds()

    assert usage is not None
    nodes_in_file = {int(n) for n in re.findall(r"\bN(\d+)=", (directory / "memory.numa_stat").read_text())}
    assert {node for by_node in usage.memory_by_type.values() for node in by_node} == nodes_in_file
    assert usage.cpu_time_s is not None
    assert before - 1e-6 <= usage.cpu_time_s <= after + 1e-6  # the float conversion may round

    def expand(path: Path) -> frozenset[int] | None:
        if not path.exists():
            return None
        members: set[int] = set()
        for part in filter(None, path.read_text().strip().split(",")):
            low, _, high = part.partition("-")
            members.update(range(int(low), int(high or low) + 1))
        return frozenset(members)

    assert usage.cpus == expand(cpu_files[0])
    assert usage.mems == expand(cpu_files[1])


def test_real_root_layout_or_missing() -> None:
    mounted = Path("/proc/self/mounts").read_text()
    unified = any(
        line.split()[1] == str(REAL_ROOT) and line.split()[2] == "cgroup2" for line in mounted.splitlines()
    )
    kubepods = any(
        p.name.startswith("kubepods") for p in (REAL_ROOT if unified else REAL_ROOT / "memory").glob("*")
    )
    if not kubepods:
        with pytest.raises(SourceMissing):
            detect_cgroup_layout(REAL_ROOT)
    else:
        assert detect_cgroup_layout(REAL_ROOT) == ("v2" if unified else "v1")


# --- cgroup v2 -------------------------------------------------------------------------------------


def test_v2_numa_stat_documented_format_any_order_and_new_keys() -> None:
    text = (
        "file N0=8192 N1=0\n"
        "anon N0=4096 N1=1052672\n"
        "brand_new_counter N0=7 N1=9\n"
        "kernel_stack N0=16384 N1=32768\n"
        "shmem N0=0 N1=4096\n"
        "anon_thp N0=0 N1=2097152\n"
    )
    assert parse_numa_stat_v2(text) == {
        "file": {0: 8192, 1: 0},
        "anon": {0: 4096, 1: 1052672},
        "brand_new_counter": {0: 7, 1: 9},
        "kernel_stack": {0: 16384, 1: 32768},
        "shmem": {0: 0, 1: 4096},
        "anon_thp": {0: 0, 1: 2097152},
    }


def test_v2_wanted_types_only_first_last_and_prefixed_lines_apart() -> None:
    text = (
        "anon N0=1 N1=2\nanon_thp N0=3\nfile_mapped N1=4\nshmem N0=oops\nfile N0=5 N1=6"  # no final newline
    )
    assert parse_numa_stat_v2(text, ("file", "anon")) == {"anon": {0: 1, 1: 2}, "file": {0: 5, 1: 6}}
    assert parse_numa_stat_v2(text, ("anon_thp",)) == {"anon_thp": {0: 3}}
    assert parse_numa_stat_v2(text, ("unevictable",)) == {}
    with pytest.raises(SourceCorrupt):  # a damaged line is found when it is wanted
        parse_numa_stat_v2(text, ("shmem",))


def test_v2_sparse_node_ids() -> None:
    assert parse_numa_stat_v2("anon N0=1 N2=3 N33=5\n") == {"anon": {0: 1, 2: 3, 33: 5}}


def test_v2_bad_number_is_corrupt() -> None:
    with pytest.raises(SourceCorrupt):
        parse_numa_stat_v2("anon N0=12x N1=4\n")


@pytest.mark.parametrize(
    ("driver", "expected_dirs"),
    [
        (
            "systemd",
            {
                ID_G: "kubepods.slice/kubepods-pod3f1c2a9e_7b44_4d1e_9c55_0a1b2c3d4e5f.slice/cri-containerd-"
                + ID_G,
                ID_B: "kubepods.slice/kubepods-burstable.slice/"
                "kubepods-burstable-pod81d2e6c0_1111_4a2b_8c3d_abcdefabcdef.slice/cri-containerd-" + ID_B,
                ID_BE: "kubepods.slice/kubepods-besteffort.slice/"
                "kubepods-besteffort-pod0c9e8f7a_2222_4b3c_9d4e_123456789abc.slice/cri-containerd-" + ID_BE,
            },
        ),
        (
            "cgroupfs",
            {
                ID_G: "kubepods/pod3f1c2a9e-7b44-4d1e-9c55-0a1b2c3d4e5f/" + ID_G,
                ID_B: "kubepods/burstable/pod81d2e6c0-1111-4a2b-8c3d-abcdefabcdef/" + ID_B,
                ID_BE: "kubepods/besteffort/pod0c9e8f7a-2222-4b3c-9d4e-123456789abc/" + ID_BE,
            },
        ),
    ],
)
def test_v2_finds_every_qos_class_for_both_drivers(
    tmp_path: Path, driver: str, expected_dirs: dict[str, str]
) -> None:
    memory = {"anon": {0: 4096, 1: 8192}, "file": {0: 0, 1: 12288}}
    write_cgroup_tree(tmp_path, "v2", driver, _three_pods(memory))  # type: ignore[arg-type]

    assert detect_cgroup_layout(tmp_path) == "v2"
    found = {c.container_id: c for c in find_container_cgroups(tmp_path)}
    suffix = ".scope" if driver == "systemd" else ""
    assert {cid: c.path for cid, c in found.items()} == {
        cid: str(tmp_path / (relative + suffix)) for cid, relative in expected_dirs.items()
    }
    assert {(c.pod_uid, c.qos) for c in found.values()} == {
        (UID_G, "guaranteed"),
        (UID_B, "burstable"),
        (UID_BE, "besteffort"),
    }

    usage = {u.container_id: u for u in read_all_usage(tmp_path)}
    assert usage[ID_G].memory_by_type == memory
    assert usage[ID_G].cpus == frozenset({2, 3})
    assert usage[ID_G].mems == frozenset({1})
    assert usage[ID_G].cpu_time_s == pytest.approx(1.5)
    assert usage[ID_B].cpu_time_s == pytest.approx(0.000250)
    assert usage[ID_B].cpus == frozenset(range(8))
    assert usage[ID_BE].pod_uid == UID_BE


@pytest.mark.parametrize("runtime", ["cri-containerd", "crio", "docker"])
def test_v2_systemd_runtime_prefixes(tmp_path: Path, runtime: str) -> None:
    write_cgroup_tree(tmp_path, "v2", "systemd", _three_pods({"anon": {0: 4096}}), runtime=runtime)
    assert {c.container_id for c in find_container_cgroups(tmp_path)} == {ID_G, ID_B, ID_BE}


def test_v2_skips_conmon_and_foreign_directories(tmp_path: Path) -> None:
    write_cgroup_tree(tmp_path, "v2", "systemd", _three_pods({"anon": {0: 4096}}), runtime="crio")
    pod_dir = (
        tmp_path
        / "kubepods.slice/kubepods-burstable.slice"
        / ("kubepods-burstable-pod81d2e6c0_1111_4a2b_8c3d_abcdefabcdef.slice")
    )
    (pod_dir / f"crio-conmon-{ID_B}.scope").mkdir()
    (pod_dir / "init.scope").mkdir()
    (tmp_path / "kubepods.slice" / "kubepods-burstable.slice" / "not-a-pod.slice").mkdir()
    (tmp_path / "system.slice" / f"docker-{'d' * 64}.scope").mkdir(parents=True)
    assert sorted(c.container_id for c in find_container_cgroups(tmp_path)) == [ID_G, ID_B, ID_BE]


def test_v2_crio_with_cgroupfs_driver_and_static_pod_uid(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu memory\n")
    static_uid = "5f3a1e0d8c7b6a594837261504f3e2d1"  # static pods carry a config hash, not a UUID
    container = tmp_path / "kubepods" / "burstable" / f"pod{static_uid}" / f"crio-{ID_B}"
    container.mkdir(parents=True)
    (container / "memory.numa_stat").write_text("anon N0=4096\n")
    (container / "cpu.stat").write_text("usage_usec 10\n")
    (container.parent / f"crio-conmon-{ID_B}").mkdir()
    assert find_container_cgroups(tmp_path) == (
        ContainerCgroup(static_uid, ID_B, "burstable", str(container)),
    )
    (usage,) = read_all_usage(tmp_path)
    assert usage.memory_by_type == {"anon": {0: 4096}}
    assert usage.cpus is None and usage.mems is None  # cpuset controller not enabled here
    assert usage.cpu_time_s == pytest.approx(10e-6)


def test_v2_sandbox_container_is_kept_under_its_own_id(tmp_path: Path) -> None:
    pods = make_pods(2, 1, with_sandbox=True)
    write_cgroup_tree(tmp_path, "v2", "systemd", pods)
    sandbox_ids = {c.container_id for pod in pods for c in pod.containers if c.is_sandbox}
    found = find_container_cgroups(tmp_path)
    assert len(found) == 4
    assert sandbox_ids <= {c.container_id for c in found}


def test_v2_container_removed_between_find_and_read_is_skipped(tmp_path: Path) -> None:
    write_cgroup_tree(tmp_path, "v2", "systemd", _three_pods({"anon": {0: 4096}}))
    cgroups = {c.container_id: c for c in find_container_cgroups(tmp_path)}
    shutil.rmtree(cgroups[ID_B].path)

    assert read_container_usage(cgroups[ID_B], "v2") is None
    assert read_container_usage(cgroups[ID_G], "v2") is not None
    assert sorted(u.container_id for u in read_all_usage(tmp_path)) == [ID_G, ID_BE]


def test_v2_pod_removed_between_find_and_read_is_skipped(tmp_path: Path) -> None:
    write_cgroup_tree(tmp_path, "v2", "cgroupfs", _three_pods({"anon": {0: 4096}}))
    cgroups = find_container_cgroups(tmp_path)
    shutil.rmtree(tmp_path / "kubepods" / "besteffort")
    results = {c.container_id: read_container_usage(c, "v2") for c in cgroups}
    assert results[ID_BE] is None
    assert results[ID_G] is not None and results[ID_B] is not None


def test_v2_custom_kubelet_cgroup_root(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("memory\n")
    container = (
        tmp_path / "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice"
        f"/kubelet-kubepods-besteffort-pod{UID_BE.replace('-', '_')}.slice/cri-containerd-{ID_BE}.scope"
    )
    container.mkdir(parents=True)
    assert find_container_cgroups(tmp_path) == (ContainerCgroup(UID_BE, ID_BE, "besteffort", str(container)),)


def test_missing_hierarchies(tmp_path: Path) -> None:
    with pytest.raises(SourceMissing):
        detect_cgroup_layout(tmp_path / "absent")
    with pytest.raises(SourceMissing):
        detect_cgroup_layout(tmp_path)
    (tmp_path / "cgroup.controllers").write_text("memory\n")
    (tmp_path / "system.slice").mkdir()
    with pytest.raises(SourceMissing):
        read_all_usage(tmp_path)
    with pytest.raises(SourceMissing):
        find_container_cgroups(tmp_path)


def test_v2_empty_kubepods_has_no_containers(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("memory\n")
    (tmp_path / "kubepods.slice" / "kubepods-burstable.slice").mkdir(parents=True)
    assert read_all_usage(tmp_path) == ()


def test_v2_corrupt_numa_stat_is_reported(tmp_path: Path) -> None:
    write_cgroup_tree(tmp_path, "v2", "systemd", _three_pods({"anon": {0: 4096}}))
    (cgroup,) = (c for c in find_container_cgroups(tmp_path) if c.container_id == ID_G)
    (Path(cgroup.path) / "memory.numa_stat").write_text("anon N0=lots\n")
    with pytest.raises(SourceCorrupt):
        read_all_usage(tmp_path)


# --- cgroup v1 -------------------------------------------------------------------------------------


def test_v1_numa_stat_pages_become_bytes_and_hierarchical_lines_win() -> None:
    # A container with one sub-cgroup holding 2 more anon pages on node 1.
    text = (
        "total=30 N0=10 N1=20\n"
        "file=12 N0=2 N1=10\n"
        "anon=15 N0=7 N1=8\n"
        "unevictable=3 N0=1 N1=2\n"
        "hierarchical_total=32 N0=10 N1=22\n"
        "hierarchical_file=12 N0=2 N1=10\n"
        "hierarchical_anon=17 N0=7 N1=10\n"
        "hierarchical_unevictable=3 N0=1 N1=2\n"
    )
    assert parse_numa_stat_v1(text, page_size=4096) == {
        "file": {0: 8192, 1: 40960},
        "anon": {0: 28672, 1: 40960},
        "unevictable": {0: 4096, 1: 8192},
    }


def test_v1_numa_stat_without_hierarchical_lines_and_vendor_lines() -> None:
    text = (
        "total=3 N0=3\nfile=1 N0=1\nanon=2 N0=2\nunevictable=0 N0=0\nnuma_locality 0 0 0 0\nnuma_exectime 0\n"
    )
    assert parse_numa_stat_v1(text, page_size=65536) == {
        "file": {0: 65536},
        "anon": {0: 131072},
        "unevictable": {0: 0},
    }


@pytest.mark.parametrize(
    ("driver", "relative"),
    [
        (
            "systemd",
            "kubepods.slice/kubepods-burstable.slice/"
            "kubepods-burstable-pod81d2e6c0_1111_4a2b_8c3d_abcdefabcdef.slice/docker-" + ID_B + ".scope",
        ),
        ("cgroupfs", "kubepods/burstable/pod81d2e6c0-1111-4a2b-8c3d-abcdefabcdef/" + ID_B),
    ],
)
@pytest.mark.parametrize("cpuacct_dir", ["cpuacct", "cpu,cpuacct"])
def test_v1_tree_both_drivers(tmp_path: Path, driver: str, relative: str, cpuacct_dir: str) -> None:
    memory = {"file": {0: 3 * PAGE, 1: 0}, "anon": {0: PAGE, 1: 5 * PAGE}, "unevictable": {0: 0, 1: 2 * PAGE}}
    write_cgroup_tree(tmp_path, "v1", driver, _three_pods(memory), runtime="docker", cpuacct_dir=cpuacct_dir)  # type: ignore[arg-type]
    (tmp_path / "unified").mkdir()  # hybrid mode: a cgroup2 mount beside the v1 controllers

    assert detect_cgroup_layout(tmp_path) == "v1"
    found = {c.container_id: c for c in find_container_cgroups(tmp_path)}
    assert found[ID_B] == ContainerCgroup(UID_B, ID_B, "burstable", str(tmp_path / "memory" / relative))
    assert found[ID_G].qos == "guaranteed" and found[ID_BE].qos == "besteffort"

    usage = {u.container_id: u for u in read_all_usage(tmp_path)}
    assert usage[ID_B].memory_by_type == memory
    assert usage[ID_B].cpus == frozenset(range(8))
    assert usage[ID_G].cpus == frozenset({2, 3}) and usage[ID_G].mems == frozenset({1})
    assert usage[ID_G].cpu_time_s == pytest.approx(1.5)


def test_v1_cpuset_falls_back_to_configured_sets(tmp_path: Path) -> None:
    write_cgroup_tree(tmp_path, "v1", "cgroupfs", _three_pods({"anon": {0: PAGE}}))
    cpuset_dir = tmp_path / "cpuset/kubepods/pod3f1c2a9e-7b44-4d1e-9c55-0a1b2c3d4e5f" / ID_G
    (cpuset_dir / "cpuset.effective_cpus").unlink()
    (cpuset_dir / "cpuset.effective_mems").unlink()
    (cpuset_dir / "cpuset.cpus").write_text("4-5,9\n")
    (cpuset_dir / "cpuset.mems").write_text("0\n")
    usage = {u.container_id: u for u in read_all_usage(tmp_path)}
    assert usage[ID_G].cpus == frozenset({4, 5, 9}) and usage[ID_G].mems == frozenset({0})


def test_v1_container_removed_from_memory_hierarchy_is_skipped(tmp_path: Path) -> None:
    write_cgroup_tree(tmp_path, "v1", "systemd", _three_pods({"anon": {0: PAGE}}))
    cgroups = {c.container_id: c for c in find_container_cgroups(tmp_path)}
    shutil.rmtree(cgroups[ID_BE].path)  # the cpuset and cpuacct copies are still there
    assert read_container_usage(cgroups[ID_BE], "v1") is None
    assert sorted(u.container_id for u in read_all_usage(tmp_path)) == [ID_G, ID_B]


# --- scale -----------------------------------------------------------------------------------------


@pytest.fixture
def memory_backed_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory in RAM where there is one: cgroupfs is in memory, and 12,000 files on disk take long."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir=shm) as directory:
        yield Path(directory)


def test_v2_250_pods_of_4_containers(memory_backed_dir: Path) -> None:
    pods = make_pods(250, 4)
    write_cgroup_tree(memory_backed_dir, "v2", "systemd", pods)
    started = time.perf_counter()
    usage = read_all_usage(memory_backed_dir)
    elapsed = time.perf_counter() - started

    assert len(usage) == 1000
    by_id = {u.container_id: u for u in usage}
    sample = pods[137].containers[2]
    assert sample.container_id == fake_container_id("0/137/2")
    assert by_id[sample.container_id].memory_by_type == sample.memory_bytes
    assert by_id[sample.container_id].cpu_time_s == pytest.approx(sample.cpu_usage_usec / 1e6)
    assert elapsed < 5.0, f"read_all_usage took {elapsed:.2f}s for 1000 containers"
