"""constraints.txt pins the exact releases the agent is installed with (set-up, image, CI): every runtime
dependency, the accelerated path's proven releases among them."""

from __future__ import annotations

import importlib.util
import re
import shutil
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from otel_numa.export.fast import PROVEN_RELEASES

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO / "constraints.txt"


def pins() -> dict[str, str]:
    return pins_of(CONSTRAINTS)


def pins_of(path: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line)
        assert match, f"{path.name}: {line!r} is not an exact pin"
        name = canonicalize_name(match.group(1))
        assert name not in found, f"{path.name} pins {name} twice"
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


def test_accepting_a_trial_moves_the_pins_and_the_proven_releases_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """scripts/upgrade_check.py --accept, once a trial held: the tried packages' pins and PROVEN_RELEASES
    take the trial's releases, every other pin stays, and a new OpenTelemetry package gets a pin."""
    spec = importlib.util.spec_from_file_location("upgrade_check", REPO / "scripts" / "upgrade_check.py")
    assert spec is not None and spec.loader is not None
    upgrade = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(upgrade)
    constraints, proven = tmp_path / "constraints.txt", tmp_path / "fast.py"
    shutil.copy(CONSTRAINTS, constraints)
    shutil.copy(REPO / "otel_numa" / "export" / "fast" / "__init__.py", proven)
    monkeypatch.setattr(upgrade, "CONSTRAINTS", constraints)
    monkeypatch.setattr(upgrade, "PROVEN_FILE", proven)
    newer = {package: "9.9.9" for package in PROVEN_RELEASES}
    frozen = "\n".join(
        [*(f"{package}==9.9.9" for package in PROVEN_RELEASES), "opentelemetry-brand-new==0.1", "psutil==1.0"]
    )
    upgrade.accept(newer, frozen)
    moved = pins_of(constraints)
    assert all(moved[canonicalize_name(package)] == "9.9.9" for package in PROVEN_RELEASES)
    assert moved["opentelemetry-brand-new"] == "0.1"
    assert moved["psutil"] == pins()["psutil"]  # not a tried package: the trial's release is not taken
    assert all(f'"{package}": "9.9.9"' in proven.read_text() for package in PROVEN_RELEASES)
