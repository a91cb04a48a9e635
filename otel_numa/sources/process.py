"""The agent's own process: CPU time, resident memory, open file descriptors and threads (psutil)."""

from __future__ import annotations

import psutil

from otel_numa.model import ProcessUsage
from otel_numa.sources.errors import SourceUnavailable


class OwnProcess:
    """Reads this process's cost: four small /proc reads (stat, statm, fd, status) per call. psutil's
    ``oneshot`` cache is left out: it pre-reads files these values do not need and measured slower."""

    def __init__(self) -> None:
        self._process = psutil.Process()

    def read(self) -> ProcessUsage:
        try:
            times = self._process.cpu_times()
            return ProcessUsage(
                cpu_user_s=times.user,
                cpu_system_s=times.system,
                resident_bytes=self._process.memory_info().rss,
                # less the descriptor of the /proc/self/fd listing itself, open while it is counted
                open_file_descriptors=self._process.num_fds() - 1,
                threads=self._process.num_threads(),
            )
        except psutil.Error as exc:  # /proc mounted oddly or hidden: the health series are left out
            raise SourceUnavailable(f"cannot read the agent's own process: {exc}") from exc
