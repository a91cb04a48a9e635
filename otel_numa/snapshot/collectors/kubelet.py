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

from otel_numa.model import CpuManagerState, DeviceManagerState, KubeletState, MemoryManagerState, Source
from otel_numa.options import KubeletOptions
from otel_numa.snapshot.source_status import SourceRegistry, SourceTracker
from otel_numa.sources.checkpoints import device_manager, memory_manager
from otel_numa.sources.checkpoints.cpu_manager import cpus_beyond, read_cpu_manager_state
from otel_numa.sources.checkpoints.device_manager import read_device_checkpoint
from otel_numa.sources.checkpoints.dra_manager import read_dra_checkpoint
from otel_numa.sources.checkpoints.memory_manager import read_memory_manager_state
from otel_numa.sources.errors import SourceCorrupt, SourceError, SourceMissing
from otel_numa.sources.files import MAX_CPU_ID, OUT_OF_RANGE, SYMLINK, StatSignature
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

    def read(self, check: Callable[[T], None] | None = None) -> T | None:
        """The parsed file; ``check`` (raising :class:`SourceError`) rejects it whole for this round."""
        with self._tracker.timed():
            value = self._read()
            if value is not None and check is not None:
                try:
                    check(value)
                except SourceError as error:
                    self._signature = self._value = None  # checked again next round
                    self._tracker.failed(error)
                    return None
            return value

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


def _inside(root: Path, parse: Callable[[Path], T]) -> Callable[[Path], T]:
    """``parse``, for a file whose directory must not lead out of ``root`` by a symbolic link (the file
    itself is never followed); checked when the file is parsed, that is when it changed."""

    def parse_inside(path: Path) -> T:
        real_root, real = os.path.realpath(root), os.path.realpath(path.parent)
        if real != real_root and not real.startswith(real_root + os.sep):
            raise SourceCorrupt(f"{path}: its directory leads out of {root}", error_type=SYMLINK)
        return parse(path)

    return parse_inside


_NO_NAMES: dict[str, tuple[str, str]] = {}  # one shared object, so "unchanged" stays "the same object"


class KubeletCollector:
    """The checkpoints the enabled metrics need (``options.checkpoints``), ``pods/`` and the pod log names."""

    def __init__(self, options: KubeletOptions, registry: SourceRegistry) -> None:
        root = self.root = options.kubelet_root
        wanted = options.checkpoints
        self._highest_cpu = MAX_CPU_ID  # the machine's, once known: a CPU set is not expanded past it
        self.cpu = (
            CheckpointFile(
                root / CPU_MANAGER_FILE,
                lambda path: read_cpu_manager_state(path, self._highest_cpu),
                registry.tracker(Source.CPU_MANAGER),
            )
            if Source.CPU_MANAGER in wanted
            else None
        )
        self.memory = (
            CheckpointFile(
                root / MEMORY_MANAGER_FILE, read_memory_manager_state, registry.tracker(Source.MEMORY_MANAGER)
            )
            if Source.MEMORY_MANAGER in wanted
            else None
        )
        self.devices = (
            CheckpointFile(
                root / DEVICE_CHECKPOINT_FILE,
                _inside(root, read_device_checkpoint),
                registry.tracker(Source.DEVICE_MANAGER),
            )
            if Source.DEVICE_MANAGER in wanted
            else None
        )
        self.dra = (
            CheckpointFile(
                root / DRA_CHECKPOINT_FILE, read_dra_checkpoint, registry.tracker(Source.DRA_MANAGER)
            )
            if Source.DRA_MANAGER in wanted
            else None
        )
        self._pods = _DirectoryCache(root / "pods", _pod_directories)
        self._pod_names = _DirectoryCache(options.pod_logs_root, _pod_names)

    @property
    def watched_files(self) -> tuple[Path, ...]:
        files = (self.cpu, self.memory, self.devices, self.dra)
        return tuple(file.path for file in files if file is not None)

    def collect(self, highest_cpu: int | None = None, node_ids: frozenset[int] | None = None) -> KubeletState:
        """The checkpoints' state. A checkpoint naming a CPU above ``highest_cpu`` or a NUMA node not among
        ``node_ids`` (the machine's, when known) is not this machine's: rejected whole (``out_of_range``)."""

        self._highest_cpu = MAX_CPU_ID if highest_cpu is None else highest_cpu

        def beyond(path: Path) -> SourceCorrupt:
            return SourceCorrupt(
                f"{path}: a CPU or NUMA node the machine does not have", error_type=OUT_OF_RANGE
            )

        def cpus_on_machine(state: CpuManagerState) -> None:
            if highest_cpu is not None and cpus_beyond(state, highest_cpu):
                raise beyond(self.root / CPU_MANAGER_FILE)

        def memory_on_machine(state: MemoryManagerState) -> None:
            if node_ids and memory_manager.nodes_beyond(state, node_ids):
                raise beyond(self.root / MEMORY_MANAGER_FILE)

        def devices_on_machine(state: DeviceManagerState) -> None:
            if node_ids and device_manager.nodes_beyond(state, node_ids):
                raise beyond(self.root / DEVICE_CHECKPOINT_FILE)

        return KubeletState(
            cpu=self.cpu.read(cpus_on_machine) if self.cpu is not None else None,
            memory=self.memory.read(memory_on_machine) if self.memory is not None else None,
            devices=self.devices.read(devices_on_machine) if self.devices is not None else None,
            dra=self.dra.read() if self.dra is not None else None,
            live_pods=self._pods.get(),
            pod_names=self._pod_names.get() or _NO_NAMES,
        )
