"""Snapshot build stages as separate failure domains.

A snapshot is built in stages (machine, allocation, container usage, enrichment). A bug in one stage (an
exception that is not a :class:`~otel_numa.sources.errors.SourceError`) must not cost the others: the stage
logs it once with its traceback, counts it as ``error.type="internal"`` on its source, and keeps its last
good result, so every other series is exported as usual.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from otel_numa.snapshot.source_status import SourceTracker
from otel_numa.sources.errors import SourceError

log = logging.getLogger(__name__)

T = TypeVar("T")
INTERNAL = "internal"


@dataclass(frozen=True, slots=True)
class StageReport:
    name: str
    last_duration_s: float
    last_ok: bool


class Stage(Generic[T]):
    def __init__(self, name: str, tracker: SourceTracker, empty: T) -> None:
        self.name = name
        self._tracker = tracker
        self._last_good = empty
        self._logged: set[str] = set()
        self._report: StageReport | None = None
        tracker.seed(INTERNAL)

    def run(self, build: Callable[[], T]) -> T:
        start = time.perf_counter()
        try:
            value = build()
        except Exception as exc:
            self._failed(exc)
            self._report = StageReport(self.name, time.perf_counter() - start, False)
            return self._last_good
        self._last_good = value
        self._report = StageReport(self.name, time.perf_counter() - start, True)
        return value

    def _failed(self, exc: Exception) -> None:
        signature = f"{type(exc).__name__}: {exc}"
        if signature not in self._logged and len(self._logged) < 100:
            self._logged.add(signature)
            log.exception("internal error in the %s stage; keeping its last good result", self.name)
        self._tracker.failed(
            SourceError(f"{self.name} stage: {type(exc).__name__}", error_type=INTERNAL), quiet=True
        )

    @property
    def report(self) -> StageReport | None:
        return self._report
