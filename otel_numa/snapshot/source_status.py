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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from otel_numa.sources.errors import SourceError, SourceMissing

log = logging.getLogger(__name__)


# error.type values every tracked source reports from the start (at 0), so rate() works from the first scrape
SEEDED_ERROR_TYPES = ("corrupt", "unavailable")
# error.type of a read still running after STUCK_READ_S: counted once per such read (a stuck NFS, FUSE or
# cgroup file); the agent keeps serving the source's last good data meanwhile
TIMEOUT = "timeout"
STUCK_READ_S = 5.0


@dataclass(frozen=True, slots=True)
class SourceReport:
    name: str
    last_good: float | None  # monotonic time the data was last confirmed current; None: never
    errors: Mapping[str, int] = field(default_factory=dict)
    present: bool = True
    last_duration_s: float | None = None  # how long the last read took; None: never timed
    last_ok: bool | None = None  # whether the last read succeeded; None: never read, or missing


class SourceTracker:
    def __init__(self, name: str, clock: Callable[[], float] = time.monotonic) -> None:
        # the value itself, never a Source member: the health series' attributes must be plain strings to
        # be kept as one flat tuple (otel_numa.series_attributes), or every collection copies them anew
        self.name = str(name)
        self._clock = clock
        self._lock = threading.Lock()
        self._last_good: float | None = None
        self._errors: dict[str, int] = dict.fromkeys(SEEDED_ERROR_TYPES, 0)
        self._present = True
        self._logged_failures: set[str] = set()
        self._last_duration_s: float | None = None
        self._last_ok: bool | None = None
        self._reading_since: float | None = None  # clock() when the read in progress began
        self._stuck_counted = False  # the read in progress was counted as a timeout
        self._wrong_root: str | None = None  # why the configured root cannot be this source's
        self.used = False  # read at least once: only sources the agent reads are reported

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Records how long the enclosed read took (``numa.agent.source.duration``), and that it runs."""
        start = time.perf_counter()
        self._reading_since, self._stuck_counted = self._clock(), False
        try:
            yield
        finally:
            self._reading_since = None
            self._last_duration_s = time.perf_counter() - start

    def count_if_stuck(self, after_s: float = STUCK_READ_S) -> bool:
        """Count the read in progress once as a ``timeout`` error when it has run longer than ``after_s``;
        whether one is stuck."""
        since = self._reading_since
        if since is None or self._clock() - since < after_s:
            return False
        with self._lock:
            if not self._stuck_counted:
                self._stuck_counted, self.used, self._last_ok = True, True, False
                self._errors[TIMEOUT] = self._errors.get(TIMEOUT, 0) + 1
                log.warning(
                    "source %s: a read has not returned for %.0f s; serving its last good data",
                    self.name,
                    after_s,
                )
        return True

    def seed(self, error_type: str) -> None:
        """Report ``error_type`` at 0 from the start."""
        with self._lock:
            self._errors.setdefault(error_type, 0)

    def succeeded(self, *, partly: bool = False) -> None:
        """The source was read; ``partly``: some of its items failed this round (counted with
        :meth:`failed`), so their failures stay logged once rather than again every round."""
        with self._lock:
            self.used = True
            if not self._present:
                log.info("source %s is available", self.name)
            elif self._logged_failures and not partly:
                log.info("source %s recovered", self.name)
            self._present = True
            self._wrong_root = None
            if not partly:
                self._logged_failures.clear()
            self._last_good = self._clock()
            self._last_ok = True

    def failed(self, error: SourceError, *, quiet: bool = False) -> None:
        """Count ``error`` (a missing source is not counted); ``quiet``: the caller has logged it."""
        with self._lock:
            self.used = True
            if isinstance(error, SourceMissing) and self._wrong_root is not None:
                return  # already reported as a wrong root: stays failed (0), not merely absent
            if isinstance(error, SourceMissing):
                if self._present:
                    log.info("source %s is not available: %s", self.name, error)
                self._present = False
                self._last_ok = None
                return
            self._present = True
            self._last_ok = False
            self._errors[error.error_type] = self._errors.get(error.error_type, 0) + 1
            message = str(error)
            if not quiet and message not in self._logged_failures:
                if len(self._logged_failures) < 100:
                    self._logged_failures.add(message)
                log.warning(
                    "source %s: %s (%s); keeping its last good data", self.name, message, error.error_type
                )

    def wrong_root(self, problem: str) -> None:
        """The configured root holds none of this source's files (the caller has warned): the source reports
        a failed read (``numa.agent.source.success`` 0) instead of looking merely absent, until it reads."""
        with self._lock:
            self.used = True
            self._present = True
            self._last_ok = False
            self._wrong_root = problem

    def report(self) -> SourceReport:
        with self._lock:
            return SourceReport(
                self.name,
                self._last_good,
                dict(self._errors),
                self._present,
                self._last_duration_s,
                self._last_ok,
            )


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
        return tuple(tracker.report() for tracker in trackers if tracker.used)

    def count_stuck_reads(self, after_s: float = STUCK_READ_S) -> tuple[str, ...]:
        """Count each read running longer than ``after_s`` once (``timeout``); the sources stuck now."""
        with self._lock:
            trackers = list(self._trackers.values())
        return tuple(tracker.name for tracker in trackers if tracker.count_if_stuck(after_s))
