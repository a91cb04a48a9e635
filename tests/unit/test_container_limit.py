"""Per-container and per-pod series stop at the container limit; the totals are left whole."""

from __future__ import annotations

from types import MappingProxyType

from otel_numa.model import Allocation, ContainerAllocation, ContainerRef, PodAllocation
from otel_numa.snapshot.container_limit import ContainerLimit
from otel_numa.snapshot.source_status import SourceRegistry


def allocation(containers: int) -> Allocation:
    refs = [ContainerRef(f"pod-{index:05d}", "c") for index in range(containers)]
    return Allocation(
        cpu_allocated={0: containers},
        containers=tuple(ContainerAllocation(ref, cpus={0: 1}) for ref in refs),
        pods=tuple(PodAllocation(ref.pod_uid, cpus={0: 1}) for ref in refs),
        container_info=MappingProxyType({(ref.pod_uid, "c"): {} for ref in reversed(refs)}),
    )


def test_past_the_limit_the_first_containers_keep_their_series_and_the_totals_all() -> None:
    registry = SourceRegistry()
    limit = ContainerLimit(registry.tracker("cpu_manager"), limit=10)
    whole = allocation(25)
    cut = limit.apply(whole)
    assert [c.container.pod_uid for c in cut.containers] == [f"pod-{index:05d}" for index in range(10)]
    assert len(cut.pods) == 10
    assert cut.container_info is not None and sorted(cut.container_info) == [
        (f"pod-{index:05d}", "c") for index in range(10)
    ]
    assert cut.cpu_allocated == {0: 25}
    for _ in range(3):
        assert limit.apply(whole) is cut  # counted once while the allocation does not change
    (report,) = registry.reports()
    assert report.errors["over_limit"] == 1


def test_under_the_limit_the_allocation_is_the_same_object() -> None:
    registry = SourceRegistry()
    limit = ContainerLimit(registry.tracker("cpu_manager"), limit=10)
    whole = allocation(10)
    assert limit.apply(whole) is whole
    assert registry.reports() == ()
