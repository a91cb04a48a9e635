"""Container names from the kubelet's log symlinks in ``/var/log/containers``.

Each running container has a symlink named ``<pod>_<namespace>_<container>-<id>.log``. Pod, namespace and
container names are DNS names (never ``_``), and the container id is 64 hex digits; container names may
contain ``-``, so the id is split off the end. Only names are read: links are never followed.
Sandbox (pause) containers have no log, so their ids are absent here.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from otel_numa.model import ContainerIdentity, shared_name
from otel_numa.sources.errors import SourceMissing, SourceUnavailable

_LOG_NAME = re.compile(r"([^_]+)_([^_]+)_([^_]+)-([0-9a-f]{64})\.log")


_SUFFIX = len(".log")
_ID_AND_SUFFIX = 64 + _SUFFIX


def log_name(identity: ContainerIdentity) -> str:
    """The name of the log link of the container with this identity."""
    return f"{identity.pod_name}_{identity.namespace}_{identity.container_name}-{identity.container_id}.log"


def parse_container_log_name(name: str) -> ContainerIdentity | None:
    """The identity a log symlink's name carries, or ``None`` for any other file name."""
    match = _LOG_NAME.fullmatch(name)
    if match is None:
        return None
    pod_name, namespace, container_name, container_id = map(shared_name, match.groups())
    return ContainerIdentity(pod_name, namespace, container_name, container_id)


def read_container_identities(
    container_logs_root: Path, parse: Callable[[str], ContainerIdentity | None] = parse_container_log_name
) -> dict[str, ContainerIdentity]:
    """Identities of the containers that have a log link, by container id (each name read by ``parse``).

    Raises :class:`SourceMissing` when the directory does not exist, :class:`SourceUnavailable` when it
    cannot be listed.
    """
    identities: dict[str, ContainerIdentity] = {}
    try:
        with os.scandir(container_logs_root) as entries:
            for entry in entries:
                identity = parse(entry.name)
                if identity is not None:
                    identities[identity.container_id] = identity
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise SourceMissing(f"{container_logs_root}: not found") from exc
    except OSError as exc:
        raise SourceUnavailable(f"{container_logs_root}: {exc.strerror or exc}") from exc
    return identities


# A listing is trusted while the directory's mtime stays the same only when the directory had not changed
# for this long when it was listed: a link made just after a listing, within the filesystem's timestamp
# granularity (a clock tick on most, one or two seconds on some), may leave the mtime as it was.
SETTLED_S = 2.0


class ContainerLogListing:
    """:func:`read_container_identities`, listed again only when the directory may have changed: its
    device, inode or mtime is not what it was, or it had changed less than :data:`SETTLED_S` before the
    last listing. While unchanged, the same dict object is handed back (its caller must not change it); a
    listing again takes the identity of a link it found before from the last listing (a link's name is
    its identity written out) instead of parsing its name, and hands back the last dict when it found the
    same containers (a pod change lists ~1,000 names on a crowded node, ~5 µs each to parse)."""

    def __init__(self, root: Path, clock: Callable[[], float] = time.time) -> None:
        self._root = root
        self._clock = clock  # the wall clock, which the directory's mtime comes from
        self._stamp: tuple[int, int, int] | None = None
        self._identities: dict[str, ContainerIdentity] | None = None
        self._last: dict[str, ContainerIdentity] = {}  # the last listing's result, trusted or not

    def _parse(self, name: str) -> ContainerIdentity | None:
        known = self._last.get(name[-_ID_AND_SUFFIX:-_SUFFIX])
        if known is not None and name == log_name(known):
            return known
        return parse_container_log_name(name)

    def _list(self) -> dict[str, ContainerIdentity]:
        identities = read_container_identities(self._root, self._parse)
        if identities == self._last:
            return self._last
        self._last = identities
        return identities

    def identities(self) -> dict[str, ContainerIdentity]:
        """Raises as :func:`read_container_identities` does."""
        try:
            status = os.stat(self._root)
        except OSError:
            status = None
        stamp = (status.st_dev, status.st_ino, status.st_mtime_ns) if status is not None else None
        if stamp is not None and stamp == self._stamp and self._identities is not None:
            return self._identities
        listed_at = self._clock()
        self._stamp = self._identities = None
        identities = self._list()
        if status is not None and listed_at - status.st_mtime_ns / 1e9 >= SETTLED_S:
            self._stamp, self._identities = stamp, identities
        return identities
