"""Joining the kubelet's podresources answer (pods by namespace and name) to pod UIDs.

The podresources API names pods but carries no UID, while every checkpoint is keyed by UID. The kubelet
names one log directory per pod ``<pod-logs-root>/<namespace>_<name>_<uid>``, which links the two.

The rule, for each pod of a ``List`` answer:

1. its candidate UIDs are those of the log directories named ``<namespace>_<name>_<uid>``;
2. with several candidates (a pod deleted and created again under the same name, whose old log
   directory is not cleaned up yet), only those with a ``<kubelet-root>/pods/<uid>`` directory are kept,
   when that directory is readable; then, if still several, only those a checkpoint refers to;
3. exactly one candidate left: the pod is *joined* to that UID. Otherwise it is *unjoined*.

What happens to an unjoined pod: it has no per-container series from podresources (they need
``k8s.pod.uid``); its exclusive CPUs and devices still count in the per-NUMA totals
(``numa.cpu.allocated``, ``numa.device.allocated``); whatever the checkpoints hold for its UID stays as the
checkpoints say, without a name; and, since podresources then no longer accounts for every live UID, the
live pod set falls back to ``<kubelet-root>/pods/`` (or to "unknown, keep every entry"), so no checkpoint
entry of that pod is dropped as stale.
"""

from __future__ import annotations

from collections.abc import Mapping

from otel_numa.model import JoinedPodResources, PodName, PodResources, PodResourcesView


def uids_by_pod_name(identities: Mapping[str, PodName]) -> dict[PodName, tuple[str, ...]]:
    """Invert ``uid -> (namespace, name)`` (from the log directories) into ``(namespace, name) -> uids``."""
    found: dict[PodName, list[str]] = {}
    for uid, pod_name in sorted(identities.items()):
        found.setdefault(pod_name, []).append(uid)
    return {pod_name: tuple(uids) for pod_name, uids in found.items()}


def _narrow(candidates: tuple[str, ...], keep: frozenset[str] | None) -> tuple[str, ...]:
    if len(candidates) <= 1 or keep is None:
        return candidates
    return tuple(uid for uid in candidates if uid in keep)


def join_pods(
    view: PodResourcesView,
    identities: Mapping[str, PodName],
    pod_directories: frozenset[str] | None,
    checkpoint_uids: frozenset[str],
) -> JoinedPodResources:
    """Key the pods of ``view`` by UID following the module's rule; the others are returned unjoined."""
    by_name = uids_by_pod_name(identities)
    by_uid: dict[str, PodResources] = {}
    unjoined: list[PodResources] = []
    for pod in view.pods:
        candidates = by_name.get((pod.namespace, pod.name), ())
        candidates = _narrow(candidates, pod_directories)
        candidates = _narrow(candidates, checkpoint_uids)
        if len(candidates) == 1 and candidates[0] not in by_uid:
            by_uid[candidates[0]] = pod
        else:
            unjoined.append(pod)
    return JoinedPodResources(by_uid=by_uid, unjoined=tuple(unjoined), allocatable=view.allocatable)


def live_pod_set(joined: JoinedPodResources, pod_directories: frozenset[str] | None) -> frozenset[str] | None:
    """The UIDs of live pods: podresources' own when every pod joined, else the pod directories as well
    (None, "unknown", when those cannot be read either)."""
    uids = frozenset(joined.by_uid)
    if not joined.unjoined:
        return uids
    return None if pod_directories is None else uids | pod_directories
