"""End to end through OTLP: the agent pushes to rotel, a real OpenTelemetry collector, over gRPC and over
HTTP/protobuf; the test reads what rotel received from its debug log. Expected values are written by hand
from the snapshot's files (16amd64-4n4c-cgroup-distance-merge)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from otel_numa import __version__
from otel_numa.testing.peers import run_agent, run_rotel, wait_for

pytestmark = pytest.mark.e2e

KIB = 1024


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_otlp_push_reaches_collector(
    protocol: str, tmp_path: Path, hwloc_root: Callable[[str], tuple[Path, Path]]
) -> None:
    sysfs, procfs = hwloc_root("16amd64-4n4c-cgroup-distance-merge")
    with run_rotel(tmp_path) as rotel:
        port = rotel.grpc_port if protocol == "grpc" else rotel.http_port
        # The endpoint comes from the standard OTel variable; over HTTP the agent appends /v1/metrics.
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        }
        args = [
            "--sysfs-root",
            str(sysfs),
            "--procfs-root",
            str(procfs),
            "--node-name",
            "otlp-node",
            "--exporter",
            "otlp",
            "--interval",
            "1",
            "--kubelet-root",
            str(tmp_path / "none"),
        ]
        with run_agent(args, tmp_path, env=env, prometheus=False):
            resource, capacity = wait_for(lambda: rotel.latest("numa.memory.capacity"), 30, "an OTLP export")

    assert resource["service.name"] == "otel-numa"
    assert resource["service.version"] == __version__
    assert resource["service.instance.id"] == "otlp-node"
    assert resource["k8s.node.name"] == "otlp-node"
    assert "host.name" in resource

    assert capacity.unit == "By"
    assert capacity.data_type == "Sum" and capacity.monotonic is False
    assert {p.attributes["numa.node.id"]: p.value for p in capacity.points} == {
        0: 8387892 * KIB,
        1: 8388608 * KIB,
        2: 8388608 * KIB,
        3: 8388608 * KIB,
    }

    _, cpu_time = wait_for(lambda: rotel.latest("numa.cpu.time"), 5, "numa.cpu.time")
    assert cpu_time.unit == "s" and cpu_time.monotonic is True
    user_node1 = [p.value for p in cpu_time.points if p.attributes == {"numa.node.id": 1, "cpu.mode": "user"}]
    assert user_node1 == [pytest.approx(9015.54)]

    _, distance = wait_for(lambda: rotel.latest("numa.node.distance"), 5, "numa.node.distance")
    assert distance.data_type == "Gauge"
    row = {
        p.attributes["numa.node.target_id"]: p.value
        for p in distance.points
        if p.attributes["numa.node.id"] == 2
    }
    assert row == {0: 20, 1: 20, 2: 10, 3: 20}
