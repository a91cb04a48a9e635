"""The checkpoint watcher: renames into the kubelet's directories are noticed at once, through inotify, also
on a read-only mount and after the directory is replaced; without inotify it polls and says so once."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from otel_numa.snapshot.watch import CheckpointWatcher, WatchBackend, inotify_batches
from otel_numa.testing.checkpoints import write_atomically, write_cpu_manager_state
from otel_numa.testing.peers import voluntary_switches, wait_for

POLL_S = 0.2  # the watcher's identity check / polling period in these tests


class Calls:
    """Records when the watcher called back."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.times.append(time.monotonic())

    def count(self) -> int:
        with self._lock:
            return len(self.times)

    def first_after(self, moment: float) -> float | None:
        with self._lock:
            return next((t for t in self.times if t >= moment), None)


def checkpoint_paths(root: Path) -> list[Path]:
    return [
        root / "cpu_manager_state",
        root / "memory_manager_state",
        root / "device-plugins" / "kubelet_internal_checkpoint",
    ]


@contextmanager
def running_watcher(
    root: Path, backend: WatchBackend = inotify_batches, **options: Any
) -> Iterator[tuple[CheckpointWatcher, Calls]]:
    calls = Calls()
    watcher = CheckpointWatcher(
        checkpoint_paths(root), calls, poll_interval_s=POLL_S, backend=backend, **options
    )
    watcher.start()
    try:
        yield watcher, calls
    finally:
        watcher.stop(timeout_s=2)


def kubelet_dir(tmp_path: Path, name: str = "kubelet") -> Path:
    root = tmp_path / name
    (root / "device-plugins").mkdir(parents=True)
    write_cpu_manager_state(root / "cpu_manager_state", "static", range(8), {})
    return root


def rewrite(root: Path, exclusive: set[int]) -> float:
    """Rewrite the CPU manager checkpoint as the kubelet does; returns when the write began (on a loaded
    machine this thread may get the CPU back only after the watcher has called back for the rename)."""
    began = time.monotonic()
    write_cpu_manager_state(
        root / "cpu_manager_state", "static", set(range(8)) - exclusive, {"pod-1": {"app": exclusive}}
    )
    return began


def wait_watching(watcher: CheckpointWatcher, started_before: int = 0) -> None:
    wait_for(
        lambda: watcher.mode == "watching" and watcher.watches_started > started_before,
        5,
        "the watch to be set up",
        interval_s=0.01,
    )


def wait_called(calls: Calls, after: float, timeout_s: float = 3.0) -> float:
    """Seconds from ``after`` to the first callback following it."""
    called = wait_for(
        lambda: calls.first_after(after), timeout_s, "the watcher to call back", interval_s=0.005
    )
    return float(called - after)


def test_a_rename_over_a_checkpoint_is_noticed_through_inotify(tmp_path: Path) -> None:
    root = kubelet_dir(tmp_path)
    with running_watcher(root) as (watcher, calls):
        wait_watching(watcher)
        latency = wait_called(calls, rewrite(root, {2, 3}))
        assert latency < 0.5
        assert watcher.notifications["event"] == 1
        assert watcher.mode == "watching"


def test_device_checkpoint_in_its_subdirectory_is_noticed(tmp_path: Path) -> None:
    root = kubelet_dir(tmp_path)
    with running_watcher(root) as (watcher, calls):
        wait_watching(watcher)
        write_atomically(root / "device-plugins" / "kubelet_internal_checkpoint", b"{}")
        wait_called(calls, 0.0)
        assert watcher.notifications["event"] == 1


def test_other_files_and_unfinished_temporary_files_are_ignored(tmp_path: Path) -> None:
    root = kubelet_dir(tmp_path)
    with running_watcher(root) as (watcher, calls):
        wait_watching(watcher)
        (root / ".cpu_manager_state.1234").write_bytes(b"half written")  # not renamed yet
        write_atomically(root / "kubeadm-flags.env", b"KUBELET_KUBEADM_ARGS=")
        (root / "pods" / "uid-1").mkdir(parents=True)
        write_atomically(root / "device-plugins" / "kubelet.sock.lock", b"")
        time.sleep(5 * POLL_S)
        assert calls.count() == 0
        # and the watch still works afterwards
        wait_called(calls, rewrite(root, {1}))


def test_the_directory_deleted_and_recreated_is_watched_again(tmp_path: Path) -> None:
    root = kubelet_dir(tmp_path)
    with running_watcher(root) as (watcher, calls):
        wait_watching(watcher)
        started = watcher.watches_started
        shutil.rmtree(root)  # a kubelet reinstall: the directory goes away and comes back
        root.mkdir()
        (root / "device-plugins").mkdir()
        wait_watching(watcher, started)
        events_before = watcher.notifications["event"]
        wait_called(calls, rewrite(root, {4, 5}), timeout_s=POLL_S * 2)
        # seen by the new watch (files are not polled while a watch is live)
        assert watcher.notifications["event"] == events_before + 1


def test_a_kubelet_directory_that_appears_later_is_watched(tmp_path: Path) -> None:
    root = tmp_path / "kubelet"
    with running_watcher(root) as (watcher, calls):
        time.sleep(2 * POLL_S)
        assert watcher.mode == "polling" and calls.count() == 0
        root.mkdir()
        wait_watching(watcher)  # device-plugins/ is not there yet: the kubelet root alone is watched
        started = watcher.watches_started
        (root / "device-plugins").mkdir()
        wait_watching(watcher, started)
        write_atomically(root / "device-plugins" / "kubelet_internal_checkpoint", b"{}")
        wait_called(calls, 0.0, timeout_s=POLL_S * 2)
        assert watcher.notifications["event"] == 1


def test_a_change_while_no_watch_is_live_is_caught_up(tmp_path: Path) -> None:
    root = kubelet_dir(tmp_path)
    calls = Calls()
    watcher = CheckpointWatcher(checkpoint_paths(root), calls, poll_interval_s=POLL_S)
    rewrite(root, {6})  # after the agent looked, before the watch exists
    watcher.start()
    try:
        wait_called(calls, 0.0)
        assert watcher.notifications["catch-up"] == 1
    finally:
        watcher.stop()


@pytest.mark.parametrize(
    "failure",
    [
        OSError(errno.EMFILE, "Too many open files"),  # inotify_init1: no inotify instance left
        OSError(errno.ENOSPC, "OS file watch limit reached"),
    ],
    ids=["no-inotify-instance", "watch-limit"],
)
def test_without_inotify_it_polls_and_says_so_once(
    failure: Exception, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    attempts: list[float] = []

    def unavailable(*_paths: Any, **_options: Any) -> Iterator[set[tuple[Any, str]]]:
        attempts.append(time.monotonic())
        raise failure
        yield set()  # a generator, like inotify_batches

    root = kubelet_dir(tmp_path)
    caplog.set_level(logging.INFO, logger="otel_numa.snapshot.watch")
    with running_watcher(root, unavailable, watch_retry_s=POLL_S) as (watcher, calls):
        wait_for(lambda: len(attempts) >= 3, 5, "the watch to be retried")
        assert watcher.mode == "polling"
        latency = wait_called(calls, rewrite(root, {1, 2}))
        assert latency < POLL_S * 3
        assert watcher.notifications["poll"] == 1
        wait_called(calls, rewrite(root, {3}))
        assert watcher.notifications["poll"] == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "polling" in warnings[0] and str(root) in warnings[0]


def test_the_watch_comes_back_after_a_failure(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    failures = [OSError(errno.EMFILE, "Too many open files")]

    def flaky(*paths: Any, **options: Any) -> Iterator[set[tuple[Any, str]]]:
        if failures:
            raise failures.pop()
        yield from inotify_batches(*paths, **options)

    root = kubelet_dir(tmp_path)
    caplog.set_level(logging.INFO, logger="otel_numa.snapshot.watch")
    with running_watcher(root, flaky, watch_retry_s=POLL_S) as (watcher, calls):
        wait_watching(watcher)
        wait_called(calls, rewrite(root, {7}))
        assert watcher.notifications["event"] == 1
    messages = [r.getMessage() for r in caplog.records]
    assert any("polling" in m for m in messages) and any("again" in m for m in messages)


def test_stop_is_prompt(tmp_path: Path) -> None:
    root = kubelet_dir(tmp_path)
    with running_watcher(root) as (watcher, _calls):
        wait_watching(watcher)
        began = time.monotonic()
        watcher.stop(timeout_s=2)
        assert time.monotonic() - began < 0.5
        assert watcher.mode == "stopped"


def test_an_idle_watch_sleeps_until_its_identity_check(tmp_path: Path) -> None:
    root = kubelet_dir(tmp_path)
    calls = Calls()
    watcher = CheckpointWatcher(checkpoint_paths(root), calls, poll_interval_s=30)
    watcher.start()
    try:
        wait_watching(watcher)
        native_id = watcher._thread.native_id
        assert native_id is not None
        time.sleep(0.1)  # the catch-up after the watch started is over
        before = voluntary_switches(native_id)
        time.sleep(1.5)
        # A stop check every STOP_CHECK_MS would wake it ~6 times; a pipe wakes it only when stopped.
        assert voluntary_switches(native_id) - before <= 1
        began = time.monotonic()
        watcher.stop(timeout_s=2)
        assert time.monotonic() - began < 0.2
        assert not watcher._thread.is_alive()
    finally:
        watcher.stop(timeout_s=2)


# Mounts (root with CAP_SYS_ADMIN) ---------------------------------------------------------------------


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@contextmanager
def bind_mount(source: Path, target: Path, read_only: bool) -> Iterator[None]:
    try:
        _mount("--bind", str(source), str(target))
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot bind-mount here (needs root with CAP_SYS_ADMIN): {exc}")
    try:
        if read_only:
            _mount("-o", "remount,bind,ro", str(target))
        yield
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False, capture_output=True)


def test_works_on_a_read_only_mount(tmp_path: Path) -> None:
    host = kubelet_dir(tmp_path, "host-kubelet")  # the kubelet writes here
    mounted = tmp_path / "mounted"  # the agent's read-only view
    mounted.mkdir()
    with bind_mount(host, mounted, read_only=True):
        with pytest.raises(OSError) as refused:
            (mounted / "probe").write_bytes(b"")
        assert refused.value.errno == errno.EROFS
        listing = sorted(os.listdir(mounted))
        with running_watcher(mounted) as (watcher, calls):
            wait_watching(watcher)
            wait_called(calls, rewrite(host, {2}))
            wait_called(calls, rewrite(host, {3}))
            assert watcher.notifications["event"] == 2
        assert sorted(os.listdir(mounted)) == listing


def test_a_mount_placed_over_the_directory_is_followed(tmp_path: Path) -> None:
    root = kubelet_dir(tmp_path)
    replacement = kubelet_dir(tmp_path, "new-kubelet")
    with running_watcher(root) as (watcher, calls):
        wait_watching(watcher)
        started = watcher.watches_started
        with bind_mount(replacement, root, read_only=False):
            wait_watching(watcher, started)
            events_before = watcher.notifications["event"]
            wait_called(calls, rewrite(replacement, {5}), timeout_s=POLL_S * 2)
            assert watcher.notifications["event"] == events_before + 1
