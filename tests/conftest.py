from __future__ import annotations

import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
HWLOC_DIR = FIXTURES / "hwloc"


def extract_hwloc(name: str, dest: Path) -> tuple[Path, Path]:
    """Extract one hwloc snapshot; returns its (sysfs root, procfs root)."""
    with tarfile.open(HWLOC_DIR / f"{name}.tar.bz2") as archive:
        archive.extractall(dest, filter="data")
    top = dest / name
    return top / "sys", top / "proc"


@pytest.fixture
def hwloc_root(tmp_path: Path) -> Callable[[str], tuple[Path, Path]]:
    def extract(name: str) -> tuple[Path, Path]:
        return extract_hwloc(name, tmp_path / "hwloc")

    return extract
