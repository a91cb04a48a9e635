"""constraints.txt pins the exact releases the agent is installed with (set-up, image, CI): every runtime
dependency, the accelerated path's proven releases among them."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from otel_numa.export.fast import PROVEN_RELEASES

CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints.txt"


def pins() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line)
        assert match, f"constraints.txt: {line!r} is not an exact pin"
        name = canonicalize_name(match.group(1))
        assert name not in found, f"constraints.txt pins {name} twice"
        found[name] = match.group(2)
    return found


def runtime_closure() -> set[str]:
    """otel-numa's runtime requirements and theirs, as installed here (no extras)."""
    seen: set[str] = set()
    pending = ["otel-numa"]
    while pending:
        name = pending.pop()
        for text in distribution(name).requires or ():
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            dependency = canonicalize_name(requirement.name)
            if dependency not in seen:
                seen.add(dependency)
                pending.append(dependency)
    return seen


def test_the_proven_releases_are_the_pinned_ones() -> None:
    pinned = pins()
    for package, proven in PROVEN_RELEASES.items():
        assert pinned.get(canonicalize_name(package)) == proven, (
            f"constraints.txt pins {package} {pinned.get(canonicalize_name(package))}, the fast path was "
            f"proven on {proven}: move both with scripts/upgrade-check.sh --accept"
        )


def test_every_runtime_dependency_is_pinned_and_installed_at_its_pin() -> None:
    pinned = pins()
    closure = runtime_closure()
    assert {"opentelemetry-sdk", "grpcio", "protobuf", "psutil", "pydantic-core"} <= closure
    unpinned = sorted(closure - set(pinned))
    assert not unpinned, f"runtime dependencies without a pin in constraints.txt: {unpinned}"
    for package in sorted(closure):
        try:
            installed = version(package)
        except PackageNotFoundError:  # pragma: no cover - the closure was read from installed metadata
            installed = "none"
        assert installed == pinned[package], f"{package} {installed} is installed, {pinned[package]} pinned"
