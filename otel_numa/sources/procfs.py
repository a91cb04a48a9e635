"""Per-CPU times from ``<procfs-root>/stat`` and memory counters from ``<procfs-root>/meminfo``.

The meminfo parser is shared with sysfs: ``nodeN/meminfo`` has the same lines behind a ``Node N`` prefix.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from otel_numa.sources.errors import SourceCorrupt
from otel_numa.sources.files import read_text

# The columns of a ``cpuN`` line in /proc/stat, in the kernel's order. The two that follow (guest,
# guest_nice) are already counted inside user and nice, so they are left out.
CPU_MODES: tuple[str, ...] = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")

# Every kernel since 2.4 prints at least user, nice, system and idle.
_MIN_CPU_FIELDS = 4

_CPU_LABEL = re.compile(r"cpu(\d+)")
# "MemTotal:  123 kB", "Node 0 MemTotal:  123 kB", "HugePages_Total:   0"
_MEMINFO_LINE = re.compile(
    r"(?:Node\s+\d+\s+)?(?P<name>[^:\s][^:]*?):\s*(?P<value>\d+)(?:\s+(?P<unit>\S+))?\s*", re.ASCII
)
# No machine has 2**63 bytes of anything; a larger value is corrupt (and would not fit an exported int64).
MAX_AMOUNT = (1 << 63) - 1


def _user_hz() -> int:
    """Ticks per second of /proc/stat (USER_HZ); 100 on every mainstream architecture."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return 100
    return ticks if ticks > 0 else 100


USER_HZ = _user_hz()


def parse_cpu_times(text: str, user_hz: int = USER_HZ) -> dict[int, dict[str, float]]:
    """The ``cpuN`` lines of /proc/stat as seconds per mode; the aggregate ``cpu`` line is skipped.

    Modes a kernel does not print (older kernels stop after idle or iowait) are absent, not 0.
    """
    times: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        fields = line.split()
        label = _CPU_LABEL.fullmatch(fields[0])
        if label is None:
            continue
        try:
            ticks = [int(value) for value in fields[1 : 1 + len(CPU_MODES)]]
        except ValueError as exc:
            raise SourceCorrupt(f"bad /proc/stat line {line[:80]!r}") from exc
        if any(tick < 0 for tick in ticks):
            raise SourceCorrupt(f"negative time in /proc/stat line {line[:80]!r}")
        if len(ticks) < _MIN_CPU_FIELDS:
            raise SourceCorrupt(f"short /proc/stat line {line[:80]!r}")
        times[int(label.group(1))] = {
            mode: tick / user_hz for mode, tick in zip(CPU_MODES, ticks, strict=False)
        }
    if not times:
        raise SourceCorrupt("/proc/stat has no per-CPU lines")
    return times


def read_cpu_times(procfs_root: Path) -> dict[int, dict[str, float]]:
    """Seconds spent per CPU id and mode (see :data:`CPU_MODES`) since boot."""
    return parse_cpu_times(read_text(procfs_root / "stat"))


def parse_meminfo(text: str) -> dict[str, int]:
    """Fields of a meminfo file by name; ``kB`` values in bytes, unit-less values (page counts) as is.

    Works for /proc/meminfo and for sysfs ``nodeN/meminfo`` (whose lines start with ``Node N``);
    blank lines (older kernels start with one) are skipped.
    """
    fields: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _MEMINFO_LINE.fullmatch(line.strip())
        if match is None:
            raise SourceCorrupt(f"bad meminfo line {line[:80]!r}")
        value = int(match.group("value"))
        unit = match.group("unit")
        if unit is None:
            fields[match.group("name")] = value
        elif unit == "kB":
            fields[match.group("name")] = value * 1024
        else:
            raise SourceCorrupt(f"unknown unit in meminfo line {line[:80]!r}")
        if fields[match.group("name")] > MAX_AMOUNT:
            raise SourceCorrupt(f"out-of-range meminfo line {line[:80]!r}")
    return fields


def read_meminfo(procfs_root: Path) -> dict[str, int]:
    """``<procfs-root>/meminfo`` by field name (bytes; ``HugePages_*`` stay page counts)."""
    return parse_meminfo(read_text(procfs_root / "meminfo"))
