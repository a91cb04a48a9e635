"""numainfo_exporter's series, with its meaning, so its dashboards keep working (``--compat numainfo``).

- ``numainfo_node_count{node}``: NUMA nodes of the machine.
- ``numainfo_core_count{node,numanode="nodeNN",type="capacity"}``: CPUs of the NUMA node; with
  ``type="allocation"``, its exclusive CPUs, for every node, but only when some CPU of the machine is
  exclusively allocated (numainfo_exporter reported nothing rather than a misleading 0). Unlike
  numainfo_exporter, entries of pods that no longer exist are not counted.
- ``numainfo_version{...} 1``.
"""

from __future__ import annotations

from collections.abc import Iterator

from otel_numa import __version__
from otel_numa.instruments.base import Observe, Point
from otel_numa.series_attributes import series_attributes, series_maker
from otel_numa.snapshot.store import Snapshot


def observers(node_name: str) -> dict[str, Observe]:
    # each series' attributes as one flat tuple: these series are observed again at every collection
    on_node = series_attributes({"node": node_name})
    by_numanode = series_maker({"node": node_name}, ("numanode", "type"))
    version_attributes = series_attributes(
        {"version": "1", "revision": __version__, "branch": "otel-numa", "goversion": "", "kubeversion": ""}
    )

    def node_count(snapshot: Snapshot) -> Iterator[Point]:
        if snapshot.machine is not None:
            yield len(snapshot.machine.topology.nodes), on_node

    def core_count(snapshot: Snapshot) -> Iterator[Point]:
        if snapshot.machine is None:
            return
        allocated = snapshot.allocation.cpu_allocated
        for node in snapshot.machine.topology.nodes:
            numanode = f"node{node.id:02d}"
            if node.cpus_known:
                yield len(node.cpus), by_numanode(numanode, "capacity")
            if allocated and any(allocated.values()):  # "no allocation" is no series, never 0
                yield allocated.get(node.id, 0), by_numanode(numanode, "allocation")

    def version(_snapshot: Snapshot) -> Iterator[Point]:
        yield 1, version_attributes

    return {
        "numainfo_node_count": node_count,
        "numainfo_core_count": core_count,
        "numainfo_version": version,
    }
