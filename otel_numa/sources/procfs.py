"""Per-CPU times from ``<procfs-root>/stat`` and memory counters from ``<procfs-root>/meminfo``.

The meminfo parser is shared with sysfs: ``nodeN/meminfo`` has the same lines behind a ``Node N`` prefix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import zip_longest
from operator import itemgetter
from pathlib import Path

from otel_numa.sources.errors import SourceCorrupt
from otel_numa.sources.files import PROCFS_FILE_BYTES, ErrorSink, naming, read_text, report, whole_lines

# The columns of a ``cpuN`` line in /proc/stat, in the kernel's order. The two that follow (guest,
# guest_nice) are already counted inside user and nice, so they are left out.
CPU_MODES: tuple[str, ...] = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")

# Every kernel since 2.4 prints at least user, nice, system and idle.
_MIN_CPU_FIELDS = 4

_CPU_LABEL = re.compile(r"cpu(\d+)")
# For the column-wise parse of an ASCII /proc/stat (where \d is the same as in _CPU_LABEL)
_CPU_LABEL_BYTES = re.compile(rb"cpu(\d+)")
_OTHER_THAN_CPU_LINE = re.compile(rb"\n(?!cpu)")
# Every byte of the cpu lines as the kernel prints them: with nothing else, bytes and str split alike
# and no value can be negative.
_CPU_BLOCK_CHARS = b"0123456789 \ncpu"
# Every line of a meminfo file, as a field ("MemTotal:  123 kB", "Node 0 MemTotal:  123 kB",
# "HugePages_Total:   0") in the first three groups, or else whole in the fourth (blank or bad). Lines end at
# "\n"; spaces, tabs and "\r" around a field's parts are allowed.
_MEMINFO_LINES = re.compile(
    r"^(?:[ \t\r\f\v]*(?:Node[ \t]+\d+[ \t]+)?([^:\s][^:\n]*?)[ \t]*:[ \t]*(\d+)(?:[ \t]+(\S+))?"
    r"[ \t\r\f\v]*|([^\n]*))$",
    re.ASCII | re.MULTILINE,
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


def _parse_cpu_ticks(text: str, on_error: ErrorSink | None = None) -> tuple[dict[int, list[int]], set[int]]:
    """The ``cpuN`` lines of /proc/stat as ticks per mode (up to :data:`CPU_MODES`), by CPU id, and the
    ids whose line is bad (reported once per read; without a sink the first one raises).

    The reference parser: every check and error message lives here. A CPU listed twice keeps its last line.
    """
    ticks_by_cpu: dict[int, list[int]] = {}
    bad_cpus: set[int] = set()
    bad_lines: list[str] = []
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        fields = line.split()
        label = _CPU_LABEL.fullmatch(fields[0])
        if label is None:
            continue
        cpu = int(label.group(1))
        try:
            ticks = [int(value) for value in fields[1 : 1 + len(CPU_MODES)]]
        except ValueError:
            problem = "bad"
        else:
            problem = "negative time in" if any(tick < 0 for tick in ticks) else ""
            problem = problem or ("short" if len(ticks) < _MIN_CPU_FIELDS else "")
        if problem:
            if on_error is None:
                raise SourceCorrupt(f"{problem} /proc/stat line of cpu{cpu}")  # contents never quoted
            bad_lines.append(f"cpu{cpu}")
            bad_cpus.add(cpu)
            ticks_by_cpu.pop(cpu, None)
            continue
        ticks_by_cpu[cpu] = ticks
        bad_cpus.discard(cpu)
    if bad_lines:
        report(
            SourceCorrupt(f"/proc/stat: {len(bad_lines)} bad CPU line(s), first of {bad_lines[0]}"),
            on_error,
        )
    elif not ticks_by_cpu:
        report(SourceCorrupt("/proc/stat has no per-CPU lines"), on_error)
    return ticks_by_cpu, bad_cpus


def sum_ticks_by_node(
    ticks_by_cpu: Mapping[int, Sequence[int]], nodes_of_cpu: Mapping[int, Iterable[int]]
) -> dict[int, tuple[int, ...]]:
    """Per-CPU ticks summed per node and mode; a mode printed for only some CPUs counts 0 for the others.

    A CPU in no node is left out; a CPU that several nodes claim counts in each. A node none of whose CPUs
    has a line is absent.
    """
    rows_by_node: dict[int, list[Sequence[int]]] = {}
    for cpu, ticks in ticks_by_cpu.items():
        for node in nodes_of_cpu.get(cpu, ()):
            rows_by_node.setdefault(node, []).append(ticks)
    return {
        node: tuple(map(sum, zip_longest(*rows, fillvalue=0))) for node, rows in sorted(rows_by_node.items())
    }


def ticks_to_seconds(
    ticks_by_node: Mapping[int, Sequence[int]], user_hz: int = USER_HZ
) -> dict[int, dict[str, float]]:
    """Tick sums (in :data:`CPU_MODES` order) as seconds per mode name."""
    return {
        node: {mode: ticks / user_hz for mode, ticks in zip(CPU_MODES, sums, strict=False)}
        for node, sums in ticks_by_node.items()
    }


# Picks a node's rows out of one column of /proc/stat values.
_RowPicker = Callable[[Sequence[int]], Iterable[int]]


def _row_picker(rows: Sequence[int]) -> _RowPicker:
    """One C-level pick per column: a slice for consecutive rows (the usual node), else an itemgetter."""
    first, last = rows[0], rows[-1]
    if list(rows) == list(range(first, last + 1)):
        span = slice(first, last + 1)
        return lambda column: column[span]
    picker: _RowPicker = itemgetter(*rows)  # two or more rows here, so it returns a tuple
    return picker


class NodeCpuTimes:
    """CPU time per NUMA node and mode from /proc/stat, for one CPU -> nodes mapping (one per topology).

    Ticks are summed per node before the one conversion to seconds. The usual file (the ``cpu`` lines
    first, each with the same number of columns, nothing in them but labels and decimal digits) is parsed
    by columns: one split per line, one ``int()`` per needed value, and each node's sum picked by row
    numbers that are kept while the file lists the same CPUs in the same order. Anything else goes through
    the line-by-line parser, which gives the same result or judges each line: a node with a bad line is
    left out (with a sink) rather than summed without that CPU.
    """

    def __init__(self, nodes_of_cpu: Mapping[int, Iterable[int]]) -> None:
        self._nodes_of_cpu = {cpu: tuple(nodes) for cpu, nodes in nodes_of_cpu.items()}
        cpus_of_node: dict[int, set[int]] = {}
        for cpu, nodes in self._nodes_of_cpu.items():
            for node in nodes:
                cpus_of_node.setdefault(node, set()).add(cpu)
        self._cpus_of_node = {node: frozenset(cpus) for node, cpus in cpus_of_node.items()}
        self._labels: tuple[bytes, ...] | None = None
        self._listed: frozenset[int] = frozenset()
        self._pickers: tuple[tuple[int, _RowPicker], ...] = ()

    def parse_ticks(self, text: str, on_error: ErrorSink | None = None) -> dict[int, tuple[int, ...]]:
        """Tick sums per node id, in :data:`CPU_MODES` order, as many modes as the kernel prints, over the
        CPUs that have a line."""
        return self._parse(text, on_error)[0]

    def _parse(
        self, text: str, on_error: ErrorSink | None
    ) -> tuple[dict[int, tuple[int, ...]], frozenset[int]]:
        """The sums, and the CPUs with a good line."""
        # bytes split and int() faster than str; only ASCII reads the same either way
        sums = self._sum_columns(text.encode("ascii")) if text.isascii() else None
        if sums is not None:
            return sums, self._listed
        ticks_by_cpu, bad_cpus = _parse_cpu_ticks(text, on_error)
        spoiled = {node for cpu in bad_cpus for node in self._nodes_of_cpu.get(cpu, ())}
        sums = sum_ticks_by_node(ticks_by_cpu, self._nodes_of_cpu)
        return {node: row for node, row in sums.items() if node not in spoiled}, frozenset(ticks_by_cpu)

    def parse(self, text: str, user_hz: int = USER_HZ) -> dict[int, dict[str, float]]:
        """Seconds per node id and mode (see :data:`CPU_MODES`)."""
        return ticks_to_seconds(self.parse_ticks(text), user_hz)

    def read(self, procfs_root: Path, on_error: ErrorSink | None = None) -> dict[int, dict[str, float]]:
        """Seconds per node id and mode from ``<procfs-root>/stat``, for the nodes every one of whose CPUs
        has a good line: a node missing a CPU's share is absent, never low (its counter would step back).

        A line cut short (the file's end lost) is reported and dropped; a missing or unreadable file raises.
        """
        path = procfs_root / "stat"
        text, cut = whole_lines(read_text(path, limit=PROCFS_FILE_BYTES), path)
        if cut is not None:
            report(cut, on_error)
        sums, listed = self._parse(text, on_error)
        whole = {node: row for node, row in sums.items() if self._cpus_of_node.get(node, listed) <= listed}
        return ticks_to_seconds(whole)

    def _sum_columns(self, text: bytes) -> dict[int, tuple[int, ...]] | None:
        """The column-wise sums, or ``None`` when the file is not in the usual shape."""
        # The kernel prints the cpu lines first; "cpu" anywhere after them is not the usual shape.
        other_line = _OTHER_THAN_CPU_LINE.search(text)
        end = len(text) if other_line is None else other_line.start()
        if not text.startswith(b"cpu") or text.find(b"cpu", end) != -1:
            return None
        block = text[:end]
        if block.translate(None, _CPU_BLOCK_CHARS):  # only labels, digits, spaces and newlines
            return None
        # at most label, the modes and the rest of the line (guest columns are neither split nor read)
        rows = [line.split(None, len(CPU_MODES) + 1) for line in block.split(b"\n")]
        widths = set(map(len, rows))
        if len(widths) != 1:
            return None
        mode_count = min(widths.pop() - 1, len(CPU_MODES))
        if mode_count < _MIN_CPU_FIELDS:
            return None
        columns = list(zip(*rows, strict=True))
        labels: tuple[bytes, ...] = columns[0]
        if labels != self._labels and not self._map_rows(labels):
            return None
        try:
            values = [list(map(int, column)) for column in columns[1 : 1 + mode_count]]
        except ValueError:
            return None
        return {node: tuple(sum(pick(column)) for column in values) for node, pick in self._pickers}

    def _map_rows(self, labels: tuple[bytes, ...]) -> bool:
        """Row numbers of each node's CPUs for this order of lines; ``False`` when no line is a CPU's."""
        row_of_cpu: dict[int, int] = {}
        for row, label in enumerate(labels):
            match = _CPU_LABEL_BYTES.fullmatch(label)
            if match is not None:
                row_of_cpu[int(match.group(1))] = row  # a CPU listed twice keeps its last line
        if not row_of_cpu:
            return False
        rows_by_node: dict[int, list[int]] = {}
        for cpu, row in row_of_cpu.items():
            for node in self._nodes_of_cpu.get(cpu, ()):
                rows_by_node.setdefault(node, []).append(row)
        self._pickers = tuple((node, _row_picker(rows)) for node, rows in sorted(rows_by_node.items()))
        self._labels = labels
        self._listed = frozenset(row_of_cpu)
        return True


def parse_meminfo(text: str, on_error: ErrorSink | None = None) -> dict[str, int]:
    """Fields of a meminfo file by name; ``kB`` values in bytes, unit-less values (page counts) as is.

    Works for /proc/meminfo and for sysfs ``nodeN/meminfo`` (whose lines start with ``Node N``); blank
    lines (older kernels start with one) are skipped. One scan judges every line: each field stands alone,
    and a bad line is reported (once per file, with how many more) and left out; without a sink it fails
    the parse.
    """
    fields: dict[str, int] = {}
    errors: list[str] = []
    for name, digits, unit, other in _MEMINFO_LINES.findall(text):
        if not name:
            if other and not other.isspace():
                errors.append("a bad meminfo line")  # contents never quoted: a link may lead anywhere
            continue
        value = int(digits)
        if unit == "kB":
            value *= 1024
        elif unit:
            errors.append(f"unknown unit in meminfo line {name}")
            continue
        if value > MAX_AMOUNT:
            errors.append(f"out-of-range meminfo line {name}")
            continue
        fields[name] = value
    if errors:
        if on_error is None:
            raise SourceCorrupt(errors[0])
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        report(SourceCorrupt(f"{errors[0]}{more}"), on_error)
    return fields


def read_meminfo(procfs_root: Path, on_error: ErrorSink | None = None) -> dict[str, int]:
    """``<procfs-root>/meminfo`` by field name (bytes; ``HugePages_*`` stay page counts).

    A missing or unreadable file raises; a line cut short or a bad line is reported and left out.
    """
    path = procfs_root / "meminfo"
    text, cut = whole_lines(read_text(path, limit=PROCFS_FILE_BYTES), path)
    if cut is not None:
        report(cut, on_error)
    try:
        return parse_meminfo(text, naming(path, on_error))
    except SourceCorrupt as error:  # only without a sink
        raise SourceCorrupt(f"{path}: {error}") from error
