"""Every metric the agent exports, in one table: name, kind, unit, meaning, attributes, group and sources.

The instruments are registered from this table, the README's metric table is generated from it (``python -m
otel_numa.instruments.catalogue --markdown``; a test fails when the README differs), and the agent reads
only the sources that the enabled metrics need. Adding a metric is one entry here plus its callback in
``otel_numa.instruments``.
"""

from __future__ import annotations

import enum
import fnmatch
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from otel_numa.model import Source
from otel_numa.options import MachinePart

Kind = Literal["updown", "gauge", "counter"]
Stability = Literal["stable", "experimental"]


class MetricGroup(enum.StrEnum):
    """Groups of series an operator can switch off, like node_exporter's ``--no-collector.<name>``."""

    TOPOLOGY = "topology"  # node count, capacities
    DISTANCES = "distances"  # numa.node.distance (n^2 series)
    USAGE = "usage"  # cpu time, memory used/free, free hugepages, numastat
    ALLOCATION = "allocation"  # per-NUMA allocatable/allocated from the kubelet
    CONTAINERS = "containers"  # per-container series (the cardinality driver)
    CONTAINER_USAGE = "container_usage"  # per-container NUMA usage, locality and pinning from cgroups
    HEALTH = "health"  # the agent's own source errors, data age and read durations
    COMPAT = "compat"  # numainfo_exporter's series: on with --compat numainfo, never by default


GROUP_MEANINGS: dict[MetricGroup, str] = {
    MetricGroup.TOPOLOGY: "node count and capacities",
    MetricGroup.DISTANCES: "numa.node.distance, n^2 series",
    MetricGroup.USAGE: "CPU time, memory used/free, free hugepages, numastat",
    MetricGroup.ALLOCATION: "per-NUMA allocatable/allocated from the kubelet",
    MetricGroup.CONTAINERS: "per-container series, the cardinality driver (container_usage with it)",
    MetricGroup.CONTAINER_USAGE: "per-container NUMA usage, locality and the kernel's pinning, from cgroups",
    MetricGroup.HEALTH: "the agent's own source errors, data age, read durations and process cost",
    MetricGroup.COMPAT: "numainfo_exporter's series, on only with --compat numainfo",
}


KUBELET_STATE = (Source.CPU_MANAGER, Source.MEMORY_MANAGER, Source.DEVICE_MANAGER, Source.PODRESOURCES)
DRA_RECORDS = (Source.DRA_MANAGER, Source.CDI)  # DRA claims, and what their drivers wrote into CDI specs
POD_CONTAINER = ("k8s.pod.uid", "k8s.container.name", "k8s.pod.name", "k8s.namespace.name")
_POD = ("k8s.pod.uid", "k8s.pod.name", "k8s.namespace.name")
NUMA_ID = "numa.node.id"

# OTel unit -> the suffix the OTel Prometheus exporter appends ("{...}" annotations and "1" add none)
_PROMETHEUS_UNIT_SUFFIX = {"By": "bytes", "s": "seconds"}


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str  # the OpenTelemetry name
    kind: Kind  # updown: additive amount; gauge: ratio or non-additive; counter: monotonic total
    unit: str
    description: str  # one line: the instrument's description, Prometheus HELP
    attributes: tuple[str, ...]  # data point attributes (beyond the resource's)
    group: MetricGroup
    sources: tuple[Source, ...]  # what must be read to compute it ((): the agent's own state)
    stability: Stability = "stable"
    meaning: str = ""  # the README's longer explanation; the description when empty
    # what the machine collector must read for it besides the topology
    parts: tuple[MachinePart, ...] = ()

    @property
    def prometheus_name(self) -> str:
        """The series name on the Prometheus page, as the OTel Prometheus exporter renders it."""
        name = self.name.replace(".", "_")
        suffix = _PROMETHEUS_UNIT_SUFFIX.get(self.unit)
        if suffix and not name.endswith(f"_{suffix}"):
            name = f"{name}_{suffix}"
        return f"{name}_total" if self.kind == "counter" else name


def _m(
    name: str,
    kind: Kind,
    unit: str,
    group: MetricGroup,
    sources: Sequence[Source],
    description: str,
    *,
    attributes: Sequence[str] = (NUMA_ID,),
    stability: Stability = "stable",
    meaning: str = "",
    parts: Sequence[MachinePart] = (),
) -> MetricSpec:
    return MetricSpec(
        name,
        kind,
        unit,
        description,
        tuple(attributes),
        group,
        tuple(sources),
        stability,
        meaning,
        tuple(parts),
    )


G = MetricGroup
S = Source
P = MachinePart
_CONTAINER_NUMA = (*POD_CONTAINER, NUMA_ID)

METRICS: tuple[MetricSpec, ...] = (
    # topology and capacity ------------------------------------------------------------------------
    _m(
        "numa.node.count",
        "updown",
        "{node}",
        G.TOPOLOGY,
        [S.SYSFS],
        "NUMA nodes of the machine.",
        attributes=(),
        meaning="NUMA nodes of the machine (the `nodeN` directories; 1 on a kernel without NUMA)",
    ),
    _m(
        "numa.cpu.capacity",
        "updown",
        "{cpu}",
        G.TOPOLOGY,
        [S.SYSFS],
        "Online CPUs of the NUMA node.",
        meaning="online CPUs of the node (0 for a CPU-less node)",
    ),
    _m(
        "numa.memory.capacity",
        "updown",
        "By",
        G.TOPOLOGY,
        [S.SYSFS],
        "Memory of the NUMA node (MemTotal).",
        meaning="`nodeN/meminfo` MemTotal",
        parts=[P.MEMORY],
    ),
    _m(
        "numa.hugepages.capacity",
        "updown",
        "By",
        G.TOPOLOGY,
        [S.SYSFS],
        "Hugepages of the NUMA node (nr_hugepages x page size).",
        attributes=(NUMA_ID, "k8s.hugepage.size"),
        meaning="`nr_hugepages` x page size",
        parts=[P.HUGEPAGES],
    ),
    _m(
        "numa.node.distance",
        "gauge",
        "{distance}",
        G.DISTANCES,
        [S.SYSFS],
        "Relative access distance from this NUMA node to the target node (10 = local).",
        attributes=(NUMA_ID, "numa.node.target_id"),
        meaning="relative access distance from `nodeN/distance` (10 = local)",
    ),
    # kernel usage -------------------------------------------------------------------------------------
    _m(
        "numa.cpu.time",
        "counter",
        "s",
        G.USAGE,
        [S.SYSFS, S.PROCFS],
        "CPU time of the node's CPUs, by mode (from /proc/stat).",
        attributes=(NUMA_ID, "cpu.mode"),
        meaning="`/proc/stat` per-CPU times summed over the node's CPUs; modes `user`, `nice`, `system`, "
        "`idle`, `iowait`, `irq`, `softirq`, `steal` (guest time is already inside `user`/`nice`)",
        parts=[P.CPU_TIME],
    ),
    _m(
        "numa.memory.usage",
        "updown",
        "By",
        G.USAGE,
        [S.SYSFS],
        "Memory of the NUMA node in use and free.",
        attributes=(NUMA_ID, "system.memory.state"),
        meaning="`nodeN/meminfo` MemUsed (else MemTotal - MemFree) and MemFree; "
        "`system.memory.state` = `used`, `free`",
        parts=[P.MEMORY],
    ),
    _m(
        "numa.hugepages.free",
        "updown",
        "By",
        G.USAGE,
        [S.SYSFS],
        "Free hugepages of the NUMA node (free_hugepages x size).",
        attributes=(NUMA_ID, "k8s.hugepage.size"),
        meaning="`free_hugepages` x page size",
        parts=[P.HUGEPAGES],
    ),
    _m(
        "numa.memory.page.allocations",
        "counter",
        "{page}",
        G.USAGE,
        [S.SYSFS],
        "Page allocation events of the NUMA node by numastat type.",
        attributes=(NUMA_ID, "numa.numastat.type"),
        meaning="`nodeN/numastat`; `numa.numastat.type` = `hit`, `miss`, `foreign`, `interleave_hit`, "
        "`local`, `other`",
        parts=[P.NUMASTAT],
    ),
    # allocation per NUMA node ---------------------------------------------------------------------------
    _m(
        "numa.cpu.allocatable",
        "updown",
        "{cpu}",
        G.ALLOCATION,
        [S.SYSFS, S.PODRESOURCES],
        "CPUs of the node the kubelet may allocate.",
        meaning="CPUs the kubelet may allocate: podresources' allocatable `cpu_ids`, else capacity minus "
        "`--reserved-cpus`; absent when neither is known",
    ),
    _m(
        "numa.cpu.allocated",
        "updown",
        "{cpu}",
        G.ALLOCATION,
        [S.SYSFS, *KUBELET_STATE, *DRA_RECORDS],
        "Exclusive CPUs of live containers and pods as recorded (cpu manager, DRA CPU drivers).",
        meaning="exclusive CPUs of live containers and pods as recorded: the cpu manager (static policy), "
        "pod-level entries, claims of DRA CPU drivers (`dra.cpu`); 0 when the records say none",
    ),
    _m(
        "numa.memory.allocatable",
        "updown",
        "By",
        G.ALLOCATION,
        [S.MEMORY_MANAGER, S.PODRESOURCES],
        "Memory the memory manager may allocate.",
        meaning="memory manager machine state, `memory` allocatable",
    ),
    _m(
        "numa.memory.allocated",
        "updown",
        "By",
        G.ALLOCATION,
        [S.MEMORY_MANAGER, S.PODRESOURCES, *DRA_RECORDS],
        "Memory the memory manager reserved for containers.",
        meaning="memory manager machine state, `memory` reserved for containers, plus claims of a DRA memory "
        "driver (`dra.memory`)",
    ),
    _m(
        "numa.hugepages.allocatable",
        "updown",
        "By",
        G.ALLOCATION,
        [S.MEMORY_MANAGER, S.PODRESOURCES],
        "Hugepages the memory manager may allocate.",
        attributes=(NUMA_ID, "k8s.hugepage.size"),
        meaning="memory manager, `hugepages-<size>` allocatable",
    ),
    _m(
        "numa.hugepages.allocated",
        "updown",
        "By",
        G.ALLOCATION,
        [S.MEMORY_MANAGER, S.PODRESOURCES, *DRA_RECORDS],
        "Hugepages the memory manager reserved for containers.",
        attributes=(NUMA_ID, "k8s.hugepage.size"),
        meaning="memory manager, `hugepages-<size>` reserved, plus claims of a DRA memory driver",
    ),
    _m(
        "numa.device.capacity",
        "updown",
        "{device}",
        G.ALLOCATION,
        [S.PODRESOURCES],
        "Allocatable devices per NUMA node and resource (podresources).",
        attributes=(NUMA_ID, "numa.resource.name"),
        meaning="podresources' allocatable devices",
    ),
    _m(
        "numa.device.allocated",
        "updown",
        "{device}",
        G.ALLOCATION,
        [S.DEVICE_MANAGER, S.PODRESOURCES, S.DRA_MANAGER, S.CDI],
        "Devices allocated to live containers per NUMA node and resource.",
        attributes=(NUMA_ID, "numa.resource.name"),
        meaning="devices of live containers (device checkpoint or podresources), and DRA devices "
        "(podresources `dynamic_resources`, else `dra_manager_state`) under their driver's name, placed by "
        "PCI address or CDI device node, else -1; a device shared by several containers counts once",
    ),
    # allocation per container ------------------------------------------------------------------------
    _m(
        "numa.container.cpu.allocated",
        "updown",
        "{cpu}",
        G.CONTAINERS,
        [S.SYSFS, *KUBELET_STATE, *DRA_RECORDS],
        "Exclusive CPUs of the container on the NUMA node.",
        attributes=_CONTAINER_NUMA,
        meaning="the container's exclusive CPUs on the node (cpu manager, DRA CPU claims)",
    ),
    _m(
        "numa.container.memory.allocated",
        "updown",
        "By",
        G.CONTAINERS,
        [S.MEMORY_MANAGER, S.PODRESOURCES, *DRA_RECORDS],
        "Memory the memory manager reserved for the container on the NUMA node.",
        attributes=_CONTAINER_NUMA,
        meaning="memory manager blocks of the container, and its DRA memory claims",
    ),
    _m(
        "numa.container.hugepages.allocated",
        "updown",
        "By",
        G.CONTAINERS,
        [S.MEMORY_MANAGER, S.PODRESOURCES, *DRA_RECORDS],
        "Hugepages the memory manager reserved for the container on the NUMA node.",
        attributes=(*_CONTAINER_NUMA, "k8s.hugepage.size"),
        meaning="memory manager hugepage blocks of the container, and its DRA hugepages claims",
    ),
    _m(
        "numa.container.device.allocated",
        "updown",
        "{device}",
        G.CONTAINERS,
        [S.DEVICE_MANAGER, S.PODRESOURCES, S.DRA_MANAGER, S.CDI],
        "Devices allocated to the container on the NUMA node.",
        attributes=(*_CONTAINER_NUMA, "numa.resource.name"),
        meaning="devices of the container, DRA devices included; a device shared with other containers "
        "counts 1 for each of them",
    ),
    _m(
        "numa.container.info",
        "gauge",
        "1",
        G.CONTAINERS,
        [S.CRI],
        "Always 1: a running container with its allowlisted pod labels, annotations and environment.",
        attributes=(*POD_CONTAINER, "label_*", "annotation_*", "env_*"),
        meaning="value 1; only with runtime enrichment in `info` mode",
    ),
    # usage per container (cgroups) -------------------------------------------------------------------
    _m(
        "numa.container.memory.usage",
        "updown",
        "By",
        G.CONTAINER_USAGE,
        [S.SYSFS, S.CGROUP, *KUBELET_STATE],
        "Memory of the container on the NUMA node, by kernel memory type (cgroup memory.numa_stat).",
        attributes=(*_CONTAINER_NUMA, "numa.memory.type"),
        meaning="cgroup `memory.numa_stat`; types v2 `anon`, `file`, `kernel_stack`, `shmem`, v1 `anon`, "
        "`file`, `unevictable` (`--container-memory-types` picks them). Types overlap (`shmem` is part of "
        "`file`): do not sum over the type. A node where the container has none of a type has no series",
    ),
    _m(
        "numa.container.cpu.time",
        "counter",
        "s",
        G.CONTAINER_USAGE,
        [S.SYSFS, S.CGROUP, *KUBELET_STATE],
        "CPU time of the container, split over NUMA nodes by its share of effective CPUs on each.",
        attributes=_CONTAINER_NUMA,
        meaning="the cgroup's CPU time; the kernel gives one total, so each interval's increase is split "
        "over nodes in proportion to the container's effective CPUs there: exact for a container confined "
        "to one node, an estimate otherwise, always monotonic",
    ),
    _m(
        "numa.container.memory.locality",
        "gauge",
        "1",
        G.CONTAINER_USAGE,
        [S.SYSFS, S.CGROUP, *KUBELET_STATE],
        "Share of the container's resident memory (anon and file pages) on the NUMA nodes meant for it.",
        attributes=POD_CONTAINER,
        meaning="share of the container's resident memory on its intended NUMA nodes (rule below); "
        "no NUMA id",
        parts=[P.MEMORY],
    ),
    _m(
        "numa.container.cpuset.nodes",
        "updown",
        "{container}",
        G.CONTAINER_USAGE,
        [S.SYSFS, S.CGROUP, *KUBELET_STATE],
        "1 per container: NUMA nodes of its effective CPUs and mems, and the nodes its locality refers to.",
        attributes=(*POD_CONTAINER, "numa.cpu.node.ids", "numa.memory.node.ids", "numa.locality.node.ids"),
        meaning="1 per container: the nodes of its effective CPUs, of its effective `cpuset.mems`, and "
        "those its locality refers to (comma lists such as `0,1`)",
        parts=[P.MEMORY],
    ),
    # the kernel's view beside the records (cgroups) ------------------------------------------------------
    _m(
        "numa.cpu.pinned",
        "updown",
        "{cpu}",
        G.CONTAINER_USAGE,
        [S.SYSFS, S.CGROUP],
        "CPUs of the NUMA node that exactly one pod's containers may run on (effective cpusets).",
        meaning="the kernel's view (cgroup `cpuset.cpus.effective` of every container): CPUs of the node "
        "that exactly one pod's containers may run on, whoever pinned them (the cpu manager, a DRA CPU "
        "driver, an NRI resource policy); absent without cgroups",
    ),
    _m(
        "numa.container.allocation.mismatch",
        "gauge",
        "1",
        G.CONTAINER_USAGE,
        [S.SYSFS, S.CGROUP, *KUBELET_STATE, *DRA_RECORDS],
        "1 when the container's recorded exclusive CPUs (memory nodes) differ from its effective cpuset.",
        attributes=(*POD_CONTAINER, "numa.resource.kind"),
        meaning="`numa.resource.kind` = `cpu`: 1 when the recorded exclusive CPUs differ from the cgroup's "
        "effective `cpuset.cpus`, 0 when they agree; `memory`: the recorded memory NUMA nodes against "
        "`cpuset.mems`; absent for a container with no record or no cgroup; no NUMA id",
    ),
    # the agent's own health ----------------------------------------------------------------------------
    _m(
        "numa.agent.source.errors",
        "counter",
        "{error}",
        G.HEALTH,
        [],
        "Failed reads of a data source, by source and error type.",
        attributes=("numa.source", "error.type"),
        meaning="failed reads of a source; starts at 0 for every source the agent reads, so `rate()` works "
        "from the first scrape",
    ),
    _m(
        "numa.agent.source.age",
        "gauge",
        "s",
        G.HEALTH,
        [],
        "Seconds since the source's data was last known good.",
        attributes=("numa.source",),
        meaning="seconds since the source's data was last known good",
    ),
    _m(
        "numa.agent.source.duration",
        "gauge",
        "s",
        G.HEALTH,
        [],
        "How long the last read of the source took.",
        attributes=("numa.source",),
        meaning="seconds the last read of the source took",
    ),
    _m(
        "numa.agent.source.success",
        "gauge",
        "1",
        G.HEALTH,
        [],
        "1 when the last read of the source succeeded, 0 when it failed.",
        attributes=("numa.source",),
        stability="experimental",
        meaning="1 when the last read of the source succeeded, 0 when it failed (absent when the source "
        "does not exist)",
    ),
    _m(
        "numa.agent.stage.duration",
        "gauge",
        "s",
        G.HEALTH,
        [],
        "How long the last run of a snapshot build stage took.",
        attributes=("numa.stage",),
        stability="experimental",
        meaning="seconds the last run of a snapshot build stage took (`machine`, `allocation`, "
        "`container_usage`, `enrichment`)",
    ),
    _m(
        "numa.agent.stage.success",
        "gauge",
        "1",
        G.HEALTH,
        [],
        "1 when the last run of a snapshot build stage succeeded, 0 when it failed.",
        attributes=("numa.stage",),
        stability="experimental",
        meaning="1 when the stage's last run succeeded, 0 when it raised (its last good result is kept)",
    ),
    _m(
        "numa.agent.fast_path",
        "gauge",
        "1",
        G.HEALTH,
        [],
        "1 while the accelerated export path serves, 0 on the public OpenTelemetry path.",
        attributes=(),
        stability="experimental",
        meaning="1 while the accelerated export path serves (--fast-path auto on the OpenTelemetry releases "
        "it was proven on), 0 on the public path (--fast-path off, or another release)",
    ),
    # the OTLP pushes (only with the otlp exporter) ---------------------------------------------------------
    _m(
        "numa.agent.export.failures",
        "counter",
        "{push}",
        G.HEALTH,
        [],
        "Failed pushes, by exporter and error type.",
        attributes=("numa.exporter", "error.type"),
        meaning="failed OTLP pushes (`numa.exporter` = `otlp`); `error.type` = `timeout` (the agent stopped "
        "the push at `--otlp-timeout`), `failed` (the exporter gave up: refused, unreachable, an error "
        "answer, no answer in its time); both start at 0",
    ),
    _m(
        "numa.agent.export.duration",
        "gauge",
        "s",
        G.HEALTH,
        [],
        "How long the last push took, retries included.",
        attributes=("numa.exporter",),
        meaning="seconds the last OTLP push took, retries included (at most `--otlp-timeout`)",
    ),
    _m(
        "numa.agent.export.age",
        "gauge",
        "s",
        G.HEALTH,
        [],
        "Seconds since the collector last accepted a push.",
        attributes=("numa.exporter",),
        meaning="seconds since the collector last accepted an OTLP push (since start before the first)",
    ),
    # the agent's own process (OpenTelemetry's process semantic conventions) -------------------------------
    _m(
        "process.cpu.time",
        "counter",
        "s",
        G.HEALTH,
        [],
        "CPU time of the agent's own process, by mode.",
        attributes=("cpu.mode",),
        meaning="CPU time of the agent's process; `cpu.mode` = `user`, `system` (`/proc/<pid>/stat`)",
    ),
    _m(
        "process.memory.usage",
        "updown",
        "By",
        G.HEALTH,
        [],
        "Resident memory of the agent's own process.",
        attributes=(),
        meaning="resident memory of the agent's process (`VmRSS` of `/proc/<pid>/status`)",
    ),
    _m(
        "process.open_file_descriptor.count",
        "updown",
        "{file_descriptor}",
        G.HEALTH,
        [],
        "Open file descriptors of the agent's own process.",
        attributes=(),
        meaning="open file descriptors of the agent's process (`/proc/<pid>/fd`)",
    ),
    _m(
        "process.thread.count",
        "updown",
        "{thread}",
        G.HEALTH,
        [],
        "Threads of the agent's own process.",
        attributes=(),
        meaning="threads of the agent's process (`Threads` of `/proc/<pid>/status`)",
    ),
    # numainfo_exporter's series (--compat numainfo) -------------------------------------------------------
    _m(
        "numainfo_node_count",
        "gauge",
        "",
        G.COMPAT,
        [S.SYSFS],
        "NUMA nodes per node, count.",
        attributes=("node",),
        meaning="numainfo_exporter's node count",
    ),
    _m(
        "numainfo_core_count",
        "gauge",
        "",
        G.COMPAT,
        [S.SYSFS, *KUBELET_STATE],
        "CPU cores per NUMA node, count.",
        attributes=("node", "numanode", "type"),
        meaning='`type="capacity"`: CPUs of the node; `type="allocation"`: exclusive CPUs on the node '
        "(only when some CPU is exclusive)",
    ),
    _m(
        "numainfo_version",
        "gauge",
        "",
        G.COMPAT,
        [],
        "Version information",
        attributes=("version", "revision", "branch", "goversion", "kubeversion"),
        meaning="always 1",
    ),
    # PCI locality, pod-level resources and alignment ----------------------------------------------------
    _m(
        "numa.pci.device.count",
        "updown",
        "{device}",
        G.TOPOLOGY,
        [S.SYSFS],
        "PCI functions of the NUMA node by base class and kind (bridges left out).",
        attributes=(NUMA_ID, "pci.device.class", "pci.function.kind"),
        meaning="sysfs `bus/pci/devices`, read with the topology: `numa_node`, else the one node holding the "
        "function's `local_cpulist`, else -1; `pci.device.class` from the base class (`network`, `display`, "
        "`processing_accelerator`, ...), `pci.function.kind` = `physical` or `virtual` (SR-IOV VF)",
        parts=[P.PCI],
    ),
    _m(
        "numa.pod.cpu.allocated",
        "updown",
        "{cpu}",
        G.CONTAINERS,
        [S.SYSFS, *KUBELET_STATE],
        "Exclusive CPUs assigned to the pod as a whole on the NUMA node (pod-level resources).",
        attributes=(*_POD, NUMA_ID),
        meaning="the pod-level exclusive CPU pool (podresources `PodResources.cpu_ids`, cpu manager "
        "`podEntries`); its containers' exclusive CPUs lie inside it, so do not add the two",
    ),
    _m(
        "numa.pod.memory.allocated",
        "updown",
        "By",
        G.CONTAINERS,
        [S.MEMORY_MANAGER, S.PODRESOURCES],
        "Memory the memory manager reserved for the pod as a whole on the NUMA node (pod-level resources).",
        attributes=(*_POD, NUMA_ID),
        meaning="pod-level memory manager blocks (podresources `PodResources.memory`, memory manager "
        "`podEntries`); they overlap the containers' blocks",
    ),
    _m(
        "numa.container.aligned",
        "gauge",
        "1",
        G.CONTAINERS,
        [S.SYSFS, *KUBELET_STATE, S.DRA_MANAGER, S.CDI],
        "1 when the container's NUMA-pinned resources lie on one NUMA node, 0 when they span several.",
        attributes=POD_CONTAINER,
        meaning="1 when every NUMA-pinned resource of the container (exclusive CPUs, memory manager blocks, "
        "devices and DRA devices with a known node) lies on one NUMA node, 0 when they span several; absent "
        "for a container with none; no NUMA id",
    ),
)

BY_NAME = {spec.name: spec for spec in METRICS}
# read from the agent's own process once per collection, when any of them is enabled
PROCESS_METRICS = frozenset(spec.name for spec in METRICS if spec.name.startswith("process."))
# exported only while the otlp exporter is on: they describe its pushes
EXPORT_METRICS = frozenset(spec.name for spec in METRICS if spec.name.startswith("numa.agent.export."))


def prometheus_names() -> frozenset[str]:
    """Every series name the Prometheus page can show (besides ``target_info``)."""
    return frozenset(spec.prometheus_name for spec in METRICS)


def select(
    disabled_groups: Iterable[MetricGroup] = (),
    excluded: Iterable[str] = (),
    *,
    compat: bool = False,
) -> tuple[MetricSpec, ...]:
    """The metrics left after switching groups off and excluding names (OTel or Prometheus, globs)."""
    off = set(disabled_groups)
    if MetricGroup.CONTAINERS in off:  # per-container usage is per-container too
        off.add(MetricGroup.CONTAINER_USAGE)
    if not compat:
        off.add(MetricGroup.COMPAT)
    patterns = tuple(excluded)
    return tuple(
        spec
        for spec in METRICS
        if spec.group not in off
        and not any(
            fnmatch.fnmatchcase(spec.name, pattern) or fnmatch.fnmatchcase(spec.prometheus_name, pattern)
            for pattern in patterns
        )
    )


def sources_of(metrics: Iterable[MetricSpec]) -> frozenset[Source]:
    return frozenset(source for spec in metrics for source in spec.sources)


def machine_parts_of(metrics: Iterable[MetricSpec]) -> frozenset[MachinePart]:
    return frozenset(part for spec in metrics for part in spec.parts)


# The README's table ---------------------------------------------------------------------------------

TABLE_BEGIN = (
    "<!-- metric table: generated by `python -m otel_numa.instruments.catalogue --markdown`; do not edit -->"
)
TABLE_END = "<!-- end of metric table -->"


def _attributes_cell(spec: MetricSpec) -> str:
    shown = [a for a in spec.attributes if a not in (NUMA_ID, *POD_CONTAINER)]
    parts = []
    if set(POD_CONTAINER) & set(spec.attributes):
        parts.append("pod/container" if "k8s.container.name" in spec.attributes else "pod")
    if NUMA_ID in spec.attributes:
        parts.insert(0, "`numa.node.id`")
    parts.extend(f"`{a}`" for a in shown)
    return ", ".join(parts)


def markdown_table() -> str:
    rows = [
        "| OTel name (Prometheus name) | kind | unit | attributes | group | sources | meaning |",
        "|---|---|---|---|---|---|---|",
    ]
    kinds = {"updown": "up-down counter", "gauge": "gauge", "counter": "counter"}
    for spec in METRICS:
        experimental = " (experimental)" if spec.stability == "experimental" else ""
        sources = ", ".join(spec.sources) or "the agent"
        rows.append(
            f"| `{spec.name}` (`{spec.prometheus_name}`){experimental} | {kinds[spec.kind]} | "
            f"`{spec.unit}` | {_attributes_cell(spec)} | `{spec.group}` | {sources} | "
            f"{spec.meaning or spec.description} |"
        )
    return "\n".join([TABLE_BEGIN, *rows, TABLE_END])


def replace_table(readme: str) -> str:
    """``readme`` with its generated metric table replaced by the current one."""
    begin, end = readme.index(TABLE_BEGIN), readme.index(TABLE_END) + len(TABLE_END)
    return readme[:begin] + markdown_table() + readme[end:]


def main(argv: Sequence[str]) -> int:
    if argv == ["--markdown"]:
        print(markdown_table())
        return 0
    if len(argv) == 2 and argv[0] == "--update-readme":
        with open(argv[1], encoding="utf-8") as file:
            text = file.read()
        with open(argv[1], "w", encoding="utf-8") as file:
            file.write(replace_table(text))
        return 0
    print(
        "usage: python -m otel_numa.instruments.catalogue --markdown | --update-readme README.md",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
