"""The accelerated export path: named patches over the public path, each acting on the agent's own
MeterProvider, readers or page only (see docs/patches.md for the ledger).

``--fast-path auto`` (the default) turns them on only where the installed OpenTelemetry and
prometheus_client releases are the exact ones they were proven on and every patch's check passes on
throwaway objects; otherwise the agent serves the public path and logs one warning. ``off`` never looks.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from otel_numa.export.fast import (
    forget_departed,
    rendered_families,
    repeated_points,
    reused_requests,
    reused_translations,
    shared_collection,
    slim_series,
)
from otel_numa.export.fast.patch import Patch

log = logging.getLogger(__name__)

# The releases the patches were proven on (tests/agent/test_two_paths.py runs both paths against each other).
PROVEN_RELEASES: Mapping[str, str] = {
    "opentelemetry-api": "1.45.2",
    "opentelemetry-sdk": "1.45.2",
    "opentelemetry-exporter-prometheus": "0.66b2",
    "opentelemetry-exporter-otlp-proto-grpc": "1.45.2",
    "opentelemetry-exporter-otlp-proto-http": "1.45.2",
    "prometheus-client": "0.26.0",
}
PATCHES: tuple[Patch, ...] = (
    forget_departed.PATCH,
    shared_collection.PATCH,
    slim_series.PATCH,
    repeated_points.PATCH,
    reused_translations.PATCH,
    rendered_families.PATCH,
    reused_requests.PATCH,
)
# For benchmarks only: patch names, comma-separated, to leave off on the fast path.
PATCHES_OFF_ENV = "OTEL_NUMA_FAST_PATH_PATCHES_OFF"
# For the upgrade check only (scripts/upgrade_check.py): "1" lifts the release check, so the patches are
# tried on releases they were not proven on (each patch's own check still decides).
UNPROVEN_ENV = "OTEL_NUMA_FAST_PATH_UNPROVEN"


@dataclass(frozen=True)
class FastPath:
    """Which patches serve (none: the public path)."""

    patches: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.patches)

    def on(self, name: str) -> bool:
        return name in self.patches


PUBLIC = FastPath()


def choose(mode: str, environ: Mapping[str, str] = os.environ) -> FastPath:
    """The path for ``--fast-path`` ``mode`` (``auto`` or ``off``)."""
    if mode == "off":
        return PUBLIC
    problem = shape_problem()
    if problem is not None:
        return PUBLIC
    off = {name.strip() for name in environ.get(PATCHES_OFF_ENV, "").split(",")}
    return FastPath(serving(off))


def serving(off: set[str]) -> frozenset[str]:
    """The patches that serve with ``off`` left off: a patch serves only where every patch it requires
    does (PATCHES lists each after those it requires)."""
    on: set[str] = set()
    for patch in PATCHES:
        if patch.name not in off and all(required in on for required in patch.requires):
            on.add(patch.name)
    return frozenset(on)


@functools.cache
def shape_problem() -> str | None:
    """Why the installed packages are not the proven ones (logged once per process), or None."""
    problem = _versions_problem() or _patches_problem()
    if problem is not None:
        log.warning("fast path off, serving through the public OpenTelemetry APIs: %s", problem)
    return problem


def _versions_problem() -> str | None:
    if os.environ.get(UNPROVEN_ENV) == "1":
        return None
    for package, proven in PROVEN_RELEASES.items():
        try:
            installed = version(package)
        except PackageNotFoundError:
            installed = "none"
        if installed != proven:
            return f"{package} {installed} is installed, the fast path was proven on {proven}"
    return None


def _patches_problem() -> str | None:
    for patch in PATCHES:
        try:
            why = patch.check()
        except Exception as error:  # any surprise from a private shape means "not this shape"
            why = f"{type(error).__name__}: {error}"
        if why is not None:
            return f"patch {patch.name}: {why}"
    return None
