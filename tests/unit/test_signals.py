"""The daemon's stop request (otel_numa/daemon/signals.py): a stop signal ends the wait whichever of the
process's threads the kernel hands it to."""

from __future__ import annotations

import subprocess
import sys

from otel_numa.testing.peers import REPO

# A stop request waited for in the main thread; another thread (a gRPC or an HTTP client thread, in the
# agent) receives SIGTERM, as the kernel may choose; a watchdog ends a process that did not notice.
_WAITER = """
import os, resource, signal, sys, threading, time
from otel_numa.daemon.signals import StopRequest

# as many files open as an agent on a large node keeps (descriptors past select()'s 1,024)
_soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if hard == resource.RLIM_INFINITY or hard >= 2048:
    resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
    kept = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]

def watchdog():
    time.sleep(10)
    print("stuck", flush=True)
    os._exit(3)

def signalled_here():
    time.sleep(0.3)
    signal.pthread_kill(threading.get_ident(), signal.SIG{name})

stop = StopRequest()
stop.install()
threading.Thread(target=watchdog, daemon=True).start()
threading.Thread(target=signalled_here).start()
started = time.monotonic()
print(stop.wait(), round(time.monotonic() - started, 1), flush=True)
"""


def test_a_stop_signal_another_thread_received_ends_the_wait() -> None:
    for name in ("TERM", "INT"):
        result = subprocess.run(
            [sys.executable, "-c", _WAITER.format(name=name)],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=30,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        received, waited = result.stdout.split()
        assert received == f"SIG{name}" and float(waited) < 2.0
