"""End to end through OTLP: the agent pushes to rotel, a real OpenTelemetry collector, over gRPC and over
HTTP/protobuf; the test reads what rotel received from its debug log. Expected values are written by hand
from the snapshot's files (16amd64-4n4c-cgroup-distance-merge)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def test_a_delta_preference_pushes_deltas_that_add_up_to_the_page(tmp_path: Path) -> None:
    """With ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta`` the push gets a delta reader of its
    own beside the page's cumulative one: rotel receives each container's CPU time as deltas, each starting
    where the last one ended, and they add up to the page's cumulative counter; the page stays cumulative."""
    from otel_numa.testing.kubelet_scenario import series
    from otel_numa.testing.large_node import LargeNodeSpec, write_large_node

    spec = LargeNodeSpec(numa_nodes=2, cpus_per_node=4, pods=3, containers_per_pod=1, devices_per_resource=1)
    node = write_large_node(tmp_path / "node", spec)
    name = "numa.container.cpu.time"
    with run_rotel(tmp_path) as rotel:
        args = [*node.cli_args(), "--exporter", "prometheus,otlp", "--interval", "1"]
        args += ["--otlp-endpoint", f"http://127.0.0.1:{rotel.grpc_port}"]
        env = {"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta"}
        with run_agent(args, tmp_path, env=env) as agent:

            def pushes(count: int) -> list[Any]:
                found = [m for batch in rotel.batches() for m in batch.metrics if m.name == name]
                return found if len(found) >= count else []

            wait_for(lambda: pushes(2), 30, "two OTLP exports")
            node.write_cgroup_usage(1)  # every container's CPU time grows
            seen = len(pushes(0))
            received = wait_for(lambda: pushes(seen + 3), 30, "three more OTLP exports")
            page = agent.metrics_text()

    totals: dict[tuple[str, int], float] = {}
    last_end: dict[tuple[str, int], int] = {}
    grew = False
    for metric in received:
        assert metric.data_type == "Sum" and metric.monotonic is True and metric.temporality == "DELTA"
        for point in metric.points:
            key = (point.attributes["k8s.pod.uid"], point.attributes["numa.node.id"])
            assert point.start_ns is not None and point.time_ns is not None
            if key in last_end:  # each delta starts where the series' last one ended
                assert point.start_ns == last_end[key], key
                grew = grew or point.value > 0
            last_end[key] = point.time_ns
            totals[key] = totals.get(key, 0.0) + point.value
    assert grew, "the rewritten cgroups show as a positive delta"
    on_page = {
        (dict(labels)["k8s_pod_uid"], int(dict(labels)["numa_node_id"])): value
        for labels, value in series(page, "numa_container_cpu_time_seconds_total").items()
    }
    assert on_page and totals.keys() == on_page.keys()
    for key, total in totals.items():
        assert total == pytest.approx(on_page[key], rel=1e-9, abs=1e-9), key
