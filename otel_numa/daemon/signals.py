"""Signals from the first instant: held (blocked) while the command line starts, answered once the daemon
has its handlers.

A signal whose default action ends the process (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2) must not end the
agent before its handlers exist: a pod deleted right after it started would exit 143, with no final push.
``otel-numa`` blocks them before it imports anything else (:func:`hold`); the blocked set is kept across
``exec``, so a signal sent meanwhile waits, pending, until the daemon has installed its handlers and lets
them through (:func:`release`). Only this module's imports run before that: the standard library's.
"""

from __future__ import annotations

import os
import select
import signal
import threading
from collections.abc import Callable
from contextlib import suppress
from types import FrameType

Handler = Callable[[int, FrameType | None], object]

# Signals that stop the agent: serving ends, one last push, exit 0.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Signals an operator or a tool may send that must not end the agent: logged and ignored.
IGNORED_SIGNALS = (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
HELD = frozenset((*STOP_SIGNALS, *IGNORED_SIGNALS))


def hold() -> None:
    """Block :data:`HELD` in this thread (and in whatever ``exec`` runs next): they wait, pending."""
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD)


def release() -> None:
    """Let :data:`HELD` through again; a pending one is handled now."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


class StopRequest:
    """Set by SIGTERM or SIGINT (:meth:`install`); ``received`` names the first such signal."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.received: str | None = None

    def install(self, on_ignored: Handler | None = None) -> None:
        """Install the handlers: the stop signals set the request, the ignored ones call ``on_ignored``
        (default: ignore silently)."""
        for stop in STOP_SIGNALS:
            signal.signal(stop, self._on_stop)
        for ignored in IGNORED_SIGNALS:
            signal.signal(ignored, on_ignored if on_ignored is not None else signal.SIG_IGN)

    def _on_stop(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name
        self.event.set()

    def wait(self) -> str | None:
        """Until a stop signal came (called in the main thread, where Python runs signal handlers).

        The kernel hands a signal sent to the process to any thread that does not block it. Python's C
        handler then only notes it, and the Python handler runs once the main thread runs again: a main
        thread asleep on a lock would sleep on, and the agent never stop. So the main thread sleeps on a
        pipe that the C handler writes to (``signal.set_wakeup_fd``), whichever thread it runs in."""
        if threading.current_thread() is not threading.main_thread():
            self.event.wait()  # no handler runs in this process's other threads: only the event can wake it
            return self.received
        wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        previous = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        woken = select.poll()  # not select(): the agent keeps thousands of files open, past its 1,024
        woken.register(wake_read, select.POLLIN)
        try:
            while not self.event.is_set():
                woken.poll()
                with suppress(BlockingIOError):
                    os.read(wake_read, 64)
        finally:
            signal.set_wakeup_fd(previous)
            os.close(wake_read)
            os.close(wake_write)
        return self.received
