"""Background refresh of the kubelet's podresources API, and its join into the kubelet state.

:meth:`PodResourcesRefresher.refresh` runs in the scheduler's thread (every ``--interval``, and at once
when the scheduler is triggered). It makes the RPCs and swaps in a new immutable
:class:`~otel_numa.accounting.join.PodResourcesView`; snapshot builds only read
:attr:`PodResourcesRefresher.latest`, so a metric callback never waits on an RPC, whatever the kubelet does.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from otel_numa.accounting.allocation import with_podresources
from otel_numa.accounting.join import join_pods, live_pod_set
from otel_numa.model import (
    AllocatableResources,
    JoinedPodResources,
    KubeletState,
    PodResourcesView,
    Source,
    Topology,
)
from otel_numa.snapshot.collectors.kubelet import RACY_LISTING_NS
from otel_numa.snapshot.memo import LastResult
from otel_numa.snapshot.source_status import SourceRegistry
from otel_numa.sources.errors import SourceError, SourceMissing
from otel_numa.sources.files import StatSignature
from otel_numa.sources.podresources_answer import MachineLimits

if TYPE_CHECKING:
    from otel_numa.sources.podresources import PodResourcesClient

log = logging.getLogger(__name__)

SOURCE = Source.PODRESOURCES
FIRST_RETRY_S = 0.5
# GetAllocatableResources is asked again at least this often, whatever the kubelet's files say
ALLOCATABLE_MAX_AGE_S = 60.0
DEVICE_CHECKPOINT = "kubelet_internal_checkpoint"


class PodResourcesRefresher:
    """Owns the client; keeps the last good answer.

    While the socket is missing, attempts back off exponentially from 0.5 s up to ``interval_s``, so a
    triggered scheduler does not hammer a missing socket and a socket that appears is seen within one
    interval. The source tracker logs one line when the socket disappears and one when it is back. An RPC
    that fails keeps the last good view (its age grows in ``numa.agent.source.age``); a socket that
    disappears drops it, and the checkpoints alone decide again. An answer is read within the machine's
    limits once its topology is known (an answer naming ids it lacks, or past a cap, is refused whole and
    counted like a failed RPC).

    ``List`` is asked every round: a pod leaves it when the API server deletes it, which no file on the
    node tells. ``GetAllocatableResources`` changes only when a device plugin registers, leaves or reports
    other devices (the kubelet then rewrites its device checkpoint, by rename, in the device-plugins
    directory, where the plugins' sockets are too) or when the kubelet restarts (a new socket): it is asked
    again when the socket's or that directory's signature changed (:func:`allocatable_signature`), when the
    machine's limits changed, and at least every :data:`ALLOCATABLE_MAX_AGE_S`.
    """

    def __init__(
        self,
        socket_path: Path,
        registry: SourceRegistry,
        interval_s: float,
        *,
        client: PodResourcesClient | None = None,
        clock: Callable[[], float] = time.monotonic,
        topology: Callable[[], Topology | None] = lambda: None,
        device_plugins: Path | None = None,
    ) -> None:
        self._socket_path = socket_path
        self._device_plugins = device_plugins
        # the signature GetAllocatableResources was last answered under, and when
        self._allocatable_seen: tuple[object, ...] | None = None
        self._allocatable_at = 0.0
        self._topology = topology
        self._client_instance = client
        self._tracker = registry.tracker(SOURCE)
        self._interval_s = interval_s
        self._clock = clock
        self._latest: PodResourcesView | None = None
        self._retry_delay_s = 0.0
        self._next_attempt = 0.0
        self._allocatable_unimplemented = False
        self._counted_disagreements: frozenset[tuple[str, str]] = frozenset()
        self._joined: LastResult[KubeletState] = LastResult()

    @property
    def latest(self) -> PodResourcesView | None:
        """The last good answer (replaced whole, never mutated: safe to read from any thread)."""
        return self._latest

    def _client(self) -> PodResourcesClient:
        """The client, made when the socket first exists: gRPC is not even imported on a node without it."""
        if self._client_instance is None:
            if not os.path.exists(self._socket_path):
                raise SourceMissing(f"{self._socket_path}: no such socket")
            from otel_numa.sources.podresources import PodResourcesClient

            self._client_instance = PodResourcesClient(self._socket_path)
        return self._client_instance

    def refresh(self) -> None:
        with self._tracker.timed():
            self._refresh()

    def _refresh(self) -> None:
        now = self._clock()
        if now < self._next_attempt:
            return
        limits = self._limits()
        try:
            pods = self._client().list_pods(limits)
            allocatable = self._allocatable_now(limits, now)
        except SourceMissing as missing:
            self._latest = self._allocatable_seen = None
            self._retry_delay_s = min(self._interval_s, max(FIRST_RETRY_S, 2 * self._retry_delay_s))
            self._next_attempt = now + self._retry_delay_s
            self._tracker.failed(missing)
            return
        except SourceError as error:
            self._tracker.failed(error)  # keeps the last good view
            return
        self._retry_delay_s = self._next_attempt = 0.0
        self._latest = PodResourcesView(pods, allocatable)
        self._tracker.succeeded()

    def _limits(self) -> MachineLimits:
        """The machine's CPU and NUMA ids, once its topology is known."""
        topology = self._topology()
        if topology is None or not topology.online_cpus:
            return MachineLimits()
        return MachineLimits(max(topology.online_cpus), frozenset(topology.node_ids))

    def _allocatable_now(self, limits: MachineLimits, now: float) -> AllocatableResources | None:
        """The last answer again while nothing tells that it changed, else a new one."""
        signature = allocatable_signature(self._socket_path, self._device_plugins, limits)
        latest = self._latest
        if (
            signature is not None
            and signature == self._allocatable_seen
            and latest is not None
            and now - self._allocatable_at < ALLOCATABLE_MAX_AGE_S
        ):
            return latest.allocatable
        self._allocatable_seen = None  # until answered
        allocatable = self._allocatable(limits)
        self._allocatable_seen, self._allocatable_at = signature, now
        return allocatable

    def _allocatable(self, limits: MachineLimits) -> AllocatableResources | None:
        if self._allocatable_unimplemented:
            return None
        try:
            return self._client().allocatable(limits)
        except SourceError as error:
            if error.error_type != "unimplemented":
                raise
            log.info("the kubelet has no GetAllocatableResources; allocatable CPUs and devices stay unknown")
            self._allocatable_unimplemented = True
            return None

    def close(self) -> None:
        if self._client_instance is not None:
            self._client_instance.close()

    # Into the kubelet state ---------------------------------------------------------------------

    def merge_into(self, state: KubeletState) -> KubeletState:
        """``state`` joined with the latest view; the same object back while no input changed."""
        view = self._latest
        if view is None:
            return state
        inputs = (view, state.pod_names, state.live_pods, state.cpu, state.memory, state.devices)

        def join() -> KubeletState:
            joined = join_pods(view, state.pod_names, state.live_pods, checkpoint_uids(state))
            return with_podresources(state, joined, live_pod_set(joined, state.live_pods))

        return self._joined.get(inputs, join)

    def count_disagreements(
        self, disagreements: frozenset[tuple[str, str]], joined: JoinedPodResources
    ) -> None:
        """Count each container once when it starts to disagree, as ``error.type="disagreement"`` on
        ``numa.agent.source.errors{numa.source="podresources"}`` (one series, whatever the pod)."""
        for uid, container in sorted(disagreements - self._counted_disagreements):
            pod = joined.by_uid.get(uid)
            name = f"{pod.namespace}/{pod.name}" if pod is not None else uid
            self._tracker.failed(
                SourceError(
                    f"{name} container {container}: the checkpoints disagree with the API, which wins",
                    error_type="disagreement",
                )
            )
        self._counted_disagreements = disagreements


def allocatable_signature(
    socket: Path, device_plugins: Path | None, limits: MachineLimits
) -> tuple[object, ...] | None:
    """What GetAllocatableResources' answer depends on that a stat can tell: the socket (a restarted
    kubelet makes it anew), the device-plugins directory (a plugin's socket made or removed, the device
    checkpoint replaced) and the checkpoint itself (written in place); ``None`` when that cannot be known
    (no such directory, or one changed within the last second)."""
    if device_plugins is None:
        return None
    try:
        sock = os.stat(socket)  # a socket made anew can reuse an inode number, not its change time
    except OSError:
        return None
    directory = StatSignature.of(device_plugins)
    if directory is None:
        return None
    written = StatSignature.of(device_plugins / DEVICE_CHECKPOINT)
    newest = max(directory.mtime_ns, written.mtime_ns if written is not None else 0)
    if time.time_ns() - newest < RACY_LISTING_NS:
        return None
    return (sock.st_ino, sock.st_ctime_ns, directory, written, limits)


def checkpoint_uids(state: KubeletState) -> frozenset[str]:
    """The pod UIDs the checkpoints refer to (tie-breaker of the join)."""
    uids: set[str] = set()
    if state.cpu is not None and not state.cpu.entries_keyed_by_container_id:
        uids.update(state.cpu.entries)
        uids.update(state.cpu.pod_entries)
    if state.memory is not None:
        uids.update(state.memory.entries)
    if state.devices is not None:
        uids.update(entry.pod_uid for entry in state.devices.entries)
    return frozenset(uids)
