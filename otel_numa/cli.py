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

from otel_numa import __version__, catalogue
from otel_numa.catalogue import GROUP_MEANINGS
from otel_numa.logs import setup_logging
from otel_numa.serve import exec_serve, run
from otel_numa.settings import (
    FLAGS,
    ConfigKeyError,
    Flag,
    Settings,
    config_keys,
    description,
    environment_names,
    shown_default,
)

EXIT_BAD_CONFIG = 2
log = logging.getLogger("otel_numa")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One clear line, as for any other bad setting.
        self.exit(EXIT_BAD_CONFIG, f"otel-numa: {message}\n")


def option_help(flag: Flag) -> str:
    """A flag's description, default and environment variables: --help is the reference."""
    extra = ""
    if flag.setting == "disable":
        groups = "; ".join(f"{group}: {meaning}" for group, meaning in GROUP_MEANINGS.items())
        extra = f" Groups: {groups}."
    elif flag.setting == "metrics_exclude":
        extra = " --list-metrics lists the names."
    environment = ", then ".join(environment_names(flag.setting))
    text = f"{description(flag.setting)}{extra} Default: {shown_default(flag.setting)}. Env: {environment}."
    return text.replace("%", "%%")  # argparse formats help strings with %


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="otel-numa",
        description="Per-NUMA resources of a Kubernetes node, through OpenTelemetry. Settings come from "
        "flags, then OTEL_NUMA_* environment variables, then the --config YAML file (its keys are the flag "
        "names), then defaults.",
    )
    for flag in FLAGS:
        p.add_argument(
            flag.option,
            dest=flag.setting,
            metavar=flag.metavar,
            action="append" if flag.repeatable else "store",
            help=option_help(flag),
        )
    p.add_argument(
        "--once", action="store_true", help="Collect once, print the Prometheus text exposition, exit 0."
    )
    p.add_argument(
        "--list-metrics",
        action="store_true",
        help="Print every metric (OTel name, Prometheus name, group, meaning) and exit 0.",
    )
    p.add_argument(
        "--version",
        action="version",
        version=f"otel-numa {__version__}",
        help="Print the version (otel-numa X.Y.Z) and exit 0.",
    )
    return p


def metric_list() -> str:
    """``--list-metrics``: one line per metric, grouped as ``--disable`` switches them."""
    lines = []
    for spec in catalogue.METRICS:
        lines.append(f"{spec.name}\t{spec.prometheus_name}\t{spec.group}\t{spec.description}")
    return "\n".join(lines) + "\n"


def load_settings(argv: Sequence[str] | None = None) -> tuple[Settings, bool]:
    """Parse flags and build the settings; raises SystemExit(2) with one line on any bad setting."""
    args = _parser().parse_args(argv)
    if args.list_metrics:
        sys.stdout.write(metric_list())
        raise SystemExit(0)
    commands = ("once", "list_metrics")
    given: dict[str, Any] = {k: v for k, v in vars(args).items() if v is not None and k not in commands}
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
    try:
        config_keys(content or {})
    except ConfigKeyError as exc:
        _die(f"invalid setting {exc.key} in {path}: {exc}")


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
