"""The kubelet's checkpoints -> :class:`KubeletState`, re-parsed only when a file's stat signature changes.

Everything under the kubelet root is opened read-only; nothing is created, locked or written there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from otel_numa.model import KubeletState
from otel_numa.options import KubeletOptions
from otel_numa.snapshot.source_status import SourceRegistry, SourceTracker
from otel_numa.sources.checkpoints.cpu_manager import read_cpu_manager_state
from otel_numa.sources.checkpoints.device_manager import read_device_checkpoint
from otel_numa.sources.checkpoints.dra_manager import read_dra_checkpoint
from otel_numa.sources.checkpoints.memory_manager import read_memory_manager_state
from otel_numa.sources.errors import SourceError, SourceMissing
from otel_numa.sources.files import StatSignature
from otel_numa.sources.pod_logs import read_pod_identities

T = TypeVar("T")

RACY_LISTING_NS = 1_000_000_000
CPU_MANAGER_FILE = "cpu_manager_state"
MEMORY_MANAGER_FILE = "memory_manager_state"
DEVICE_CHECKPOINT_FILE = os.path.join("device-plugins", "kubelet_internal_checkpoint")
DRA_CHECKPOINT_FILE = "dra_manager_state"


class CheckpointFile(Generic[T]):
    """One checkpoint: parsed again only when its (inode, size, mtime) changes; rejected files are retried."""

    def __init__(self, path: Path, parse: Callable[[Path], T], tracker: SourceTracker) -> None:
        self.path = path
        self._parse = parse
        self._tracker = tracker
        self._signature: StatSignature | None = None
        self._value: T | None = None

    def read(self) -> T | None:
        with self._tracker.timed():
            return self._read()

    def _read(self) -> T | None:
        signature = StatSignature.of(self.path)
        if signature is None:
            self._signature = self._value = None
            self._tracker.failed(SourceMissing(f"{self.path}: not found"))
            return None
        if signature != self._signature or self._value is None:
            try:
                value = self._parse(self.path)
            except SourceError as error:
                # rejected whole for this round: no allocation from it, and parsed again next round
                self._signature = self._value = None
                self._tracker.failed(error)
                return None
            self._signature, self._value = signature, value
        self._tracker.succeeded()
        return self._value


@dataclass
class _DirectoryCache(Generic[T]):
    """A directory listing, re-read when the directory's mtime changes (entries added or removed).

    A listing taken less than a second after the directory's mtime is not trusted to stay current: on
    kernels with coarse timestamps an entry added in the same tick would not change the mtime again.
    """

    path: Path
    read: Callable[[Path], T]
    signature: StatSignature | None = None
    value: T | None = None

    def get(self) -> T | None:
        signature = StatSignature.of(self.path)
        if signature is None:
            self.signature = self.value = None
        elif signature != self.signature:
            try:
                racy = time.time_ns() - signature.mtime_ns < RACY_LISTING_NS
                self.value, self.signature = self.read(self.path), None if racy else signature
            except SourceError:
                self.value = self.signature = None
        return self.value


def _pod_directories(path: Path) -> frozenset[str]:
    try:
        return frozenset(entry.name for entry in os.scandir(path) if entry.is_dir(follow_symlinks=False))
    except OSError as exc:
        raise SourceMissing(f"{path}: {exc.strerror or exc}") from exc


def _pod_names(path: Path) -> dict[str, tuple[str, str]]:
    return {uid: (pod.namespace, pod.name) for uid, pod in read_pod_identities(path).items()}


_NO_NAMES: dict[str, tuple[str, str]] = {}  # one shared object, so "unchanged" stays "the same object"


class KubeletCollector:
    """The checkpoints the enabled metrics need (``options.checkpoints``), ``pods/`` and the pod log names."""

    def __init__(self, options: KubeletOptions, registry: SourceRegistry) -> None:
        root = options.kubelet_root
        wanted = options.checkpoints
        self.cpu = (
            CheckpointFile(root / CPU_MANAGER_FILE, read_cpu_manager_state, registry.tracker("cpu_manager"))
            if "cpu_manager" in wanted
            else None
        )
        self.memory = (
            CheckpointFile(
                root / MEMORY_MANAGER_FILE, read_memory_manager_state, registry.tracker("memory_manager")
            )
            if "memory_manager" in wanted
            else None
        )
        self.devices = (
            CheckpointFile(
                root / DEVICE_CHECKPOINT_FILE, read_device_checkpoint, registry.tracker("device_manager")
            )
            if "device_manager" in wanted
            else None
        )
        self.dra = (
            CheckpointFile(root / DRA_CHECKPOINT_FILE, read_dra_checkpoint, registry.tracker("dra_manager"))
            if "dra_manager" in wanted
            else None
        )
        self._pods = _DirectoryCache(root / "pods", _pod_directories)
        self._pod_names = _DirectoryCache(options.pod_logs_root, _pod_names)

    @property
    def watched_files(self) -> tuple[Path, ...]:
        files = (self.cpu, self.memory, self.devices, self.dra)
        return tuple(file.path for file in files if file is not None)

    def collect(self) -> KubeletState:
        return KubeletState(
            cpu=self.cpu.read() if self.cpu is not None else None,
            memory=self.memory.read() if self.memory is not None else None,
            devices=self.devices.read() if self.devices is not None else None,
            dra=self.dra.read() if self.dra is not None else None,
            live_pods=self._pods.get(),
            pod_names=self._pod_names.get() or _NO_NAMES,
        )
