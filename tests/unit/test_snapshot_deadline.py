"""A build that hangs costs a collection at most the store's wait; the last good snapshot is served, aged."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest

from otel_numa.model import Allocation
from otel_numa.snapshot.source_status import SourceReport
from otel_numa.snapshot.store import Snapshot, SnapshotStore


def test_a_hanging_build_serves_the_last_snapshot_aged_to_now() -> None:
    release = threading.Event()
    hang = threading.Event()
    built: list[float] = []

    def build() -> Snapshot:
        if hang.is_set():
            release.wait(30)
        built.append(time.monotonic())
        source = SourceReport("sysfs", last_good=built[-1])
        return Snapshot(taken_at=built[-1], machine=None, allocation=Allocation(), sources=(source,))

    store = SnapshotStore(build, fresh_wait_s=0.2)
    first = store.refresh()
    assert store.ready and store.stalled_for() == 0.0
    hang.set()
    try:
        started = time.monotonic()
        with store.pinned() as served:
            waited = time.monotonic() - started
        assert 0.15 < waited < 2.0
        assert served.allocation is first.allocation and served.taken_at > first.taken_at
        assert served.source_ages()["sysfs"] >= 0.15

        started = time.monotonic()
        with store.pinned():  # the build is known to hang: no wait at all
            assert time.monotonic() - started < 0.15
        assert store.stalled_for() >= 0.2
    finally:
        release.set()
    fresh = store.refresh(wait_s=None)
    assert fresh.taken_at > first.taken_at and store.stalled_for() == 0.0


def test_a_build_begun_late_is_waited_for_once() -> None:
    """On a busy machine the worker may begin a build well after the collection asked for it: once a
    collection waited for that build in vain, the next one does not wait for it again."""
    release = threading.Event()

    def build() -> Snapshot:
        release.wait(30)
        return Snapshot(taken_at=time.monotonic(), machine=None, allocation=Allocation(), sources=())

    def clock() -> float:  # the worker reads it when it begins a build: as if it began 0.15 s late
        late = threading.current_thread().name == "otel-numa-collect"
        return time.monotonic() + (0.15 if late else 0.0)

    store = SnapshotStore(build, fresh_wait_s=0.2, clock=clock)
    try:
        started = time.monotonic()
        with store.pinned():
            assert time.monotonic() - started >= 0.2
        started = time.monotonic()
        with store.pinned():
            assert time.monotonic() - started < 0.15
    finally:
        release.set()
        store.close()


def test_a_collection_waits_for_a_build_that_starts_after_its_request() -> None:
    """A collection never gets a build that began before it asked: a file changed just before still
    shows."""
    generation = [0]
    started = threading.Event()
    proceed = threading.Event()

    def build() -> Snapshot:
        generation[0] += 1
        if generation[0] == 2:  # the second build is slow; a request made during it waits for a third
            started.set()
            proceed.wait(5)
        return Snapshot(taken_at=float(generation[0]), machine=None, allocation=Allocation(), sources=())

    store = SnapshotStore(build, fresh_wait_s=5)
    store.refresh()
    threading.Thread(target=store.refresh, daemon=True).start()
    assert started.wait(5)
    threading.Timer(0.1, proceed.set).start()
    assert store.refresh().taken_at == 3.0


def _collect_workers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "otel-numa-collect"]


def test_a_closed_store_ends_its_worker_and_serves_the_last_snapshot() -> None:
    store = SnapshotStore(lambda: Snapshot(time.monotonic(), None, Allocation(), ()), fresh_wait_s=5)
    first = store.refresh()
    (worker,) = [thread for thread in _collect_workers() if thread not in _before_each]
    store.close()
    worker.join(2)
    assert not worker.is_alive()
    started = time.monotonic()
    served = store.refresh(wait_s=None)  # no worker to wait for: at once, the last one aged
    assert time.monotonic() - started < 1.0
    assert served.allocation is first.allocation and served.taken_at >= first.taken_at


def test_a_store_dropped_without_close_ends_its_worker_and_frees_what_it_built_with() -> None:
    class Builder:
        def build(self) -> Snapshot:
            return Snapshot(time.monotonic(), None, Allocation(), ())

    builder = Builder()
    gone = threading.Event()
    weakref.finalize(builder, gone.set)
    store = SnapshotStore(builder.build)
    store.refresh()
    (worker,) = [thread for thread in _collect_workers() if thread not in _before_each]
    del store, builder
    gc.collect()
    worker.join(2)
    assert not worker.is_alive()
    assert gone.is_set()


_before_each: list[threading.Thread] = []


@pytest.fixture(autouse=True)
def _workers_before() -> None:
    _before_each[:] = _collect_workers()
