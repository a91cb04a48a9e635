"""The background threads: one refreshes slow sources, one pushes through OTLP, each periodically or on
demand (a push that waits on its collector never delays a refresh, nor a refresh a push)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)


class Scheduler:
    """Runs ``tasks`` in order every ``interval_s`` seconds, and at once when :meth:`trigger` is called.

    ``periodic_tasks`` run first, on the timer only: slow reads that a kubelet change does not affect (the
    cgroup walk) must not delay the push a change triggers. ``closing_tasks`` run last, on the timer only
    (housekeeping that a burst of kubelet changes need not repeat). A failing task is logged (once per
    distinct message) and does not stop the others or the loop. Triggered rounds start at least
    ``min_trigger_gap_s`` apart: triggers that come during a round or the gap fold into one more round
    after it, so the last trigger is always followed by a full round. ``first_round_at_once``: the first
    round starts with the thread, else one interval later; ``trigger_restarts_timer``: a triggered round
    also puts the next timer round one interval after it (pushes that follow each refresh, with the timer
    only for when refreshes stop).
    """

    def __init__(
        self,
        interval_s: float,
        tasks: Sequence[Callable[[], None]],
        name: str = "otel-numa-scheduler",
        min_trigger_gap_s: float = 0.0,
        periodic_tasks: Sequence[Callable[[], None]] = (),
        closing_tasks: Sequence[Callable[[], None]] = (),
        first_round_at_once: bool = True,
        trigger_restarts_timer: bool = False,
    ):
        self._interval_s = interval_s
        self._first_round_at_once = first_round_at_once
        self._trigger_restarts_timer = trigger_restarts_timer
        self._min_trigger_gap_s = min_trigger_gap_s
        self._last_round_started = -math.inf
        self._tasks = list(tasks)
        self._periodic_tasks = list(periodic_tasks)
        self._closing_tasks = list(closing_tasks)
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

    def run_once(self, triggered: bool = False) -> None:
        timer_round = [*self._periodic_tasks, *self._tasks, *self._closing_tasks]
        for task in self._tasks if triggered else timer_round:
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
        if not self._first_round_at_once:
            next_run += self._interval_s
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_run - time.monotonic()))
            if self._stop.is_set():
                return
            triggered = self._wake.is_set() and time.monotonic() < next_run
            if self._wake.is_set():
                gap_left = self._last_round_started + self._min_trigger_gap_s - time.monotonic()
                if gap_left > 0 and self._stop.wait(gap_left):
                    return
            # cleared before the round reads anything: a trigger from now on gets a round of its own
            self._wake.clear()
            self._last_round_started = time.monotonic()
            self.run_once(triggered)
            if triggered and not self._trigger_restarts_timer:
                continue  # a triggered round leaves the periodic timer where it was
            next_run = time.monotonic() + self._interval_s


class WithDeadline:
    """Runs ``task`` in a thread of its own and waits for it at most ``wait_s`` seconds, so a read that hangs
    (a stuck NFS, FUSE or cgroup file) cannot hold the scheduler's push or shutdown. While a run is still
    going, calls do not start another; it finishes (or not) on its own."""

    def __init__(self, task: Callable[[], None], wait_s: float, name: str) -> None:
        self._task = task
        self._wait_s = wait_s
        self._name = name
        self._running: threading.Thread | None = None
        self.__qualname__ = getattr(task, "__qualname__", name)  # named as the task in failure logs

    def __call__(self) -> None:
        running = self._running
        if running is None or not running.is_alive():
            running = self._running = threading.Thread(target=self._run, name=self._name, daemon=True)
            running.start()
        running.join(self._wait_s)

    def _run(self) -> None:
        try:
            self._task()
        except Exception as exc:  # a background task must never go unnoticed
            log.warning("background task failed: %s: %r", self.__qualname__, exc)
