"""Per-CPU times from ``<procfs-root>/stat`` and memory counters from ``<procfs-root>/meminfo``.

The meminfo parser is shared with sysfs: ``nodeN/meminfo`` has the same lines behind a ``Node N`` prefix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
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

_CPU_LABEL = re.compile(rb"cpu(\d+)")
_CPU_LINES = re.compile(rb"^cpu.*", re.MULTILINE)  # "." stops at the line's end
_OTHER_THAN_CPU_LINE = re.compile(rb"\n(?!cpu)")
# a cpu line split into its label, the modes read, and the rest (guest columns: neither split nor read)
_SPLITS = len(CPU_MODES) + 1
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


# Picks a node's rows out of one column of /proc/stat values.
_RowPicker = Callable[[Sequence[int]], Iterable[int]]


def _row_picker(rows: Sequence[int]) -> _RowPicker:
    """One C-level pick per column: a slice for consecutive rows (the usual node), else an itemgetter."""
    first, last = rows[0], rows[-1]
    if list(rows) == list(range(first, last + 1)):
        span = slice(first, last + 1)
        return lambda column: column[span]
    if len(rows) == 1:
        return lambda column: (column[first],)
    picker: _RowPicker = itemgetter(*rows)  # two or more rows here, so it returns a tuple
    return picker


def ticks_to_seconds(
    ticks_by_node: Mapping[int, Sequence[int]], user_hz: int = USER_HZ
) -> dict[int, dict[str, float]]:
    """Tick sums (in :data:`CPU_MODES` order) as seconds per mode name."""
    return {
        node: {mode: ticks / user_hz for mode, ticks in zip(CPU_MODES, sums, strict=False)}
        for node, sums in ticks_by_node.items()
    }


@dataclass(frozen=True)
class _Layout:
    """Where each CPU's line is among a file's ``cpu`` lines, for one order of labels."""

    rows: tuple[int, ...]  # the lines read: each CPU's last one, in file order
    cpus: tuple[int, ...]  # the CPU of each of those rows
    pickers: tuple[tuple[int, _RowPicker], ...]  # per node, the rows of its CPUs


class NodeCpuTimes:
    """CPU time per NUMA node and mode from /proc/stat, for one CPU -> nodes mapping (one per topology).

    One parse, one pass: the ``cpu`` lines are split once (label, the modes, the rest); each CPU's last line
    is its own (labels that are not ``cpuN``, like the total ``cpu`` line, are skipped). A line is good when
    it has at least :data:`_MIN_CPU_FIELDS` modes, every one a non-negative integer. In the kernel's usual
    file every line has as many columns, and the checks and sums run a column at a time (one ``int()`` per
    value, each node's sum picked by row positions kept while the file lists the same CPUs in the same
    order); otherwise each line is judged on its own, and a mode some lines lack counts 0 for them. Ticks
    are summed per node before the one conversion to seconds; a node with a bad line is left out (with a
    sink) rather than summed without that CPU.
    """

    def __init__(self, nodes_of_cpu: Mapping[int, Iterable[int]]) -> None:
        self._nodes_of_cpu = {cpu: tuple(nodes) for cpu, nodes in nodes_of_cpu.items()}
        cpus_of_node: dict[int, set[int]] = {}
        for cpu, nodes in self._nodes_of_cpu.items():
            for node in nodes:
                cpus_of_node.setdefault(node, set()).add(cpu)
        self._cpus_of_node = {node: frozenset(cpus) for node, cpus in cpus_of_node.items()}
        self._labels: tuple[bytes, ...] | None = None
        self._layout = _Layout((), (), ())

    def parse_ticks(self, text: str, on_error: ErrorSink | None = None) -> dict[int, tuple[int, ...]]:
        """Tick sums per node id, in :data:`CPU_MODES` order, as many modes as the kernel prints, over the
        CPUs that have a good line."""
        return self._parse(text, on_error)[0]

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

    def _parse(
        self, text: str, on_error: ErrorSink | None
    ) -> tuple[dict[int, tuple[int, ...]], frozenset[int]]:
        """The sums per node, and the CPUs with a good line."""
        data = text.encode("utf-8", "surrogateescape")
        lines = [line.split(None, _SPLITS) for line in _cpu_lines(data)]
        layout = self._layout_of(tuple(line[0] for line in lines))
        if not layout.rows:
            report(SourceCorrupt("/proc/stat has no per-CPU lines"), on_error)
            return {}, frozenset()
        sums = _column_sums(lines, layout, signed=b"-" in data)
        if sums is not None:
            return sums, frozenset(layout.cpus)
        return self._judged_sums([lines[row] for row in layout.rows], layout, on_error)

    def _layout_of(self, labels: tuple[bytes, ...]) -> _Layout:
        if labels == self._labels:
            return self._layout
        row_of_cpu: dict[int, int] = {}
        for row, label in enumerate(labels):
            match = _CPU_LABEL.fullmatch(label)
            if match is not None:
                row_of_cpu[int(match.group(1))] = row  # a CPU listed twice keeps its last line
        ordered = sorted(row_of_cpu.items(), key=lambda item: item[1])
        rows_of_node: dict[int, list[int]] = {}
        for cpu, row in ordered:
            for node in self._nodes_of_cpu.get(cpu, ()):
                rows_of_node.setdefault(node, []).append(row)
        self._labels = labels
        self._layout = _Layout(
            rows=tuple(row for _cpu, row in ordered),
            cpus=tuple(cpu for cpu, _row in ordered),
            pickers=tuple((node, _row_picker(rows)) for node, rows in sorted(rows_of_node.items())),
        )
        return self._layout

    def _judged_sums(
        self, rows: list[list[bytes]], layout: _Layout, on_error: ErrorSink | None
    ) -> tuple[dict[int, tuple[int, ...]], frozenset[int]]:
        """The sums when the lines are not all alike: each line judged on its own."""
        good: dict[int, list[int]] = {}
        bad: list[int] = []
        for row, cpu in zip(rows, layout.cpus, strict=True):
            ticks, problem = _ticks_of(row)
            if problem:
                if on_error is None:
                    raise SourceCorrupt(f"{problem} /proc/stat line of cpu{cpu}")  # contents never quoted
                bad.append(cpu)
            else:
                good[cpu] = ticks
        if bad:
            report(SourceCorrupt(f"/proc/stat: {len(bad)} bad CPU line(s), first of cpu{bad[0]}"), on_error)
        spoiled = {node for cpu in bad for node in self._nodes_of_cpu.get(cpu, ())}
        by_node: dict[int, list[list[int]]] = {}
        for cpu, ticks in good.items():
            for node in self._nodes_of_cpu.get(cpu, ()):
                by_node.setdefault(node, []).append(ticks)
        sums = {
            node: tuple(map(sum, zip_longest(*rows_of_node, fillvalue=0)))
            for node, rows_of_node in sorted(by_node.items())
            if node not in spoiled
        }
        return sums, frozenset(good)


def _cpu_lines(data: bytes) -> list[bytes]:
    """The ``cpu`` lines: the kernel prints them first, so the usual file is cut where they end."""
    other = _OTHER_THAN_CPU_LINE.search(data)
    end = len(data) if other is None else other.start()
    if data.startswith(b"cpu") and data.find(b"\ncpu", end) == -1:
        return data[:end].split(b"\n")
    return _CPU_LINES.findall(data)


def _column_sums(
    lines: list[list[bytes]], layout: _Layout, signed: bool
) -> dict[int, tuple[int, ...]] | None:
    """The sums a column at a time, when every ``cpu`` line (the total and any repeated line too) has as
    many good modes; else None. ``signed``: whether the file holds a minus sign at all."""
    rows = lines
    widths = set(map(len, rows))
    if len(widths) != 1:
        return None
    mode_count = min(widths.pop() - 1, len(CPU_MODES))
    if mode_count < _MIN_CPU_FIELDS:
        return None
    columns = list(zip(*rows, strict=True))[1 : 1 + mode_count]
    try:
        values = [list(map(int, column)) for column in columns]
    except ValueError:
        return None
    if signed and any(min(column) < 0 for column in values):
        return None
    return {node: tuple(sum(pick(column)) for column in values) for node, pick in layout.pickers}


def _ticks_of(row: list[bytes]) -> tuple[list[int], str]:
    """One line's ticks per mode, or why the line is bad."""
    try:
        ticks = [int(value) for value in row[1 : 1 + len(CPU_MODES)]]
    except ValueError:
        return [], "bad"
    if any(tick < 0 for tick in ticks):
        return [], "negative time in"
    if len(ticks) < _MIN_CPU_FIELDS:
        return [], "short"
    return ticks, ""


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
