"""/proc/stat per-CPU times and /proc/meminfo: real snapshots, synthetic files and the live /proc."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_numa.sources import procfs, sysfs
from otel_numa.sources.errors import SourceCorrupt, SourceError, SourceMissing
from otel_numa.testing.hwloc import extract_snapshot, snapshot_files, snapshot_names
from otel_numa.testing.sysfs_tree import NodeSpec, format_proc_stat, write_file, write_machine

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


def per_cpu_times(procfs_root: Path) -> dict[int, dict[str, float]]:
    """Seconds per CPU and mode through the agent's own reader, each CPU taken as a node of its own."""
    return procfs.NodeCpuTimes({cpu: (cpu,) for cpu in range(256)}).read(procfs_root)


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
    times = per_cpu_times(extract_snapshot(name, tmp_path, only=PROC) / "proc")
    assert sorted(times) == list(range(count))
    assert times[1] == pytest.approx(seconds(cpu1))


def test_snapshot_with_eight_columns_has_steal_but_no_guest(tmp_path: Path) -> None:
    times = per_cpu_times(extract_snapshot("16em64t-4s2c2t-offlines", tmp_path, only=PROC) / "proc")
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
    times = per_cpu_times(procfs_root)
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
    times = per_cpu_times(tmp_path)
    assert set(times[0]) == {"user", "nice", "system", "idle", "iowait", "irq", "softirq"}
    assert times[1] == pytest.approx({"user": 10 / HZ, "nice": 20 / HZ, "system": 30 / HZ, "idle": 40 / HZ})


def test_sparse_cpu_ids(tmp_path: Path) -> None:
    write_file(tmp_path / "stat", format_proc_stat({0: (1,) * 10, 5: (2,) * 10, 130: (3,) * 10}))
    assert sorted(per_cpu_times(tmp_path)) == [0, 5, 130]


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
        per_cpu_times(tmp_path)


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(SourceMissing):
        per_cpu_times(tmp_path)
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
        per_cpu_times(tmp_path)


# --- the live machine ----------------------------------------------------------------------------


def test_live_proc() -> None:
    live = Path("/proc")
    first = per_cpu_times(live)
    online = os.sysconf("SC_NPROCESSORS_ONLN")
    assert len(first) == online
    second = per_cpu_times(live)
    for cpu, modes in first.items():
        assert {"user", "system", "idle"} <= set(modes)
        # user and system only grow (iowait, and idle on some kernels, may step back)
        assert second[cpu]["user"] >= modes["user"] and second[cpu]["system"] >= modes["system"]
    meminfo = procfs.read_meminfo(live)
    assert 0 < meminfo["MemFree"] <= meminfo["MemTotal"]
    assert meminfo["MemTotal"] == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


# --- CPU time per NUMA node (NodeCpuTimes) ---------------------------------------------------------

# cpu -> nodes: 0-1 on node 0, 2-3 on node 1, 4 claimed by both (buggy firmware), 5 in no node, 6 on node 2
NODES_OF_CPU = {0: (0,), 1: (0,), 2: (1,), 3: (1,), 4: (0, 1), 6: (2,)}


def node_ticks(
    text: str, nodes_of_cpu: dict[int, tuple[int, ...]] = NODES_OF_CPU
) -> dict[int, tuple[int, ...]]:
    return procfs.NodeCpuTimes(nodes_of_cpu).parse_ticks(text)


def test_node_ticks_are_summed_per_node_before_the_conversion() -> None:
    # columns: user nice system idle iowait irq softirq steal guest guest_nice (guest is in user already)
    text = format_proc_stat(
        {
            0: (100, 1, 10, 1000, 5, 0, 2, 0, 50, 0),
            1: (200, 2, 20, 2000, 6, 1, 3, 4, 60, 0),
            2: (300, 3, 30, 3000, 7, 0, 4, 0, 0, 0),
            3: (400, 4, 40, 4000, 8, 0, 5, 0, 0, 0),
            4: (7, 7, 7, 7, 7, 7, 7, 7, 7, 7),
            5: (900, 9, 90, 9000, 9, 9, 9, 9, 9, 9),
        }
    )
    assert node_ticks(text) == {
        0: (307, 10, 37, 3007, 18, 8, 12, 11),
        1: (707, 14, 77, 7007, 22, 7, 16, 7),
    }  # CPU 4 in both, CPU 5 in neither, node 2 has no line at all
    seconds = procfs.NodeCpuTimes(NODES_OF_CPU).parse(text, user_hz=100)
    assert seconds[0] == {
        "user": 3.07,
        "nice": 0.10,
        "system": 0.37,
        "idle": 30.07,
        "iowait": 0.18,
        "irq": 0.08,
        "softirq": 0.12,
        "steal": 0.11,
    }
    assert set(seconds) == {0, 1}


def test_node_ticks_of_old_kernels_have_fewer_modes() -> None:
    seven = format_proc_stat(
        {0: (1, 2, 3, 4, 5, 6, 7), 1: (10, 20, 30, 40, 50, 60, 70), 2: (5, 5, 5, 5, 5, 5, 5)}
    )
    assert node_ticks(seven) == {0: (11, 22, 33, 44, 55, 66, 77), 1: (5, 5, 5, 5, 5, 5, 5)}
    assert set(procfs.NodeCpuTimes(NODES_OF_CPU).parse(seven)[0]) == set(procfs.CPU_MODES[:7])
    # a node whose CPUs print different numbers of columns: a column only some print counts 0 for the others
    mixed = format_proc_stat({0: (1, 2, 3, 4, 5, 6, 7), 1: (10, 20, 30, 40)})
    assert node_ticks(mixed) == {0: (11, 22, 33, 44, 5, 6, 7)}


def test_node_ticks_of_unusual_spelling_are_the_same() -> None:
    canonical = "cpu  3 3 3 3\ncpu0 1 1 1 1\ncpu2 2 2 2 2\nintr 1\n"
    expected = {0: (1, 1, 1, 1), 1: (2, 2, 2, 2)}
    assert node_ticks(canonical) == expected
    for text in (
        canonical.replace("cpu0 ", "cpu0\t"),  # any whitespace separates columns
        canonical.replace("\n", "\r\n"),
        "intr 1\n" + canonical,  # the cpu lines not first
        canonical + "cpu7 9 9 9 9\n",  # a CPU line after the others (CPU 7 is in no node)
        canonical.replace("cpu2 2", "cpu2 +2").replace("cpu0 1", "cpu0 0_1"),  # what int() reads
        canonical + "cpufreq 1 x\n",  # not a CPU line: skipped, not judged
    ):
        assert node_ticks(text) == expected, text


def test_node_ticks_of_a_cpu_listed_twice_keep_the_last_line() -> None:
    text = "cpu0 1 1 1 1\ncpu2 2 2 2 2\ncpu0 5 5 5 5\n"
    assert node_ticks(text) == {0: (5, 5, 5, 5), 1: (2, 2, 2, 2)}


def test_node_ticks_follow_cpus_coming_and_going() -> None:
    reader = procfs.NodeCpuTimes(NODES_OF_CPU)
    every = {cpu: (cpu + 1,) * 8 for cpu in range(7)}
    assert reader.parse_ticks(format_proc_stat(every)) == {0: (8,) * 8, 1: (12,) * 8, 2: (7,) * 8}
    without_1 = {cpu: ticks for cpu, ticks in every.items() if cpu != 1}
    assert reader.parse_ticks(format_proc_stat(without_1)) == {0: (6,) * 8, 1: (12,) * 8, 2: (7,) * 8}
    reordered = "".join(f"cpu{cpu} {cpu + 1} 1 1 1\n" for cpu in (6, 3, 2, 0))
    assert reader.parse_ticks(reordered) == {0: (1, 1, 1, 1), 1: (7, 2, 2, 2), 2: (7, 1, 1, 1)}
    assert reader.parse_ticks(format_proc_stat(every)) == {0: (8,) * 8, 1: (12,) * 8, 2: (7,) * 8}


@pytest.mark.parametrize(
    "text",
    [
        "cpu  1 2 3 4\ncpu0 1 2 x 4\n",
        "cpu  1 2 3\ncpu0 1 2 3\n",
        "cpu  1 2 3 4\nintr 5\n",  # no per-CPU line at all
        "",
        "cpu0 1 2 3 4\ncpu2 1 -2 3 4\n",
        "cpu0 1 2 3 4\ncpu5 1 2 3 4.5\n",  # a CPU in no node is still judged
        "cpu0 1 2 3 4\ncpu2 1 2 3\n",
    ],
)
def test_corrupt_stat_per_node(text: str) -> None:
    with pytest.raises(SourceCorrupt):
        node_ticks(text)


@pytest.mark.parametrize("name", sorted(STAT_SNAPSHOTS))
def test_snapshot_cpu_time_per_node(tmp_path: Path, name: str) -> None:
    root = extract_snapshot(name, tmp_path)
    topology = sysfs.read_topology(root / "sys")
    stat = (root / "proc" / "stat").read_text()
    expected: dict[int, list[int]] = {}
    for line in stat.splitlines():  # the sums by hand: each node's CPUs' columns added up
        label, *columns = line.split()
        if label.startswith("cpu") and label != "cpu":
            for node in topology.nodes:
                if int(label[3:]) in node.cpus:
                    sums = expected.setdefault(node.id, [0] * 8)
                    for index, value in enumerate(columns[:8]):
                        sums[index] += int(value)
    reader = procfs.NodeCpuTimes(sysfs.nodes_by_cpu(topology))
    got = reader.read(root / "proc")
    assert set(got) == set(expected)
    for node_id, sums in expected.items():
        assert got[node_id] == pytest.approx(
            dict(zip(procfs.CPU_MODES, (tick / HZ for tick in sums), strict=True))
        )


NODES = st.dictionaries(
    st.integers(0, 40),
    st.lists(st.integers(0, 5), min_size=1, max_size=2, unique=True).map(tuple),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(
    nodes_of_cpu=NODES,
    ticks=st.dictionaries(
        st.integers(0, 40),
        st.lists(st.integers(0, 2**64), min_size=4, max_size=10).map(tuple),
        min_size=1,
        max_size=30,
    ),
    same_width=st.booleans(),
)
def test_node_ticks_equal_sums_by_hand(
    nodes_of_cpu: dict[int, tuple[int, ...]], ticks: dict[int, tuple[int, ...]], same_width: bool
) -> None:
    if same_width:  # the kernel's usual file: the column-wise path
        width = min(map(len, ticks.values()))
        ticks = {cpu: values[:width] for cpu, values in ticks.items()}
    expected: dict[int, list[int]] = {}
    for cpu, values in ticks.items():
        for node in nodes_of_cpu.get(cpu, ()):
            sums = expected.setdefault(node, [])
            for index, value in enumerate(values[:8]):
                if index == len(sums):
                    sums.append(0)
                sums[index] += value
    assert node_ticks(format_proc_stat(ticks), nodes_of_cpu) == {
        node: tuple(sums) for node, sums in expected.items()
    }


# --- meminfo: every line judged on its own --------------------------------------------------------------

_FIELD = re.compile(r"(?:Node[ \t]+\d+[ \t]+)?([^:\s][^:\n]*?)[ \t]*:[ \t]*(\d+)(?:[ \t]+(\S+))?", re.ASCII)


def meminfo_by_line(text: str) -> dict[str, int] | str:
    """What meminfo says, read the slow, plain way: line by line, each stripped and matched whole."""
    fields = {}
    for line in text.split("\n"):
        line = line.strip(" \t\r\f\v")
        if not line:
            continue
        match = _FIELD.fullmatch(line)
        if match is None or match.group(3) not in (None, "kB"):
            return "corrupt"
        value = int(match.group(2)) * (1024 if match.group(3) else 1)
        if value >= 1 << 63:
            return "corrupt"
        fields[match.group(1)] = value
    return fields


MEMINFO_LINES = st.tuples(
    st.sampled_from(["", " ", "Node 1 ", "Node  12  ", "Node x ", "node 1 ", "\t"]),
    st.sampled_from(["MemTotal", "Active(anon)", "Mem Free", "Hugepagesize", "", ":", "Node"]),
    st.sampled_from([":", ": ", ":  \t", " :", "", "::"]),
    st.sampled_from(["0", "12", "007", str((1 << 63) - 1), str(1 << 63), str(1 << 53), "x", "-1", "1.5", ""]),
    st.sampled_from(["", " kB", "  kB  ", " MB", " kB kB", "kB", "\t kB", " ", "\r"]),
).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(MEMINFO_LINES | st.text(alphabet=" :\t\rkB0123456789MemNode", max_size=12), max_size=6),
    end=st.sampled_from(["", "\n", "\n\n", "\r\n"]),
)
def test_meminfo_is_what_a_line_by_line_reading_says(lines: list[str], end: str) -> None:
    text = end.join(lines) + end
    try:
        got: dict[str, int] | str = procfs.parse_meminfo(text)
    except SourceCorrupt:
        got = "corrupt"
    assert got == meminfo_by_line(text)


def test_meminfo_bad_lines_are_counted_and_the_good_ones_kept() -> None:
    errors: list[SourceError] = []
    text = "\nMemTotal:  4 kB\nMemFree: x kB\nHugePages_Total:  3\nbroken line\nMemUsed: 2 MB\n"
    assert procfs.parse_meminfo(text, errors.append) == {"MemTotal": 4096, "HugePages_Total": 3}
    assert [str(error) for error in errors] == ["a bad meminfo line (and 2 more)"]
