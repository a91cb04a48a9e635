"""The one place where the sources open files (sysfs, procfs, cgroups, kubelet checkpoints), strictly
read-only, and the small formats several of them share (CPU lists and masks, stat signatures)."""

from __future__ import annotations

import errno
import functools
import os
import resource
import stat
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from otel_numa.sources.errors import SourceCorrupt, SourceError, SourceMissing, SourceUnavailable

# Receives each error of one item (a file, a line, a field) while a read goes on without that item.
ErrorSink = Callable[[SourceError], None]

# More than any sysfs attribute holds (one page): such a file comes back in a single read.
READ_SIZE = 1 << 16

# Highest CPU id accepted anywhere (CPU lists, masks, the kubelet's CPU sets): far above any kernel's
# NR_CPUS (8192), low enough that a corrupt range such as "0-999999999" cannot exhaust memory. Where the
# machine's topology is known, its own highest CPU is the bound (``limit`` of :func:`parse_cpulist`).
MAX_CPU_ID = 65535

# Highest NUMA node id of any Linux kernel: MAX_NUMNODES is at most 1024 (CONFIG_NODES_SHIFT <= 10).
MAX_NUMA_NODE_ID = 1023

# Byte caps per kind of file, far above any real one (docs/decisions/hostile-input.md): a larger file is
# rejected whole as ``too_large`` after reading one byte past the cap, so a sparse 1 GB file costs no more
# memory than the cap. A sysfs attribute is at most one page (4 KiB, 64 KiB on some arm64 kernels).
SYSFS_FILE_BYTES = 1 << 20
# /proc/stat grows with CPUs and interrupts: ~150 bytes per CPU, 8,192 CPUs and their IRQ counts stay
# under 4 MiB; /proc/meminfo is ~1.5 KB.
PROCFS_FILE_BYTES = 8 << 20
# memory.numa_stat holds ~25 lines of one token per NUMA node: ~300 KB with 1,024 nodes.
CGROUP_FILE_BYTES = 1 << 20

# error.type words of the checks every read makes
NOT_REGULAR = "not_regular_file"  # a FIFO, socket or device where a file is expected
SYMLINK = "symlink"  # the file itself is a symbolic link: never followed
TOO_LARGE = "too_large"
OUT_OF_RANGE = "out_of_range"  # a CPU or NUMA node id the machine does not have

# O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer; it is then refused as not a
# regular file. O_NOFOLLOW: a file that is itself a link is refused rather than read wherever it points.
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW


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


def read_bytes(path: str | Path, *, limit: int = SYSFS_FILE_BYTES) -> bytes:
    """The bytes of the regular file ``path``, with os-level calls (files read every round stay cheap).

    Never blocks on a FIFO or device, never follows ``path`` itself when it is a symbolic link, and reads at
    most ``limit + 1`` bytes. A file that does not exist, or whose cgroup or device is gone (``ENODEV``),
    raises :class:`SourceMissing`; a link, a FIFO, a socket, a device, or a file larger than ``limit``
    raises :class:`SourceCorrupt` (rejected whole, error types :data:`SYMLINK`, :data:`NOT_REGULAR`,
    :data:`TOO_LARGE`); any other failure, a directory in place of the file included, raises
    :class:`SourceUnavailable`. A read shorter than asked for ends the file: sysfs returns an attribute
    whole, a regular file up to its end.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)  # read-only, never created
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise SourceMissing(f"{path}: not found") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SourceCorrupt(f"{path}: a symbolic link, not followed", error_type=SYMLINK) from exc
        raise _open_error(path, exc) from exc
    try:
        status = os.fstat(fd)
        if stat.S_ISDIR(status.st_mode):
            raise SourceUnavailable(f"{path}: is a directory")
        if not stat.S_ISREG(status.st_mode):
            raise SourceCorrupt(f"{path}: not a regular file", error_type=NOT_REGULAR)
        if status.st_size > limit:  # a real file says its size; sysfs and procfs files say 4096 or 0
            raise SourceCorrupt(f"{path}: larger than {limit} bytes", error_type=TOO_LARGE)
        # one read is the whole file unless it fills the buffer: then read on to the end (or the limit)
        cap = min(READ_SIZE, limit + 1)
        data = os.read(fd, cap)
        if len(data) == cap and len(data) <= limit:
            chunks, size = [data], len(data)
            while size <= limit:
                chunk = os.read(fd, min(READ_SIZE, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
    except OSError as exc:
        raise _open_error(path, exc) from exc
    finally:
        os.close(fd)
    if len(data) > limit:
        raise SourceCorrupt(f"{path}: larger than {limit} bytes", error_type=TOO_LARGE)
    return data


class _OpenFiles:
    """The files kept open by every :class:`KeptFiles` of the process together: at most half of what the
    process may open (a DaemonSet's container may usually open a million, a login shell 1,024), so that
    agents that a program makes and drops (tests) never leave it without descriptors."""

    def __init__(self) -> None:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.budget = soft // 2 if soft != resource.RLIM_INFINITY else 1 << 20
        self.count = 0
        self.lock = threading.Lock()

    def close(self, fds: dict[str, dict[str, int]]) -> None:
        """Close ``fds`` (directory -> file name -> descriptor) and forget them."""
        with self.lock:
            self.count -= sum(map(len, fds.values()))
        for in_directory in fds.values():
            for fd in in_directory.values():
                os.close(fd)
        fds.clear()


_OPEN_FILES = _OpenFiles()


_NO_FILES: Mapping[str, int] = {}  # the files kept in a directory where none are (never written)


class KeptFiles:
    """Files read again every round (each container's cgroup files), kept open between rounds: reading
    one again is one ``pread(2)`` at offset 0 instead of open, fstat, read and close. On kernfs (sysfs,
    cgroupfs) a read at offset 0 has the kernel print the file anew; on any other filesystem it reads what
    the file holds now, written in place. A file replaced by another (renamed over, removed and made
    again) is not seen through the old descriptor: the owner forgets a directory's files when its entries
    change (:meth:`forget_under`, from an inotify event), and says in which directories files may be kept
    at all (:meth:`retain_under`: the ones watched). A file is opened and checked as :func:`read_bytes`
    does; at most ``capacity`` files are kept open, within the process's budget (:class:`_OpenFiles`),
    others are opened for each read. A file that cannot be read is forgotten, and opened again at its next
    read. Closed when dropped. Not thread-safe: one reading thread.

    A file is named by its directory and its name: thousands of containers' files are kept under the
    directory string each container already holds, not under a long path of their own each."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._fds: dict[str, dict[str, int]] = {}  # directory -> file name -> descriptor
        self._count = 0
        self._keepable: set[str] | None = None  # directories whose files may be kept; None: any
        self._closer = weakref.finalize(self, _OPEN_FILES.close, self._fds)

    def __len__(self) -> int:
        return self._count

    def read_kept(self, directory: str, first: str, second: str) -> tuple[bytes, bytes] | None:
        """The bytes of two files of ``directory`` when both are kept open and one ``pread`` each reads
        them whole; else ``None`` (read them with :meth:`read_optional`, which opens them, or tells what is
        wrong). Two at once: a container's round is its two counter files, and this is the loop that
        runs for every container every round."""
        kept = self._fds.get(directory, _NO_FILES)
        first_fd, second_fd = kept.get(first), kept.get(second)
        if first_fd is None or second_fd is None:
            return None
        try:
            first_data, second_data = os.pread(first_fd, READ_SIZE, 0), os.pread(second_fd, READ_SIZE, 0)
        except OSError:
            return None
        if 0 < len(first_data) < READ_SIZE and 0 < len(second_data) < READ_SIZE:
            return first_data, second_data
        return None

    def read_optional(self, directory: str, name: str, *, limit: int = SYSFS_FILE_BYTES) -> bytes | None:
        """Like :meth:`read`, but a missing file is ``None`` instead of an error."""
        fd = self._fds.get(directory, _NO_FILES).get(name)
        if fd is not None:  # the common case, on its own path: one pread, nothing else
            try:
                data = os.pread(fd, READ_SIZE, 0)
            except OSError:
                data = b""
            if 0 < len(data) < READ_SIZE and len(data) <= limit:
                return data
        try:
            return self.read(directory, name, limit=limit)
        except SourceMissing:
            return None

    def read(self, directory: str, name: str, *, limit: int = SYSFS_FILE_BYTES) -> bytes:
        """The bytes of ``directory/name``, as :func:`read_bytes` gives them (and raises)."""
        path = f"{directory}/{name}"
        fd = self._fds.get(directory, _NO_FILES).get(name)
        if fd is None:
            keepable = self._keepable
            if (
                self._count >= self.capacity
                or (keepable is not None and directory not in keepable)
                or _OPEN_FILES.count >= _OPEN_FILES.budget
            ):
                return read_bytes(path, limit=limit)
            fd = _open_regular(path, limit)
            with _OPEN_FILES.lock:
                _OPEN_FILES.count += 1
            self._fds.setdefault(directory, {})[name] = fd
            self._count += 1
        try:
            return _read_at_start(fd, path, limit)
        except SourceError:
            self._close(directory, name)
            raise

    def forget_under(self, directory: str) -> None:
        """Close the files kept in ``directory`` (its entries changed: a file may have been replaced)."""
        for name in list(self._fds.get(directory, ())):
            self._close(directory, name)

    def retain_under(self, directories: set[str]) -> None:
        """Keep files open only in ``directories`` from now on; the others are closed."""
        self._keepable = directories
        for directory in [directory for directory in self._fds if directory not in directories]:
            self.forget_under(directory)

    def close(self) -> None:
        _OPEN_FILES.close(self._fds)
        self._count = 0

    def _close(self, directory: str, name: str) -> None:
        in_directory = self._fds.get(directory)
        fd = in_directory.pop(name, None) if in_directory is not None else None
        if fd is None:
            return
        if not in_directory:
            del self._fds[directory]
        self._count -= 1
        with _OPEN_FILES.lock:
            _OPEN_FILES.count -= 1
        os.close(fd)


def _open_regular(path: str, limit: int) -> int:
    """``path`` opened as :func:`read_bytes` opens it and checked to be a regular file of at most
    ``limit`` bytes by its size (kernfs and procfs files say 4096 or 0)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise SourceMissing(f"{path}: not found") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SourceCorrupt(f"{path}: a symbolic link, not followed", error_type=SYMLINK) from exc
        raise _open_error(path, exc) from exc
    try:
        status = os.fstat(fd)
        if stat.S_ISDIR(status.st_mode):
            raise SourceUnavailable(f"{path}: is a directory")
        if not stat.S_ISREG(status.st_mode):
            raise SourceCorrupt(f"{path}: not a regular file", error_type=NOT_REGULAR)
        if status.st_size > limit:
            raise SourceCorrupt(f"{path}: larger than {limit} bytes", error_type=TOO_LARGE)
    except OSError as exc:
        os.close(fd)
        raise _open_error(path, exc) from exc
    except SourceError:
        os.close(fd)
        raise
    return fd


def _read_at_start(fd: int, path: str, limit: int) -> bytes:
    """The file of ``fd`` from its start, at most ``limit`` bytes (then ``too_large``)."""
    cap = min(READ_SIZE, limit + 1)
    try:
        data = os.pread(fd, cap, 0)
        if len(data) == cap and len(data) <= limit:
            if os.fstat(fd).st_size > limit:  # a regular file grown past the cap: not read on
                raise SourceCorrupt(f"{path}: larger than {limit} bytes", error_type=TOO_LARGE)
            chunks, size = [data], len(data)
            while size <= limit:
                chunk = os.pread(fd, min(READ_SIZE, limit + 1 - size), size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
    except OSError as exc:
        raise _open_error(path, exc) from exc
    if len(data) > limit:
        raise SourceCorrupt(f"{path}: larger than {limit} bytes", error_type=TOO_LARGE)
    return data


def _open_error(path: str | Path, exc: OSError) -> SourceError:
    if exc.errno == errno.ENODEV:  # the cgroup or device went away while we read it
        return SourceMissing(f"{path}: gone")
    return SourceUnavailable(f"{path}: {exc.strerror or exc}")


def read_text(path: str | Path, *, limit: int = SYSFS_FILE_BYTES) -> str:
    """A small text file; trailing NULs (some sysfs files end with one) are dropped."""
    return read_bytes(path, limit=limit).rstrip(b"\x00").decode("utf-8", errors="replace")


def read_optional_text(path: str | Path, *, limit: int = SYSFS_FILE_BYTES) -> str | None:
    """Like :func:`read_text`, but a missing file is ``None`` instead of an error."""
    try:
        return read_text(path, limit=limit)
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
def parse_cpulist(text: str, limit: int = MAX_CPU_ID) -> frozenset[int]:
    """Parse the kernel's list format, e.g. ``0-3,8,10-11`` (an empty string is the empty set); a CPU id
    above ``limit`` (the machine's highest, when known) makes the list corrupt (``out_of_range``)."""
    cpus: set[int] = set()
    for part in text.strip().strip("\x00").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                low_text, high_text = part.split("-", 1)
                low, high = int(low_text), int(high_text)
                if high < low or low < 0:
                    raise ValueError(part)
                if high > limit:
                    raise SourceCorrupt("a CPU the machine does not have", error_type=OUT_OF_RANGE)
                cpus.update(range(low, high + 1))
            else:
                cpu = int(part)
                if cpu < 0:
                    raise ValueError(part)
                if cpu > limit:
                    raise SourceCorrupt("a CPU the machine does not have", error_type=OUT_OF_RANGE)
                cpus.add(cpu)
        except ValueError as exc:
            raise SourceCorrupt("bad CPU list") from exc  # never quoted: a link may lead anywhere
    return frozenset(cpus)


def parse_cpumask(text: str) -> frozenset[int]:
    """Parse the kernel's hex mask format, e.g. ``00000000,0000ff0f`` (32-bit words, high word first)."""
    words = text.strip().strip("\x00").replace("\n", "").split(",")
    try:
        value = int("".join(word.strip() for word in words) or "0", 16)
    except ValueError as exc:
        raise SourceCorrupt("bad CPU mask") from exc
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
