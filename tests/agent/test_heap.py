"""The process's heap: a round of the agent leaves no reference cycles behind, which is what lets the
cyclic collector wait for many young objects (otel_numa/daemon/heap.py)."""

from __future__ import annotations

import gc
import math
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from otel_numa.cli.settings import Settings
from otel_numa.daemon.agent import Agent
from otel_numa.daemon.heap import YOUNG_OBJECTS_BEFORE_COLLECTION
from otel_numa.daemon.serve import with_allocator_tunables
from otel_numa.pipeline import build_pipeline
from otel_numa.testing.kubelet_scenario import build_scenario
from otel_numa.testing.large_node import LargeNodeSpec, write_large_node
from otel_numa.testing.sysfs_tree import uniform_nodes


class EncodingExporter(MetricExporter):
    """Encodes each push as the OTLP exporters do, and keeps the bytes of the last one."""

    def __init__(self) -> None:
        super().__init__()
        self.last = b""

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.last = encode_metrics(metrics_data).SerializeToString()
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


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
        if round_ == 1:
            gc.collect()
            gc.garbage.clear()  # from here on, only what the rounds leave
    assert b"numa_container_memory_usage_bytes{" in page and b"numa.container.cpu.time" in exporter.last
    assert gc.collect() == 0, Counter(type(item).__name__ for item in gc.garbage).most_common(5)
    pipeline.shutdown(timeout_s=1)


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
    agent = node.agent(interval=3600, exporters="prometheus")
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
