"""Pod names from the kubelet's log directory: ``/var/log/pods/<namespace>_<name>_<uid>/``.

The kubelet names one directory per pod that way. Namespace and pod names are DNS names (lower
case letters, digits, ``-`` and ``.``) and UIDs are UUIDs or, for static pods, hex hashes, so none
of them contains ``_`` and a name splits unambiguously into its three parts. Entries that do not
split into three non-empty parts of those alphabets, and entries that are not directories, are
skipped.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from otel_numa.model import shared_name
from otel_numa.sources.errors import SourceMissing, SourceUnavailable

_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_UID = re.compile(r"[0-9A-Za-z-]+")


@dataclass(frozen=True)
class PodIdentity:
    uid: str
    name: str
    namespace: str


def parse_pod_log_dir_name(dir_name: str) -> PodIdentity | None:
    """``<namespace>_<name>_<uid>`` as a :class:`PodIdentity`, or None when the name is not of that form."""
    parts = dir_name.split("_")
    if len(parts) != 3:
        return None
    namespace, name, uid = parts
    if not (_DNS_NAME.fullmatch(namespace) and _DNS_NAME.fullmatch(name) and _UID.fullmatch(uid)):
        return None
    return PodIdentity(uid=shared_name(uid), name=shared_name(name), namespace=shared_name(namespace))


def read_pod_identities(pod_logs_root: Path) -> dict[str, PodIdentity]:
    """The pods with a log directory under ``pod_logs_root``, by UID.

    Raises :class:`SourceMissing` when the root does not exist and :class:`SourceUnavailable`
    when it cannot be listed.
    """
    try:
        entries = list(os.scandir(pod_logs_root))
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise SourceMissing(f"{pod_logs_root}: no such directory") from exc
    except OSError as exc:
        raise SourceUnavailable(f"{pod_logs_root}: {exc.strerror or exc}") from exc
    identities: dict[str, PodIdentity] = {}
    for entry in sorted(entries, key=lambda entry: entry.name):
        identity = parse_pod_log_dir_name(entry.name)
        if identity is None or not _is_directory(entry):
            continue
        identities.setdefault(identity.uid, identity)
    return identities


def _is_directory(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # follows symlinks, as a mounted log tree may use them
    except OSError:
        return False
