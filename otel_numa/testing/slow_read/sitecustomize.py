"""A file whose read hangs, for tests of the agent as it serves (put this directory on ``PYTHONPATH``).

No FUSE or NFS is at hand in a test, so the stuck filesystem is simulated where the agent reads: with
``OTEL_NUMA_TEST_SLOW_READ=<path>:<seconds>:<marker>`` in the environment, every read of ``<path>``
through the sources' read helpers (a file read once, or kept open between rounds), while the file
``<marker>`` exists, sleeps that long in the reading thread before it reads, as a read stuck in the
kernel would. Python imports ``sitecustomize``
at start-up, also in the process the agent ``exec``s.
"""

from __future__ import annotations

import os
import time

_SETTING = os.environ.get("OTEL_NUMA_TEST_SLOW_READ")
if _SETTING:
    from pathlib import Path

    from otel_numa.sources import files

    _slow_path, _seconds, _marker = _SETTING.split(":")
    _delay_s = float(_seconds)
    _read_bytes = files.read_bytes

    def _slow_read_bytes(path: str | Path, *, limit: int = files.SYSFS_FILE_BYTES) -> bytes:
        if os.fspath(path) == _slow_path and os.path.exists(_marker):
            time.sleep(_delay_s)
        return _read_bytes(path, limit=limit)

    files.read_bytes = _slow_read_bytes
    _kept_read = files.KeptFiles.read

    def _slow_kept_read(
        self: files.KeptFiles, directory: str, name: str, *, limit: int = files.SYSFS_FILE_BYTES
    ) -> bytes:
        if f"{directory}/{name}" == _slow_path and os.path.exists(_marker):
            time.sleep(_delay_s)
        return _kept_read(self, directory, name, limit=limit)

    files.KeptFiles.read = _slow_kept_read  # type: ignore[method-assign]
    _kept_read_optional = files.KeptFiles.read_optional

    def _slow_kept_read_optional(
        self: files.KeptFiles, directory: str, name: str, *, limit: int = files.SYSFS_FILE_BYTES
    ) -> bytes | None:
        if f"{directory}/{name}" == _slow_path and os.path.exists(_marker):
            time.sleep(_delay_s)
        return _kept_read_optional(self, directory, name, limit=limit)

    files.KeptFiles.read_optional = _slow_kept_read_optional  # type: ignore[method-assign]
    _kept_read_kept = files.KeptFiles.read_kept

    def _slow_read_kept(
        self: files.KeptFiles, directory: str, first: str, second: str
    ) -> tuple[bytes, bytes] | None:
        if _slow_path in (f"{directory}/{first}", f"{directory}/{second}") and os.path.exists(_marker):
            time.sleep(_delay_s)
        return _kept_read_kept(self, directory, first, second)

    files.KeptFiles.read_kept = _slow_read_kept  # type: ignore[method-assign]
