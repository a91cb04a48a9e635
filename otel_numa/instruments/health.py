"""The agent's own health: source errors, data age and read durations, build stages
and what its process costs."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from otel_numa.instruments.base import Observe, Point
from otel_numa.series_attributes import EMPTY_ATTRIBUTES, series_attributes, series_maker
from otel_numa.snapshot.store import Snapshot

SOURCE = "numa.source"
STAGE = "numa.stage"
EXPORTER = "numa.exporter"

# the series' attributes made as the flat tuples the instruments keep: these series are observed again at
# every collection (their values are times and ages), and a tuple is compared with last time's in one step
_by_source = series_maker({}, (SOURCE,))
_by_source_and_error = series_maker({}, (SOURCE, "error.type"))
_by_stage = series_maker({}, (STAGE,))
_user, _system = (series_attributes({"cpu.mode": mode}) for mode in ("user", "system"))
_otlp = series_attributes({EXPORTER: "otlp"})
_by_otlp_error = series_maker({EXPORTER: "otlp"}, ("error.type",))


def _errors(snapshot: Snapshot) -> Iterator[Point]:
    for report in snapshot.sources:
        for error_type, count in report.errors.items():
            if count or report.present:  # a source that does not exist has no zero counters
                yield count, _by_source_and_error(report.name, error_type)


def _ages(snapshot: Snapshot) -> Iterator[Point]:
    for name, age in snapshot.source_ages().items():
        yield age, _by_source(name)


def _durations(snapshot: Snapshot) -> Iterator[Point]:
    for report in snapshot.sources:
        if report.last_duration_s is not None and report.present:
            yield report.last_duration_s, _by_source(report.name)


def _success(snapshot: Snapshot) -> Iterator[Point]:
    for report in snapshot.sources:
        if report.last_ok is not None:
            yield int(report.last_ok), _by_source(report.name)


def _stage_durations(snapshot: Snapshot) -> Iterator[Point]:
    for stage in snapshot.stages:
        yield stage.last_duration_s, _by_stage(stage.name)


def _stage_success(snapshot: Snapshot) -> Iterator[Point]:
    for stage in snapshot.stages:
        yield int(stage.last_ok), _by_stage(stage.name)


def _process_cpu(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.process is not None:
        yield snapshot.process.cpu_user_s, _user
        yield snapshot.process.cpu_system_s, _system


def _process_memory(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.process is not None:
        yield snapshot.process.resident_bytes, EMPTY_ATTRIBUTES


def _process_fds(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.process is not None:
        yield snapshot.process.open_file_descriptors, EMPTY_ATTRIBUTES


def _process_threads(snapshot: Snapshot) -> Iterator[Point]:
    if snapshot.process is not None:
        yield snapshot.process.threads, EMPTY_ATTRIBUTES


OBSERVERS: dict[str, Observe] = {
    "numa.agent.source.errors": _errors,
    "numa.agent.source.age": _ages,
    "numa.agent.source.duration": _durations,
    "numa.agent.source.success": _success,
    "numa.agent.stage.duration": _stage_durations,
    "numa.agent.stage.success": _stage_success,
    "process.cpu.time": _process_cpu,
    "process.memory.usage": _process_memory,
    "process.open_file_descriptor.count": _process_fds,
    "process.thread.count": _process_threads,
}


def fast_path_observers(fast_path: bool) -> dict[str, Observe]:
    """``numa.agent.fast_path``: which export path the pipeline chose when it was built."""

    def _fast_path(_snapshot: Snapshot) -> Iterator[Point]:
        yield int(fast_path), EMPTY_ATTRIBUTES

    return {"numa.agent.fast_path": _fast_path}


class Pushes(Protocol):
    """What the OTLP pushes did (otel_numa.export.otlp_deadline.PushRecord)."""

    @property
    def last_duration_s(self) -> float | None: ...
    @property
    def generation(self) -> object:
        """Another object after each push: the failures and the duration change only then."""

    def failures(self) -> Mapping[str, int]: ...
    def age_s(self) -> float: ...


def export_observers(pushes: Pushes) -> dict[str, Observe]:
    """``numa.agent.export.failures`` and ``.duration``: what the OTLP pushes did (the only push exporter
    they describe); they change with :attr:`Pushes.generation` only. ``.age`` is
    :func:`export_age_observers`'."""

    def _failures(_snapshot: Snapshot) -> Iterator[Point]:
        for error_type, count in pushes.failures().items():
            yield count, _by_otlp_error(error_type)

    def _duration(_snapshot: Snapshot) -> Iterator[Point]:
        duration = pushes.last_duration_s
        if duration is not None:
            yield duration, _otlp

    return {"numa.agent.export.failures": _failures, "numa.agent.export.duration": _duration}


def export_age_observers(pushes: Pushes) -> dict[str, Observe]:
    """``numa.agent.export.age``: seconds since the collector last accepted a push."""

    def _age(_snapshot: Snapshot) -> Iterator[Point]:
        yield pushes.age_s(), _otlp

    return {"numa.agent.export.age": _age}
