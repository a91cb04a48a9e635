"""Opt-in enrichment from the container runtime (CRI), refreshed in the background.

:meth:`RuntimeRefresher.refresh` runs in the scheduler's thread and swaps in a new immutable
:class:`RuntimeView`; snapshot builds only read :attr:`RuntimeRefresher.latest`. Only allowlisted pod
labels, pod annotations and environment variables are kept (exact names; a secret-like name is always
refused, even when allowlisted, by the rule of :mod:`otel_numa.sources.secret_names`), with the credentials
of URL-shaped values taken out and values cut to a maximum length.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from otel_numa.model import Allocation, Source
from otel_numa.options import EnrichMode
from otel_numa.snapshot.source_status import SourceRegistry
from otel_numa.sources.errors import SourceError, SourceMissing
from otel_numa.sources.secret_names import is_secret_like, without_url_credentials

if TYPE_CHECKING:  # the CRI client brings gRPC: imported only where the runtime is configured
    from otel_numa.sources.cri import ContainerInfo, CriClient

log = logging.getLogger(__name__)

SOURCE = Source.CRI
LABEL_PREFIX, ANNOTATION_PREFIX, ENV_PREFIX = "label_", "annotation_", "env_"
_NOT_NAME_CHARACTER = re.compile(r"[^A-Za-z0-9_]")

ContainerKey = tuple[str, str]  # (pod uid, container name)


@dataclass(frozen=True, slots=True)
class EnrichmentRules:
    pod_labels: frozenset[str] = frozenset()
    pod_annotations: frozenset[str] = frozenset()
    env: frozenset[str] = frozenset()
    value_max_length: int = 128


@dataclass(frozen=True, slots=True)
class RuntimeView:
    """The enrichment attributes of each running container (already filtered and cut), and its pod's name."""

    attributes: Mapping[ContainerKey, Mapping[str, str]]
    pod_names: Mapping[ContainerKey, tuple[str, str]]  # (namespace, name)


def attribute_name(prefix: str, key: str) -> str:
    """``label_`` + the key with every character other than a letter, digit or ``_`` made ``_``
    (``app.kubernetes.io/name`` -> ``label_app_kubernetes_io_name``), as kube-state-metrics names them."""
    return prefix + _NOT_NAME_CHARACTER.sub("_", key)


def refused_names(rules: EnrichmentRules) -> list[str]:
    """The allowlisted names that look like they hold a secret, as ``setting: name``."""
    return [
        f"{setting}: {name}"
        for setting, names in (
            ("enrich_pod_labels", rules.pod_labels),
            ("enrich_pod_annotations", rules.pod_annotations),
            ("enrich_env", rules.env),
        )
        for name in sorted(names)
        if is_secret_like(name)
    ]


def enrichment_attributes(info: ContainerInfo, rules: EnrichmentRules) -> dict[str, str]:
    """The allowlisted, not secret-like labels, annotations and environment variables of one container."""
    found: dict[str, str] = {}
    for prefix, values, allowed in (
        (LABEL_PREFIX, info.pod_labels, rules.pod_labels),
        (ANNOTATION_PREFIX, info.pod_annotations, rules.pod_annotations),
        (ENV_PREFIX, info.env, rules.env),
    ):
        for key in sorted(allowed):
            value = values.get(key)
            if value is not None and not is_secret_like(key):
                # credentials out before the cut: a cut could leave ``user:password`` without its ``@``
                found[attribute_name(prefix, key)] = without_url_credentials(value)[: rules.value_max_length]
    return found


def resolve_cri_socket(setting: str) -> Path | None:
    """``none`` (off), ``auto`` (the first containerd or CRI-O socket that exists) or a path."""
    if setting.lower() == "none":
        return None
    if setting.lower() == "auto":
        from otel_numa.sources.cri import CRI_SOCKET_CANDIDATES, detect_cri_socket

        return detect_cri_socket([Path(candidate) for candidate in CRI_SOCKET_CANDIDATES])
    return Path(setting)


class RuntimeRefresher:
    """Owns the CRI client; keeps the last good view (an RPC failure keeps it, a missing socket drops it)."""

    def __init__(
        self,
        socket_path: Path,
        rules: EnrichmentRules,
        registry: SourceRegistry,
        *,
        client: CriClient | None = None,
    ) -> None:
        if client is None:
            from otel_numa.sources.cri import CriClient

            client = CriClient(socket_path)
        self._client = client
        self._rules = rules
        refused = refused_names(rules)
        if refused:
            log.warning(
                "allowlisted names refused, they look like they hold a secret: %s", ", ".join(refused)
            )
        self._tracker = registry.tracker(SOURCE)
        self._latest: RuntimeView | None = None

    @property
    def latest(self) -> RuntimeView | None:
        return self._latest

    def refresh(self) -> None:
        with self._tracker.timed():
            self._refresh()

    def _refresh(self) -> None:
        try:
            containers = self._client.containers(self._rules.env)
        except SourceMissing as missing:
            self._latest = None
            self._tracker.failed(missing)
            return
        except SourceError as error:
            self._tracker.failed(error)
            return
        self._latest = RuntimeView(
            attributes=MappingProxyType(
                {
                    (info.pod_uid, info.container_name): MappingProxyType(
                        enrichment_attributes(info, self._rules)
                    )
                    for info in containers
                }
            ),
            pod_names=MappingProxyType(
                {(info.pod_uid, info.container_name): (info.namespace, info.pod_name) for info in containers}
            ),
        )
        self._tracker.succeeded()

    def close(self) -> None:
        self._client.close()


def apply_enrichment(allocation: Allocation, view: RuntimeView, mode: EnrichMode) -> Allocation:
    """``info``: one attribute map per running container for ``numa.container.info``; ``attributes``: the
    same attributes straight on each per-container allocation series."""
    if mode == "info":
        info: dict[ContainerKey, Mapping[str, str]] = {}
        for key, attributes in view.attributes.items():
            namespace, pod = view.pod_names[key]
            info[key] = {"k8s.pod.name": pod, "k8s.namespace.name": namespace, **attributes}
        return replace(allocation, container_info=MappingProxyType(info))
    containers = tuple(
        replace(
            container,
            container=replace(
                container.container,
                extra_attributes=tuple(
                    sorted(view.attributes.get((ref.pod_uid, ref.container_name), {}).items())
                ),
            ),
        )
        for container in allocation.containers
        for ref in (container.container,)
    )
    return replace(allocation, containers=containers)
