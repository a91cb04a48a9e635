"""Container Device Interface (CDI) spec files: which device nodes and environment each CDI device hands a
container.

Written from the published CDI specification: a spec file (``.json``, ``.yaml`` or ``.yml``) holds
``cdiVersion``, ``kind`` (``vendor.com/class``), ``devices`` (each a ``name`` and ``containerEdits``) and
spec-wide ``containerEdits``. A device's fully qualified name is ``<kind>=<name>``. Of a device's edits its
own ``deviceNodes`` (where it sits) and ``env`` (what a CPU driver writes its cpuset into) are kept; of the
spec-wide edits only ``env``: control nodes such as ``/dev/nvidiactl`` belong to every device of the
vendor and tell nothing about where one device sits.

A spec is JSON when its text begins as a JSON object does (JSON parses ~50 times faster than YAML), else
YAML, whatever its suffix, as the CDI runtime reads both. Either way the document is parsed within a budget
of nodes (:mod:`otel_numa.sources.bounded_documents`), and a spec may hold at most :data:`MAX_DEVICES` devices
and :data:`MAX_DEVICE_NODES` device nodes. A file that does not parse, is not shaped as a spec or is past a
limit is rejected whole (``parse_error``, ``invalid_spec``, ``over_limit``, ``too_large``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_numa.sources.bounded_documents import OVER_LIMIT, load_json, load_yaml, starts_as_json
from otel_numa.sources.errors import SourceCorrupt, SourceUnavailable
from otel_numa.sources.files import read_bytes

SPEC_SUFFIXES = (".json", ".yaml", ".yml")
# Limits per spec file (docs/decisions/hostile-input.md), each far above a real spec: NVIDIA's spec for
# 8 GPUs and their MIG devices holds ~100 devices and a few thousand nodes.
MAX_SPEC_BYTES = 4 * 1024 * 1024
MAX_SPEC_NODES = 100_000  # scalars, lists and mappings, aliases expanded
MAX_DEVICES = 4096
MAX_DEVICE_NODES = 16_384  # over the spec's devices
INVALID_SPEC = "invalid_spec"
_KIND = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


@dataclass(frozen=True, slots=True)
class CdiDeviceNode:
    """One ``deviceNodes`` entry: the path in the container, and what the host has there."""

    path: str
    host_path: str | None = None
    type: str | None = None  # "c", "b", "u" or "p"; None when not stated
    major: int | None = None
    minor: int | None = None

    @property
    def on_host(self) -> str:
        return self.host_path or self.path


@dataclass(frozen=True, slots=True)
class CdiDevice:
    """One device of a spec: its fully qualified name, its own device nodes and environment."""

    name: str  # vendor.com/class=name
    device_nodes: tuple[CdiDeviceNode, ...] = ()
    env: tuple[str, ...] = ()  # "KEY=VALUE", as the spec gives them (e.g. DRA_CPUSET_<claim UID>=0-3)


@dataclass(frozen=True, slots=True)
class CdiSpec:
    kind: str
    devices: tuple[CdiDevice, ...]
    env: tuple[str, ...] = ()  # the spec-wide edits' environment, given to a container with any device


def spec_document(data: bytes, path: Path) -> Any:
    """The file's document, JSON where the text is JSON, else YAML; SourceCorrupt when it is neither or is
    past :data:`MAX_SPEC_NODES`."""
    if not starts_as_json(data):
        return load_yaml(data, MAX_SPEC_NODES, str(path))
    try:
        return load_json(data, MAX_SPEC_NODES, str(path))
    except SourceCorrupt as not_json:
        if not_json.error_type == OVER_LIMIT:
            raise
        try:  # a YAML flow mapping starts with "{" too
            return load_yaml(data, MAX_SPEC_NODES, str(path))
        except SourceCorrupt as not_yaml:
            raise not_json if path.suffix == ".json" else not_yaml from None


def _corrupt(where: str, what: str) -> SourceCorrupt:
    return SourceCorrupt(f"{where}: {what}", error_type=INVALID_SPEC)


def _edits(edits: Any, where: str) -> dict[str, Any]:
    if edits is None:
        return {}
    if not isinstance(edits, dict):
        raise _corrupt(where, "containerEdits is not a mapping")
    return edits


def _env(edits: dict[str, Any], where: str) -> tuple[str, ...]:
    env = edits.get("env") or []
    if not isinstance(env, list) or not all(isinstance(entry, str) for entry in env):
        raise _corrupt(where, "env is not a list of strings")
    return tuple(env)


def _device_nodes(edits: dict[str, Any], where: str) -> tuple[CdiDeviceNode, ...]:
    nodes = edits.get("deviceNodes") or []
    if not isinstance(nodes, list):
        raise _corrupt(where, "deviceNodes is not a list")
    found = []
    for node in nodes:
        if not isinstance(node, dict) or not isinstance(node.get("path"), str) or not node["path"]:
            raise _corrupt(where, "a device node without a path")
        numbers = [node.get("major"), node.get("minor")]
        if any(value is not None and (type(value) is not int or value < 0) for value in numbers):
            raise _corrupt(where, "a bad major or minor number")
        host = node.get("hostPath")
        kind = node.get("type")
        found.append(
            CdiDeviceNode(
                node["path"],
                host if isinstance(host, str) and host else None,
                kind if isinstance(kind, str) and kind else None,
                numbers[0],
                numbers[1],
            )
        )
    return tuple(found)


def parse_cdi_spec(data: bytes, path: Path) -> CdiSpec:
    """The spec in ``data``; SourceCorrupt for a file that is no spec or is past a limit."""
    document = spec_document(data, path)
    if not isinstance(document, dict):
        raise _corrupt(str(path), "not a CDI spec (no mapping at the top)")
    kind = document.get("kind")
    if (
        not isinstance(document.get("cdiVersion"), str)
        or not isinstance(kind, str)
        or not _KIND.fullmatch(kind)
    ):
        raise _corrupt(str(path), "not a CDI spec (cdiVersion or kind missing or bad)")
    devices = document.get("devices")
    if not isinstance(devices, list):
        raise _corrupt(str(path), "devices is not a list")
    if len(devices) > MAX_DEVICES:
        raise SourceCorrupt(f"{path}: more than {MAX_DEVICES} devices", error_type=OVER_LIMIT)
    found: list[CdiDevice] = []
    device_nodes = 0
    for device in devices:
        name = device.get("name") if isinstance(device, dict) else None
        if not isinstance(name, str) or not _DEVICE_NAME.fullmatch(name):
            raise _corrupt(str(path), "a device without a valid name")
        where = f"{path}: {kind}={name}"
        edits = _edits(device.get("containerEdits"), where)
        nodes = _device_nodes(edits, where)
        device_nodes += len(nodes)
        if device_nodes > MAX_DEVICE_NODES:
            raise SourceCorrupt(f"{path}: more than {MAX_DEVICE_NODES} device nodes", error_type=OVER_LIMIT)
        found.append(CdiDevice(f"{kind}={name}", nodes, _env(edits, where)))
    spec_env = _env(_edits(document.get("containerEdits"), str(path)), str(path))
    return CdiSpec(kind, tuple(found), spec_env)


def read_cdi_spec(path: Path) -> CdiSpec:
    """The spec file at ``path`` (never followed if it is a link); SourceError when it cannot be used."""
    return parse_cdi_spec(read_bytes(path, limit=MAX_SPEC_BYTES), path)


def spec_files(directory: Path) -> tuple[Path, ...]:
    """The spec files of ``directory`` by name; empty when it does not exist."""
    try:
        with os.scandir(directory) as entries:
            names = sorted(entry.name for entry in entries if entry.name.endswith(SPEC_SUFFIXES))
    except (FileNotFoundError, NotADirectoryError):
        return ()
    except OSError as exc:
        raise SourceUnavailable(f"{directory}: {exc.strerror or exc}") from exc
    return tuple(directory / name for name in names if not name.startswith("."))
