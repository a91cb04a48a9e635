"""Logging set-up: one line per event, and a rate limit so a failing neighbour cannot flood the log."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable

# The OTLP exporters log every failed export and every retry, and urllib3 each broken answer of an OTLP/HTTP
# collector (with a traceback); one line per kind per minute is enough, without the traceback.
RATE_LIMITED_LOGGERS = ("opentelemetry", "urllib3")
RATE_LIMIT_SECONDS = 60.0
PEER_FAILURE_LOGGERS = ("urllib3",)  # what they log is the collector's failure: no traceback


class RateLimitFilter(logging.Filter):
    """Lets through at most one record per (logger, message template) per period."""

    def __init__(
        self,
        prefixes: tuple[str, ...] = RATE_LIMITED_LOGGERS,
        period_s: float = RATE_LIMIT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._prefixes = prefixes
        self._period_s = period_s
        self._clock = clock
        self._last_seen: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self._prefixes):
            return True
        key = (record.name, str(record.msg))
        now = self._clock()
        with self._lock:
            last = self._last_seen.get(key)
            if last is not None and now - last < self._period_s:
                self.suppressed += 1
                return False
            if len(self._last_seen) > 1000:  # message templates are few; never let this grow without bound
                self._last_seen.clear()
            self._last_seen[key] = now
        if record.name.startswith(PEER_FAILURE_LOGGERS):
            record.exc_info = record.exc_text = None
        return True


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RateLimitFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
