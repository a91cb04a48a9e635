"""A page that cannot be rendered whole is rendered without the series that cannot be, never not at all.

Names and values are made valid where the agent reads them (``otel_numa.model``), so prometheus_client can
always render the page. Should a series still defeat it, the scrape would fail whole (HTTP 500) and every
other series with it. This guard catches that case only: the page is collected again, each family is
rendered alone, a family that fails is rendered series by series, and only the series that fail are left
out, logged once per family and counted in :attr:`RenderGuard.dropped`. A page that renders, which is every
page, costs nothing more.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Families:
    """A collector that hands prometheus_client a fixed list of families."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _render(families: list[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)


def _with_samples(family: Metric, samples: list[Any]) -> Metric:
    copy = Metric(family.name, family.documentation, family.type, family.unit)
    copy.samples = samples
    return copy


class RenderGuard:
    """Wraps the page's WSGI ``app``; ``registry`` is the page's registry, collected again on a failure."""

    def __init__(self, app: WsgiApp, registry: CollectorRegistry) -> None:
        self._app = app
        self._registry = registry
        self._lock = threading.Lock()
        self._logged: set[str] = set()
        self.dropped = 0  # series left out of pages, since start

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        try:
            return list(self._app(environ, start_response))
        except Exception:  # a value prometheus_client cannot write: every other series still goes out
            body = self._render_what_renders()
            start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
            return [body]

    def _render_what_renders(self) -> bytes:
        parts: list[bytes] = []
        for family in self._registry.collect():
            try:
                parts.append(_render([family]))
                continue
            except Exception:
                pass
            kept = []
            for sample in family.samples:
                try:
                    _render([_with_samples(family, [sample])])
                except Exception:
                    continue
                kept.append(sample)
            self._count(family.name, len(family.samples) - len(kept))
            if kept:
                parts.append(_render([_with_samples(family, kept)]))
        return b"".join(parts)

    def _count(self, name: str, dropped: int) -> None:
        with self._lock:
            self.dropped += dropped
            first = name not in self._logged
            self._logged.add(name)
        if first:
            log.warning("%d series of %s cannot be written on the page and are left out", dropped, name)
