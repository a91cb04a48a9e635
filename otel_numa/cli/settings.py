"""The agent's settings: command line over ``OTEL_NUMA_*`` environment over the YAML file over defaults.

pydantic-settings validates every source the same way, so a bad value names its setting wherever it came from.
"""

from __future__ import annotations

import difflib
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import AliasChoices, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from otel_numa.cli import mistakes
from otel_numa.instruments import catalogue
from otel_numa.instruments.catalogue import MetricGroup
from otel_numa.model import Source
from otel_numa.options import (
    AgentOptions,
    CgroupOptions,
    ExportOptions,
    KubeletOptions,
    MachineOptions,
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
        use_attribute_docstrings=True,  # the docstrings below are --help's descriptions
    )

    config: Path | None = None
    """YAML file with the same keys (the flag names, with dashes or underscores)."""
    sysfs_root: Path = Path("/sys")
    """sysfs mount: reads DIR/devices/system/node and DIR/devices/system/cpu."""
    procfs_root: Path = Path("/proc")
    """procfs mount: reads DIR/stat and DIR/meminfo."""
    kubelet_root: Path = Path("/var/lib/kubelet")
    """The kubelet's state directory (checkpoints, pods/, pod-resources/kubelet.sock); never written."""
    podresources_socket: str | None = None
    """The kubelet's podresources socket; 'none' disables the client."""
    pod_logs_root: Path = Path("/var/log/pods")
    """Directory whose <namespace>_<pod>_<uid> entries name the pods."""
    reserved_cpus: Annotated[frozenset[int] | None, NoDecode] = None
    """The kubelet's reserved CPU set (e.g. 0-1), for numa.cpu.allocatable without podresources."""
    cgroup_root: Path = Path("/sys/fs/cgroup")
    """cgroup mount, for per-container NUMA usage."""
    container_logs_root: Path = Path("/var/log/containers")
    """Directory whose <pod>_<namespace>_<container>-<id>.log links name the containers."""
    cdi_spec_dirs: Annotated[tuple[Path, ...], NoDecode] = (Path("/etc/cdi"), Path("/var/run/cdi"))
    """CDI spec directories (comma list), read to place DRA-allocated devices on NUMA nodes."""
    node_name: str = Field(
        default_factory=socket.gethostname,
        validation_alias=AliasChoices("OTEL_NUMA_NODE_NAME", "NODE_NAME"),
    )
    """Becomes k8s.node.name on every series."""
    exporters: Annotated[tuple[ExporterName, ...], NoDecode] = Field(
        default=("prometheus",), validation_alias=AliasChoices("OTEL_NUMA_EXPORTERS")
    )
    """Where metrics go: prometheus, otlp, console (repeatable or a comma list)."""
    prometheus_address: str = "0.0.0.0:9464"
    """Address of the Prometheus page (/metrics); 'none': no page."""
    health_address: str = "0.0.0.0:9465"
    """Address of /healthz and /readyz (plain HTTP); 'none' disables."""
    tls_cert_file: Path | None = None
    """PEM certificate (chain): the Prometheus page is served over TLS only; re-read when it changes."""
    tls_key_file: Path | None = Field(default=None, validate_default=True)
    """The certificate's PEM private key (unencrypted); given together with the certificate."""
    tls_client_ca_file: Path | None = None
    """Require scrapers' client certificates signed by this CA (mTLS)."""
    otlp_endpoint: str | None = Field(
        default=None,
        validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"),
    )
    """The collector's base URL; over HTTP /v1/metrics is appended when the URL has no path."""
    otlp_protocol: OtlpProtocol = Field(
        default="grpc",
        validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"),
    )
    """OTLP transport: grpc or http/protobuf."""
    otlp_timeout: float = Field(default=3.0, gt=0, le=60)
    """Seconds one OTLP export may take by the wall clock, retries included."""
    stall_timeout: float = Field(default=60.0, gt=0, le=3600)
    """Seconds one collection may run (a read that hangs) before /healthz answers 503."""
    interval: float = Field(default=15.0, ge=0.1, le=3600)
    """Seconds between OTLP exports and background refreshes; at least 0.1."""
    push_min_interval: float = Field(default=0.2, ge=0, le=60)
    """Shortest seconds between two exports triggered by kubelet state changes (the last is always sent)."""
    compat: Literal["numainfo"] | None = None
    """'numainfo': also emit numainfo_exporter's series."""
    disable: Annotated[frozenset[MetricGroup], NoDecode] = frozenset()
    """Metric groups to switch off; their sources are not read at all (repeatable or a comma list)."""
    cardinality_limit: int = Field(default=100_000, ge=100)
    """Attribute sets per instrument before the SDK folds them into an overflow series."""
    metrics_exclude: Annotated[frozenset[str], NoDecode] = frozenset()
    """Metrics to switch off by OTel or Prometheus name, shell globs; their sources too (repeatable)."""
    # the cardinality driver: every type adds a series per container and node
    container_memory_types: Annotated[frozenset[str], NoDecode] = frozenset({"anon", "file"})
    """numa.container.memory.usage types (any memory.numa_stat name: anon, file, kernel_stack, shmem)."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """debug, info, warning or error."""
    fast_path: Literal["auto", "off"] = "auto"
    """auto: the accelerated export path on the OpenTelemetry releases it was proven on; off: public APIs."""
    cri_socket: str = "none"
    """Container runtime socket for opt-in enrichment: none, auto (containerd or CRI-O) or a path."""
    enrich_pod_labels: Annotated[frozenset[str], NoDecode] = frozenset()
    """Pod labels to export, exact keys (repeatable)."""
    enrich_pod_annotations: Annotated[frozenset[str], NoDecode] = frozenset()
    """Pod annotations to export, exact keys (repeatable)."""
    enrich_env: Annotated[frozenset[str], NoDecode] = frozenset()
    """Container environment variables to export, exact names; secret-like names are always refused."""
    enrich_mode: Literal["info", "attributes"] = "info"
    """info: one numa.container.info series per container; attributes: the values on every one."""
    enrich_value_max_length: int = Field(default=128, ge=1, le=4096)
    """Longer enrichment values are cut."""

    @field_validator("exporters", mode="before")
    @classmethod
    def _exporters_list(cls, value: Any) -> Any:
        items = _split_list(value)
        if isinstance(items, list) and not items:
            raise ValueError("at least one exporter is needed")
        return tuple(dict.fromkeys(items)) if isinstance(items, list) else items

    @field_validator("cdi_spec_dirs", mode="before")
    @classmethod
    def _cdi_dirs(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("disable", mode="before")
    @classmethod
    def _disable_list(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("metrics_exclude", mode="before")
    @classmethod
    def _exclude_list(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("metrics_exclude")
    @classmethod
    def _excludes_something(cls, value: frozenset[str]) -> frozenset[str]:
        # a pattern that matches no metric excludes nothing: a typo the operator would never notice
        problems = mistakes.unmatched_patterns(value)
        if problems:
            raise ValueError("; ".join(problems))
        return value

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

    @field_validator("reserved_cpus")
    @classmethod
    def _cpus_of_this_machine(
        cls, value: frozenset[int] | None, info: ValidationInfo
    ) -> frozenset[int] | None:
        # the kubelet's reserved CPUs are some of the machine's: others would make numa.cpu.allocatable wrong
        sysfs_root = info.data.get("sysfs_root")
        if value and isinstance(sysfs_root, Path):
            problem = mistakes.absent_cpus(value, sysfs_root)
            if problem:
                raise ValueError(problem)
        return value

    @field_validator("prometheus_address", "health_address")
    @classmethod
    def _address(cls, value: str) -> str:
        if value.lower() == "none":
            return "none"
        parse_host_port(value)
        return value

    @field_validator("health_address")
    @classmethod
    def _own_port(cls, value: str, info: ValidationInfo) -> str:
        page = info.data.get("prometheus_address")
        if isinstance(page, str) and mistakes.shared_port(_address_or_none(page), _address_or_none(value)):
            raise ValueError(
                f"{value} is where prometheus_address ({page}) serves the page: give /healthz a port of its "
                "own (--health-address, 9465 by default)"
            )
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
            content = yaml.safe_load(config_file.read_text()) or {}
            if isinstance(content, dict):  # the command line reports anything else with the file's name
                content = config_keys(content)
            sources.append(InitSettingsSource(settings_cls, init_kwargs=content))
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
        checkpoints = sources & {
            Source.CPU_MANAGER,
            Source.MEMORY_MANAGER,
            Source.DEVICE_MANAGER,
            Source.DRA_MANAGER,
        }
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
                catalogue.machine_parts_of(metrics),
            ),
            kubelet=(
                KubeletOptions(
                    self.kubelet_root,
                    self.pod_logs_root,
                    self.reserved_cpus,
                    frozenset(str(source) for source in checkpoints),
                    place_dra_devices=Source.CDI in sources,
                    cdi_spec_dirs=self.cdi_spec_dirs if Source.CDI in sources else (),
                )
                if checkpoints or Source.PODRESOURCES in sources
                else None
            ),
            podresources=(
                PodResourcesOptions(socket, self.interval, self.kubelet_root / "device-plugins")
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
                fast_path=self.fast_path,
            ),
            log_level=self.log_level,
            own_process=bool(catalogue.PROCESS_METRICS & names),
        )


INFO_METRIC = "numa.container.info"
PER_CONTAINER_GROUPS = frozenset({MetricGroup.CONTAINERS, MetricGroup.CONTAINER_USAGE})


def _address_or_none(value: str) -> tuple[str, int] | None:
    return None if value == "none" else parse_host_port(value)


def _config_file_from(init_settings: PydanticBaseSettingsSource) -> Path | None:
    """The YAML file named by ``--config`` or ``OTEL_NUMA_CONFIG`` (it cannot name itself)."""
    given = init_settings().get("config") or os.environ.get("OTEL_NUMA_CONFIG")
    return Path(given) if given else None


# The command line ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Flag:
    """One command-line flag of a setting; its YAML key may be the flag's name or the setting's."""

    name: str  # without the dashes
    setting: str
    metavar: str
    repeatable: bool = False

    @property
    def option(self) -> str:
        return f"--{self.name}"


FLAGS: tuple[Flag, ...] = (
    Flag("config", "config", "FILE"),
    Flag("sysfs-root", "sysfs_root", "DIR"),
    Flag("procfs-root", "procfs_root", "DIR"),
    Flag("kubelet-root", "kubelet_root", "DIR"),
    Flag("podresources-socket", "podresources_socket", "PATH"),
    Flag("pod-logs-root", "pod_logs_root", "DIR"),
    Flag("reserved-cpus", "reserved_cpus", "LIST"),
    Flag("cgroup-root", "cgroup_root", "DIR"),
    Flag("container-logs-root", "container_logs_root", "DIR"),
    Flag("cdi-spec-dirs", "cdi_spec_dirs", "DIRS"),
    Flag("node-name", "node_name", "NAME"),
    Flag("exporter", "exporters", "NAME", repeatable=True),
    Flag("prometheus-address", "prometheus_address", "HOST:PORT"),
    Flag("health-address", "health_address", "HOST:PORT"),
    Flag("tls-cert-file", "tls_cert_file", "FILE"),
    Flag("tls-key-file", "tls_key_file", "FILE"),
    Flag("tls-client-ca-file", "tls_client_ca_file", "FILE"),
    Flag("otlp-endpoint", "otlp_endpoint", "URL"),
    Flag("otlp-protocol", "otlp_protocol", "grpc|http/protobuf"),
    Flag("otlp-timeout", "otlp_timeout", "SECONDS"),
    Flag("stall-timeout", "stall_timeout", "SECONDS"),
    Flag("interval", "interval", "SECONDS"),
    Flag("push-min-interval", "push_min_interval", "SECONDS"),
    Flag("compat", "compat", "numainfo"),
    Flag("disable", "disable", "GROUP", repeatable=True),
    Flag("metrics-exclude", "metrics_exclude", "GLOB", repeatable=True),
    Flag("container-memory-types", "container_memory_types", "LIST"),
    Flag("cardinality-limit", "cardinality_limit", "N"),
    Flag("log-level", "log_level", "LEVEL"),
    Flag("fast-path", "fast_path", "auto|off"),
    Flag("cri-socket", "cri_socket", "auto|none|PATH"),
    Flag("enrich-pod-label", "enrich_pod_labels", "KEY", repeatable=True),
    Flag("enrich-pod-annotation", "enrich_pod_annotations", "KEY", repeatable=True),
    Flag("enrich-env", "enrich_env", "NAME", repeatable=True),
    Flag("enrich-mode", "enrich_mode", "info|attributes"),
    Flag("enrich-value-max-length", "enrich_value_max_length", "CHARS"),
)
# Defaults that are not a plain value
_SHOWN_DEFAULTS = {
    "node_name": "the host name",
    "podresources_socket": "<kubelet-root>/pod-resources/kubelet.sock",
    "otlp_endpoint": "http://localhost:4317 (grpc), http://localhost:4318 (http/protobuf)",
}


def environment_names(setting: str) -> tuple[str, ...]:
    """The environment variables that set ``setting``, first one first."""
    choices = getattr(Settings.model_fields[setting].validation_alias, "choices", None)
    if choices:
        return tuple(str(choice) for choice in choices)
    return (f"OTEL_NUMA_{setting.upper()}",)


def shown_default(setting: str) -> str:
    """The default of ``setting`` as an operator would write it."""
    if setting in _SHOWN_DEFAULTS:
        return _SHOWN_DEFAULTS[setting]
    value = Settings.model_fields[setting].default
    if value is None:
        return "none"
    if isinstance(value, frozenset | tuple):
        return ",".join(sorted(str(item) for item in value)) or "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def description(setting: str) -> str:
    return Settings.model_fields[setting].description or ""


def _key_form(key: str) -> str:
    return key.strip().lstrip("-").replace("-", "_")


# YAML key (flag name or setting name, dashes or underscores) -> setting
_KEYS: dict[str, str] = {
    **{name: name for name in Settings.model_fields},
    **{_key_form(flag.name): flag.setting for flag in FLAGS},
}


class ConfigKeyError(ValueError):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def config_keys(content: dict[Any, Any]) -> dict[str, Any]:
    """The YAML file's mapping keyed by setting names: every documented flag name is accepted as a key.
    An unknown key raises :class:`ConfigKeyError` naming the nearest valid one."""
    found: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for key, value in content.items():
        setting = _KEYS.get(_key_form(str(key)))
        if setting is None:
            raise ConfigKeyError(str(key), f"unknown key {key!r}; {nearest_key_hint(str(key))}")
        if setting in found:
            raise ConfigKeyError(
                str(key), f"{key!r} and {given_as[setting]!r} both set {setting}: keep one of them"
            )
        found[setting], given_as[setting] = value, str(key)
    return found


def nearest_key_hint(key: str) -> str:
    """'did you mean ...?' for the closest documented key, else where the keys are listed."""
    # suggested in the style the key was written in: setting_name or flag-name
    underscores = "_" in key
    documented = sorted(Settings.model_fields) if underscores else sorted(flag.name for flag in FLAGS)
    close = difflib.get_close_matches(key.strip().lstrip("-"), documented, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    return "the keys are the flag names of otel-numa --help (config/agent.example.yaml lists them)"
