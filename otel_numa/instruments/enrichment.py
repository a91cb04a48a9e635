"""``numa.container.info``: one series of value 1 per running container, carrying the opt-in enrichment.

Joined to the per-container series on ``k8s.pod.uid`` and ``k8s.container.name``, e.g. in PromQL
``numa_container_cpu_allocated * on (k8s_pod_uid, k8s_container_name) group_left (label_team)
numa_container_info``. Present only while the runtime's enrichment is on (``cri_socket``) in ``info`` mode.
"""

from __future__ import annotations

from collections.abc import Iterator

from otel_numa.instruments.base import Observe, Point
from otel_numa.snapshot.store import Snapshot


def _info(snapshot: Snapshot) -> Iterator[Point]:
    info = snapshot.allocation.container_info
    if info is None:
        return
    for (uid, container), attributes in sorted(info.items()):
        yield 1, {"k8s.pod.uid": uid, "k8s.container.name": container, **attributes}


OBSERVERS: dict[str, Observe] = {"numa.container.info": _info}
