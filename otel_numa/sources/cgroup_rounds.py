"""Round after round of the containers' cgroup files: kept open, and parsed only when their bytes changed.

cgroupfs (kernfs) keeps a file's mtime when its values change, so no stat signature can tell that
``memory.numa_stat`` or ``cpu.stat`` changed: every round reads every container's files. What a round
can skip is the rest: each file is kept open (:class:`~otel_numa.sources.files.KeptFiles`: one ``pread``
a file instead of open, fstat, read and close), and a container whose files hold what they held last
round is its last round's :class:`~otel_numa.model.ContainerNumaUsage` object again, unparsed, with the
errors its files gave then counted again. A cgroup v2 container's small files (cpusets, ``cpu.stat``)
are compared byte for byte; its ``memory.numa_stat`` (~1.5 KB on two NUMA nodes, ~5 KB on eight: too
much to hold for 2,000 containers) by the lines the agent reads from it (:func:`_numa_stat_key`). v1
containers are compared by the texts parsed. The caller says which directories' entries changed
(:meth:`CgroupRounds.changed`: a file there may have been replaced, so it is opened again) and which
containers it still reads (:meth:`CgroupRounds.keep_only`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Container, Iterable
from dataclasses import dataclass

from otel_numa.model import CgroupLayout, ContainerNumaUsage, Interned
from otel_numa.sources.cgroups import (
    V2_FILES,
    ContainerCgroup,
    ContainerTexts,
    container_usage,
    decoded,
    read_container_texts,
    texts_v2,
)
from otel_numa.sources.errors import SourceError
from otel_numa.sources.files import CGROUP_FILE_BYTES, MAX_CPU_ID, ErrorSink, KeptFiles

# Files kept open at most: four a container (within the process's budget, otel_numa.sources.files).
FILES_PER_CONTAINER = 4


_NUMA_STAT, _CPUS, _MEMS, _CPU_STAT = V2_FILES


# the cpuset files' bytes kept per container: a node has a few distinct ones (see _checked_ids)
_cpuset_bytes: Interned[bytes] = Interned(limit=4096)


@dataclass(frozen=True, slots=True)
class _Read:
    """A container's files last round and what they gave: its usage, or the error that left it out, and
    the errors of its cpusets (counted again every round they are read). For v2 what tells its files'
    bytes apart: ``key`` that of ``memory.numa_stat`` (:func:`_numa_stat_key`), the cpusets and
    ``cpu.stat`` as read (fields, not a tuple: one object less a container); for v1 ``key`` holds the
    texts parsed, the others ``None``."""

    key: object
    cpus: bytes | None
    mems: bytes | None
    cpu_stat: bytes | None
    usage: ContainerNumaUsage | None
    error: SourceError | None
    cpuset_errors: tuple[SourceError, ...]


class CgroupRounds:
    """Reads containers' usage round after round; one thread uses it."""

    def __init__(self, containers: int) -> None:
        self.files = KeptFiles(FILES_PER_CONTAINER * containers)
        self._last: dict[str, _Read] = {}
        self._bounds: tuple[object, ...] | None = None  # what the texts were judged against
        # the reads judged against the bounds before, until each container is judged again: a usage that
        # comes out equal stays the same object (the machine's bounds are known from the second round on;
        # a copy would be held beside the original by whatever joined it)
        self._before: dict[str, _Read] = {}

    def read(
        self,
        cgroup: ContainerCgroup,
        layout: CgroupLayout,
        memory_types: Collection[str] | None = None,
        nodes: Collection[int] | None = None,
        cpu_limit: int = MAX_CPU_ID,
        *,
        machine_cpus: Collection[int] | None = None,
        on_cpuset_error: ErrorSink | None = None,
        cpusets: bool = True,
        counters: tuple[bytes, bytes] | None = None,
    ) -> ContainerNumaUsage | None:
        """:func:`~otel_numa.sources.cgroups.read_container_usage`, through the kept files, and the last
        round's answer again while the container's texts and the machine's bounds are the same. With
        ``cpusets`` false a v2 container's cpuset files are taken as last round's (the caller knows that
        nothing wrote a cpuset since) and only its counters are read; ``counters`` are its
        ``memory.numa_stat`` and ``cpu.stat`` bytes when the caller read them already."""
        bounds = (layout, memory_types, nodes, cpu_limit, machine_cpus)
        if bounds != self._bounds:
            self._before = dict(self._last)
            self._last.clear()
            self._bounds = bounds
        last = self._last.get(cgroup.path)
        if layout == "v2":
            directory, read_file = cgroup.path, self.files.read_optional
            numa_stat: bytes | None
            cpu_stat: bytes | None
            if counters is None:
                numa_stat = read_file(directory, _NUMA_STAT, limit=CGROUP_FILE_BYTES)
            if cpusets or last is None:
                cpus = read_file(directory, _CPUS, limit=CGROUP_FILE_BYTES)
                mems = read_file(directory, _MEMS, limit=CGROUP_FILE_BYTES)
            else:
                cpus, mems = last.cpus, last.mems
            if counters is None:
                cpu_stat = read_file(directory, _CPU_STAT, limit=CGROUP_FILE_BYTES)
            else:
                numa_stat, cpu_stat = counters
            if (numa_stat is None or cpus is None or mems is None or cpu_stat is None) and not os.path.isdir(
                directory
            ):
                self._last.pop(cgroup.path, None)
                return None  # the container stopped while we read it: not an error
            if last is None or not _same_v2(last, numa_stat, cpus, mems, cpu_stat):
                seen = (
                    _numa_stat_key(numa_stat, memory_types),
                    _cpuset_bytes(cpus) if cpus is not None else None,
                    _cpuset_bytes(mems) if mems is not None else None,
                    cpu_stat,
                )
                texts = texts_v2(
                    decoded(numa_stat), decoded(cpus), decoded(mems), decoded(cpu_stat), memory_types
                )
                last = self._judged(cgroup, layout, seen, texts, nodes, cpu_limit, machine_cpus)
                self._last[cgroup.path] = last
        else:
            read = read_container_texts(cgroup, layout, memory_types, self.files)
            if read is None:
                self._last.pop(cgroup.path, None)
                return None
            if last is None or last.key != read:
                last = self._judged(
                    cgroup, layout, (read, None, None, None), read, nodes, cpu_limit, machine_cpus
                )
                self._last[cgroup.path] = last
        for error in last.cpuset_errors:
            if on_cpuset_error is None:
                raise error
            on_cpuset_error(error)
        if last.error is not None:
            raise last.error
        return last.usage

    def read_all(
        self,
        cgroups: Iterable[ContainerCgroup],
        layout: CgroupLayout,
        memory_types: Collection[str] | None,
        nodes: Collection[int] | None,
        cpu_limit: int,
        *,
        machine_cpus: Collection[int] | None,
        on_cpuset_error: ErrorSink,
        on_error: Callable[[ContainerCgroup, SourceError], None],
        cpusets_of: Container[str] | None = None,
    ) -> list[ContainerNumaUsage]:
        """Every container's usage, as :meth:`read` gives it (``cpusets_of``: the directories of the
        containers whose cpusets are read; ``None``: every container's); a container that fails goes to
        ``on_error``. The common round, a v2 container whose cpusets stand and whose counters hold last
        round's bytes, is two ``pread`` calls and a comparison."""
        usages: list[ContainerNumaUsage] = []
        last_of, read_kept = self._last, self.files.read_kept
        bounds = (layout, memory_types, nodes, cpu_limit, machine_cpus)
        quick = layout == "v2" and cpusets_of is not None and bounds == self._bounds
        for cgroup in cgroups:
            path = cgroup.path
            cpusets = cpusets_of is None or path in cpusets_of
            counters: tuple[bytes, bytes] | None = None
            last = last_of.get(path) if quick and not cpusets else None
            if last is not None and last.error is None and not last.cpuset_errors:
                # else read again the long way, which tells what is wrong
                counters = read_kept(path, _NUMA_STAT, _CPU_STAT)
                if counters is not None:
                    numa_stat, cpu_stat = counters
                    key = last.key  # as _same_v2 compares, without the calls
                    if last.cpu_stat == cpu_stat and (
                        numa_stat.startswith(key) if type(key) is bytes else _same_numa_stat(key, numa_stat)
                    ):
                        usages.append(last.usage)  # type: ignore[arg-type]
                        continue
            try:
                usage = self.read(
                    cgroup,
                    layout,
                    memory_types,
                    nodes,
                    cpu_limit,
                    machine_cpus=machine_cpus,
                    on_cpuset_error=on_cpuset_error,
                    cpusets=cpusets,
                    counters=counters,
                )
            except SourceError as error:
                on_error(cgroup, error)
                continue
            if usage is not None:  # None: the container stopped meanwhile
                usages.append(usage)
        self._before.clear()  # every container was judged again, or is gone
        return usages

    def _judged(
        self,
        cgroup: ContainerCgroup,
        layout: CgroupLayout,
        seen: tuple[object, bytes | None, bytes | None, bytes | None],
        texts: ContainerTexts,
        nodes: Collection[int] | None,
        cpu_limit: int,
        machine_cpus: Collection[int] | None,
    ) -> _Read:
        cpuset_errors: list[SourceError] = []
        try:
            usage = container_usage(
                cgroup,
                layout,
                texts,
                nodes,
                cpu_limit,
                machine_cpus=machine_cpus,
                on_cpuset_error=cpuset_errors.append,
            )
        except SourceError as error:
            # kept without its traceback, whose frames would hold the file's text
            return _Read(*seen, None, error.with_traceback(None), tuple(cpuset_errors))
        before = self._before.pop(cgroup.path, None) if self._before else None
        if before is not None and before.usage == usage:
            usage = before.usage
        return _Read(*seen, usage, None, tuple(cpuset_errors))

    def changed(self, directories: Iterable[str]) -> None:
        """Entries of these directories came or went: their files are opened again at their next read."""
        for directory in directories:
            self.files.forget_under(directory)

    def keep_only(self, cgroups: Iterable[ContainerCgroup], kept: set[str]) -> None:
        """Only these containers are read from now on, and only files in the ``kept`` directories (the ones
        watched for files replaced) are kept open."""
        paths = {cgroup.path for cgroup in cgroups}
        for path in [path for path in self._last if path not in paths]:
            del self._last[path]
        self._before.clear()
        self.files.retain_under(kept)

    def close(self) -> None:
        self.files.close()
        self._last.clear()
        self._before.clear()


def _numa_stat_key(numa_stat: bytes | None, memory_types: Collection[str] | None) -> object:
    """What tells that a v2 ``memory.numa_stat`` would parse the same: its bytes up to the end of the last
    line of the types read (its first lines: ``anon`` and ``file`` lead the file; ~200 bytes on eight NUMA
    nodes, where the whole file is ~5 KB), which a file with the same lines starts with; where those lines
    are not all there, the interpreter's keyed 64-bit hash of all its bytes (two different files apart but
    for a chance of 2^-64)."""
    if numa_stat is None:
        return None
    end = -1
    for memory_type in memory_types or ():
        head = memory_type.encode() + b" "
        start = 0 if numa_stat.startswith(head) else numa_stat.find(b"\n" + head) + 1
        line_end = numa_stat.find(b"\n", start) if start or numa_stat.startswith(head) else -1
        if line_end < 0:  # a type not there, or its line not ended
            return hash(numa_stat)
        end = max(end, line_end)
    return numa_stat[: end + 1] if end >= 0 else hash(numa_stat)


def _same_v2(
    last: _Read, numa_stat: bytes | None, cpus: bytes | None, mems: bytes | None, cpu_stat: bytes | None
) -> bool:
    """Whether a v2 container's files parse as those ``last`` read (``numa_stat`` by its key)."""
    return (
        last.cpus == cpus
        and last.mems == mems
        and last.cpu_stat == cpu_stat
        and _same_numa_stat(last.key, numa_stat)
    )


def _same_numa_stat(key: object, numa_stat: bytes | None) -> bool:
    """Whether ``numa_stat`` parses as the file whose :func:`_numa_stat_key` is ``key``."""
    if type(key) is bytes:
        return numa_stat is not None and numa_stat.startswith(key)
    if numa_stat is None:
        return key is None
    return key == hash(numa_stat)
