"""Fresh data through OTLP: a checkpoint rewritten the way the kubelet does it reaches a real collector
(rotel) within a fraction of a second, although the periodic export is 60 s away; bursts are rate-limited.

The machine is synthetic: two NUMA nodes, CPUs 0-3 on node 0 and 4-7 on node 1. Expected values are written by
hand from the checkpoints the tests write.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from otel_numa.daemon.scheduler import Scheduler
from otel_numa.testing.checkpoints import write_cpu_manager_state
from otel_numa.testing.peers import (
    AgentProcess,
    ReceivedBatch,
    ReceivedMetric,
    Rotel,
    run_agent,
    run_rotel,
    wait_for,
)
from otel_numa.testing.sysfs_tree import NodeSpec, write_machine

pytestmark = pytest.mark.e2e

POD = "0f1e2d3c-aaaa-bbbb-cccc-000000000001"
ALL_CPUS = frozenset(range(8))
PERIODIC_INTERVAL_S = 60
PUSH_MIN_INTERVAL_S = 0.2
# The watcher reports a change at most this long after it (it groups a burst's events for up to 0.1 s).
WATCH_BATCH_S = 0.12


@dataclass
class FreshAgent:
    rotel: Rotel
    agent: AgentProcess
    cpu_manager_state: Path

    def rewrite(self, containers: dict[str, set[int]]) -> float:
        """Replace the CPU manager checkpoint (temp file, fsync, rename); returns the time of the rename."""
        exclusive = set().union(*containers.values())
        write_cpu_manager_state(self.cpu_manager_state, "static", ALL_CPUS - exclusive, {POD: containers})
        return time.monotonic()


def metric(batch: ReceivedBatch, name: str) -> ReceivedMetric | None:
    return next((m for m in batch.metrics if m.name == name), None)


def container_cpus(batch: ReceivedBatch) -> dict[tuple[str, int], float] | None:
    """(container, NUMA node) -> exclusive CPUs, from one export; None when the export lacks the metric."""
    found = metric(batch, "numa.container.cpu.allocated")
    if found is None:
        return None
    return {(p.attributes["k8s.container.name"], p.attributes["numa.node.id"]): p.value for p in found.points}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshAgent]:
    tmp_path = tmp_path_factory.mktemp("fresh")
    nodes = [
        NodeSpec(0, cpus=range(4), mem_total_kib=4 << 20, mem_free_kib=2 << 20),
        NodeSpec(1, cpus=range(4, 8), mem_total_kib=4 << 20, mem_free_kib=3 << 20),
    ]
    sysfs, procfs = write_machine(tmp_path / "machine", nodes)
    kubelet = tmp_path / "kubelet"
    kubelet.mkdir()
    cpu_manager_state = kubelet / "cpu_manager_state"
    write_cpu_manager_state(cpu_manager_state, "static", ALL_CPUS, {})
    missing = str(tmp_path / "absent")
    args = [
        *("--sysfs-root", str(sysfs), "--procfs-root", str(procfs), "--kubelet-root", str(kubelet)),
        *("--podresources-socket", "none", "--pod-logs-root", missing, "--cgroup-root", missing),
        *("--container-logs-root", missing, "--node-name", "fresh-node", "--exporter", "otlp"),
        *("--interval", str(PERIODIC_INTERVAL_S)),
    ]
    with run_rotel(tmp_path) as rotel:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rotel.grpc_port}",
            "OTEL_NUMA_PUSH_MIN_INTERVAL": str(PUSH_MIN_INTERVAL_S),
        }
        with run_agent(args, tmp_path, env=env, prometheus=False) as agent:
            # the export every agent makes when it starts; the next periodic one is 60 s away
            wait_for(lambda: rotel.latest("numa.cpu.allocated"), 20, "the first export")
            yield FreshAgent(rotel, agent, cpu_manager_state)


def test_a_kubelet_rewrite_reaches_the_collector_well_before_the_next_export(fresh: FreshAgent) -> None:
    exports_before = len(fresh.rotel.batches())
    renamed = fresh.rewrite({"app": {1, 2, 3}})

    def received() -> ReceivedBatch | None:
        return next(
            (b for b in fresh.rotel.batches()[exports_before:] if container_cpus(b) == {("app", 0): 3}), None
        )

    batch = wait_for(received, 5, "the new allocation at the collector", interval_s=0.01)
    latency = time.monotonic() - renamed
    # the periodic export is 60 s away; a push on change arrives in well under a second
    assert latency < 1.0, f"received {latency:.3f} s after the rename"

    allocated = metric(batch, "numa.cpu.allocated")
    assert allocated is not None
    assert {p.attributes["numa.node.id"]: p.value for p in allocated.points} == {0: 3, 1: 0}
    ages = metric(batch, "numa.agent.source.age")
    assert ages is not None
    cpu_manager_age = [p.value for p in ages.points if p.attributes["numa.source"] == "cpu_manager"]
    assert len(cpu_manager_age) == 1 and cpu_manager_age[0] < 0.5
    assert fresh.agent.process.poll() is None


def test_a_burst_of_100_renames_makes_a_bounded_number_of_exports_and_the_last_wins(
    fresh: FreshAgent,
) -> None:
    exports_before = len(fresh.rotel.batches())
    began = time.monotonic()
    for index in range(100):  # 100 renames in one second
        fresh.rewrite({f"burst-{index}": {4 + index % 4}})
        time.sleep(max(0.0, began + (index + 1) * 0.01 - time.monotonic()))
    duration = time.monotonic() - began
    last = {("burst-99", 1): 1}

    wait_for(lambda: container_cpus(fresh.rotel.batches()[-1]) == last, 5, "the last value", interval_s=0.01)
    time.sleep(3 * PUSH_MIN_INTERVAL_S)  # nothing more may come: the last value was already the last export
    exports = fresh.rotel.batches()[exports_before:]
    # Exports start at least push_min_interval apart; all but the trailing one start before the last change
    # is reported: at most floor((burst + watch batching) / 0.2 s) + 2, i.e. 7 for a one-second burst.
    bound = math.floor((duration + WATCH_BATCH_S) / PUSH_MIN_INTERVAL_S) + 2
    assert 2 <= len(exports) <= bound, (len(exports), bound, duration)
    assert duration < 1.1 and bound <= 7  # the burst really was a burst (else the bound says little)
    assert container_cpus(exports[-1]) == last


def test_triggered_rounds_are_rate_limited_and_the_trailing_trigger_always_runs() -> None:
    rounds: list[float] = []
    scheduler = Scheduler(3600, [lambda: rounds.append(time.monotonic())], min_trigger_gap_s=0.2)
    scheduler.start()
    try:
        wait_for(lambda: rounds, 2, "the first round", interval_s=0.005)
        triggered_from = len(rounds)
        began = time.monotonic()
        last_trigger = began
        while time.monotonic() - began < 1.0:
            scheduler.trigger()
            last_trigger = time.monotonic()
            time.sleep(0.005)
        time.sleep(0.5)
    finally:
        scheduler.stop(timeout_s=1)
    triggered = rounds[triggered_from:]
    gaps = [b - a for a, b in zip(rounds[triggered_from - 1 :], triggered, strict=False)]
    assert all(gap >= 0.2 - 0.005 for gap in gaps), gaps
    assert 5 <= len(triggered) <= 7, triggered
    assert triggered[-1] > last_trigger  # the last trigger got a round that started after it


def test_a_trigger_long_after_the_last_round_runs_at_once() -> None:
    rounds: list[float] = []
    ran = threading.Event()

    def task() -> None:
        rounds.append(time.monotonic())
        ran.set()

    scheduler = Scheduler(3600, [task], min_trigger_gap_s=0.2)
    scheduler.start()
    try:
        wait_for(lambda: rounds, 2, "the first round", interval_s=0.005)
        time.sleep(0.3)
        ran.clear()
        asked = time.monotonic()
        scheduler.trigger()
        assert ran.wait(1)
        assert rounds[-1] - asked < 0.05
    finally:
        scheduler.stop(timeout_s=1)


def test_closing_tasks_run_last_and_only_in_rounds_on_the_timer() -> None:
    order: list[str] = []
    scheduler = Scheduler(
        3600,
        [lambda: order.append("task")],
        periodic_tasks=[lambda: order.append("periodic")],
        closing_tasks=[lambda: order.append("closing")],
    )
    scheduler.run_once()
    scheduler.run_once(triggered=True)
    assert order == ["periodic", "task", "closing", "task"]
