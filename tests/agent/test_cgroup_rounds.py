"""Round after round of the cgroup walk: what a round that changes nothing skips, and that every change is
still seen the round after it is made (the tree listed again when a pod or container comes or goes, a
file read anew when it is rewritten in place or replaced, a cpuset read again when it is written), with
inotify and without it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from otel_numa.snapshot.collectors import cgroups as collector_module
from otel_numa.snapshot.collectors.cgroups import CgroupCollector, CgroupView, ContainerLogNames
from otel_numa.snapshot.source_status import SourceRegistry
from otel_numa.sources import cgroups
from otel_numa.sources.container_logs import ContainerLogListing
from otel_numa.sources.directory_watch import DirectoryWatch
from otel_numa.testing.cgroup_tree import render_cpu_stat_v2, render_numa_stat_v2, write_kubepods_sums
from otel_numa.testing.checkpoints import write_atomically
from otel_numa.testing.large_node import LargeNode, LargeNodeSpec, write_large_node

SPEC = LargeNodeSpec(
    numa_nodes=2,
    cpus_per_node=8,
    mem_per_node_kib=4 << 20,
    hugepage_sizes_kib=(2048,),
    pods=6,
    containers_per_pod=2,
    devices_per_resource=0,
    exclusive_pod_every=3,
)


class NoInotify(DirectoryWatch):
    """A watch that cannot be set up (no inotify, or every instance taken)."""

    def __init__(
        self, written_prefixes: tuple[str, ...] = (), noticed_prefixes: tuple[str, ...] = ()
    ) -> None:
        super().__init__(written_prefixes, noticed_prefixes)
        self.close()


@pytest.fixture(params=["inotify", "no inotify"])
def watched(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "no inotify":
        monkeypatch.setattr(collector_module, "DirectoryWatch", NoInotify)
    return str(request.param)


@pytest.fixture
def node(tmp_path: Path) -> LargeNode:
    return write_large_node(tmp_path / "node", SPEC)


def collector(node: LargeNode) -> CgroupCollector:
    return CgroupCollector(node.cgroup_root, ContainerLogNames(node.container_logs_root), SourceRegistry())


def view_of(walk: CgroupCollector) -> CgroupView:
    walk.refresh()
    assert walk.view is not None
    return walk.view


def anon(view: CgroupView, container_id: str) -> dict[int, int]:
    usage = next(usage for usage in view.usages if usage.container_id == container_id)
    return {node: amount for node, amount in usage.memory_by_type["anon"].items() if amount}


def test_a_round_that_changes_nothing_lists_and_parses_nothing(
    node: LargeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    walk = collector(node)
    first = view_of(walk)
    listed: list[object] = []
    parsed: list[object] = []

    def listing(*args: Any) -> Any:
        listed.append(args)
        return cgroups.find_container_cgroups(*args)

    def parsing(*args: Any, **kwargs: Any) -> Any:
        parsed.append(args)
        return cgroups.container_usage(*args, **kwargs)

    monkeypatch.setattr("otel_numa.snapshot.collectors.cgroups.find_container_cgroups", listing)
    monkeypatch.setattr("otel_numa.sources.cgroup_rounds.container_usage", parsing)
    view_of(walk)  # the round after the first lists the directories first watched again
    listed.clear()
    again = view_of(walk)
    assert again.usages is first.usages and again.names is first.names
    assert not listed and not parsed
    assert len(walk._rounds.files) == 4 * len(first.usages)  # every file kept open


def test_every_change_is_seen_the_round_after_it(node: LargeNode, watched: str) -> None:
    walk = collector(node)
    first = view_of(walk)
    view_of(walk)
    pods = node.cgroup_pods(1)
    # rewritten in place (as the kernel's files change), and replaced by a rename (another file)
    node.write_cgroup_usage(1)
    renamed = pods[1].containers[0]
    directory = cgroups.find_container_cgroups(node.cgroup_root)
    path = next(c.path for c in directory if c.container_id == renamed.container_id)
    write_atomically(Path(path) / "memory.numa_stat", b"anon N0=4096 N1=8192\nfile N0=0 N1=0\n")
    changed = view_of(walk)
    assert changed.usages is not first.usages
    in_place = pods[0].containers[0]
    assert anon(changed, in_place.container_id) == dict(in_place.memory_bytes["anon"])
    assert anon(changed, renamed.container_id) == {0: 4096, 1: 8192}
    # a pod replaced: its containers go, the new pod's come
    old = node.pods[1]
    new = node.replace_pod(1, 1)
    replaced = {usage.pod_uid for usage in view_of(walk).usages}
    assert new.uid in replaced and old.uid not in replaced
    assert len(view_of(walk).usages) == len(first.usages)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cpus_of(view: CgroupView, container_id: str) -> frozenset[int] | None:
    usage = next(usage for usage in view.usages if usage.container_id == container_id)
    return usage.cpus


def first_container(node: LargeNode) -> tuple[str, Path]:
    found = cgroups.find_container_cgroups(node.cgroup_root)[0]
    return found.container_id, Path(found.path)


def counted_reads(walk: CgroupCollector, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The containers' files the walk reads from now on."""
    read: list[str] = []
    files = walk._rounds.files
    for name in ("read_kept", "read_optional", "read"):
        method = getattr(files, name)

        def counting(directory: str, *names_and_limit: Any, method: Any = method, **kwargs: Any) -> Any:
            read.extend(f"{directory}/{file}" for file in names_and_limit if isinstance(file, str))
            return method(directory, *names_and_limit, **kwargs)

        monkeypatch.setattr(files, name, counting)
    return read


def test_a_round_in_which_only_counters_changed_reads_no_cpuset(
    node: LargeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    walk = collector(node)
    view_of(walk)
    view_of(walk)
    read = counted_reads(walk, monkeypatch)
    node.write_cgroup_usage(1)  # the containers' counters, and the kubepods cgroup's sums of them
    view_of(walk)
    assert read and all(path.endswith(("/memory.numa_stat", "/cpu.stat")) for path in read)
    assert len(read) == 2 * len(walk._rounds.files) // 4


def test_while_the_kubepods_sums_stand_no_container_file_is_read(
    node: LargeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cgroup v2 sums every container's counters in the kubepods cgroup's own: while those keep their
    bytes (and nothing in the tree is made, removed or written), the round reads no container's file and
    hands back the last usages; when they move, every container is read again."""
    walk = collector(node)
    view_of(walk)
    first = view_of(walk)
    read = counted_reads(walk, monkeypatch)
    assert view_of(walk).usages is first.usages and not read
    # the kernel's counters report no write: here only the sums above tell that a container's moved
    monkeypatch.setattr(walk._watch, "noticed", lambda: False)
    pods = node.cgroup_pods(1)
    container = pods[0].containers[0]
    found = cgroups.find_container_cgroups(node.cgroup_root)
    directory = Path(next(c.path for c in found if c.container_id == container.container_id))
    (directory / "memory.numa_stat").write_text(render_numa_stat_v2(container.memory_bytes, [0, 1]))
    assert view_of(walk).usages is first.usages and not read  # the sums stand: not looked at
    write_kubepods_sums(node.cgroup_root, "systemd", pods, [0, 1])
    moved = view_of(walk)
    assert anon(moved, container.container_id) == dict(container.memory_bytes["anon"])
    assert len(read) == 2 * len(first.usages)
    # a counter written (a tree on a disk): every container read again, whatever the sums say
    monkeypatch.undo()
    view_of(walk)  # the writes above, seen now
    read = counted_reads(walk, monkeypatch)
    view_of(walk)
    assert not read
    (directory / "cpu.stat").write_text(render_cpu_stat_v2(container.cpu_usage_usec + 1))
    assert view_of(walk).usages is not moved.usages and len(read) == 2 * len(first.usages)


def test_a_cpuset_written_is_read_the_round_after(node: LargeNode, watched: str) -> None:
    walk = collector(node)
    container_id, directory = first_container(node)
    view_of(walk)
    view_of(walk)
    (directory / "cpuset.cpus.effective").write_text("5\n")  # in place, as the runtime's write
    assert cpus_of(view_of(walk), container_id) == frozenset({5})
    (directory / "cpuset.cpus.effective").write_text("6-7\n")
    assert cpus_of(view_of(walk), container_id) == frozenset({6, 7})


def test_cpusets_changed_unseen_are_read_again_within_their_longest_age(node: LargeNode) -> None:
    """The kernel changes effective cpusets without a write (CPU hotplug): no event comes, and every
    container's cpusets are read again at least every CPUSETS_MAX_AGE_S."""
    clock = Clock()
    walk = CgroupCollector(
        node.cgroup_root, ContainerLogNames(node.container_logs_root), SourceRegistry(), clock=clock
    )
    container_id, directory = first_container(node)
    before = cpus_of(view_of(walk), container_id)
    view_of(walk)
    (directory / "cpuset.cpus.effective").write_text("5\n")
    walk._watch.changed(), walk._watch.written()  # the event is lost: as if the kernel changed it
    clock.now += collector_module.CPUSETS_MAX_AGE_S - 1
    assert cpus_of(view_of(walk), container_id) == before  # skipped: nothing said it changed
    clock.now += 1
    assert cpus_of(view_of(walk), container_id) == frozenset({5})


def test_a_cpuset_written_above_the_containers_has_every_container_read_again(node: LargeNode) -> None:
    walk = collector(node)
    container_id, directory = first_container(node)
    view_of(walk)
    view_of(walk)
    # the kernel changes a child's effective cpuset when its parent's is written: no event in the child
    (directory / "cpuset.cpus.effective").write_text("5\n")
    walk._watch.changed(), walk._watch.written()
    (directory.parent / "cpuset.cpus").write_text("5\n")
    assert cpus_of(view_of(walk), container_id) == frozenset({5})


def test_numa_stat_is_parsed_again_only_when_a_line_it_reads_changed(
    node: LargeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    walk = collector(node)
    container_id, directory = first_container(node)
    numa_stat = directory / "memory.numa_stat"
    numa_stat.write_bytes(b"anon N0=4096 N1=0\nfile N0=0 N1=8192\nshmem N0=0 N1=0\n")
    view_of(walk)
    parsed: list[object] = []

    def parsing(*args: Any, **kwargs: Any) -> Any:
        parsed.append(args)
        return cgroups.container_usage(*args, **kwargs)

    monkeypatch.setattr("otel_numa.sources.cgroup_rounds.container_usage", parsing)
    numa_stat.write_bytes(b"anon N0=4096 N1=0\nfile N0=0 N1=8192\nshmem N0=4096 N1=0\n")  # a line not read
    assert anon(view_of(walk), container_id) == {0: 4096}
    assert not parsed
    numa_stat.write_bytes(b"anon N0=4096 N1=0\nfile N0=0 N1=12288\nshmem N0=4096 N1=0\n")
    usage = next(usage for usage in view_of(walk).usages if usage.container_id == container_id)
    assert usage.memory_by_type["file"][1] == 12288 and len(parsed) == 1
    # the last line read without its end: a longer number on it is still a change
    numa_stat.write_bytes(b"anon N0=4096 N1=0\nfile N0=0 N1=1")
    view_of(walk)
    numa_stat.write_bytes(b"anon N0=4096 N1=0\nfile N0=0 N1=12")
    usage = next(usage for usage in view_of(walk).usages if usage.container_id == container_id)
    assert usage.memory_by_type["file"][1] == 12


def test_a_watch_tells_cpuset_writes_among_thousands_of_other_writes(tmp_path: Path) -> None:
    """Every file written in a watched directory reports (a test tree's counters, the kernel's
    ``memory.events``): only a cpuset's counts, and a queue that overflowed says that anything changed."""
    directories = [tmp_path / f"cgroup-{index}" for index in range(500)]
    for directory in directories:
        directory.mkdir()
        (directory / "cpuset.cpus").write_text("")
    watch = DirectoryWatch(written_prefixes=("cpuset.",))
    assert not watch.watch(str(directory) for directory in directories)
    for directory in directories:
        (directory / "memory.numa_stat").write_text("anon N0=1\n")
        (directory / "cpu.stat").write_text("usage_usec 1\n")
    assert watch.changed() == {str(directory) for directory in directories}  # files made: entries
    assert watch.written() == set()
    for directory in directories:
        (directory / "memory.numa_stat").write_text("anon N0=2\n")
        (directory / "cpu.stat").write_text("usage_usec 2\n")
    (directories[7] / "cpuset.cpus").write_text("3\n")
    assert watch.changed() == set() and watch.written() == {str(directories[7])}
    # more events than the kernel queues: not known
    queued = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    with open(directories[0] / "a", "w") as a, open(directories[0] / "b", "w") as b:
        for _ in range(queued // 2 + 10):
            for each in (a, b):  # alternating, so that the kernel does not merge them
                each.write("x")
                each.flush()
    assert watch.changed() is None
    watch.close()


def test_a_file_replaced_by_a_fifo_is_refused_not_read_through_its_old_descriptor(node: LargeNode) -> None:
    registry = SourceRegistry()
    walk = CgroupCollector(node.cgroup_root, ContainerLogNames(node.container_logs_root), registry)
    before = len(view_of(walk).usages)
    view_of(walk)
    target = next(node.cgroup_root.rglob("*.scope/memory.numa_stat"))
    target.unlink()
    os.mkfifo(target)
    assert len(view_of(walk).usages) == before - 1
    (report,) = registry.reports()
    assert report.errors.get("not_regular_file", 0) >= 1


def test_container_log_names_are_listed_again_when_the_directory_changes(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    container_id = "a" * 64
    (logs / f"web_shop_app-{container_id}.log").symlink_to("/nowhere")
    now = [time.time()]
    listing = ContainerLogListing(logs, clock=lambda: now[0])
    assert set(listing.identities()) == {container_id}
    stamp = logs.stat().st_mtime_ns

    def link_within_the_same_timestamp(name: str) -> None:
        (logs / name).symlink_to("/nowhere")
        os.utime(logs, ns=(stamp, stamp))  # as a filesystem with coarse timestamps may leave it

    # changed less than SETTLED_S before it was listed: listed again though its mtime stands
    link_within_the_same_timestamp(f"web_shop_init-{'c' * 64}.log")
    assert set(listing.identities()) == {container_id, "c" * 64}
    now[0] += 10
    settled = listing.identities()
    assert listing.identities() is settled  # settled and the same directory: not listed again
    link_within_the_same_timestamp(f"web_shop_late-{'d' * 64}.log")
    assert listing.identities() is settled
    (logs / f"web_shop_sidecar-{'b' * 64}.log").symlink_to("/nowhere")
    assert set(listing.identities()) == {container_id, "b" * 64, "c" * 64, "d" * 64}


def writable_cgroup2() -> Path | None:
    """A writable cgroup v2 mount (pure v2 or the hybrid ``unified`` one), where the test may make cgroups."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        writable = len(fields) >= 4 and "rw" in fields[3].split(",") and os.access(fields[1], os.W_OK)
        if writable and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def test_on_the_kernels_own_cgroupfs_containers_come_and_go_and_cpu_time_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real kernfs: a cgroup directory keeps its mtime when a child is made or removed, yet the walk sees
    the container come and go; a kept ``cpu.stat`` read again shows the CPU time a process spent since,
    which the kubepods cgroup's own ``cpu.stat`` sums: while nothing runs below it, no container's file
    is read."""
    mount = writable_cgroup2()
    if mount is None:
        pytest.skip("needs a writable cgroup v2 mount (root)")
    root = mount / f"otel-numa-test-{os.getpid()}"
    pod = root / "kubepods.slice" / "kubepods-burstable.slice" / "kubepods-burstable-pod1234abcd_5678.slice"
    first, second = (pod / f"cri-containerd-{digit * 64}.scope" for digit in "ab")
    first.mkdir(parents=True)
    walk = CgroupCollector(root, ContainerLogNames(tmp_path / "no-logs"), SourceRegistry())
    try:
        assert [usage.container_id for usage in view_of(walk).usages] == ["a" * 64]
        stamp = os.stat(pod).st_mtime_ns
        second.mkdir()
        assert os.stat(pod).st_mtime_ns == stamp  # what no stat signature can see
        assert sorted(usage.container_id for usage in view_of(walk).usages) == ["a" * 64, "b" * 64]
        first.rmdir()
        (usage,) = view_of(walk).usages
        before = usage.cpu_time_s
        # a write to a cgroup's file reports to inotify (as the runtime writing cpuset.cpus does)
        writes = DirectoryWatch(written_prefixes=("cgroup.procs",))
        assert not writes.watch([str(second)])
        busy = "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end: pass"
        process = subprocess.Popen(
            [sys.executable, "-c", busy],
            preexec_fn=lambda: (second / "cgroup.procs").write_text(str(os.getpid())),
        )
        assert process.wait(timeout=30) == 0
        assert writes.changed() == set() and writes.written() == {str(second)}
        writes.close()
        (usage,) = view_of(walk).usages
        assert before is not None and usage.cpu_time_s is not None and usage.cpu_time_s >= before + 0.15
        idle = view_of(walk)  # nothing runs below kubepods from now on
        read = counted_reads(walk, monkeypatch)
        assert view_of(walk).usages is idle.usages and not read
        process = subprocess.Popen(
            [sys.executable, "-c", busy],
            preexec_fn=lambda: (second / "cgroup.procs").write_text(str(os.getpid())),
        )
        assert process.wait(timeout=30) == 0
        (usage,) = view_of(walk).usages
        assert usage.cpu_time_s is not None and usage.cpu_time_s >= before + 0.3
        assert read and all(path.startswith(f"{second}/") for path in read)  # the sums moved: read again
    finally:
        walk.close()
        for directory in (first, second, pod, pod.parent, pod.parent.parent, root):
            if directory.exists():
                directory.rmdir()
