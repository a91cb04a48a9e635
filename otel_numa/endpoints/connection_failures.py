"""Failed client connections of the agent's HTTP servers, logged once per kind and then only counted.

A client that resets, times out or fails its TLS handshake is the client's problem, and a hostile or broken
one can do it hundreds of times a second: the first failure of each kind is logged (one line, no traceback),
later ones are counted, and the counts are logged at most once per ``summary_interval_s`` and when the
server stops.
"""

from __future__ import annotations

import errno
import logging
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable

log = logging.getLogger(__name__)

SUMMARY_INTERVAL_S = 300.0

RESET = "connection reset"
BROKEN_PIPE = "broken pipe"
TIMEOUT = "timeout"
HEAD_TIMEOUT = "request head not received in time"
HEAD_TOO_LARGE = "request head too large"
ANSWER_NOT_READ = "answer not taken in time"
TLS_FAILURE = "TLS error"
CAPPED = "closed at the connection cap"
OUT_OF_DESCRIPTORS = "out of file descriptors"
OTHER = "other socket error"

_DESCRIPTOR_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def is_out_of_descriptors(error: OSError) -> bool:
    return error.errno in _DESCRIPTOR_ERRNOS


def kind_of(error: BaseException) -> str:
    """The fixed word for a failed connection's exception."""
    if isinstance(error, ssl.SSLError):
        return TLS_FAILURE
    if isinstance(error, ConnectionResetError | ConnectionAbortedError):
        return RESET
    if isinstance(error, BrokenPipeError):
        return BROKEN_PIPE
    if isinstance(error, TimeoutError):
        return TIMEOUT
    if isinstance(error, OSError) and is_out_of_descriptors(error):
        return OUT_OF_DESCRIPTORS
    return OTHER


class ConnectionFailures:
    """Counts failures per kind for the server called ``server``; thread-safe."""

    def __init__(
        self,
        server: str,
        summary_interval_s: float = SUMMARY_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._server = server
        self._interval_s = summary_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._unreported: Counter[str] = Counter()
        self.totals: Counter[str] = Counter()
        self._last_summary = clock()

    def count(self, kind: str, peer: object = None) -> None:
        with self._lock:
            self.totals[kind] += 1
            first = kind not in self._seen
            if first:
                self._seen.add(kind)
            else:
                self._unreported[kind] += 1
            due = self._clock() - self._last_summary >= self._interval_s
        if first:
            log.warning(
                "%s: client connection failed (%s) from %s; further failures of this kind are counted",
                self._server,
                kind,
                _peer(peer),
            )
        if due:
            self.flush()

    def flush(self) -> None:
        """Log the failures counted since the last line, if any."""
        with self._lock:
            unreported, self._unreported = self._unreported, Counter()
            self._last_summary = self._clock()
        if unreported:
            log.warning(
                "%s: %s more client connection failures: %s",
                self._server,
                sum(unreported.values()),
                ", ".join(f"{kind} x{count}" for kind, count in sorted(unreported.items())),
            )


def _peer(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return "an unknown peer" if peer is None else str(peer)
