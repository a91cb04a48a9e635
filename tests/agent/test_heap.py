"""The process's heap: a round of the agent leaves no reference cycles behind, which is what lets the
cyclic collector wait for many young objects (otel_numa/daemon/heap.py)."""

from __future__ import annotations

import gc
import math
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

from otel_numa.cli.settings import Settings
from otel_numa.daemon.agent import Agent
from otel_numa.daemon.heap import YOUNG_OBJECTS_BEFORE_COLLECTION, HeapPolicy
from otel_numa.daemon.serve import with_allocator_tunables
from otel_numa.export.pipeline import build_pipeline
from otel_numa.testing.kubelet_scenario import build_scenario
from otel_numa.testing.large_node import LargeNodeSpec, write_large_node
from otel_numa.testing.sysfs_tree import uniform_nodes
from tests.support import InProcessExporter


class EncodingExporter(InProcessExporter):
    """Encodes each push as the OTLP exporters do, and keeps the bytes of the last one."""

    def __init__(self) -> None:
        super().__init__()
        self.last = b""

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.last = encode_metrics(metrics_data).SerializeToString()
        return MetricExportResult.SUCCESS


@pytest.fixture
def saved_garbage() -> Iterator[None]:
    """The collector off and what it finds kept in gc.garbage, for the test; restored after."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()


@pytest.mark.usefixtures("saved_garbage")
def test_rounds_with_new_values_and_departing_pods_leave_no_reference_cycles(tmp_path: Path) -> None:
    """Refreshes, OTLP encodings and scrapes in both formats, with new cgroup values each round and a pod
    gone in one, free everything they make by reference counting: the cyclic collector finds nothing."""
    import prometheus_client.exposition as exposition
    import prometheus_client.openmetrics.exposition as openmetrics

    spec = LargeNodeSpec(numa_nodes=2, cpus_per_node=8, pods=6, containers_per_pod=2, devices_per_resource=2)
    node = write_large_node(tmp_path, spec)
    agent = Agent(Settings(**node.settings_values()).to_options())  # type: ignore[arg-type]
    exporter = EncodingExporter()
    pipeline = build_pipeline(
        agent.options,
        agent.store,
        exporters=("prometheus", "otlp"),
        otlp_exporter_factory=lambda _e: exporter,
    )
    assert pipeline.registry is not None
    for round_ in range(6):  # the first round's state and the agent's caches are made here
        node.write_cgroup_usage(round_)
        if round_ == 4:
            next((node.root / "pod-logs").iterdir()).rename(tmp_path / "departed")
        agent.refresh_background()
        pipeline.push(timeout_s=5)
        page = exposition.generate_latest(pipeline.registry)
        openmetrics.generate_latest(pipeline.registry)  # type: ignore[no-untyped-call]
        if round_ == 1:  # from here on, only what the rounds leave: the start-up's cycles (the fast
            gc.set_debug(0)  # path's checks on throwaway providers) are freed, not saved
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)
    assert b"numa_container_memory_usage_bytes{" in page and b"numa.container.cpu.time" in exporter.last
    assert gc.collect() == 0, Counter(type(item).__name__ for item in gc.garbage).most_common(5)
    pipeline.shutdown(timeout_s=1)


def test_without_the_daemon_the_heap_is_left_as_python_sets_it(tmp_path: Path) -> None:
    """``--once``, the tests and a program that builds a pipeline (here: an agent started in a fresh
    interpreter, scraped and pushed to) neither freeze the heap nor move the collector's thresholds."""
    node = build_scenario(tmp_path, uniform_nodes(2, 4))
    once = node.run_once()
    assert "numa_cpu_capacity" in once
    values = {
        "sysfs_root": str(node.sysfs_root),
        "procfs_root": str(node.procfs_root),
        "kubelet_root": str(node.kubelet_root),
        "pod_logs_root": str(node.pod_logs_root),
        "podresources_socket": "none",
        "prometheus_address": "127.0.0.1:0",
        "health_address": "none",
        "exporters": "prometheus,otlp",
        "otlp_endpoint": "http://127.0.0.1:9",  # nothing listens: each push fails at once
        "otlp_timeout": 0.5,
    }
    script = f"""
import gc, sys
threshold = gc.get_threshold()
from prometheus_client import generate_latest
from otel_numa.daemon.agent import Agent
from otel_numa.cli.settings import Settings
settings = Settings(**{values!r})
agent = Agent(settings.to_options())
agent.start()
assert agent.pipeline is not None and agent.pipeline.registry is not None
for _ in range(3):
    agent.refresh_background()
    generate_latest(agent.pipeline.registry)
    agent.pipeline.push()
agent.stop(timeout_s=2)
print(gc.get_freeze_count(), gc.get_threshold() == threshold)
"""
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["0", "True"]


def test_after_the_first_collection_the_collector_waits_for_many_young_objects(tmp_path: Path) -> None:
    from otel_numa.daemon.heap import freeze_long_lived_objects

    freeze_long_lived_objects()  # once per process; a no-op when an earlier test collected already
    assert gc.get_freeze_count() > 0
    # twice what was frozen then; frozen objects can only have been freed since
    threshold = gc.get_threshold()[0]
    assert threshold >= YOUNG_OBJECTS_BEFORE_COLLECTION and threshold >= 2 * gc.get_freeze_count()


def test_a_timer_round_of_the_serving_agent_ends_with_a_full_collection_at_most_once_a_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The only collection that empties the interpreter's free lists, which otherwise grow with scrapes
    (otel_numa.daemon.heap.tidy_after_round); a round a kubelet change triggers leaves it to the timer, and so
    does a timer round within a minute of the last collection. The collector's own collections are off
    during the rounds."""
    import otel_numa.daemon.heap as heap

    node = build_scenario(tmp_path, uniform_nodes(2, 4))
    agent = Agent(node.settings(interval=3600, exporters="prometheus").to_options(), heap=HeapPolicy())
    agent.start()
    events: list[tuple[str, int]] = []

    def record(phase: str, info: dict[str, int]) -> None:
        events.append((phase, info["generation"]))

    enabled = gc.isenabled()
    try:
        assert agent.scheduler is not None
        while agent.scheduler.rounds < 1:  # the scheduler's own first round
            time.sleep(0.01)
        gc.disable()
        gc.callbacks.append(record)
        monkeypatch.setattr(heap, "_last_tidy", -math.inf)  # whatever an earlier test's agent did
        agent.scheduler.run_once()
        after_first = len(events)
        agent.scheduler.run_once(triggered=True)
        agent.scheduler.run_once()  # within the minute
        monkeypatch.setattr(heap, "_last_tidy", time.monotonic() - heap.TIDY_GAP_S)
        after_quiet = len(events)
        agent.scheduler.run_once()
    finally:
        gc.callbacks.remove(record)
        if enabled:
            gc.enable()
        agent.stop(timeout_s=2)
    assert events[:after_first] == [("start", 2), ("stop", 2)]
    assert events[after_first:after_quiet] == []
    assert events[after_quiet:] == [("start", 2), ("stop", 2)]


_OURS = "glibc.malloc.tcache_count=0"


@pytest.mark.parametrize(
    ("given", "handed_on"),
    [
        ("", _OURS),
        ("glibc.malloc.trim_threshold=131072", "glibc.malloc.trim_threshold=131072:" + _OURS),
        ("glibc.malloc.tcache_count=3", "glibc.malloc.tcache_count=3"),
        ("glibc.malloc.mmap_threshold=4096:glibc.malloc.tcache_count=7",) * 2,
    ],
)
def test_the_serving_process_gets_the_allocator_settings_the_operator_did_not_set(
    given: str, handed_on: str
) -> None:
    assert with_allocator_tunables(given) == handed_on
