"""/proc/stat per-CPU times and /proc/meminfo: real snapshots, synthetic files and the live /proc."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from otel_numa.sources import procfs
from otel_numa.sources.errors import SourceCorrupt, SourceError, SourceMissing
from tests.support.hwloc import extract_snapshot, snapshot_files, snapshot_names
from tests.support.sysfs_tree import NodeSpec, format_proc_stat, write_file, write_machine

HZ = os.sysconf("SC_CLK_TCK")
PROC = ("proc",)  # only the proc/ part of a snapshot is needed here
KIB = 1024

# Snapshot -> (number of cpuN lines, cpu1's line copied from its proc/stat)
STAT_SNAPSHOTS: dict[str, tuple[int, str]] = {
    "16amd64-4n4c-cgroup-distance-merge": (16, "232548 1312 47423 13129667 3247 0 2 0 0 0"),
    "16amd64-8n2c": (16, "60398 3622 6245 16698327 91 0 1 0 0"),
    "16em64t-4s2c2t-offlines": (16, "170348 48 78701 802730858 51 0 128 0"),
    "2arm-2c": (2, "93 0 268 17383 1835 0 0 0 0 0"),
    "2i386-2t-hugepagesizecount": (2, "11664094 68066 1381753 227142355 895096 0 12718 0 0 0"),
    "48amd64-4pa2n6c-sparse": (48, "147 0 326 5726010 248 0 0 0 0 0"),
    "8em64t-2s2ca2c-buggynuma": (8, "42615 1116 124453 200138709 56143 0 1553 0 0 0"),
    # captured with cpu0-3 offline, but its stat still lists all 24 CPUs: reported as the file says
    "offline-cpu0-node0": (24, "8857377 4260630 119981 2901931 3990 0 1175 0 0 0"),
}


def seconds(ticks: str) -> dict[str, float]:
    """Hand-side conversion of a cpuN line's columns to seconds per mode."""
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    return {name: int(value) / HZ for name, value in zip(names, ticks.split()[:8], strict=False)}


def test_cpu_modes() -> None:
    assert procfs.CPU_MODES == ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def test_every_snapshot_with_a_stat_is_listed() -> None:
    with_stat = {name for name in snapshot_names() if "proc/stat" in snapshot_files(name)}
    assert with_stat == set(STAT_SNAPSHOTS)


@pytest.mark.parametrize("name", sorted(STAT_SNAPSHOTS))
def test_snapshot_cpu_times(tmp_path: Path, name: str) -> None:
    count, cpu1 = STAT_SNAPSHOTS[name]
    times = procfs.read_cpu_times(extract_snapshot(name, tmp_path, only=PROC) / "proc")
    assert sorted(times) == list(range(count))
    assert times[1] == pytest.approx(seconds(cpu1))


def test_snapshot_with_eight_columns_has_steal_but_no_guest(tmp_path: Path) -> None:
    times = procfs.read_cpu_times(extract_snapshot("16em64t-4s2c2t-offlines", tmp_path, only=PROC) / "proc")
    assert set(times[0]) == set(procfs.CPU_MODES)
    assert times[0]["irq"] == pytest.approx(3245242 / HZ)


def test_snapshot_meminfo(tmp_path: Path) -> None:
    fields = procfs.read_meminfo(extract_snapshot("2i386-2t-hugepagesizecount", tmp_path, only=PROC) / "proc")
    assert fields["MemTotal"] == 400016779264 * KIB
    assert fields["Active(anon)"] == 1696 * KIB
    assert fields["HugePages_Total"] == 0  # a count, not kB
    assert fields["Hugepagesize"] == 2048 * KIB
    assert fields["DirectMap2M"] == 903168 * KIB


def test_snapshot_meminfo_without_hugepage_lines(tmp_path: Path) -> None:
    fields = procfs.read_meminfo(extract_snapshot("2arm-2c", tmp_path, only=PROC) / "proc")
    assert fields["MemFree"] == 250460 * KIB
    assert "HugePages_Total" not in fields


# --- synthetic -------------------------------------------------------------------------------------


def test_synthetic_stat_guest_time_is_not_added(tmp_path: Path) -> None:
    # columns: user nice system idle iowait irq softirq steal guest guest_nice
    ticks = {0: (500, 20, 300, 9000, 10, 1, 2, 3, 400, 15), 1: (100, 0, 50, 7000, 0, 0, 0, 0, 0, 0)}
    _, procfs_root = write_machine(tmp_path, [NodeSpec(0, cpus=[0, 1])], cpu_times=ticks)
    times = procfs.read_cpu_times(procfs_root)
    assert times[0] == pytest.approx(
        {
            "user": 500 / HZ,
            "nice": 20 / HZ,
            "system": 300 / HZ,
            "idle": 9000 / HZ,
            "iowait": 10 / HZ,
            "irq": 1 / HZ,
            "softirq": 2 / HZ,
            "steal": 3 / HZ,
        }
    )
    assert times[1]["idle"] == pytest.approx(7000 / HZ)


def test_old_kernel_short_lines(tmp_path: Path) -> None:
    # 2.6.0 printed 7 columns (no steal), 2.4 only 4
    write_file(tmp_path / "stat", format_proc_stat({0: (1, 2, 3, 4, 5, 6, 7), 1: (10, 20, 30, 40)}))
    times = procfs.read_cpu_times(tmp_path)
    assert set(times[0]) == {"user", "nice", "system", "idle", "iowait", "irq", "softirq"}
    assert times[1] == pytest.approx({"user": 10 / HZ, "nice": 20 / HZ, "system": 30 / HZ, "idle": 40 / HZ})


def test_sparse_cpu_ids(tmp_path: Path) -> None:
    write_file(tmp_path / "stat", format_proc_stat({0: (1,) * 10, 5: (2,) * 10, 130: (3,) * 10}))
    assert sorted(procfs.read_cpu_times(tmp_path)) == [0, 5, 130]


@pytest.mark.parametrize(
    "text",
    [
        "cpu  1 2 3 4\ncpu0 1 2 x 4\n",
        "cpu  1 2 3\ncpu0 1 2 3\n",
        "cpu  1 2 3 4\nintr 5\n",  # no per-CPU line at all
        "",
    ],
)
def test_corrupt_stat(tmp_path: Path, text: str) -> None:
    write_file(tmp_path / "stat", text)
    with pytest.raises(SourceCorrupt):
        procfs.read_cpu_times(tmp_path)


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(SourceMissing):
        procfs.read_cpu_times(tmp_path)
    with pytest.raises(SourceMissing):
        procfs.read_meminfo(tmp_path)


def test_meminfo_blank_line_nul_and_node_prefix(tmp_path: Path) -> None:
    write_file(tmp_path / "meminfo", "\nMemTotal:  100 kB\nHugePages_Free:   3\n\x00")
    assert procfs.read_meminfo(tmp_path) == {"MemTotal": 100 * KIB, "HugePages_Free": 3}
    assert procfs.parse_meminfo("Node 12 MemFree:  7 kB\n") == {"MemFree": 7 * KIB}


@pytest.mark.parametrize("text", ["MemTotal 100 kB\n", "MemTotal: lots kB\n", "MemTotal: 100 MB\n"])
def test_corrupt_meminfo(tmp_path: Path, text: str) -> None:
    write_file(tmp_path / "meminfo", text)
    with pytest.raises(SourceCorrupt):
        procfs.read_meminfo(tmp_path)


def test_directory_in_place_of_stat(tmp_path: Path) -> None:
    (tmp_path / "stat").mkdir()
    with pytest.raises(SourceError):
        procfs.read_cpu_times(tmp_path)


# --- the live machine ----------------------------------------------------------------------------


def test_live_proc() -> None:
    live = Path("/proc")
    first = procfs.read_cpu_times(live)
    online = os.sysconf("SC_NPROCESSORS_ONLN")
    assert len(first) == online
    second = procfs.read_cpu_times(live)
    for cpu, modes in first.items():
        assert {"user", "system", "idle"} <= set(modes)
        # user and system only grow (iowait, and idle on some kernels, may step back)
        assert second[cpu]["user"] >= modes["user"] and second[cpu]["system"] >= modes["system"]
    meminfo = procfs.read_meminfo(live)
    assert 0 < meminfo["MemFree"] <= meminfo["MemTotal"]
    assert meminfo["MemTotal"] == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
