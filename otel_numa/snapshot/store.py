"""One consistent view of everything the agent knows, taken once per collection.

Every reader's collection runs inside :meth:`SnapshotStore.pinned`: the snapshot is built once, every
instrument callback of that collection reads the same object, and builds are serialised so two readers
(Prometheus and OTLP) never see a half-updated state. Builds run in a worker thread: a read that hangs
costs a collection at most :data:`FRESH_WAIT_S`, after which it serves the last good data with its age.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace

from otel_numa.model import Allocation, ContainerUsage, MachineUsage, ProcessUsage
from otel_numa.snapshot.source_status import SourceReport
from otel_numa.snapshot.stages import StageReport


@dataclass(frozen=True, slots=True)
class Snapshot:
    taken_at: float  # time.monotonic() when built
    machine: MachineUsage | None  # None until sysfs has been read once
    allocation: Allocation
    sources: tuple[SourceReport, ...]
    # per-container NUMA usage from cgroups, joined with the allocation; empty when not read
    container_usage: tuple[ContainerUsage, ...] = ()
    # the kernel's view: CPUs of each NUMA node that exactly one pod may run on; None when not known
    cpu_pinned: Mapping[int, int] | None = None
    stages: tuple[StageReport, ...] = ()
    # the agent's own process, read with the snapshot; None: not wanted or not readable
    process: ProcessUsage | None = None

    def source_ages(self) -> dict[str, float]:
        """Seconds since each source's data was last known good (sources never read are absent)."""
        return {
            report.name: max(0.0, self.taken_at - report.last_good)
            for report in self.sources
            if report.last_good is not None
        }


# How long a collection (a scrape, a push) waits for a fresh snapshot before it serves the last one, aged to
# now: a read that hangs (a stuck NFS, FUSE or cgroup file) must not hold the page, the push or shutdown.
# Builds take milliseconds; a build still running after this long is treated as stuck, and later
# collections do not wait for it at all.
FRESH_WAIT_S = 0.5

log = logging.getLogger(__name__)


def aged(snapshot: Snapshot | None, now: float) -> Snapshot:
    """The last snapshot served again at ``now`` (its sources' ages grow), or an empty one."""
    if snapshot is None:
        return Snapshot(taken_at=now, machine=None, allocation=Allocation(), sources=())
    return replace(snapshot, taken_at=now)


class SnapshotStore:
    """Builds snapshots and pins one per collection.

    Instrument callbacks run synchronously in the thread that collects, so the pin is per thread: a
    Prometheus scrape and an OTLP push each see their own consistent snapshot, and a push stuck on a dead
    collector never holds up a scrape. Builds run one at a time in a worker thread of their own (collectors
    keep caches); a collection asks for a build that starts after its request and waits for it at most
    ``fresh_wait_s`` seconds, then serves what ``stale`` makes of the last good snapshot.
    """

    def __init__(
        self,
        build: Callable[[], Snapshot],
        *,
        fresh_wait_s: float = FRESH_WAIT_S,
        stale: Callable[[Snapshot | None, float], Snapshot] = aged,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._build = build
        self.fresh_wait_s = fresh_wait_s
        self._stale = stale
        self._clock = clock
        self._changed = threading.Condition()
        self._latest: Snapshot | None = None
        self._wanted = 0  # the newest build generation asked for
        self._built = 0  # the newest one finished
        self._running: int | None = None  # the one in progress
        self._running_since: float | None = None
        self._overdue = 0  # the newest generation a collection waited for in vain
        self._worker: threading.Thread | None = None
        self._closed = False
        self._local = threading.local()
        # a store dropped without close() still ends its worker, which holds it only while it builds
        weakref.finalize(self, _wake, self._changed)

    def _build_now(self, wait_s: float | None) -> Snapshot:
        """A snapshot built after this call began, or the stale last one when none is ready within
        ``wait_s`` seconds (``None``: wait for it however long it takes)."""
        with self._changed:
            now = self._clock()
            # a build that outlasted a wait, or that another collection already waited for in vain (its
            # worker may have begun it late, on a busy machine), is not waited for again
            running, since = self._running, self._running_since
            stuck = (
                wait_s is not None
                and running is not None
                and since is not None
                and (running <= self._overdue or now - since > wait_s)
            )
            target = (self._running if self._running is not None else self._built) + 1
            self._wanted = max(self._wanted, target)
            if self._worker is None and not self._closed:
                worker_args = (weakref.ref(self), self._changed)
                self._worker = threading.Thread(
                    target=_serve_builds, args=worker_args, name="otel-numa-collect", daemon=True
                )
                self._worker.start()
            self._changed.notify_all()
            waited = not stuck and not self._closed
            if waited:
                self._changed.wait_for(lambda: self._built >= target or self._closed, timeout=wait_s)
            fresh, latest = self._built >= target, self._latest
            if waited and not fresh:
                self._overdue = max(self._overdue, target)
        if fresh and latest is not None:
            return latest
        return self._stale(latest, self._clock())

    def _wants_build(self) -> bool:
        return self._closed or self._wanted > self._built

    def _begin_build(self) -> int | None:
        """The generation to build now (the condition is held), or ``None`` once closed."""
        if self._closed:
            return None
        self._running = self._wanted
        self._running_since = self._clock()
        return self._running

    def _run_build(self, generation: int) -> None:
        snapshot: Snapshot | None = None
        try:
            snapshot = self._build()
        except Exception:  # the stages catch their own; this is a last resort, logged
            log.exception("building a snapshot failed; serving the last good one")
        with self._changed:
            if snapshot is not None:
                self._latest = snapshot
            self._built = generation
            self._running = self._running_since = None
            self._changed.notify_all()

    def close(self) -> None:
        """End the worker; collections after this serve the last snapshot, aged."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def stalled_for(self) -> float:
        """Seconds the build in progress has run (0 when none runs): what ``/healthz`` judges."""
        since = self._running_since
        return 0.0 if since is None else max(0.0, self._clock() - since)

    @contextmanager
    def pinned(self) -> Iterator[Snapshot]:
        """Build a fresh snapshot and hold it, for this thread, for the duration of one collection."""
        snapshot = self._build_now(self.fresh_wait_s)
        previous = getattr(self._local, "snapshot", None)
        self._local.snapshot = snapshot
        try:
            yield snapshot
        finally:
            self._local.snapshot = previous

    def current(self) -> Snapshot:
        """The snapshot pinned by this thread's collection (or the latest one, built now if none exists)."""
        pinned: Snapshot | None = getattr(self._local, "snapshot", None)
        if pinned is not None:
            return pinned
        latest = self._latest
        return latest if latest is not None else self._build_now(self.fresh_wait_s)

    @property
    def ready(self) -> bool:
        return self._latest is not None

    def refresh(self, wait_s: float | None = None) -> Snapshot:
        """A fresh snapshot, waited for at most ``wait_s`` seconds (``None``: however long it takes)."""
        return self._build_now(wait_s)


def _serve_builds(store_ref: weakref.ref[SnapshotStore], changed: threading.Condition) -> None:
    """The worker: builds one generation at a time until its store is closed or collected. It holds the
    store only while it builds, so an agent dropped without being stopped frees its files and watches."""
    while True:
        with changed:
            changed.wait_for(lambda: (store := store_ref()) is None or store._wants_build())
            store = store_ref()
            generation = store._begin_build() if store is not None else None
        if store is None or generation is None:
            return
        store._run_build(generation)
        del store


def _wake(changed: threading.Condition) -> None:
    with changed:
        changed.notify_all()
