"""One consistent view of everything the agent knows, taken once per collection.

Every reader's collection runs inside :meth:`SnapshotStore.pinned`: the snapshot is built once, every
instrument callback of that collection reads the same object, and collections are serialised so two
readers (Prometheus and OTLP) never see a half-updated state.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

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
    stages: tuple[StageReport, ...] = ()
    # whether departed pods' series can be forgotten in this SDK; None: not known (no pipeline)
    series_forgetting: bool | None = None
    # the agent's own process, read with the snapshot; None: not wanted or not readable
    process: ProcessUsage | None = None

    def source_ages(self) -> dict[str, float]:
        """Seconds since each source's data was last known good (sources never read are absent)."""
        return {
            report.name: max(0.0, self.taken_at - report.last_good)
            for report in self.sources
            if report.last_good is not None
        }


class SnapshotStore:
    """Builds snapshots and pins one per collection.

    Instrument callbacks run synchronously in the thread that collects, so the pin is per thread: a
    Prometheus scrape and an OTLP push each see their own consistent snapshot, and a push stuck on a dead
    collector never holds up a scrape. Only building is serialised (collectors keep caches).
    """

    def __init__(self, build: Callable[[], Snapshot]) -> None:
        self._build = build
        self._build_lock = threading.Lock()
        self._latest: Snapshot | None = None
        self._local = threading.local()

    def _build_now(self) -> Snapshot:
        with self._build_lock:
            snapshot = self._build()
            self._latest = snapshot
            return snapshot

    @contextmanager
    def pinned(self) -> Iterator[Snapshot]:
        """Build a fresh snapshot and hold it, for this thread, for the duration of one collection."""
        snapshot = self._build_now()
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
        return latest if latest is not None else self._build_now()

    @property
    def ready(self) -> bool:
        return self._latest is not None

    def refresh(self) -> Snapshot:
        return self._build_now()
