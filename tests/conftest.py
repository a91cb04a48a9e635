from __future__ import annotations

import fcntl
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from otel_numa.testing.fault_sweep import SWEEP_SUMMARY, sweep_summary
from otel_numa.testing.hwloc import extract_snapshot
from otel_numa.testing.podresources_server import PodResourcesServer, short_socket_dir

KINDS = ("unit", "agent", "e2e", "deploy")


# Modules whose tests share one container engine's store (images built and pruned, the stack's containers):
# they run one after the other on one worker (`--dist loadgroup`, as scripts/test.sh runs them), while the
# other workers go on with the rest; under any other distribution the lock still makes them take turns.
ONE_ENGINE = frozenset({"test_image.py", "test_deploy_stack.py"})
ENGINE_LOCK = Path(os.environ.get("OTEL_NUMA_TEST_ENGINE_LOCK", "/tmp/otel-numa-tests-container-engine.lock"))

# Modules whose module-scoped fixture takes seconds (a fleet of agents with a gateway and two Prometheus
# servers, an agent with its collector, the chart rendered by helm): each runs on one worker, so that the
# fixture is set up once, not once on every worker that gets one of its tests.
ONE_WORKER = frozenset({"test_fleet.py", "test_fresh_push.py", "test_helm_chart.py"})


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test carries its folder's kind as a marker: `pytest -m unit`, `-m "not e2e and not deploy"`."""
    for item in items:
        kind = item.path.parent.name
        if kind in KINDS:
            item.add_marker(kind)
        if item.path.name in ONE_ENGINE:
            item.add_marker(pytest.mark.xdist_group("container-engine"))
        elif item.path.name in ONE_WORKER:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))


@pytest.fixture(scope="module", autouse=True)
def _one_container_engine_module(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.path.name not in ONE_ENGINE:
        yield
        return
    with ENGINE_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The fault sweep's counts, all trees together, shown in every run's output (not only with ``-rA``)."""
    counts = [
        tuple(value)
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == SWEEP_SUMMARY
    ]
    if counts:
        terminalreporter.write_line(sweep_summary(counts))


@pytest.fixture
def hwloc_root(tmp_path: Path) -> Callable[[str], tuple[Path, Path]]:
    """Extract one of hwloc's real-machine snapshots; returns its (sysfs root, procfs root)."""

    def extract(name: str) -> tuple[Path, Path]:
        top = extract_snapshot(name, tmp_path / "hwloc")
        return top / "sys", top / "proc"

    return extract


@pytest.fixture
def quiet_logging() -> Iterator[None]:
    """The command line sets up the root logger: put it back for the tests that follow."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def podresources_server() -> Iterator[PodResourcesServer]:
    """The kubelet's podresources API, served from the published proto by a test server, on a socket in a
    short directory (unix socket paths are limited to 108 bytes)."""
    directory = short_socket_dir()
    with PodResourcesServer(directory / "kubelet.sock") as server:
        yield server
    shutil.rmtree(directory, ignore_errors=True)
