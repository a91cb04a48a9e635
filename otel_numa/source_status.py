"""Health of each data source: when its data was last known good, and how often reading it failed.

A missing source (no memory manager, no podresources socket) is a normal state on many nodes: it is
logged once when it goes away or comes back, and not counted as an error. A source that exists but
cannot be read or does not verify is an error: counted under its ``error.type`` and logged once per
distinct failure until it recovers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from otel_numa.sources.errors import SourceError, SourceMissing

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SourceReport:
    name: str
    last_good: float | None  # monotonic time the data was last confirmed current; None: never
    errors: Mapping[str, int] = field(default_factory=dict)
    present: bool = True


class SourceTracker:
    def __init__(self, name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._last_good: float | None = None
        self._errors: dict[str, int] = {}
        self._present = True
        self._logged_failures: set[str] = set()

    def succeeded(self) -> None:
        with self._lock:
            if not self._present:
                log.info("source %s is available", self.name)
            elif self._logged_failures:
                log.info("source %s recovered", self.name)
            self._present = True
            self._logged_failures.clear()
            self._last_good = self._clock()

    def failed(self, error: SourceError) -> None:
        with self._lock:
            if isinstance(error, SourceMissing):
                if self._present:
                    log.info("source %s is not available: %s", self.name, error)
                self._present = False
                return
            self._present = True
            self._errors[error.error_type] = self._errors.get(error.error_type, 0) + 1
            message = str(error)
            if message not in self._logged_failures:
                if len(self._logged_failures) < 100:
                    self._logged_failures.add(message)
                log.warning(
                    "source %s: %s (%s); keeping its last good data", self.name, message, error.error_type
                )

    def report(self) -> SourceReport:
        with self._lock:
            return SourceReport(self.name, self._last_good, dict(self._errors), self._present)


class SourceRegistry:
    """The trackers of all sources, by the ``numa.source`` attribute value."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._trackers: dict[str, SourceTracker] = {}
        self._lock = threading.Lock()

    def tracker(self, name: str) -> SourceTracker:
        with self._lock:
            tracker = self._trackers.get(name)
            if tracker is None:
                tracker = self._trackers[name] = SourceTracker(name, self._clock)
            return tracker

    def reports(self) -> tuple[SourceReport, ...]:
        with self._lock:
            trackers = list(self._trackers.values())
        return tuple(tracker.report() for tracker in trackers)
