"""The sources read over RPC (podresources, the container runtime), as the agent sees them.

The scheduler's thread runs :attr:`BackgroundSources.tasks`; a snapshot build only calls :meth:`merge` and
:meth:`enrich`, which read the refreshers' last views and never make an RPC.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from otel_numa.model import Allocation, KubeletState, Topology
from otel_numa.options import PodResourcesOptions, RuntimeOptions
from otel_numa.snapshot.collectors.podresources import PodResourcesRefresher
from otel_numa.snapshot.collectors.runtime import (
    EnrichmentRules,
    RuntimeRefresher,
    apply_enrichment,
    resolve_cri_socket,
)
from otel_numa.snapshot.memo import LastResult
from otel_numa.snapshot.source_status import SourceRegistry

log = logging.getLogger(__name__)

LivePodsListener = Callable[[frozenset[str]], None]


class BackgroundSources:
    def __init__(
        self,
        podresources: PodResourcesOptions | None,
        runtime: RuntimeOptions | None,
        registry: SourceRegistry,
        topology: Callable[[], Topology | None] = lambda: None,
    ) -> None:
        self.podresources = (
            PodResourcesRefresher(
                podresources.socket,
                registry,
                podresources.interval_s,
                topology=topology,
                device_plugins=podresources.device_plugins,
            )
            if podresources is not None
            else None
        )
        self.runtime: RuntimeRefresher | None = None
        self._mode = runtime.mode if runtime is not None else "info"
        if runtime is not None:
            cri_socket = resolve_cri_socket(runtime.cri_socket)
            if cri_socket is None:
                log.warning("cri_socket=auto found no containerd or CRI-O socket; runtime enrichment is off")
            else:
                rules = EnrichmentRules(
                    runtime.pod_labels, runtime.pod_annotations, runtime.env, runtime.value_max_length
                )
                self.runtime = RuntimeRefresher(cri_socket, rules, registry)
        self.live_pods_listener: LivePodsListener | None = None
        self._last_state: KubeletState | None = None
        self._last_allocation = Allocation()
        self._enriched: LastResult[Allocation] = LastResult()

    @property
    def tasks(self) -> list[Callable[[], None]]:
        """The scheduler's tasks, to run before a push: refresh each source, then report the live pods."""
        tasks: list[Callable[[], None]] = []
        if self.podresources is not None:
            tasks.append(self.podresources.refresh)
        if self.runtime is not None:
            tasks.append(self.runtime.refresh)
        tasks.append(self.report_live_pods)
        return tasks

    def refresh_once(self) -> None:
        """Every refresh at once (``--once``: there is no scheduler)."""
        for refresher in (self.podresources, self.runtime):
            if refresher is not None:
                refresher.refresh()

    def merge(self, state: KubeletState) -> KubeletState:
        merged = self.podresources.merge_into(state) if self.podresources is not None else state
        self._last_state = merged
        return merged

    def count_disagreements(self, allocation: Allocation) -> None:
        state = self._last_state
        if self.podresources is not None and state is not None and state.podresources is not None:
            self.podresources.count_disagreements(allocation.disagreements, state.podresources)

    def enrich(self, allocation: Allocation) -> Allocation:
        """``allocation`` with the runtime's enrichment (recomputed only when an input changed)."""
        view = self.runtime.latest if self.runtime is not None else None
        result = allocation
        if view is not None:
            mode = self._mode
            result = self._enriched.get((allocation, view), lambda: apply_enrichment(allocation, view, mode))
        self._last_allocation = result
        return result

    def live_pods(self) -> frozenset[str]:
        """The live pod set when known; else the pods the last allocation or the runtime still name."""
        state = self._last_state
        if state is not None and state.live_pods is not None:
            return state.live_pods
        uids = {container.container.pod_uid for container in self._last_allocation.containers}
        view = self.runtime.latest if self.runtime is not None else None
        if view is not None:
            uids.update(uid for uid, _name in view.attributes)
        return frozenset(uids)

    def report_live_pods(self) -> None:
        """Tell the listener (the pipeline, which forgets departed pods' series) who is alive."""
        if self.live_pods_listener is not None:
            self.live_pods_listener(self.live_pods())

    def close(self) -> None:
        for refresher in (self.podresources, self.runtime):
            if refresher is not None:
                refresher.close()
