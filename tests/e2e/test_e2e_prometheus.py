"""End to end through a real Prometheus: the agent serves a real machine's sysfs snapshot, Debian's
prometheus scrapes it, and the test asks Prometheus' HTTP API. Expected values are written by hand
from the snapshot's files (16amd64-4n4c-cgroup-distance-merge: 4 nodes x 4 CPUs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from otel_numa.testing.peers import run_agent, run_prometheus, wait_for

pytestmark = pytest.mark.e2e

KIB = 1024
NODE = "e2e-node"


def labels(**kwargs: str) -> frozenset[tuple[str, str]]:
    return frozenset({("job", "otel-numa"), ("k8s_node_name", NODE), *kwargs.items()})


def test_prometheus_scrapes_agent(tmp_path: Path, hwloc_root: Callable[[str], tuple[Path, Path]]) -> None:
    sysfs, procfs = hwloc_root("16amd64-4n4c-cgroup-distance-merge")
    args = [
        "--sysfs-root",
        str(sysfs),
        "--procfs-root",
        str(procfs),
        "--node-name",
        NODE,
        "--kubelet-root",
        str(tmp_path / "no-kubelet"),
    ]
    with (
        run_agent(args, tmp_path) as agent,
        run_prometheus(tmp_path, [f"127.0.0.1:{agent.prometheus_port}"]) as prom,
    ):
        wait_for(lambda: prom.query("numa_node_count"), 30, "the first scrape")

        def value(expr: str) -> dict[frozenset[tuple[str, str]], float]:
            series = prom.series(expr)
            # the instance label depends on the port: drop it to compare with hand-written label sets
            return {frozenset(kv for kv in key if kv[0] != "instance"): v for key, v in series.items()}

        assert value("numa_node_count") == {labels(): 4}
        assert value("numa_cpu_capacity") == {labels(numa_node_id=str(n)): 4 for n in range(4)}
        assert value("numa_memory_capacity_bytes") == {
            labels(numa_node_id="0"): 8387892 * KIB,
            labels(numa_node_id="1"): 8388608 * KIB,
            labels(numa_node_id="2"): 8388608 * KIB,
            labels(numa_node_id="3"): 8388608 * KIB,
        }
        assert value('numa_memory_usage_bytes{numa_node_id="1"}') == {
            labels(numa_node_id="1", system_memory_state="used"): 1404884 * KIB,
            labels(numa_node_id="1", system_memory_state="free"): 6983724 * KIB,
        }
        assert value("numa_hugepages_capacity_bytes") == {
            labels(numa_node_id=str(n), k8s_hugepage_size="2Mi"): 512 * 2048 * KIB for n in range(4)
        }
        assert value('numa_node_distance{numa_node_id="1"}') == {
            labels(numa_node_id="1", numa_node_target_id="0"): 20,
            labels(numa_node_id="1", numa_node_target_id="1"): 10,
            labels(numa_node_id="1", numa_node_target_id="2"): 20,
            labels(numa_node_id="1", numa_node_target_id="3"): 20,
        }
        assert value('numa_memory_page_allocations_total{numa_node_id="1"}') == {
            labels(numa_node_id="1", numa_numastat_type="hit"): 8134636,
            labels(numa_node_id="1", numa_numastat_type="miss"): 0,
            labels(numa_node_id="1", numa_numastat_type="foreign"): 0,
            labels(numa_node_id="1", numa_numastat_type="interleave_hit"): 5901,
            labels(numa_node_id="1", numa_numastat_type="local"): 8127180,
            labels(numa_node_id="1", numa_numastat_type="other"): 7456,
        }
        # cpu4..cpu7 of proc/stat, USER_HZ 100: user 208297+280612+206432+206213, idle 13160300+...+13170138
        user = value('numa_cpu_time_seconds_total{numa_node_id="1",cpu_mode="user"}')
        idle = value('numa_cpu_time_seconds_total{numa_node_id="1",cpu_mode="idle"}')
        assert user == {labels(numa_node_id="1", cpu_mode="user"): pytest.approx(9015.54)}
        assert idle == {labels(numa_node_id="1", cpu_mode="idle"): pytest.approx(525814.49)}
        ages = value("numa_agent_source_age_seconds")
        assert {dict(k)["numa_source"] for k in ages} >= {"sysfs", "procfs"}
        assert all(0 <= age < 5 for age in ages.values())
        # no bare `node` label anywhere, and every series names the node
        everything = prom.query('{job="otel-numa",__name__=~"numa_.*|target_info"}')
        assert everything
        for item in everything:
            assert "node" not in item["metric"]
            assert item["metric"].get("k8s_node_name") == NODE
