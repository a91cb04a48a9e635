"""At most :data:`MAX_CONTAINERS` containers (and pods) with series of their own, whatever the node runs.

The cgroup walk reads at most this many containers (:mod:`.collectors.cgroups`); the series made from the
records stop at the same number: each container's allocation and alignment, each pod's pool, and the
runtime's ``numa.container.info``. The first ones by pod UID and container name keep theirs, so the same
containers keep them round after round. The per-NUMA totals are not cut: they are counted over every
container before this. What is past the limit is counted once per change of the allocation as
``over_limit`` on the allocation stage's source (``cpu_manager``), and logged once until the node is
back under the limit.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from types import MappingProxyType

from otel_numa.model import Allocation
from otel_numa.snapshot.memo import LastResult
from otel_numa.snapshot.source_status import SourceTracker
from otel_numa.sources.errors import SourceCorrupt

log = logging.getLogger(__name__)

# Far above a node's containers (the kubelet's default is 110 pods, its documented maximum 250 per node,
# and a pod has a few containers); it keeps a runaway node from pushing the agent past its memory limit.
MAX_CONTAINERS = 2000
OVER_LIMIT = "over_limit"


class ContainerLimit:
    def __init__(self, tracker: SourceTracker, limit: int = MAX_CONTAINERS) -> None:
        self._tracker = tracker
        self._limit = limit
        self._cut: LastResult[Allocation] = LastResult()
        self._logged = False

    def apply(self, allocation: Allocation) -> Allocation:
        """``allocation`` with at most the limit of containers, pods and runtime infos; the same object
        while it is under the limit, and the same cut while it does not change."""
        return self._cut.get((allocation,), lambda: self._within_limit(allocation))

    def _within_limit(self, allocation: Allocation) -> Allocation:
        info = allocation.container_info
        largest = max(len(allocation.containers), len(allocation.pods), len(info) if info else 0)
        if largest <= self._limit:
            self._logged = False
            return allocation
        message = f"more than {self._limit} containers or pods; the rest have no series of their own"
        self._tracker.failed(SourceCorrupt(message, error_type=OVER_LIMIT), quiet=True)
        if not self._logged:
            self._logged = True
            log.warning("%s (%d of them); the per-NUMA totals count them all", message, largest)
        if info is not None and len(info) > self._limit:
            info = MappingProxyType({key: info[key] for key in sorted(info)[: self._limit]})
        return replace(
            allocation,
            containers=allocation.containers[: self._limit],
            pods=allocation.pods[: self._limit],
            container_info=info,
        )
