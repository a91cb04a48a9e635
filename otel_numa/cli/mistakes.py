"""What an operator most likely meant: the nearest flag, environment variable or metric name, and the checks
of settings that can only be wrong (a pattern that matches no metric, CPUs the machine does not have, one
port for two servers). The wording of each fix lives here, so the command line, the environment and the
YAML file give the same help."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Mapping
from pathlib import Path

from otel_numa.instruments import catalogue
from otel_numa.sources.errors import SourceError
from otel_numa.sources.files import format_cpulist, parse_cpulist, read_text

# Variables with the agent's prefix that belong to the repository's scripts, not to the agent.
SCRIPT_VARIABLES = (
    "OTEL_NUMA_STACK_",
    "OTEL_NUMA_ENGINE",
    "OTEL_NUMA_BASE_IMAGE",
    "OTEL_NUMA_CA_BUNDLE",
    "OTEL_NUMA_TEST_",
    "OTEL_NUMA_PODMAN_HOME",
)
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The choice closest to ``word``, if any is close enough to be a typo of it."""
    found = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_argument_hint(word: str, options: Iterable[str]) -> str:
    """``--exporters`` -> "did you mean --exporter?"; flags are written with dashes, values after them."""
    spelled = word.split("=", 1)[0].lstrip("-").replace("_", "-").lower()
    known = {option.lstrip("-"): option for option in options}
    if spelled in known and word.split("=", 1)[0] != known[spelled]:
        return f"did you mean {known[spelled]}? (flags are written with dashes, in lower case)"
    close = nearest(spelled, known)
    if close:
        return f"did you mean {known[close]}?"
    return "otel-numa --help lists the flags"


def unknown_environment(environment: Mapping[str, str], known: Iterable[str]) -> list[tuple[str, str | None]]:
    """``OTEL_NUMA_*`` variables that set nothing, each with the nearest setting's variable (or None)."""
    names = set(known)
    return [
        (name, nearest(name, names))
        for name in sorted(environment)
        if name.startswith("OTEL_NUMA_") and name not in names and not name.startswith(SCRIPT_VARIABLES)
    ]


def unmatched_patterns(patterns: Iterable[str]) -> list[str]:
    """Messages for metric patterns (``--metrics-exclude``) that match no metric: they exclude nothing."""
    names = {spec.name for spec in catalogue.METRICS} | catalogue.prometheus_names()
    problems = []
    for pattern in sorted(patterns):
        if any(fnmatch.fnmatchcase(name, pattern) for name in names):
            continue
        close = nearest(pattern, names)
        hint = f"did you mean {close}?" if close else "otel-numa --list-metrics lists the names"
        problems.append(f"{pattern!r} matches no metric; {hint}")
    return problems


def machine_cpus(sysfs_root: Path) -> tuple[frozenset[int], Path] | None:
    """The CPUs this machine has (``present``, else ``possible``), with the file read; None when unknown."""
    for name in ("present", "possible"):
        path = sysfs_root / "devices" / "system" / "cpu" / name
        try:
            return parse_cpulist(read_text(path)), path
        except (OSError, SourceError):
            continue
    return None


def absent_cpus(cpus: frozenset[int], sysfs_root: Path) -> str | None:
    """Why CPUs the machine does not have cannot be the kubelet's reserved CPUs; None when they are fine
    (or the machine's CPUs cannot be read here)."""
    machine = machine_cpus(sysfs_root)
    if machine is None:
        return None
    present, path = machine
    missing = cpus - present
    if not missing:
        return None
    return (
        f"CPUs {format_cpulist(missing)} are not on this machine (it has {format_cpulist(present)}, {path}): "
        "give the kubelet's reservedSystemCPUs of this node"
    )


def shared_port(prometheus_address: tuple[str, int] | None, health_address: tuple[str, int] | None) -> bool:
    """True when the page and /healthz would listen on one port of one address (the second bind fails)."""
    if prometheus_address is None or health_address is None:
        return False
    (page_host, page_port), (health_host, health_port) = prometheus_address, health_address
    if page_port != health_port or page_port == 0:
        return False
    return page_host == health_host or bool({page_host, health_host} & WILDCARD_HOSTS)
