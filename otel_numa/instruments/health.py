"""The agent's own health: source errors and the age of each source's data."""

from __future__ import annotations

from collections.abc import Iterator

from otel_numa.instruments.base import Instruments, Point
from otel_numa.snapshot import Snapshot


def register_health(instruments: Instruments) -> None:
    instruments.add(
        "counter",
        "numa.agent.source.errors",
        "{error}",
        "Failed reads of a data source, by source and error type.",
        _errors,
    )
    instruments.add(
        "gauge",
        "numa.agent.source.age",
        "s",
        "Seconds since the source's data was last known good.",
        _ages,
    )


def _errors(snapshot: Snapshot) -> Iterator[Point]:
    for report in snapshot.sources:
        for error_type, count in report.errors.items():
            yield count, {"numa.source": report.name, "error.type": error_type}


def _ages(snapshot: Snapshot) -> Iterator[Point]:
    for name, age in snapshot.source_ages().items():
        yield age, {"numa.source": name}
