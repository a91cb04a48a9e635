"""``otel-numa`` command line: flags over ``OTEL_NUMA_*`` environment over ``--config`` YAML."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml
from pydantic import ValidationError

from otel_numa import __version__
from otel_numa.logs import setup_logging
from otel_numa.serve import exec_serve, run
from otel_numa.settings import Settings

EXIT_BAD_CONFIG = 2
log = logging.getLogger("otel_numa")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One clear line, as for any other bad setting.
        self.exit(EXIT_BAD_CONFIG, f"otel-numa: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="otel-numa", description="Per-NUMA resources of a Kubernetes node, through OpenTelemetry."
    )
    add = p.add_argument
    add("--config", metavar="FILE", help="YAML file with the same keys (underscores: sysfs_root, ...)")
    add("--sysfs-root", metavar="DIR")
    add("--procfs-root", metavar="DIR")
    add("--kubelet-root", metavar="DIR")
    add("--podresources-socket", metavar="PATH", help="'none' disables the podresources client")
    add("--pod-logs-root", metavar="DIR")
    add("--reserved-cpus", metavar="LIST", help="the kubelet's reserved CPU set, e.g. 0-1")
    add("--cgroup-root", metavar="DIR")
    add("--container-logs-root", metavar="DIR")
    add("--node-name", metavar="NAME")
    add("--exporter", dest="exporters", action="append", metavar="NAME", help="prometheus, otlp, console")
    add("--prometheus-address", metavar="HOST:PORT")
    add("--health-address", metavar="HOST:PORT", help="/healthz and /readyz; 'none' disables")
    add("--tls-cert-file", metavar="FILE", help="serve the Prometheus page over TLS only; re-read on change")
    add("--tls-key-file", metavar="FILE", help="the certificate's private key (PEM)")
    add("--tls-client-ca-file", metavar="FILE", help="require client certificates signed by this CA (mTLS)")
    add("--otlp-endpoint", metavar="URL")
    add("--otlp-protocol", metavar="grpc|http/protobuf")
    add("--interval", metavar="SECONDS")
    add("--compat", metavar="numainfo")
    add("--disable", action="append", metavar="GROUP", help="switch off a metric group (repeatable)")
    add(
        "--metrics-exclude",
        action="append",
        metavar="GLOB",
        help="switch off metrics by OTel or Prometheus name, shell globs (repeatable); their sources too",
    )
    add(
        "--container-memory-types",
        metavar="LIST",
        help="numa.container.memory.usage types, e.g. anon,file (default) or anon,file,kernel_stack,shmem",
    )
    add("--log-level", metavar="LEVEL")
    add(
        "--fast-path",
        metavar="auto|off",
        help="auto: the accelerated export path where the OpenTelemetry releases are the proven ones; "
        "off: public APIs only",
    )
    add("--cri-socket", metavar="auto|none|PATH", help="runtime socket for opt-in enrichment")
    add("--enrich-pod-label", dest="enrich_pod_labels", action="append", metavar="KEY", help="repeatable")
    add("--enrich-pod-annotation", dest="enrich_pod_annotations", action="append", metavar="KEY")
    add("--enrich-env", action="append", metavar="NAME", help="exact name; secret-like names are refused")
    add("--enrich-mode", metavar="info|attributes")
    add("--enrich-value-max-length", metavar="CHARS")
    add("--once", action="store_true", help="collect once, print the Prometheus text exposition, exit")
    add("--version", action="version", version=f"otel-numa {__version__}")
    return p


def load_settings(argv: Sequence[str] | None = None) -> tuple[Settings, bool]:
    """Parse flags and build the settings; raises SystemExit(2) with one line on any bad setting."""
    args = _parser().parse_args(argv)
    given: dict[str, Any] = {k: v for k, v in vars(args).items() if v is not None and k != "once"}
    config_file = given.get("config") or os.environ.get("OTEL_NUMA_CONFIG")
    if config_file:
        _check_config_file(Path(config_file))
    try:
        settings = Settings(**given)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = _setting_name(str(error["loc"][0])) if error["loc"] else "settings"
        _die(f"invalid setting {name}: {error['msg']}")
    _check_tls_files(settings)
    return settings, bool(args.once)


def _check_tls_files(settings: Settings) -> None:
    """Unusable TLS files are a bad setting, reported before anything starts."""
    if settings.tls is None:
        return
    from otel_numa.http_server import TlsFileError, load_server_context

    try:
        load_server_context(settings.tls)
    except TlsFileError as exc:
        _die(f"invalid setting {exc.setting}: {exc}")


def _setting_name(location: str) -> str:
    """pydantic reports environment aliases (OTEL_NUMA_X) even for YAML input: name the setting itself."""
    for name, info in Settings.model_fields.items():
        choices = getattr(info.validation_alias, "choices", ())
        if location == name or location in choices:
            return name
    return location


def _check_config_file(path: Path) -> None:
    try:
        content = yaml.safe_load(path.read_text())
    except OSError as exc:
        _die(f"invalid setting config: cannot read {path}: {exc.strerror or exc}")
    except yaml.YAMLError as exc:
        _die(f"invalid setting config: {path} is not valid YAML ({str(exc).splitlines()[0]})")
    if content is not None and not isinstance(content, dict):
        _die(f"invalid setting config: {path} must hold a mapping of settings")


def _die(message: str) -> NoReturn:
    print(f"otel-numa: {message}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_CONFIG)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    settings, once = load_settings(args)
    options = settings.to_options()
    setup_logging(settings.log_level)
    if once:
        from otel_numa.agent import Agent  # after logging, so import-time warnings are formatted

        sys.stdout.buffer.write(Agent(options).exposition_once())
        sys.stdout.flush()
        return 0
    if argv is not None:  # called in-process (tests, embedding): serve here
        return run(options)
    exec_serve(options, args)
    return 1  # not reached: exec replaced the process
