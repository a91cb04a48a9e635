"""The CDI spec files of the configured directories, each parsed again only when its own stat changes.

A round costs one ``stat`` per directory and one ``lstat`` per spec file: a directory is listed again when
its stat changed (a spec added, removed or renamed over), and a file is parsed again when its inode, size,
mtime or ctime changed (a spec edited in place changes only its own). A rejected file is remembered with its
error, counted every round while it stays as it is (as a rejected checkpoint is), and not parsed again.

A stat taken within a second of the last change (the ctime) is not trusted to stay current: where
timestamps are coarse, a second change in the same tick would look the same, so such a file is read again
next round. The ctime is the kernel's clock, which no writer can set, so an mtime in the future (a skewed
clock, ``touch -d``) never makes a file or a directory look new: a writer that adds and removes a claim's
spec every 10 ms costs the parse of that one file, never of the others.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from otel_numa.sources.cdi import CdiDevice, CdiSpec, read_cdi_spec, spec_files
from otel_numa.sources.errors import SourceError, SourceMissing

RACY_NS = 1_000_000_000
Stamp = tuple[int, int, int, int]  # inode, size, mtime, ctime (ns)
CdiDevices = Mapping[str, CdiDevice]  # fully qualified name -> device


def stamp_of(path: Path) -> Stamp | None:
    """What tells that ``path`` itself changed (a link is not followed); None when it is not there."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class CdiSpecs:
    """The devices of every spec, a later directory's (and within one, a later file name's) winning, as the
    CDI cache resolves conflicts; the same mapping object while no spec changed."""

    def __init__(self, directories: Iterable[Path], clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._directories = tuple(directories)
        self._clock_ns = clock_ns
        self._listings: dict[Path, tuple[Stamp | None, tuple[Path, ...]]] = {}
        self._files: dict[Path, tuple[Stamp | None, CdiSpec | SourceError]] = {}
        self._results: tuple[CdiSpec | SourceError, ...] = ()
        self._devices: CdiDevices = {}
        self.present = False  # whether any of the directories exists

    def read(self, errors: list[SourceError]) -> CdiDevices:
        """The devices now; the error of each file that cannot be used is added to ``errors``."""
        now = self._clock_ns()
        results: list[CdiSpec | SourceError] = []
        listed: set[Path] = set()
        self.present = False
        for directory in self._directories:
            for path in self._listing(directory, now, errors):
                listed.add(path)
                result = self._spec(path, now)
                if result is not None:
                    results.append(result)
                    if isinstance(result, SourceError):
                        errors.append(result)
        for gone in self._files.keys() - listed:
            del self._files[gone]
        if len(results) != len(self._results) or any(
            a is not b for a, b in zip(results, self._results, strict=True)
        ):
            self._results = tuple(results)
            devices = {
                device.name: device
                for result in results
                if isinstance(result, CdiSpec)
                for device in result.devices
            }
            if devices != self._devices:
                self._devices = devices
        return self._devices

    def _trusted(self, stamp: Stamp, now: int) -> Stamp | None:
        """``stamp``, or None when it was taken in its last change's second (read again next round)."""
        return None if 0 <= now - stamp[3] < RACY_NS else stamp

    def _listing(self, directory: Path, now: int, errors: list[SourceError]) -> tuple[Path, ...]:
        stamp = stamp_of(directory)
        if stamp is None:
            self._listings.pop(directory, None)
            return ()
        self.present = True
        kept = self._listings.get(directory)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        try:
            files = spec_files(directory)
        except SourceError as error:
            errors.append(error)
            self._listings.pop(directory, None)
            return ()
        self._listings[directory] = (self._trusted(stamp, now), files)
        return files

    def _spec(self, path: Path, now: int) -> CdiSpec | SourceError | None:
        """The file's spec or its error, parsed only when its stamp changed; None when it is gone."""
        stamp = stamp_of(path)
        if stamp is None:
            return None
        kept = self._files.get(path)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        result: CdiSpec | SourceError
        try:
            result = read_cdi_spec(path)
        except SourceMissing:
            return None  # removed since it was listed
        except SourceError as error:
            # remembered without its traceback, whose frames would hold the file and what was built of it
            result = type(error)(str(error), error_type=error.error_type)
        if kept is not None and isinstance(kept[1], CdiSpec) and kept[1] == result:
            result = kept[1]  # read again but the same: the devices need not be merged again
        self._files[path] = (self._trusted(stamp, now), result)
        return result
