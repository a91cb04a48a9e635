"""The long-running agent, started from resolved options in a process that never imports pydantic.

``otel-numa`` reads and checks its settings (pydantic-settings: flags, environment, YAML), resolves them
into plain :class:`~otel_numa.options.AgentOptions`, and replaces itself (``exec``, same PID) with
``python -m otel_numa.daemon.serve``, which receives them in :data:`OPTIONS_ENV`. The settings machinery
(about 20 MB of imports) is then not resident in a process that runs for months on every node.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from types import FrameType

from otel_numa.daemon import signals
from otel_numa.daemon.logs import setup_logging
from otel_numa.options import AgentOptions, from_json

OPTIONS_ENV = "OTEL_NUMA_RESOLVED_OPTIONS"
EXIT_BAD_SETTING = 2  # as otel-numa exits for any bad setting
# glibc gives each thread that allocates its own malloc arena (up to 8 per core), each keeping freed
# memory of its own; the agent's threads (HTTP workers, the scheduler, gRPC's) then held ~1 MB more on a
# 2x32 node. With two arenas, one agent in two or three still held that megabyte more (the second arena's
# share of a round's and a page's buffers); with one, none did, at no measurable CPU: Python's own
# allocator serves the small objects under the GIL. An operator's own value wins.
MALLOC_ARENAS = ("MALLOC_ARENA_MAX", "1")
# One more glibc setting, unless the operator's GLIBC_TUNABLES sets it (read when the program starts): no
# per-thread cache of freed blocks (tcache: up to 7 of each size up to 1 KiB per thread). In the agent those
# are the larger objects of a collection or a page, allocated anew at other sizes by the next round, so the
# cache is resident memory that is rarely reused (~0.4 MB on the 2x32 node). Python's own allocator serves
# the small objects, so this costs no measurable CPU.
ALLOCATOR_TUNABLES = (("glibc.malloc.tcache_count", "0"),)
GLIBC_TUNABLES = "GLIBC_TUNABLES"
log = logging.getLogger("otel_numa")


def _on_ignored(signum: int, _frame: FrameType | None) -> None:
    # Their default would end the process at once, with no final push and no log line.
    log.info("received %s; ignored (TLS files are re-read when they change)", signal.Signals(signum).name)


def stop_request() -> signals.StopRequest:
    """The handlers of every signal the agent answers, installed now (the first thing the daemon does)."""
    stop = signals.StopRequest()
    stop.install(_on_ignored)
    return stop


def run(options: AgentOptions, stop: signals.StopRequest | None = None) -> int:
    """Serve until SIGTERM/SIGINT (``stop``, else handlers installed now), then push once more and exit
    within 5 s; SIGHUP, SIGUSR1 and SIGUSR2 are logged and ignored. A stop that comes while the agent starts
    still gets its first snapshot pushed, and exits 0."""
    if stop is None:
        stop = stop_request()
    from otel_numa.daemon.agent import (  # after logging, so import-time warnings are formatted
        Agent,
        CannotListen,
    )
    from otel_numa.daemon.heap import HeapPolicy

    agent = Agent(options, heap=HeapPolicy())  # this process runs for months: it owns the heap
    try:
        agent.start()
    except CannotListen as exc:  # a setting the operator must change: exits as any bad setting does
        log.error("%s", exc)
        agent.stop(timeout_s=1)
        return EXIT_BAD_SETTING
    except OSError as exc:
        log.error("cannot start: %s", exc)
        agent.stop(timeout_s=1)
        return 1
    log.info("received %s, shutting down", stop.wait())
    agent.stop()
    log.info("stopped")
    return 0


def exec_serve(options: AgentOptions, shown_args: list[str]) -> None:
    """Replace this process with one that serves ``options`` (``shown_args`` keep ``ps`` informative)."""
    from otel_numa.options import to_json

    os.environ[OPTIONS_ENV] = to_json(options)
    # both read by the C library when the new program starts
    os.environ.setdefault(*MALLOC_ARENAS)
    os.environ[GLIBC_TUNABLES] = with_allocator_tunables(os.environ.get(GLIBC_TUNABLES, ""))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "otel_numa.daemon.serve", *shown_args])


def with_allocator_tunables(tunables: str) -> str:
    """``tunables`` (glibc's ``name=value:name=value``) with :data:`ALLOCATOR_TUNABLES` added where they do
    not set the same name."""
    given = {entry.partition("=")[0] for entry in tunables.split(":")}
    added = [f"{name}={value}" for name, value in ALLOCATOR_TUNABLES if name not in given]
    return ":".join(entry for entry in (tunables, *added) if entry)


def main() -> int:
    stop = stop_request()  # before anything else: otel-numa held the signals until now
    text = os.environ.pop(OPTIONS_ENV, None)
    if text is None:
        print("otel-numa: start the agent with the otel-numa command", file=sys.stderr)
        return 2
    options = from_json(text)
    setup_logging(options.log_level)
    signals.release()  # a signal that came during start-up is handled now
    return run(options, stop)


if __name__ == "__main__":
    raise SystemExit(main())
