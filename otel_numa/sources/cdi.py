"""Container Device Interface (CDI) spec files: which device nodes each CDI device hands a container.

Written from the published CDI specification: a spec file (``.json``, ``.yaml`` or ``.yml``) holds
``cdiVersion``, ``kind`` (``vendor.com/class``), ``devices`` (each a ``name`` and ``containerEdits``) and
spec-wide ``containerEdits``. A device's fully qualified name is ``<kind>=<name>``. Only the device's own
``containerEdits.deviceNodes`` are kept: the spec-wide ones (control nodes such as ``/dev/nvidiactl``)
belong to every device of the vendor and tell nothing about where one device sits.

A file that does not parse or is not shaped as a spec is rejected whole (reported to the error sink);
the other files still count. When two files define the same device, the one read last wins (directories
in the order given, files by name), as the CDI cache resolves conflicts by directory priority.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_numa.sources.errors import SourceCorrupt, SourceError, SourceMissing, SourceUnavailable
from otel_numa.sources.files import ErrorSink, read_bytes, report

SPEC_SUFFIXES = (".json", ".yaml", ".yml")
MAX_SPEC_BYTES = 4 * 1024 * 1024
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


def _spec_document(data: bytes, path: Path) -> Any:
    """The file's document; SourceCorrupt (``parse_error``) when it is not JSON or YAML."""
    if path.suffix == ".json":
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as exc:  # json.JSONDecodeError is a ValueError
            raise SourceCorrupt(f"{path}: not JSON: {exc}", error_type="parse_error") from exc
    # Only nodes with YAML specs pay for the YAML parser.
    import yaml

    try:
        return yaml.safe_load(data)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise SourceCorrupt(f"{path}: not YAML: {exc}", error_type="parse_error") from exc


def _device_nodes(edits: Any, where: str) -> tuple[CdiDeviceNode, ...]:
    if edits is None:
        return ()
    if not isinstance(edits, dict):
        raise SourceCorrupt(f"{where}: containerEdits is not a mapping", error_type="invalid_spec")
    nodes = edits.get("deviceNodes") or []
    if not isinstance(nodes, list):
        raise SourceCorrupt(f"{where}: deviceNodes is not a list", error_type="invalid_spec")
    found = []
    for node in nodes:
        if not isinstance(node, dict) or not isinstance(node.get("path"), str) or not node["path"]:
            raise SourceCorrupt(f"{where}: a device node without a path", error_type="invalid_spec")
        numbers = [node.get("major"), node.get("minor")]
        if any(value is not None and (not isinstance(value, int) or value < 0) for value in numbers):
            raise SourceCorrupt(f"{where}: a bad major or minor number", error_type="invalid_spec")
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


def parse_cdi_spec(data: bytes, path: Path) -> dict[str, tuple[CdiDeviceNode, ...]]:
    """Fully qualified CDI device name -> its own device nodes; SourceCorrupt for a file that is no spec."""
    document = _spec_document(data, path)
    if not isinstance(document, dict):
        raise SourceCorrupt(f"{path}: not a CDI spec (no mapping at the top)", error_type="invalid_spec")
    kind = document.get("kind")
    if (
        not isinstance(document.get("cdiVersion"), str)
        or not isinstance(kind, str)
        or not _KIND.fullmatch(kind)
    ):
        raise SourceCorrupt(
            f"{path}: not a CDI spec (cdiVersion or kind missing or bad)", error_type="invalid_spec"
        )
    devices = document.get("devices")
    if not isinstance(devices, list):
        raise SourceCorrupt(f"{path}: devices is not a list", error_type="invalid_spec")
    found: dict[str, tuple[CdiDeviceNode, ...]] = {}
    for device in devices:
        name = device.get("name") if isinstance(device, dict) else None
        if not isinstance(name, str) or not _DEVICE_NAME.fullmatch(name):
            raise SourceCorrupt(f"{path}: a device without a valid name", error_type="invalid_spec")
        found[f"{kind}={name}"] = _device_nodes(device.get("containerEdits"), f"{path}: {kind}={name}")
    return found


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


def read_cdi_specs(
    directories: Iterable[Path], on_error: ErrorSink | None = None
) -> dict[str, tuple[CdiDeviceNode, ...]]:
    """Every CDI device of the spec files in ``directories``; a bad file is reported and left out."""
    devices: dict[str, tuple[CdiDeviceNode, ...]] = {}
    for directory in directories:
        for path in spec_files(directory):
            try:
                data = read_bytes(path, limit=MAX_SPEC_BYTES)
                if len(data) > MAX_SPEC_BYTES:
                    raise SourceCorrupt(f"{path}: larger than {MAX_SPEC_BYTES} bytes", error_type="too_large")
                devices.update(parse_cdi_spec(data, path))
            except SourceMissing:
                continue  # removed while listing
            except SourceError as error:
                report(error, on_error)
    return devices
