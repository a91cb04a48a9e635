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
writing a cgroup's ``cpuset.cpus`` is seen, while the counters the kernel updates itself are not. One made
with ``noticed_prefixes`` tells whether any file of those names was written at all
(:meth:`DirectoryWatch.noticed`): a counter file written is a tree on a disk or tmpfs (a test's), never the
kernel's own.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from collections.abc import Iterable
from contextlib import suppress

from inotify_simple import INotify, flags

log = logging.getLogger(__name__)

# an inotify event: watch descriptor, mask, cookie and the length of the name that follows (inotify(7))
_EVENT = struct.Struct("iIII")
_READ_BYTES = 1 << 16  # events read at once (each at most 16 bytes and a 256-byte name)
_MODIFY, _OVERFLOW = int(flags.MODIFY), int(flags.Q_OVERFLOW)
_GONE = int(flags.IGNORED | flags.DELETE_SELF | flags.MOVE_SELF)

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

    def __init__(
        self, written_prefixes: tuple[str, ...] = (), noticed_prefixes: tuple[str, ...] = ()
    ) -> None:
        self._written_prefixes_bytes = tuple(prefix.encode() for prefix in written_prefixes)
        self._noticed_prefixes_bytes = tuple(prefix.encode() for prefix in noticed_prefixes)
        self._mask = _ENTRIES | flags.MODIFY if written_prefixes or noticed_prefixes else _ENTRIES
        self._written: set[str] = set()
        self._noticed = False
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
        event queue overflowed.

        The events are read raw and only those that matter are looked at: with ``written_prefixes`` every
        file written in a watched directory reports (a test tree's rewritten counters, the kernel's
        ``memory.events`` notifications), and a round may bring thousands of them."""
        inotify = self._inotify
        if inotify is None:
            return None
        found: set[str] = set()
        paths, prefixes, written = self._paths, self._written_prefixes_bytes, self._written
        noticed_prefixes = self._noticed_prefixes_bytes
        fd = inotify.fileno()
        while True:
            try:
                data = os.read(fd, _READ_BYTES)
            except BlockingIOError:
                break
            if not data:
                break
            position, end = 0, len(data)
            while position < end:
                descriptor, mask, _cookie, size = _EVENT.unpack_from(data, position)
                name_at = position + _EVENT.size
                position = name_at + size
                if mask == _MODIFY:  # a file written (the common event): which one, by its name
                    if prefixes and data.startswith(prefixes, name_at):
                        path = paths.get(descriptor)
                        if path is not None:
                            written.add(path)
                    elif noticed_prefixes and data.startswith(noticed_prefixes, name_at):
                        self._noticed = True
                    continue
                if mask & _OVERFLOW:
                    self._overflowed = True
                    continue
                path = paths.get(descriptor)
                if path is None:
                    continue
                found.add(path)
                if mask & _GONE:
                    self._forget(descriptor)
        if self._overflowed:
            self._overflowed = False
            return None
        return found

    def written(self) -> set[str]:
        """The watched directories where a file named with one of ``written_prefixes`` was written since
        the last call (read by :meth:`changed`, which comes first)."""
        written, self._written = self._written, set()
        return written

    def noticed(self) -> bool:
        """Whether a file named with one of ``noticed_prefixes`` was written in a watched directory since
        the last call (read by :meth:`changed`, which comes first)."""
        noticed, self._noticed = self._noticed, False
        return noticed

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
