"""The agent's settings: command line over ``OTEL_NUMA_*`` environment over the YAML file over defaults.

pydantic-settings validates every source the same way, so a bad value names its setting wherever it came from.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from otel_numa import catalogue
from otel_numa.catalogue import MetricGroup, Source
from otel_numa.options import (
    AgentOptions,
    CgroupOptions,
    ExportOptions,
    KubeletOptions,
    MachineOptions,
    MachinePart,
    PodResourcesOptions,
    RuntimeOptions,
    TlsOptions,
)
from otel_numa.sources.errors import SourceError
from otel_numa.sources.files import parse_cpulist

_MEMORY_TYPE = re.compile(r"[a-z][a-z0-9_]*")

ExporterName = Literal["prometheus", "otlp", "console"]
OtlpProtocol = Literal["grpc", "http/protobuf"]


def _split_list(value: Any) -> Any:
    """Accept ``a,b`` strings (environment, flags) as well as YAML lists."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    if isinstance(value, list | tuple):
        items: list[Any] = []
        for item in value:
            items.extend(_split_list(item) if isinstance(item, str) else [item])
        return items
    return value


def parse_host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port)."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port_text)


class Settings(BaseSettings):
    # Aliases name environment variables only (never the bare field name, which would also match e.g. an
    # unrelated EXPORTERS variable); populate_by_name keeps field names for flags and the YAML file.
    model_config = SettingsConfigDict(
        env_prefix="OTEL_NUMA_",
        extra="forbid",
        populate_by_name=True,
        frozen=True,
    )

    config: Path | None = None
    sysfs_root: Path = Path("/sys")
    procfs_root: Path = Path("/proc")
    kubelet_root: Path = Path("/var/lib/kubelet")
    # None: <kubelet-root>/pod-resources/kubelet.sock; "none" disables the client
    podresources_socket: str | None = None
    pod_logs_root: Path = Path("/var/log/pods")
    reserved_cpus: Annotated[frozenset[int] | None, NoDecode] = None
    cgroup_root: Path = Path("/sys/fs/cgroup")
    container_logs_root: Path = Path("/var/log/containers")
    node_name: str = Field(
        default_factory=socket.gethostname,
        validation_alias=AliasChoices("OTEL_NUMA_NODE_NAME", "NODE_NAME"),
    )
    exporters: Annotated[tuple[ExporterName, ...], NoDecode] = Field(
        default=("prometheus",), validation_alias=AliasChoices("OTEL_NUMA_EXPORTERS")
    )
    prometheus_address: str = "0.0.0.0:9464"
    health_address: str = "0.0.0.0:9465"
    # The Prometheus page over TLS only (certificate and key together); a client CA makes it mTLS.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = Field(default=None, validate_default=True)
    tls_client_ca_file: Path | None = None
    otlp_endpoint: str | None = Field(
        default=None,
        validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"),
    )
    otlp_protocol: OtlpProtocol = Field(
        default="grpc",
        validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"),
    )
    otlp_timeout: float = Field(default=3.0, gt=0, le=60)
    # /healthz answers 503 once one collection has run this many seconds without finishing (a stuck read)
    stall_timeout: float = Field(default=60.0, gt=0, le=3600)
    interval: float = Field(default=15.0, gt=0, le=3600)
    # Shortest time between two exports triggered by kubelet state changes (the last change is always sent).
    push_min_interval: float = Field(default=0.2, ge=0, le=60)
    compat: Literal["numainfo"] | None = None
    disable: Annotated[frozenset[MetricGroup], NoDecode] = frozenset()
    # Upper bound of attribute sets per instrument: 1,000 containers x 16 NUMA nodes x 4 memory types + room.
    cardinality_limit: int = Field(default=100_000, ge=100)
    # per-metric switches: OTel or Prometheus names, shell globs; the work behind a metric stops too
    metrics_exclude: Annotated[frozenset[str], NoDecode] = frozenset()
    # numa.container.memory.usage types (the cardinality driver): every type adds a series per container
    # and node. v2 anon, file, kernel_stack, shmem, ...; v1 anon, file, unevictable.
    container_memory_types: Annotated[frozenset[str], NoDecode] = frozenset({"anon", "file"})
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Opt-in enrichment from the container runtime (CRI): "none" (off), "auto" (containerd or CRI-O) or a path
    cri_socket: str = "none"
    enrich_pod_labels: Annotated[frozenset[str], NoDecode] = frozenset()  # exact label keys
    enrich_pod_annotations: Annotated[frozenset[str], NoDecode] = frozenset()  # exact annotation keys
    enrich_env: Annotated[frozenset[str], NoDecode] = frozenset()  # exact names; secret-like ones never
    enrich_mode: Literal["info", "attributes"] = "info"
    enrich_value_max_length: int = Field(default=128, ge=1, le=4096)

    @field_validator("exporters", mode="before")
    @classmethod
    def _exporters_list(cls, value: Any) -> Any:
        items = _split_list(value)
        if isinstance(items, list) and not items:
            raise ValueError("at least one exporter is needed")
        return tuple(dict.fromkeys(items)) if isinstance(items, list) else items

    @field_validator("disable", mode="before")
    @classmethod
    def _disable_list(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("metrics_exclude", mode="before")
    @classmethod
    def _exclude_list(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("container_memory_types", mode="before")
    @classmethod
    def _memory_types(cls, value: Any) -> Any:
        items = _split_list(value)
        if isinstance(items, list):
            bad = [item for item in items if not _MEMORY_TYPE.fullmatch(item)]
            if bad or not items:
                raise ValueError(f"expected memory.numa_stat type names such as anon,file; got {value!r}")
        return items

    @field_validator("enrich_pod_labels", "enrich_pod_annotations", "enrich_env", mode="before")
    @classmethod
    def _allowlist(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("reserved_cpus", mode="before")
    @classmethod
    def _cpu_list(cls, value: Any) -> Any:
        if isinstance(value, int):
            return frozenset({value})
        if isinstance(value, str):
            try:
                return parse_cpulist(value)
            except SourceError as exc:
                raise ValueError(f"expected a CPU list such as 0-1,8: {exc}") from exc
        return value

    @field_validator("prometheus_address", "health_address")
    @classmethod
    def _address(cls, value: str) -> str:
        if value.lower() == "none":
            return "none"
        parse_host_port(value)
        return value

    @field_validator("tls_cert_file", "tls_key_file", "tls_client_ca_file", mode="before")
    @classmethod
    def _empty_path_is_none(cls, value: Any) -> Any:
        # An empty environment variable (a chart value left blank) means "not set", not the current directory.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("tls_key_file")
    @classmethod
    def _key_with_certificate(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        has_certificate = info.data.get("tls_cert_file") is not None
        if value is None and has_certificate:
            raise ValueError("tls_cert_file is set, so tls_key_file is needed too")
        if value is not None and not has_certificate:
            raise ValueError("tls_key_file is set, so tls_cert_file is needed too")
        return value

    @field_validator("tls_client_ca_file")
    @classmethod
    def _client_ca_with_certificate(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None and info.data.get("tls_cert_file") is None:
            raise ValueError("client certificates need TLS: set tls_cert_file and tls_key_file too")
        return value

    @field_validator("otlp_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
        return value

    @model_validator(mode="after")
    def _no_empty_node_name(self) -> Settings:
        if not self.node_name.strip():
            raise ValueError("node_name must not be empty")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = _config_file_from(init_settings)
        if config_file is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
        return tuple(sources)

    # Derived values -----------------------------------------------------------------------------

    @property
    def podresources_socket_path(self) -> Path | None:
        if self.podresources_socket is None:
            return self.kubelet_root / "pod-resources" / "kubelet.sock"
        if self.podresources_socket.lower() == "none":
            return None
        return Path(self.podresources_socket)

    @property
    def otlp_url(self) -> str:
        """The collector URL for the protocol; over HTTP ``/v1/metrics`` is added to a bare base URL."""
        if self.otlp_protocol == "grpc":
            return self.otlp_endpoint or "http://localhost:4317"
        url = self.otlp_endpoint or "http://localhost:4318"
        if urlsplit(url).path in ("", "/"):
            url = url.rstrip("/") + "/v1/metrics"
        return url

    @property
    def tls(self) -> TlsOptions | None:
        """The Prometheus page's TLS files; None: plain HTTP."""
        if self.tls_cert_file is None or self.tls_key_file is None:
            return None
        return TlsOptions(self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file)

    def to_options(self) -> AgentOptions:
        """The plain options the agent runs from; sources no enabled metric needs are left out."""
        runtime_on = self.cri_socket.lower() != "none"
        metrics = [
            spec
            for spec in catalogue.select(self.disable, self.metrics_exclude, compat=self.compat == "numainfo")
            if spec.name != INFO_METRIC or (runtime_on and self.enrich_mode == "info")
        ]
        names = {spec.name for spec in metrics}
        sources = catalogue.sources_of(metrics)
        checkpoints = sources & {Source.CPU_MANAGER, Source.MEMORY_MANAGER, Source.DEVICE_MANAGER}
        socket = self.podresources_socket_path
        per_container = any(spec.group in PER_CONTAINER_GROUPS for spec in metrics)
        # info mode needs the runtime for numa.container.info, attributes mode for any per-container series
        enrich = runtime_on and (INFO_METRIC in names or (self.enrich_mode == "attributes" and per_container))
        return AgentOptions(
            node_name=self.node_name,
            interval_s=self.interval,
            push_min_interval_s=self.push_min_interval,
            stall_timeout_s=self.stall_timeout,
            health_address=_address_or_none(self.health_address),
            metrics=tuple(spec.name for spec in metrics),
            machine=MachineOptions(
                self.sysfs_root,
                self.procfs_root,
                frozenset(part for metric, part in MACHINE_PARTS if metric in names),
            ),
            kubelet=(
                KubeletOptions(
                    self.kubelet_root,
                    self.pod_logs_root,
                    self.reserved_cpus,
                    frozenset(str(source) for source in checkpoints),
                )
                if checkpoints or Source.PODRESOURCES in sources
                else None
            ),
            podresources=(
                PodResourcesOptions(socket, self.interval)
                if socket is not None and Source.PODRESOURCES in sources
                else None
            ),
            runtime=(
                RuntimeOptions(
                    self.cri_socket,
                    self.enrich_pod_labels,
                    self.enrich_pod_annotations,
                    self.enrich_env,
                    self.enrich_value_max_length,
                    self.enrich_mode,
                )
                if enrich
                else None
            ),
            cgroups=(
                CgroupOptions(self.cgroup_root, self.container_logs_root, self.container_memory_types)
                if Source.CGROUP in sources
                else None
            ),
            export=ExportOptions(
                exporters=self.exporters,
                prometheus_address=_address_or_none(self.prometheus_address),
                otlp_url=self.otlp_url,
                otlp_protocol=self.otlp_protocol,
                otlp_timeout_s=self.otlp_timeout,
                cardinality_limit=self.cardinality_limit,
                tls=self.tls,
            ),
            log_level=self.log_level,
        )


INFO_METRIC = "numa.container.info"
PER_CONTAINER_GROUPS = frozenset({MetricGroup.CONTAINERS, MetricGroup.CONTAINER_USAGE})
# The parts of the machine a metric needs read besides the topology (container usage needs to know which
# nodes have memory).
MACHINE_PARTS: tuple[tuple[str, MachinePart], ...] = (
    ("numa.memory.capacity", "memory"),
    ("numa.memory.usage", "memory"),
    ("numa.container.memory.locality", "memory"),
    ("numa.container.cpuset.nodes", "memory"),
    ("numa.hugepages.capacity", "hugepages"),
    ("numa.hugepages.free", "hugepages"),
    ("numa.memory.page.allocations", "numastat"),
    ("numa.cpu.time", "cpu_time"),
)


def _address_or_none(value: str) -> tuple[str, int] | None:
    return None if value == "none" else parse_host_port(value)


def _config_file_from(init_settings: PydanticBaseSettingsSource) -> Path | None:
    """The YAML file named by ``--config`` or ``OTEL_NUMA_CONFIG`` (it cannot name itself)."""
    given = init_settings().get("config") or os.environ.get("OTEL_NUMA_CONFIG")
    return Path(given) if given else None
