"""The sources read over RPC (podresources, the container runtime), as the agent sees them.

The scheduler's thread runs :attr:`BackgroundSources.tasks`; a snapshot build only calls :meth:`merge` and
:meth:`finish`, which read the refreshers' last views and never make an RPC.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from opentelemetry.sdk.metrics import MeterProvider

from otel_numa.collectors.podresources import PodResourcesRefresher
from otel_numa.collectors.runtime import (
    EnrichmentRules,
    RuntimeRefresher,
    apply_enrichment,
    resolve_cri_socket,
)
from otel_numa.instruments.departed import DepartedSeriesJanitor
from otel_numa.model import Allocation, KubeletState
from otel_numa.settings import Settings
from otel_numa.source_status import SourceRegistry

log = logging.getLogger(__name__)


class BackgroundSources:
    def __init__(self, settings: Settings, registry: SourceRegistry) -> None:
        self._settings = settings
        socket = settings.podresources_socket_path
        self.podresources = (
            PodResourcesRefresher(socket, registry, settings.interval) if socket is not None else None
        )
        cri_socket = resolve_cri_socket(settings.cri_socket)
        if cri_socket is None and settings.cri_socket.lower() == "auto":
            log.warning("cri_socket=auto found no containerd or CRI-O socket; runtime enrichment is off")
        rules = EnrichmentRules(
            pod_labels=settings.enrich_pod_labels,
            pod_annotations=settings.enrich_pod_annotations,
            env=settings.enrich_env,
            value_max_length=settings.enrich_value_max_length,
        )
        self.runtime = RuntimeRefresher(cri_socket, rules, registry) if cri_socket is not None else None
        self._janitor: DepartedSeriesJanitor | None = None
        self._last_state: KubeletState | None = None
        self._last_allocation = Allocation()
        self._enrich_inputs: tuple[object, ...] = ()
        self._enriched = Allocation()

    @property
    def tasks(self) -> list[Callable[[], None]]:
        """The scheduler's tasks, to run before a push: refresh each source, then forget departed pods."""
        tasks: list[Callable[[], None]] = []
        if self.podresources is not None:
            tasks.append(self.podresources.refresh)
        if self.runtime is not None:
            tasks.append(self.runtime.refresh)
        tasks.append(self.forget_departed)
        return tasks

    def refresh_once(self) -> None:
        """Every refresh at once (``--once``: there is no scheduler)."""
        for refresher in (self.podresources, self.runtime):
            if refresher is not None:
                refresher.refresh()

    def attach(self, provider: MeterProvider) -> None:
        self._janitor = DepartedSeriesJanitor(provider)

    def merge(self, state: KubeletState) -> KubeletState:
        merged = self.podresources.merge_into(state) if self.podresources is not None else state
        self._last_state = merged
        return merged

    def finish(self, allocation: Allocation) -> Allocation:
        """Count new disagreements and add the runtime's enrichment (memoised on the inputs' identity)."""
        state = self._last_state
        if self.podresources is not None and state is not None and state.podresources is not None:
            self.podresources.count_disagreements(allocation.disagreements, state.podresources)
        view = self.runtime.latest if self.runtime is not None else None
        if view is None:
            result = allocation
        elif len(self._enrich_inputs) == 2 and all(
            new is old for new, old in zip((allocation, view), self._enrich_inputs, strict=True)
        ):
            result = self._enriched
        else:
            result = apply_enrichment(allocation, view, self._settings.enrich_mode)
            self._enrich_inputs, self._enriched = (allocation, view), result
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

    def forget_departed(self) -> None:
        """Drop the SDK's state for the series of pods that are gone (see otel_numa.instruments.departed)."""
        if self._janitor is not None:
            live = self.live_pods()
            self._janitor.forget(live.__contains__)

    def close(self) -> None:
        for refresher in (self.podresources, self.runtime):
            if refresher is not None:
                refresher.close()
