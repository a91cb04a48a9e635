"""Pod churn over the agent's life: 5,000 pods created and removed, 100 at a time, through a real
podresources server; the agent's scheduler tasks are run by hand, one round per batch of pods."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import psutil
import pytest
from prometheus_client import generate_latest

from otel_numa.daemon.agent import Agent
from otel_numa.proto import podresources_v1_pb2 as pb
from otel_numa.testing.kubelet_scenario import KubeletScenario, build_scenario, parse_exposition, series
from otel_numa.testing.podresources_server import PodResourcesServer
from otel_numa.testing.sysfs_tree import uniform_nodes

BATCH = 100
CARDINALITY_LIMIT = 1_000  # far below the 5,000 pods the agent sees over its life


def uid(index: int) -> str:
    return f"c0ffee00-0000-4000-8000-{index:012d}"


class Churn:
    def __init__(self, node: KubeletScenario, podresources_server: PodResourcesServer, agent: Agent) -> None:
        self.node, self.podresources_server, self.agent = node, podresources_server, agent
        self.batch = 0

    def next_batch(self) -> str:
        """Replace the node's pods by the next 100 (log directories and the API's list), run one scheduler
        round and return what a scrape sees."""
        logs = self.node.pod_logs_root
        for entry in logs.iterdir():
            entry.rmdir()
        first = self.batch * BATCH
        pods = []
        for index in range(first, first + BATCH):
            (logs / f"churn_job-{index}_{uid(index)}").mkdir()
            pods.append(
                pb.PodResources(
                    name=f"job-{index}",
                    namespace="churn",
                    containers=[pb.ContainerResources(name="main", cpu_ids=[index % 8])],
                )
            )
        self.podresources_server.state.pods = pods
        self.batch += 1
        assert self.agent.scheduler is not None
        self.agent.scheduler.run_once()
        assert self.agent.pipeline is not None and self.agent.pipeline.registry is not None
        return generate_latest(self.agent.pipeline.registry).decode()


def started_agent(
    node: KubeletScenario, podresources_server: PodResourcesServer, fast_path: str = "auto"
) -> Agent:
    agent = node.agent(
        podresources_socket=str(podresources_server.socket_path),
        cardinality_limit=CARDINALITY_LIMIT,
        interval=3600,  # the scheduler's own first round only; the test runs the others
        fast_path=fast_path,
    )
    agent.start()
    assert agent.scheduler is not None
    while agent.scheduler.rounds < 1:
        time.sleep(0.01)
    return agent


def batches_without_live_pods(
    tmp_path: Path, podresources_server: PodResourcesServer, monkeypatch: pytest.MonkeyPatch, fast_path: str
) -> list[str]:
    """The pages of 11 batches (more pods than the cardinality limit); the pipeline never hears who lives."""
    node = build_scenario(tmp_path, uniform_nodes(2, 4))
    agent = started_agent(node, podresources_server, fast_path)
    monkeypatch.setattr(agent.background, "report_live_pods", lambda: None)
    assert agent.scheduler is not None
    agent.scheduler._tasks = [*agent.background.tasks, agent._push]
    churn = Churn(node, podresources_server, agent)
    try:
        return [churn.next_batch() for _ in range(CARDINALITY_LIMIT // BATCH + 1)]
    finally:
        agent.stop(timeout_s=2)


def rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


@pytest.mark.parametrize("fast_path", ["auto", "off"])
def test_five_thousand_pods_leave_no_overflow_no_stale_series_and_no_leak(
    tmp_path: Path, podresources_server: PodResourcesServer, fast_path: str
) -> None:
    """The fast path forgets departed pods' series in place; the public path rebuilds its readers once as
    many pods departed as live (otel_numa.export.rebuild)."""
    node = build_scenario(tmp_path, uniform_nodes(2, 4))
    agent = started_agent(node, podresources_server, fast_path)
    assert agent.pipeline is not None
    assert bool(agent.pipeline.fast_path) is (fast_path == "auto")
    churn = Churn(node, podresources_server, agent)
    try:
        churn.next_batch()
        after_first_100 = rss()
        for _ in range(49):
            text = churn.next_batch()
            assert "otel_metric_overflow" not in text
        grown = rss() - after_first_100
    finally:
        agent.stop(timeout_s=2)
    assert churn.batch * BATCH == 5_000
    per_container = series(text, "numa_container_cpu_allocated")
    assert {dict(key)["k8s_pod_uid"] for key in per_container} == {uid(i) for i in range(4_900, 5_000)}
    assert all(uid(i) not in text for i in range(4_900))
    assert not any(
        "otel_metric_overflow" in str(key) for samples in parse_exposition(text).values() for key in samples
    )
    assert grown < 10 * 1024 * 1024, f"RSS grew by {grown / 1024 / 1024:.1f} MiB"
    # the public path rebuilt once 100 departed pods piled up: every batch or two
    if fast_path == "auto":
        assert agent.pipeline.rebuilds == 0
    else:
        assert 20 <= agent.pipeline.rebuilds <= 49


@pytest.mark.parametrize("fast_path", ["auto", "off"])
def test_without_forgetting_the_sdk_folds_new_pods_into_overflow(
    tmp_path: Path, podresources_server: PodResourcesServer, monkeypatch: pytest.MonkeyPatch, fast_path: str
) -> None:
    """The control: the SDK's behaviour the design works around (so the test above can fail), when the
    pipeline never hears which pods live."""
    texts = batches_without_live_pods(tmp_path, podresources_server, monkeypatch, fast_path)
    assert "otel_metric_overflow" not in texts[0]
    assert "otel_metric_overflow" in texts[-1]
