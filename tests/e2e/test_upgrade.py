"""The newest releases: a throwaway virtual environment gets the newest PyPI releases of the OpenTelemetry
packages and prometheus-client that pyproject.toml admits, and the agent installed from this checkout.
With ``--fast-path off`` the agent prints a page (``--once``), a real Prometheus scrapes it, and rotel
receives its push; with ``auto`` it serves the fast path on the releases it was proven on, or says (one
warning and ``numa_agent_fast_path 0``) that it serves the public path.

Run by scripts/upgrade_check.py (or alone: ``pytest -m upgrade``), not by CI; it takes a minute or two with
pip's cache warm."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from otel_numa.export.fast import PROVEN_RELEASES
from otel_numa.testing.kubelet_scenario import build_scenario, series
from otel_numa.testing.peers import REPO, run_agent, run_prometheus, run_rotel, wait_for
from otel_numa.testing.sysfs_tree import uniform_nodes

pytestmark = [pytest.mark.upgrade, pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def newest(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    """A venv's python with the newest releases admitted and the agent; the installed versions."""
    venv = tmp_path_factory.mktemp("newest") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    install = [python, "-m", "pip", "install", "--quiet", "--upgrade", "--upgrade-strategy", "eager"]
    completed = subprocess.run(
        [*install, str(REPO), *PROVEN_RELEASES], capture_output=True, text=True, timeout=480, check=False
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    script = (
        "import json, sys, importlib.metadata as m\n"
        "print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))"
    )
    listed = subprocess.run(
        [python, "-c", script, *PROVEN_RELEASES], capture_output=True, text=True, check=True, timeout=60
    )
    versions: dict[str, str] = json.loads(listed.stdout)
    print("newest releases admitted:", versions)
    return python, versions


def once(python: str, node_args: list[str], fast_path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-m", "otel_numa", "--once", "--fast-path", fast_path, *node_args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd="/",  # the installed agent, not this checkout's sources
    )


def test_the_public_path_serves_a_scrape_and_a_push_with_the_newest_releases(
    newest: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    python, _versions = newest
    node = build_scenario(tmp_path / "node", uniform_nodes(2, 4))
    printed = once(python, node.cli_args(), "off")
    assert printed.returncode == 0, printed.stderr
    assert series(printed.stdout, "numa_cpu_capacity")
    assert series(printed.stdout, "numa_agent_fast_path") == {frozenset(): 0.0}
    with run_rotel(tmp_path) as rotel:
        args = [*node.cli_args(), "--fast-path", "off", "--exporter", "prometheus,otlp", "--interval", "1"]
        args += ["--otlp-endpoint", f"http://127.0.0.1:{rotel.grpc_port}"]
        with (
            run_agent(args, tmp_path, python=python) as agent,
            run_prometheus(tmp_path, [f"127.0.0.1:{agent.prometheus_port}"]) as prom,
        ):
            wait_for(lambda: prom.query("numa_cpu_capacity"), 30, "a scrape by Prometheus")
            assert {value for value in prom.series("numa_agent_fast_path").values()} == {0}
            wait_for(lambda: rotel.latest("numa.cpu.capacity"), 30, "a push to rotel")


def test_auto_serves_the_fast_path_on_the_proven_releases_or_says_it_does_not(
    newest: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    python, versions = newest
    node = build_scenario(tmp_path / "node", uniform_nodes(2, 4))
    printed = once(python, node.cli_args(), "auto")
    assert printed.returncode == 0, printed.stderr
    assert series(printed.stdout, "numa_cpu_capacity")
    fast = series(printed.stdout, "numa_agent_fast_path")
    warnings = [line for line in printed.stderr.splitlines() if "fast path off" in line]
    if versions == dict(PROVEN_RELEASES):
        assert fast == {frozenset(): 1.0} and warnings == [], printed.stderr
    else:  # the fast path turns itself on only for the exact releases it was proven on
        assert fast == {frozenset(): 0.0} and len(warnings) == 1, printed.stderr
