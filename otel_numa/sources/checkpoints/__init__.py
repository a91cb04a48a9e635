"""Readers of the kubelet's checkpoint files, verifying their checksums exactly as the kubelet does.

Each ``parse_*`` takes the file's bytes; each ``read_*`` takes a path, opens it read-only and raises
:class:`SourceMissing` when it is absent. A file that does not parse, whose JSON types fit no layout, or
whose checksum matches no layout raises :class:`SourceCorrupt`, with ``error_type`` one of
``parse_error``, ``wrong_type``, ``checksum_mismatch``, ``invalid_value``, ``unsupported_layout``,
``too_large``. Nothing but :class:`SourceError` escapes, whatever the bytes.
"""

from otel_numa.model import (
    CpuManagerState,
    DeviceEntry,
    DeviceManagerState,
    MemoryBlock,
    MemoryManagerState,
    MemoryTable,
    NumaMemoryState,
)
from otel_numa.sources.checkpoints.cpu_manager import parse_cpu_manager_state, read_cpu_manager_state
from otel_numa.sources.checkpoints.device_manager import (
    NO_NUMA_AFFINITY,
    parse_device_checkpoint,
    read_device_checkpoint,
)
from otel_numa.sources.checkpoints.memory_manager import parse_memory_manager_state, read_memory_manager_state

__all__ = [
    "NO_NUMA_AFFINITY",
    "CpuManagerState",
    "DeviceEntry",
    "DeviceManagerState",
    "MemoryBlock",
    "MemoryManagerState",
    "MemoryTable",
    "NumaMemoryState",
    "parse_cpu_manager_state",
    "parse_device_checkpoint",
    "parse_memory_manager_state",
    "read_cpu_manager_state",
    "read_device_checkpoint",
    "read_memory_manager_state",
]
