"""A dead or slow collector never stops the Prometheus page, never floods the log, never stalls shutdown."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from otel_numa.testing.peers import http_get, run_agent

pytestmark = pytest.mark.e2e


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A TCP port that accepts connections into its backlog and never answers: the slowest collector."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield int(listener.getsockname()[1])


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_slow_collector_does_not_hold_up_scrapes_or_shutdown(
    protocol: str, black_hole: int, tmp_path: Path, hwloc_root: Callable[[str], tuple[Path, Path]]
) -> None:
    sysfs, procfs = hwloc_root("16amd64-8n2c")
    args = [
        "--sysfs-root",
        str(sysfs),
        "--procfs-root",
        str(procfs),
        "--exporter",
        "prometheus,otlp",
        "--otlp-endpoint",
        f"http://127.0.0.1:{black_hole}",
        "--otlp-protocol",
        protocol,
        "--interval",
        "1",
        "--kubelet-root",
        str(tmp_path / "none"),
    ]
    with run_agent(args, tmp_path) as agent:
        slowest = 0.0
        deadline = time.monotonic() + 8
        scrapes = 0
        while time.monotonic() < deadline:
            started = time.monotonic()
            text = agent.metrics_text()
            slowest = max(slowest, time.monotonic() - started)
            assert "numa_cpu_capacity" in text
            scrapes += 1
            time.sleep(0.2)
        assert slowest < 1.0, f"a scrape took {slowest:.2f}s while the collector hung"
        assert http_get(f"http://127.0.0.1:{agent.health_port}/healthz")[0] == 200

        started = time.monotonic()
        assert agent.stop(signal.SIGTERM, timeout_s=15) == 0
        assert time.monotonic() - started < 5.0

    failures = [
        line
        for line in agent.log().splitlines()
        if "opentelemetry" in line and ("WARNING" in line or "ERROR" in line)
    ]
    # about 8 failed exports happened; at most one line per kind of failure per minute reaches the log
    kinds = {line.split(": ", 1)[-1][:60] for line in failures}
    assert len(failures) <= 2 * max(1, len(kinds)) and len(failures) <= 4, "\n".join(failures)
