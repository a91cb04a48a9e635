"""What the kernel sums over a whole kubepods tree: while the sums stand, no container below them changed.

cgroupfs tells no change of a counter file (its mtime stays, nothing reports to inotify), but cgroup v2
counts hierarchically: a cgroup's ``cpu.stat`` and ``memory.numa_stat`` are its own figures plus all its
descendants' (reading one has the kernel flush the pending updates of the whole subtree, at least as far
as reading a container's own would flush that container's). CPU time only grows, and a page stays charged
to the cgroup that first used it until it is freed, so a container's figures cannot move while every sum
of the kubepods cgroup above it keeps its bytes: that would take changes of two containers' pages that
cancel out to the page, made while neither container ran (the kernel reclaiming or moving pages). Two
reads a kubepods cgroup then stand for two a container (``otel_numa.snapshot.collectors.cgroups`` still
reads every container at least once a minute).

A kubepods cgroup without ``cpu.stat`` (not cgroup v2) gives no sums. One without ``memory.numa_stat``
has no memory controller, nor then do the containers below it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from otel_numa.sources.errors import SourceError
from otel_numa.sources.files import CGROUP_FILE_BYTES, KeptFiles

# the files whose sums stand for the containers' own (the two counters cgroup_rounds reads a container by)
SUMMED_FILES = ("memory.numa_stat", "cpu.stat")
FILES_KEPT = 8  # two for each of a few kubepods cgroups (a node has one)


class SubtreeCounters:
    """Reads the kubepods cgroups' summed counters, kept open between rounds; one thread uses it."""

    def __init__(self) -> None:
        self._files = KeptFiles(FILES_KEPT)

    def read(self, roots: Sequence[str]) -> tuple[bytes | None, ...] | None:
        """The bytes of each root's summed files, in order; ``None`` when a root has no ``cpu.stat`` or a
        file cannot be read (then every container is read)."""
        files = self._files
        sums: list[bytes | None] = []
        for root in roots:
            try:
                numa_stat = files.read_optional(root, SUMMED_FILES[0], limit=CGROUP_FILE_BYTES)
                cpu_stat = files.read_optional(root, SUMMED_FILES[1], limit=CGROUP_FILE_BYTES)
            except SourceError:
                return None
            if cpu_stat is None:
                return None
            sums += (numa_stat, cpu_stat)
        return tuple(sums) if sums else None

    def changed(self, directories: Iterable[str]) -> None:
        """Entries of these directories came or went: their files are opened again at their next read."""
        for directory in directories:
            self._files.forget_under(directory)

    def keep_only(self, roots: Collection[str]) -> None:
        """Keep files open only under these roots from now on."""
        self._files.retain_under(set(roots))

    def close(self) -> None:
        self._files.close()
