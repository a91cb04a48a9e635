"""The agent's own process: CPU time, resident memory, open file descriptors and threads, through psutil.

psutil reads the kernel's view of this process (``/proc/self/stat``, ``statm``, the ``fd`` listing) in one
``oneshot`` per collection: ~60 µs, and its import about 2.7 MB of resident memory
(docs/performance.md measures both).
"""

from __future__ import annotations

import psutil

from otel_numa.model import ProcessUsage
from otel_numa.sources.errors import SourceUnavailable


class OwnProcess:
    """Reads this process's cost (the host's procfs root does not matter: this is the agent's own
    process, in its own mount namespace)."""

    def __init__(self) -> None:
        self._process = psutil.Process()

    def read(self) -> ProcessUsage:
        process = self._process
        try:
            with process.oneshot():
                times = process.cpu_times()
                return ProcessUsage(
                    cpu_user_s=times.user,
                    cpu_system_s=times.system,
                    resident_bytes=process.memory_info().rss,
                    # less the descriptor of the fd listing itself, open while psutil counts
                    open_file_descriptors=process.num_fds() - 1,
                    threads=process.num_threads(),
                )
        except (psutil.Error, OSError) as exc:  # /proc mounted oddly or hidden
            raise SourceUnavailable(f"cannot read the agent's own process: {exc}") from exc
