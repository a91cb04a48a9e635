"""Small helpers for reading sysfs, procfs and kubelet files, strictly read-only."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from otel_numa.sources.errors import SourceCorrupt, SourceMissing, SourceUnavailable


def read_text(path: Path) -> str:
    """Read a small text file; trailing NULs (some sysfs files end with one) are dropped."""
    try:
        with open(path, "rb") as handle:  # read-only, never created
            data = handle.read()
    except FileNotFoundError as exc:
        raise SourceMissing(f"{path}: not found") from exc
    except NotADirectoryError as exc:
        raise SourceMissing(f"{path}: not found") from exc
    except OSError as exc:
        raise SourceUnavailable(f"{path}: {exc.strerror or exc}") from exc
    return data.rstrip(b"\x00").decode("utf-8", errors="replace")


def read_optional_text(path: Path) -> str | None:
    """Like :func:`read_text`, but a missing file is ``None`` instead of an error."""
    try:
        return read_text(path)
    except SourceMissing:
        return None


# Far above any real machine (the kernel's NR_CPUS tops out at 8192): a corrupt range must not eat memory.
MAX_CPU_ID = 1 << 16


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse the kernel's list format, e.g. ``0-3,8,10-11`` (an empty string is the empty set)."""
    cpus: set[int] = set()
    for part in text.strip().strip("\x00").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                low_text, high_text = part.split("-", 1)
                low, high = int(low_text), int(high_text)
                if high < low or high > MAX_CPU_ID:
                    raise ValueError(part)
                cpus.update(range(low, high + 1))
            else:
                cpu = int(part)
                if not 0 <= cpu <= MAX_CPU_ID:
                    raise ValueError(part)
                cpus.add(cpu)
        except ValueError as exc:
            raise SourceCorrupt(f"bad CPU list {text.strip()!r}") from exc
    return frozenset(cpus)


def parse_cpumask(text: str) -> frozenset[int]:
    """Parse the kernel's hex mask format, e.g. ``00000000,0000ff0f`` (32-bit words, high word first)."""
    words = text.strip().strip("\x00").replace("\n", "").split(",")
    try:
        value = int("".join(word.strip() for word in words) or "0", 16)
    except ValueError as exc:
        raise SourceCorrupt(f"bad CPU mask {text.strip()[:80]!r}") from exc
    if value.bit_length() > MAX_CPU_ID + 1:  # a corrupt or hostile file must not cost seconds to expand
        raise SourceCorrupt(f"CPU mask wider than {MAX_CPU_ID + 1} bits")
    return frozenset(bit for bit, digit in enumerate(reversed(f"{value:b}")) if digit == "1")


def format_cpulist(cpus: frozenset[int] | set[int]) -> str:
    """The inverse of :func:`parse_cpulist`, with ranges collapsed (``0-3,8``)."""
    ordered = sorted(cpus)
    parts: list[str] = []
    start = prev = None
    for cpu in ordered:
        if start is None:
            start = prev = cpu
        elif prev is not None and cpu == prev + 1:
            prev = cpu
        else:
            parts.append(f"{start}-{prev}" if start != prev else f"{start}")
            start = prev = cpu
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ",".join(parts)


@dataclass(frozen=True, slots=True)
class StatSignature:
    """What tells that a file changed without reading it: the kubelet replaces files by rename."""

    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> StatSignature | None:
        """The file's signature, or ``None`` when it does not exist (or cannot be stat'ed)."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cls(st.st_ino, st.st_size, st.st_mtime_ns)
