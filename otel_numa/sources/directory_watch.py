"""Which directories had entries made, removed or renamed since the last look: inotify, without blocking.

A round that walks a tree of directories (the kubelet's cgroups) needs to list them again only when an
entry came or went. The kernel's directory timestamps do not say so on cgroupfs (kernfs keeps a cgroup
directory's mtime when a child cgroup is made or removed), but ``mkdir(2)`` and ``rmdir(2)`` there report
to inotify as everywhere else, as do the renames and removals that replace a file on a disk or tmpfs.
A watch needs read access only (a read-only mount works). Reading the events costs one ``read(2)`` a
round when none came.

:meth:`DirectoryWatch.changed` answers ``None`` (everything may have changed) when the kernel's event
queue overflowed or the watch could not be set up at all; a directory that cannot be watched (the user's
inotify watch limit) is reported by :meth:`DirectoryWatch.watch`, and its owner looks at it every round.

A watch made with ``written_prefixes`` also tells which directories had a file of those names written
(:meth:`DirectoryWatch.written`): ``write(2)`` reports to inotify on cgroupfs too, so the container runtime
writing a cgroup's ``cpuset.cpus`` is seen, while the counters the kernel updates itself are not.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterable
from contextlib import suppress

from inotify_simple import INotify, flags

log = logging.getLogger(__name__)

_ENTRIES = (
    flags.CREATE
    | flags.DELETE
    | flags.MOVED_FROM
    | flags.MOVED_TO
    | flags.DELETE_SELF
    | flags.MOVE_SELF
    | flags.ONLYDIR
    | flags.DONT_FOLLOW
)


class DirectoryWatch:
    """Non-blocking inotify watches on a set of directories; one thread uses it."""

    def __init__(self, written_prefixes: tuple[str, ...] = ()) -> None:
        self._written_prefixes = written_prefixes
        self._mask = _ENTRIES | flags.MODIFY if written_prefixes else _ENTRIES
        self._written: set[str] = set()
        self._inotify: INotify | None = None
        self._paths: dict[int, str] = {}  # watch descriptor -> directory
        self._watches: dict[str, int] = {}
        self._overflowed = False
        self._reported: int | None = None
        self._closed = False

    @property
    def available(self) -> bool:
        return self._inotify is not None

    @property
    def watched(self) -> frozenset[str]:
        return frozenset(self._watches)

    def watch(self, directories: Iterable[str]) -> set[str]:
        """Watch exactly ``directories`` from now on (the others' watches are removed); the ones that could
        not be watched (gone meanwhile, or past the watch limit)."""
        wanted = set(directories)
        inotify = self._inotify
        if inotify is None and wanted and not self._closed:
            # made at the first directory (an instance is a per-user kernel resource, 128 by default);
            # tried again at each call while the kernel refuses one
            try:
                inotify = self._inotify = INotify(nonblocking=True)
            except OSError as error:
                self._report(error)
        if inotify is None:
            return wanted
        for path in [path for path in self._watches if path not in wanted]:
            descriptor = self._watches.pop(path)
            self._paths.pop(descriptor, None)
            with suppress(OSError):  # the directory is gone: the kernel removed its watch already
                inotify.rm_watch(descriptor)
        missed: set[str] = set()
        for path in wanted - self._watches.keys():
            try:
                descriptor = inotify.add_watch(path, self._mask)
            except OSError as error:
                if error.errno not in (errno.ENOENT, errno.ENOTDIR):
                    self._report(error)
                missed.add(path)
                continue
            self._watches[path] = descriptor
            self._paths[descriptor] = path
        return missed

    def changed(self) -> set[str] | None:
        """The watched directories whose entries changed since the last call (a directory removed or moved
        counts as changed, and is no longer watched); ``None`` when that cannot be known: no inotify, or the
        event queue overflowed."""
        inotify = self._inotify
        if inotify is None:
            return None
        found: set[str] = set()
        prefixes, written = self._written_prefixes, self._written
        while True:
            try:
                events = inotify.read(timeout=0)
            except BlockingIOError:
                break
            if not events:
                break
            for event in events:
                if event.mask & flags.Q_OVERFLOW:
                    self._overflowed = True
                    continue
                path = self._paths.get(event.wd)
                if path is None:
                    continue
                if event.mask & flags.MODIFY:
                    if event.name.startswith(prefixes):
                        written.add(path)
                    continue
                found.add(path)
                if event.mask & (flags.IGNORED | flags.DELETE_SELF | flags.MOVE_SELF):
                    self._forget(event.wd)
        if self._overflowed:
            self._overflowed = False
            return None
        return found

    def written(self) -> set[str]:
        """The watched directories where a file named with one of ``written_prefixes`` was written since
        the last call (read by :meth:`changed`, which comes first)."""
        written, self._written = self._written, set()
        return written

    def close(self) -> None:
        self._closed = True
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        self._paths.clear()
        self._watches.clear()

    def _forget(self, descriptor: int) -> None:
        path = self._paths.pop(descriptor, None)
        if path is not None and self._watches.get(path) == descriptor:
            del self._watches[path]

    def _report(self, error: OSError) -> None:
        """Logged once per kind of failure: the rounds go on, listing what cannot be watched."""
        if self._reported != error.errno:
            self._reported = error.errno
            log.info("cgroup directories cannot all be watched (%s); they are listed every round", error)
