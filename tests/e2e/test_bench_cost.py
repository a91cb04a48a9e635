"""The cost benchmark's smoke run still measures the agent and node_exporter side by side.

The benchmark runs as a program of its own, not as a module of the tests; no figure is judged here, only that
the run completes with both targets measured and every page of the fresh cycles showing its inputs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from otel_numa.testing.peers import REPO

pytestmark = pytest.mark.e2e


def cells(table: str, label: str) -> list[str]:
    row = next((line for line in table.splitlines() if line.startswith(f"| {label} |")), None)
    assert row is not None, f"no row {label!r} in:\n{table}"
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def test_quick_run_measures_both_targets(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench_cost",
            "--quick",
            "--trees",
            "hwloc",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    table = (tmp_path / "cost-quick.md").read_text()
    assert "#### hwloc snapshot" in done.stdout  # the tables are printed too

    _, agent_series, exporter_series, _ = cells(table, "series exposed")
    assert int(agent_series) > 100 and int(exporter_series) > 100
    _, agent_us, exporter_us, _ = cells(table, "**CPU per series, unchanged inputs (µs)**")
    assert float(agent_us) > 0 and float(exporter_us) >= 0
    _, agent_share, exporter_share, _ = cells(table, "**share of one core, 15 s scrape + 15 s push (%)**")
    assert float(agent_share) > 0 and float(exporter_share) >= 0
    assert "2/2 agent pages showed their cycle's inputs" in table
    verdicts = cells(table, "CPU per series vs node_exporter, unchanged, machine only (hwloc 48 CPUs) ≤ 2x")
    assert verdicts[-1] in {"met", "NOT met"}

    # the two export paths side by side, as run_all.sh prints them (here the same run twice)
    figures = tmp_path / "cost-quick.json"
    compared = subprocess.run(
        [sys.executable, "-m", "benchmarks.compare_paths", str(figures), str(figures)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert compared.returncode == 0, compared.stderr
    label = "CPU per series vs node_exporter, unchanged, machine only (hwloc 48 CPUs) ≤ 2x"
    _, fast, public, ratio = cells(compared.stdout, label)
    assert fast == public and fast.split("x")[0] == verdicts[1].rstrip("x") and ratio == "1.00x"
