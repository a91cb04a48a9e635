"""The background thread: refreshes slow sources and pushes through OTLP, periodically or on demand."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)


class Scheduler:
    """Runs ``tasks`` in order every ``interval_s`` seconds, and at once when :meth:`trigger` is called.

    A failing task is logged (once per distinct message) and does not stop the others or the loop.
    """

    def __init__(
        self, interval_s: float, tasks: Sequence[Callable[[], None]], name: str = "otel-numa-scheduler"
    ):
        self._interval_s = interval_s
        self._tasks = list(tasks)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._logged: set[str] = set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.rounds = 0

    def start(self) -> None:
        self._thread.start()

    def trigger(self) -> None:
        """Run the tasks as soon as the current round (if any) ends."""
        self._wake.set()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        """Whether the thread is still alive (after :meth:`stop`: stuck in a task)."""
        return self._thread.is_alive()

    def run_once(self) -> None:
        for task in self._tasks:
            if self._stop.is_set():
                return
            try:
                task()
            except Exception as exc:  # a background task must never kill the loop
                message = f"{getattr(task, '__qualname__', task)}: {exc!r}"
                if message not in self._logged and len(self._logged) < 100:
                    self._logged.add(message)
                    log.warning("background task failed: %s", message)
        self.rounds += 1

    def _run(self) -> None:
        next_run = time.monotonic()  # the first round at once: a collector has data from the start
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_run - time.monotonic()))
            if self._stop.is_set():
                return
            self._wake.clear()
            self.run_once()
            next_run = time.monotonic() + self._interval_s
