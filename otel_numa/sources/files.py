"""The one place where the sources open files (sysfs, procfs, cgroups, kubelet checkpoints), strictly
read-only, and the small formats several of them share (CPU lists and masks, stat signatures)."""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from otel_numa.sources.errors import SourceCorrupt, SourceError, SourceMissing, SourceUnavailable

# Receives each error of one item (a file, a line, a field) while a read goes on without that item.
ErrorSink = Callable[[SourceError], None]

# More than any sysfs attribute holds (one page): such a file comes back in a single read.
_READ_SIZE = 1 << 16

# Highest CPU id accepted anywhere (CPU lists, masks, the kubelet's CPU sets): far above any kernel's
# NR_CPUS (8192), low enough that a corrupt range such as "0-999999999" cannot exhaust memory.
MAX_CPU_ID = 65535


def report(error: SourceError, on_error: ErrorSink | None) -> None:
    """Hand an item's ``error`` to the sink; without one a corrupt item fails the whole read and an
    unreadable one is skipped (a node or cgroup going away mid-read)."""
    if on_error is not None:
        on_error(error)
    elif not isinstance(error, SourceUnavailable):
        raise error


def naming(path: str | Path, on_error: ErrorSink | None) -> ErrorSink | None:
    """``on_error`` with ``path`` named in each message (for parsers that only see the text)."""
    if on_error is None:
        return None
    sink = on_error
    return lambda error: sink(type(error)(f"{path}: {error}", error_type=error.error_type))


def read_bytes(path: str | Path, *, limit: int | None = None) -> bytes:
    """The file's bytes with os-level calls (files read every round stay cheap).

    At most ``limit + 1`` bytes are read when ``limit`` is given, so a caller can tell a file that is too
    large. A file that does not exist, or whose cgroup or device is gone (``ENODEV``), raises
    :class:`SourceMissing`; any other failure, a directory in place of the file included, raises
    :class:`SourceUnavailable`. A read shorter than asked for ends the file: sysfs returns an attribute
    whole, a regular file up to its end.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # read-only, never created
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise SourceMissing(f"{path}: not found") from exc
    except OSError as exc:
        raise _open_error(path, exc) from exc
    try:
        # one read is the whole file unless it fills the buffer: then read on to the end (or the limit)
        cap = _READ_SIZE if limit is None else min(_READ_SIZE, limit + 1)
        data = os.read(fd, cap)
        if len(data) == cap and (limit is None or len(data) <= limit):
            chunks, size = [data], len(data)
            while limit is None or size <= limit:
                chunk = os.read(fd, _READ_SIZE if limit is None else min(_READ_SIZE, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
    except OSError as exc:
        raise _open_error(path, exc) from exc
    finally:
        os.close(fd)
    return data


def _open_error(path: str | Path, exc: OSError) -> SourceError:
    if exc.errno == errno.ENODEV:  # the cgroup or device went away while we read it
        return SourceMissing(f"{path}: gone")
    return SourceUnavailable(f"{path}: {exc.strerror or exc}")


def read_text(path: str | Path) -> str:
    """A small text file; trailing NULs (some sysfs files end with one) are dropped."""
    return read_bytes(path).rstrip(b"\x00").decode("utf-8", errors="replace")


def read_optional_text(path: str | Path) -> str | None:
    """Like :func:`read_text`, but a missing file is ``None`` instead of an error."""
    try:
        return read_text(path)
    except SourceMissing:
        return None


def whole_lines(text: str, path: str | Path) -> tuple[str, SourceCorrupt | None]:
    """The complete lines of a kernel file, and an error when the file was cut short.

    The kernel ends every line it prints with a newline, so a file that does not end with one (an empty
    file included) lost its end: whatever follows the last newline is not trusted.
    """
    if text.endswith("\n"):
        return text, None
    kept = text[: text.rfind("\n") + 1]
    what = "empty" if not text else f"cut short after {len(text)} characters"
    return kept, SourceCorrupt(f"{path}: {what}")


def read_value_text(path: str | Path) -> str:
    """A one-line kernel attribute (a count, a list, a mask), its newline removed; ``SourceCorrupt`` when
    it was cut short or is empty."""
    text = read_text(path)
    error = whole_lines(text, path)[1]
    if error is not None:
        raise error
    return text[:-1]


# Remembered by text: the containers of a node share a few CPU lists (above all the shared pool), so a
# round parses each once and every container holds the same set. Few entries: on a 1,024-CPU machine a
# shared pool's set is ~40 KB, and each exclusive allocation changes the shared pool's text.
@functools.lru_cache(maxsize=64)
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
            raise SourceCorrupt(f"bad CPU list {text.strip()[:80]!r}") from exc
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
