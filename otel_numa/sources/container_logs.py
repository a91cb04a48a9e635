"""Container names from the kubelet's log symlinks in ``/var/log/containers``.

Each running container has a symlink named ``<pod>_<namespace>_<container>-<id>.log``. Pod, namespace and
container names are DNS names (never ``_``), and the container id is 64 hex digits; container names may
contain ``-``, so the id is split off the end. Only names are read: links are never followed.
Sandbox (pause) containers have no log, so their ids are absent here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from otel_numa.model import ContainerIdentity, shared_name
from otel_numa.sources.errors import SourceMissing, SourceUnavailable

_LOG_NAME = re.compile(r"([^_]+)_([^_]+)_([^_]+)-([0-9a-f]{64})\.log")


def parse_container_log_name(name: str) -> ContainerIdentity | None:
    """The identity a log symlink's name carries, or ``None`` for any other file name."""
    match = _LOG_NAME.fullmatch(name)
    if match is None:
        return None
    pod_name, namespace, container_name, container_id = map(shared_name, match.groups())
    return ContainerIdentity(pod_name, namespace, container_name, container_id)


def read_container_identities(container_logs_root: Path) -> dict[str, ContainerIdentity]:
    """Identities of the containers that have a log link, by container id.

    Raises :class:`SourceMissing` when the directory does not exist, :class:`SourceUnavailable` when it
    cannot be listed.
    """
    identities: dict[str, ContainerIdentity] = {}
    try:
        with os.scandir(container_logs_root) as entries:
            for entry in entries:
                identity = parse_container_log_name(entry.name)
                if identity is not None:
                    identities[identity.container_id] = identity
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise SourceMissing(f"{container_logs_root}: not found") from exc
    except OSError as exc:
        raise SourceUnavailable(f"{container_logs_root}: {exc.strerror or exc}") from exc
    return identities
