"""The agent's resolved options: plain typed values, one small object per part of the agent.

``otel_numa.cli.settings`` (pydantic) reads flags, environment and the YAML file and resolves them into an
:class:`AgentOptions` once, at the edge. Everything below the command line takes these plain values, so a
collector never sees the whole configuration, and the long-running process can be started from them without
ever importing pydantic (:func:`to_json` / :func:`from_json` carry them across ``exec``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal


class MachinePart(enum.StrEnum):
    """What the machine collector reads besides the topology, each only when an enabled metric needs it
    (the catalogue says which)."""

    MEMORY = "memory"  # nodeN/meminfo
    HUGEPAGES = "hugepages"  # nodeN/hugepages
    NUMASTAT = "numastat"  # nodeN/numastat
    CPU_TIME = "cpu_time"  # /proc/stat
    PCI = "pci"  # bus/pci/devices


EnrichMode = Literal["info", "attributes"]
Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class MachineOptions:
    sysfs_root: Path
    procfs_root: Path
    parts: frozenset[MachinePart]  # what is read besides the topology


@dataclass(frozen=True, slots=True)
class KubeletOptions:
    kubelet_root: Path
    pod_logs_root: Path
    reserved_cpus: frozenset[int] | None
    checkpoints: frozenset[str]  # numa.source names of the checkpoints to read
    place_dra_devices: bool = False  # whether an enabled metric needs DRA devices placed on NUMA nodes
    cdi_spec_dirs: tuple[Path, ...] = ()  # read to place them


@dataclass(frozen=True, slots=True)
class PodResourcesOptions:
    socket: Path
    interval_s: float  # the longest back-off while the socket is missing
    # the kubelet's device-plugins directory: GetAllocatableResources is asked again when it changes
    device_plugins: Path | None = None


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    cri_socket: str  # "auto" or a path
    pod_labels: frozenset[str]
    pod_annotations: frozenset[str]
    env: frozenset[str]
    value_max_length: int
    mode: EnrichMode


@dataclass(frozen=True, slots=True)
class CgroupOptions:
    cgroup_root: Path
    container_logs_root: Path
    memory_types: frozenset[str]  # exported numa.memory.type values


@dataclass(frozen=True, slots=True)
class TlsOptions:
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None


@dataclass(frozen=True, slots=True)
class ExportOptions:
    exporters: tuple[str, ...]  # prometheus, otlp, console
    prometheus_address: Address | None  # None: no HTTP page
    otlp_url: str
    otlp_protocol: str  # grpc, http/protobuf
    otlp_timeout_s: float
    cardinality_limit: int
    tls: TlsOptions | None = None
    fast_path: str = "auto"  # auto, off (otel_numa.export.fast)


@dataclass(frozen=True, slots=True)
class AgentOptions:
    node_name: str
    interval_s: float
    push_min_interval_s: float
    health_address: Address | None
    metrics: tuple[str, ...]  # the enabled metrics' OTel names, in catalogue order
    machine: MachineOptions
    export: ExportOptions
    kubelet: KubeletOptions | None = None  # None: no kubelet state is needed
    podresources: PodResourcesOptions | None = None
    runtime: RuntimeOptions | None = None
    cgroups: CgroupOptions | None = None
    log_level: str = "info"
    stall_timeout_s: float = 60.0  # /healthz turns 503 when one collection has run this long
    own_process: bool = False  # whether the agent reads its own process's cost (the process.* series)


# Across exec ----------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, frozenset):
        return sorted(_plain(item) for item in value)
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


def to_json(options: AgentOptions) -> str:
    return json.dumps(_plain(options), sort_keys=True)


def _typed(hint: Any, value: Any) -> Any:
    """``value`` (from JSON) as the type ``hint`` says."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None:
            return None
        return _typed(next(arg for arg in args if arg is not type(None)), value)
    if origin is frozenset:
        return frozenset(_typed(args[0], item) for item in value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_typed(args[0], item) for item in value)
        return tuple(_typed(arg, item) for arg, item in zip(args, value, strict=True))
    if origin is Literal or hint in (str, int, float, bool, Any):
        return value
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    if hint is Path:
        return Path(value)
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        cls: Any = hint
        return cls(**{name: _typed(hints[name], item) for name, item in value.items()})
    raise TypeError(f"cannot read {hint!r} from JSON")


def from_json(text: str) -> AgentOptions:
    options = _typed(AgentOptions, json.loads(text))
    assert isinstance(options, AgentOptions)
    return options
