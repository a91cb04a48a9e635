"""Per-container NUMA memory, effective cpusets and CPU time from the kubelet's cgroups.

The kubelet names its cgroups in one of two ways (``pkg/kubelet/cm``), and runs on either cgroup version:

- systemd driver: ``kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid, '-' as '_'>.slice/
  <runtime>-<container id>.scope``; Guaranteed pods sit directly in ``kubepods.slice`` as
  ``kubepods-pod<uid>.slice``.
- cgroupfs driver: ``kubepods/<qos>/pod<uid>/<container id>``; Guaranteed pods are ``kubepods/pod<uid>``.
  CRI-O names the container directory ``crio-<id>`` here too.

Files read per container:

- v2 (``<root>/cgroup.controllers`` exists): ``memory.numa_stat`` (``type N0=<bytes> N1=<bytes>``, any key
  order, new keys may appear), ``cpuset.cpus.effective``, ``cpuset.mems.effective``, ``cpu.stat``
  (``usage_usec``).
- v1 (one hierarchy per controller under ``<root>/<controller>``): ``memory/…/memory.numa_stat``
  (``type=<total> N0=<pages> …`` in pages), ``cpuset/…/cpuset.effective_cpus`` and ``effective_mems``
  (else ``cpuset.cpus``/``cpuset.mems``), ``cpuacct/…/cpuacct.usage`` (ns).

This runs for every container each export interval, so the hot path uses ``os.scandir`` and raw ``os``
reads, and reads each file once.

An effective cpuset is the kernel's view of where a container may run. The kernel prints it as one line;
a file that is empty, is not one whole line (a write caught half-way: it changed while being read), is no
list, or names CPUs or NUMA nodes the machine lacks is not trusted: with an error sink, that container's
cpusets are unknown this round and the error goes to the sink, while its memory and CPU time still count.
"""

from __future__ import annotations

import errno
import functools
import os
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from otel_numa.model import CgroupLayout, ContainerNumaUsage, shared_name, shared_set, small_map
from otel_numa.sources.errors import SourceCorrupt, SourceMissing, SourceUnavailable
from otel_numa.sources.files import (
    CGROUP_FILE_BYTES,
    MAX_CPU_ID,
    MAX_NUMA_NODE_ID,
    OUT_OF_RANGE,
    ErrorSink,
    KeptFiles,
    parse_cpulist,
    read_optional_text,
)

QosClass = Literal["guaranteed", "burstable", "besteffort"]

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

_V1_CPUACCT_DIRS = ("cpuacct", "cpu,cpuacct", "cpuacct,cpu")
_QOS_DIR_NAMES: Mapping[str, QosClass] = {"burstable": "burstable", "besteffort": "besteffort"}
# Pod UIDs are UUIDs, static pods use a hex hash; systemd names carry '_' for '-'.
_CGROUPFS_POD = re.compile(r"pod([0-9a-fA-F][0-9a-fA-F-]*)")
_SYSTEMD_POD = re.compile(r".*?-pod([0-9a-fA-F][0-9a-fA-F_]*)\.slice")
_CONTAINER_ID = re.compile(r"[0-9a-f]{12,}")


@dataclass(frozen=True, slots=True)
class ContainerCgroup:
    pod_uid: str
    container_id: str
    qos: QosClass
    # the container's directory (v2), or its directory in the memory hierarchy (v1); a string, as read
    path: str


class _Vanished(Exception):
    """The cgroup was removed while being read (the container stopped)."""


# --- layout ----------------------------------------------------------------------------------------


def _is_kubepods_name(name: str) -> bool:
    # A custom kubelet --cgroup-root nests it: systemd names it "<parent>-kubepods.slice".
    return name in ("kubepods", "kubepods.slice") or name.endswith("-kubepods.slice")


def _child_dirs(path: str) -> list[os.DirEntry[str]]:
    """Subdirectories of ``path``; a directory that vanished has none."""
    try:
        with os.scandir(path) as entries:
            return [entry for entry in entries if entry.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        if exc.errno == errno.ENODEV:
            return []
        raise SourceUnavailable(f"{path}: {exc.strerror or exc}") from exc


def _kubepods_roots(hierarchy: str, listed: list[str] | None = None) -> list[str]:
    """The kubepods cgroups directly under ``hierarchy``, else one level deeper (custom cgroup root); each
    directory listed goes to ``listed``."""
    top = _child_dirs(hierarchy)
    if listed is not None:
        listed.append(hierarchy)
    found = [entry.path for entry in top if _is_kubepods_name(entry.name)]
    if found:
        return found
    if listed is not None:
        listed += [entry.path for entry in top]
    return [inner.path for entry in top for inner in _child_dirs(entry.path) if _is_kubepods_name(inner.name)]


def kubepods_cgroups(cgroup_root: Path, layout: CgroupLayout) -> tuple[str, ...]:
    """The kubepods cgroups every container cgroup is found under (in the memory hierarchy for v1)."""
    return tuple(_kubepods_roots(_hierarchy(cgroup_root, layout)))


def _hierarchy(cgroup_root: Path, layout: CgroupLayout) -> str:
    """Where the kubepods tree lives: the root itself (v2) or the memory controller's mount (v1)."""
    return str(cgroup_root) if layout == "v2" else os.path.join(cgroup_root, "memory")


def detect_cgroup_layout(cgroup_root: Path) -> CgroupLayout:
    """``v2`` for the unified hierarchy, ``v1`` for per-controller mounts (hybrid mode counts as v1).

    Raises :class:`SourceMissing` when no kubepods hierarchy exists under the root.
    """
    if os.path.isfile(os.path.join(cgroup_root, "cgroup.controllers")):
        layout: CgroupLayout = "v2"
    elif os.path.isdir(os.path.join(cgroup_root, "memory")):
        layout = "v1"
    else:
        raise SourceMissing(f"{cgroup_root}: no cgroup v2 root and no v1 memory hierarchy")
    if not _kubepods_roots(_hierarchy(cgroup_root, layout)):
        raise SourceMissing(f"{cgroup_root}: no kubepods cgroup ({layout})")
    return layout


# --- discovery -------------------------------------------------------------------------------------


def _pod_uid_of(name: str) -> str | None:
    """The pod UID when ``name`` is a pod cgroup directory (``pod<uid>``, ``<parent>-pod<uid_>.slice``)."""
    if name.endswith(".slice"):
        match = _SYSTEMD_POD.fullmatch(name)
        return shared_name(match.group(1).replace("_", "-")) if match else None
    match = _CGROUPFS_POD.fullmatch(name)
    return shared_name(match.group(1)) if match else None


def _qos_of_dir(name: str) -> QosClass | None:
    """The QoS class a QoS-level directory holds (``burstable``, ``kubepods-besteffort.slice``)."""
    base = name.removesuffix(".slice").rsplit("-", 1)[-1]
    return _QOS_DIR_NAMES.get(base)


def _container_id_of(name: str) -> str | None:
    """The id in ``<runtime>-<id>.scope``, ``crio-<id>`` or ``<id>``; conmon scopes are not containers."""
    stem = name.removesuffix(".scope")
    prefix, _, container_id = stem.rpartition("-")
    if prefix.endswith("conmon"):
        return None
    return shared_name(container_id) if _CONTAINER_ID.fullmatch(container_id) else None


def _pods_under(kubepods: str, listed: list[str]) -> Iterator[tuple[str, str, QosClass]]:
    """(pod directory, pod UID, QoS class) for every pod cgroup below one kubepods cgroup; each directory
    listed goes to ``listed``."""
    listed.append(kubepods)
    for entry in _child_dirs(kubepods):
        pod_uid = _pod_uid_of(entry.name)
        if pod_uid is not None:  # Guaranteed pods have no QoS level
            yield entry.path, pod_uid, "guaranteed"
            continue
        qos = _qos_of_dir(entry.name)
        if qos is None:
            continue
        listed.append(entry.path)
        for pod_entry in _child_dirs(entry.path):
            pod_uid = _pod_uid_of(pod_entry.name)
            if pod_uid is not None:
                yield pod_entry.path, pod_uid, qos


def find_container_cgroups(cgroup_root: Path, listed: list[str] | None = None) -> tuple[ContainerCgroup, ...]:
    """Every container cgroup (sandboxes included) the kubelet made, for either driver and version; every
    directory listed on the way (the hierarchy's root, the kubepods, QoS and pod cgroups) goes to
    ``listed``: a container comes or goes by an entry made or removed in one of them.

    Raises :class:`SourceMissing` when there is no kubepods hierarchy.
    """
    return _find(cgroup_root, detect_cgroup_layout(cgroup_root), [] if listed is None else listed)


def _find(cgroup_root: Path, layout: CgroupLayout, listed: list[str]) -> tuple[ContainerCgroup, ...]:
    found: list[ContainerCgroup] = []
    for kubepods in _kubepods_roots(_hierarchy(cgroup_root, layout), listed):
        for pod_dir, pod_uid, qos in _pods_under(kubepods, listed):
            listed.append(pod_dir)
            for entry in _child_dirs(pod_dir):
                container_id = _container_id_of(entry.name)
                if container_id is not None:
                    found.append(ContainerCgroup(pod_uid, container_id, qos, entry.path))
    return tuple(found)


# --- reading ---------------------------------------------------------------------------------------


def _read(directory: str, name: str, files: KeptFiles | None) -> str | None:
    """A cgroup file's text, or ``None`` when it is not there (or its cgroup was just removed); through
    ``files`` when given (kept open from one round to the next)."""
    if files is None:
        return read_optional_text(f"{directory}/{name}", limit=CGROUP_FILE_BYTES)
    return decoded(files.read_optional(directory, name, limit=CGROUP_FILE_BYTES))


def decoded(data: bytes | None) -> str | None:
    """A kernel file's text as :func:`~otel_numa.sources.files.read_text` gives it."""
    return data.rstrip(b"\x00").decode("utf-8", errors="replace") if data is not None else None


def container_directories(cgroup: ContainerCgroup, layout: CgroupLayout) -> tuple[str, ...]:
    """Where a container's cgroup files are: its directory (v2), or its directories in the memory, cpuset
    and CPU accounting hierarchies that may hold them (v1)."""
    if layout == "v2":
        return (cgroup.path,)
    controllers = ("cpuset", *_V1_CPUACCT_DIRS)
    return (cgroup.path, *(_v1_controller_dir(cgroup.path, controller) for controller in controllers))


def _node_values(tokens: list[str], scale: int, nodes: Collection[int] | None) -> dict[int, int]:
    """``N<id>=<value>`` tokens as node id -> value x scale; other tokens are not per-node and skipped.

    A node id the machine does not have (any id of ``nodes`` when given, else the kernel's largest) makes
    the file corrupt (``out_of_range``): one such file must not become thousands of series."""
    by_node: dict[int, int] = {}
    for token in tokens:
        node_text, separator, value_text = token.partition("=")
        if not separator or node_text[:1] != "N":
            continue
        try:
            node, value = int(node_text[1:]), int(value_text) * scale
        except ValueError as exc:
            raise SourceCorrupt("memory.numa_stat: a bad N<id>=<value> entry") from exc  # never quoted
        if not 0 <= node <= MAX_NUMA_NODE_ID or (nodes is not None and node not in nodes):
            raise SourceCorrupt(
                "memory.numa_stat: a NUMA node the machine does not have", error_type=OUT_OF_RANGE
            )
        by_node[node] = value
    return by_node


def parse_numa_stat_v2(
    text: str, types: Iterable[str] | None = None, nodes: Collection[int] | None = None
) -> dict[str, dict[int, int]]:
    """cgroup v2 ``memory.numa_stat``: type -> node -> bytes, for every type listed (or only ``types``);
    only the NUMA ids of ``nodes`` (when given) are accepted."""
    # parsing is most of the cost on many-node machines: only the wanted lines are looked at, found by
    # searching the text for them (a file has ~30 types, the agent wants 2 or 3)
    lines = text.splitlines() if types is None else _lines_of(text, types)
    memory: dict[str, dict[int, int]] = {}
    for line in lines:
        tokens = line.split()
        by_node = _node_values(tokens[1:], 1, nodes) if len(tokens) > 1 else None
        if by_node:
            memory[tokens[0]] = by_node
    return memory


def _lines_of(text: str, types: Iterable[str]) -> Iterator[str]:
    """The line of each of ``types`` in a ``<type> <values>`` file, in the file's order of the types."""
    starts = []
    for memory_type in types:
        head = f"{memory_type} "
        if text.startswith(head):
            starts.append(0)
        elif (newline := text.find(f"\n{head}")) >= 0:
            starts.append(newline + 1)
    for start in sorted(starts):
        end = text.find("\n", start)
        yield text[start:] if end < 0 else text[start:end]


def parse_numa_stat_v1(
    text: str, page_size: int = PAGE_SIZE, nodes: Collection[int] | None = None
) -> dict[str, dict[int, int]]:
    """cgroup v1 ``memory.numa_stat``: type -> node -> bytes (the kernel counts pages).

    The ``hierarchical_<type>`` lines, which also count the cgroup's descendants, win over the plain ones, so
    a container that made its own sub-cgroups is counted whole, as cgroup v2 does. ``total`` is the sum of
    the other types, not a type.
    """
    own: dict[str, dict[int, int]] = {}
    hierarchical: dict[str, dict[int, int]] = {}
    for line in text.splitlines():
        tokens = line.split()
        if not tokens:
            continue
        name, separator, _ = tokens[0].partition("=")
        if not separator:
            continue  # vendor lines such as "numa_locality 0 0 0" carry no per-node amounts
        target = own
        if name.startswith("hierarchical_"):
            name = name.removeprefix("hierarchical_")
            target = hierarchical
        by_node = _node_values(tokens[1:], page_size, nodes)
        if name != "total" and by_node:
            target[name] = by_node
    own.update(hierarchical)
    return own


def _cpu_usage_usec(cpu_stat: str) -> int | None:
    for line in cpu_stat.splitlines():
        if line.startswith("usage_usec "):
            return _int(line[len("usage_usec ") :], cpu_stat)
    return None


def _int(text: str, context: str) -> int:
    try:
        return int(text)
    except ValueError as exc:
        raise SourceCorrupt("a bad number in a cgroup file") from exc  # never quoted


def _v1_controller_dir(memory_dir: str, controller: str) -> str:
    """The same cgroup in another v1 hierarchy: ``<root>/memory/<rel>`` -> ``<root>/<controller>/<rel>``."""
    if memory_dir.endswith("/memory"):
        return memory_dir[: -len("memory")] + controller
    root, _, relative = memory_dir.rpartition("/memory/")
    return f"{root}/{controller}/{relative}"


def _read_v2(
    directory: str, files: KeptFiles | None
) -> tuple[str | None, str | None, str | None, float | None]:
    numa_stat = _read(directory, "memory.numa_stat", files)
    cpus = _read(directory, "cpuset.cpus.effective", files)
    mems = _read(directory, "cpuset.mems.effective", files)
    cpu_stat = _read(directory, "cpu.stat", files)
    usage = _cpu_usage_usec(cpu_stat) if cpu_stat is not None else None
    return numa_stat, cpus, mems, usage / 1e6 if usage is not None else None


def _read_v1(
    memory_dir: str, files: KeptFiles | None
) -> tuple[str | None, str | None, str | None, float | None]:
    numa_stat = _read(memory_dir, "memory.numa_stat", files)
    cpuset_dir = _v1_controller_dir(memory_dir, "cpuset")
    cpus = _read(cpuset_dir, "cpuset.effective_cpus", files)
    if cpus is None:
        cpus = _read(cpuset_dir, "cpuset.cpus", files)
    mems = _read(cpuset_dir, "cpuset.effective_mems", files)
    if mems is None:
        mems = _read(cpuset_dir, "cpuset.mems", files)
    usage_text = None
    for controller in _V1_CPUACCT_DIRS:
        usage_text = _read(_v1_controller_dir(memory_dir, controller), "cpuacct.usage", files)
        if usage_text is not None:
            break
    cpu_time = _int(usage_text, usage_text) / 1e9 if usage_text is not None else None
    return numa_stat, cpus, mems, cpu_time


def _cpuset(text: str | None, limit: int, known: Collection[int] | None, path: str) -> frozenset[int] | None:
    """An effective cpuset file's ids (``None`` when the file is not there); SourceCorrupt when it cannot
    be trusted (see the module notes)."""
    if text is None:
        return None
    try:
        return _checked_ids(text, limit, known if known is None else frozenset(known))
    except SourceCorrupt as error:
        raise SourceCorrupt(f"{path}: {error}", error_type=error.error_type) from None


# Remembered by text: a node has few distinct cpusets (the shared pool, the NUMA nodes, each exclusive
# set), read again for every container whose other files changed. More than the 2,000 containers a round
# reads, so a round's distinct texts stay in.
@functools.lru_cache(maxsize=4096)
def _checked_ids(text: str, limit: int, known: frozenset[int] | None) -> frozenset[int]:
    if not text.endswith("\n") or "\n" in text[:-1]:
        raise SourceCorrupt("empty" if not text else "not one whole line")
    ids = parse_cpulist(text, limit)
    if not ids:
        raise SourceCorrupt("empty")
    if known is not None and not ids.issubset(known):
        raise SourceCorrupt("ids the machine does not have", error_type=OUT_OF_RANGE)
    return shared_set(ids)  # one object for all equal sets


@dataclass(frozen=True, slots=True)
class ContainerTexts:
    """What one container's cgroup files said: ``numa_stat`` only the lines of the memory types wanted
    (v2), the effective cpusets as read, the CPU time; ``None`` for a file that is not there."""

    numa_stat: str | None
    cpus: str | None
    mems: str | None
    cpu_time_s: float | None


def read_container_texts(
    cgroup: ContainerCgroup,
    layout: CgroupLayout,
    memory_types: Collection[str] | None = None,
    files: KeptFiles | None = None,
) -> ContainerTexts | None:
    """One container's cgroup files (through ``files`` when given); ``None`` when its cgroup vanished."""
    directory = cgroup.path
    numa_stat, cpus, mems, cpu_time = (
        _read_v2(directory, files) if layout == "v2" else _read_v1(directory, files)
    )
    if (numa_stat is None or cpus is None or mems is None or cpu_time is None) and not os.path.isdir(
        directory
    ):
        return None  # the container stopped while we read it: not an error
    if numa_stat is not None and layout == "v2" and memory_types is not None:
        numa_stat = "".join(line + "\n" for line in _lines_of(numa_stat, memory_types))
    return ContainerTexts(numa_stat, cpus, mems, cpu_time)


V2_FILES = ("memory.numa_stat", "cpuset.cpus.effective", "cpuset.mems.effective", "cpu.stat")


def texts_v2(
    numa_stat: str | None,
    cpus: str | None,
    mems: str | None,
    cpu_stat: str | None,
    memory_types: Collection[str] | None = None,
) -> ContainerTexts:
    """:class:`ContainerTexts` from the text of a v2 container's :data:`V2_FILES`, as read."""
    if numa_stat is not None and memory_types is not None:
        numa_stat = "".join(line + "\n" for line in _lines_of(numa_stat, memory_types))
    usage = _cpu_usage_usec(cpu_stat) if cpu_stat is not None else None
    return ContainerTexts(numa_stat, cpus, mems, usage / 1e6 if usage is not None else None)


def read_container_usage(
    cgroup: ContainerCgroup,
    layout: CgroupLayout,
    memory_types: Collection[str] | None = None,
    nodes: Collection[int] | None = None,
    cpu_limit: int = MAX_CPU_ID,
    *,
    machine_cpus: Collection[int] | None = None,
    on_cpuset_error: ErrorSink | None = None,
) -> ContainerNumaUsage | None:
    """One container's NUMA memory, cpusets and CPU time; ``None`` when its cgroup vanished meanwhile.

    ``memory_types`` limits the v2 memory types parsed (v1 files have only three); ``None``: all of them.
    ``nodes``, ``cpu_limit`` and ``machine_cpus``: the machine's NUMA ids, highest CPU id and online CPUs,
    when known; a file naming another node or CPU is corrupt (``out_of_range``). A cpuset that cannot be
    trusted raises, or with ``on_cpuset_error`` goes there and leaves the container's cpusets unknown.
    """
    texts = read_container_texts(cgroup, layout, memory_types)
    if texts is None:
        return None
    return container_usage(
        cgroup, layout, texts, nodes, cpu_limit, machine_cpus=machine_cpus, on_cpuset_error=on_cpuset_error
    )


def container_usage(
    cgroup: ContainerCgroup,
    layout: CgroupLayout,
    texts: ContainerTexts,
    nodes: Collection[int] | None = None,
    cpu_limit: int = MAX_CPU_ID,
    *,
    machine_cpus: Collection[int] | None = None,
    on_cpuset_error: ErrorSink | None = None,
) -> ContainerNumaUsage:
    """:func:`read_container_usage` from the texts already read (:func:`read_container_texts`)."""
    directory = cgroup.path
    numa_stat, cpus, mems, cpu_time = texts.numa_stat, texts.cpus, texts.mems, texts.cpu_time_s
    if numa_stat is None:
        memory: dict[str, dict[int, int]] = {}  # a kernel without CONFIG_NUMA has no numa_stat
    elif layout == "v2":
        memory = parse_numa_stat_v2(numa_stat, None, nodes)  # the wanted lines only, already
    else:
        memory = parse_numa_stat_v1(numa_stat, nodes=nodes)
    cpu_set: frozenset[int] | None
    mem_set: frozenset[int] | None
    try:
        cpu_set = _cpuset(cpus, cpu_limit, machine_cpus, f"{directory}: effective cpuset.cpus")
        mem_set = _cpuset(mems, MAX_NUMA_NODE_ID, nodes, f"{directory}: effective cpuset.mems")
    except SourceCorrupt as error:
        if on_cpuset_error is None:
            raise
        on_cpuset_error(error)
        cpu_set = mem_set = None  # the kernel's view of this container is unknown this round
    return ContainerNumaUsage(
        pod_uid=cgroup.pod_uid,
        container_id=cgroup.container_id,
        # kept until the container's files change: one tuple per map instead of a dict
        memory_by_type=small_map({kind: small_map(by_node) for kind, by_node in memory.items()}),
        cpus=cpu_set,
        mems=mem_set,
        cpu_time_s=cpu_time,
    )
