"""What every accelerator patch declares about itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Patch:
    """One named unit of the accelerated path. It acts only on the agent's own MeterProvider, readers or
    page, never on a library function for the whole process, and imports no private name until
    :attr:`check` runs."""

    name: str
    replaces: str  # the public-path work it replaces
    # every internal of another package it relies on: private names, and unexported helpers or shapes of
    # public calls that their documentation does not promise
    private_names: tuple[str, ...]
    # Tries the patch on throwaway objects of the installed libraries: None when it gives exactly what the
    # public path gives, else why not. Any exception it raises means "not this shape".
    check: Callable[[], str | None]
    # set for a patch kept for what it does rather than for speed (the ledger's 5% rule does not apply)
    kept_for: str = ""
    # patches it builds on: it serves only where they serve too (and comes after them in PATCHES)
    requires: tuple[str, ...] = ()


def point_summaries(data: Any) -> list[tuple[str, dict[str, Any], Any, bool]]:
    """What a check compares of one collection (an SDK ``MetricsData`` or None): each point's metric name,
    attributes, value and whether it has a start time."""
    return [
        (
            metric.name,
            dict(point.attributes or {}),
            getattr(point, "value", None),
            bool(point.start_time_unix_nano),
        )
        for resource in (data.resource_metrics if data is not None else ())
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    ]


class Raising:
    """Observations that raise ``error`` when the SDK iterates them: a stand-in callback's way to report its
    instrument's callback error where the SDK's own loop catches and logs it."""

    def __init__(self, error: Exception) -> None:
        self._error = error

    def __iter__(self) -> Any:
        raise self._error
