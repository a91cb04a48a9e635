"""When the public path rebuilds its readers to forget departed pods' series.

The SDK keeps an aggregation for every attribute set an instrument ever reported, for the life of the
MeterProvider, and folds sets beyond the cardinality limit into one overflow series; its public API has no
way to forget one set. So, without the ``forget_departed`` patch, the pipeline replaces the MeterProvider
and its readers once the pods that departed since the last rebuild are as many as the live ones (and at
least :data:`MIN_DEPARTED`). Each instrument then holds at most the series of about twice the live pods
(plus the pod-less ones): memory stays bounded through any churn, and no live pod's series reaches the
overflow series while a node's live series per instrument stay under half the cardinality limit.

What it costs: every series starts afresh at a rebuild, so cumulative counters pushed over OTLP get a new
start time (their values go on: they are totals read from the kernel and the kubelet); the Prometheus page,
which carries no start times, does not change. Pushes export what the old readers hold just before, and
the new delta readers are primed without sending, so no delta is lost or counted twice.
"""

from __future__ import annotations

MIN_DEPARTED = 100  # no rebuild for a handful of departed pods: each one restarts every counter


class RebuildPlan:
    """Counts the pods seen since the last rebuild and says when the next one is due."""

    def __init__(self, cardinality_limit: int) -> None:
        self._cardinality_limit = cardinality_limit
        self._seen: set[str] = set()
        self.departed = 0

    def seen(self, live_pods: frozenset[str]) -> bool:
        """Record the live pods; True when the readers should be rebuilt now."""
        self._seen |= live_pods
        self.departed = len(self._seen) - len(live_pods & self._seen)
        threshold = max(MIN_DEPARTED, len(live_pods))
        return self.departed >= min(threshold, self._cardinality_limit // 2)

    def rebuilt(self) -> None:
        self._seen.clear()
        self.departed = 0
