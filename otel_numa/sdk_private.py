"""Every use of the OpenTelemetry SDK's private attributes, in one module owned by the pipeline.

Each use is listed in the README with the reason no public route exists; the SDK is pinned to the minor
version the tests prove (``~=`` in pyproject.toml), and tests/test_sdk_private.py fails when a shape
changes.

Forgetting the attribute sets of departed pods, so that pod churn neither leaks nor overflows.

What the OpenTelemetry SDK (1.45) does with an observable instrument: every reader keeps one aggregation
per attribute set it was ever given, for the life of the MeterProvider. An attribute set that a callback
no longer reports is not exported (a cumulative sum or a gauge with no new value yields no point), so a
removed pod's series does disappear; but its aggregation stays, and counts towards the cardinality limit.
Once the limit is reached, every new attribute set lands in one ``otel.metric.overflow=true`` series:
after enough churn, new pods would lose their series and memory would grow with every pod ever seen.

The SDK has no public call to forget an attribute set, and the public alternative, a new MeterProvider or
readers removed and added again (``MeterProvider.remove_metric_reader``/``add_metric_reader``), forgets
everything: every cumulative counter of every series would restart with a new start time, and scrapes during
the swap would see no series or two copies of each. So :class:`DepartedSeriesJanitor` removes, from each
reader's storage, exactly the aggregations whose ``k8s.pod.uid`` belongs to no live pod, holding the
collection lock the SDK itself takes, so it never runs while a reader collects. Series of live pods keep
their state and start time.

This reaches into the SDK's private storage. It checks the shape it expects first; if a future SDK differs, it
logs one warning and does nothing (the cardinality limit then bounds memory, and the churn test fails, which
is how an SDK upgrade that changes the internals is caught).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider

log = logging.getLogger(__name__)

POD_UID = "k8s.pod.uid"


class DepartedSeriesJanitor:
    def __init__(self, provider: MeterProvider) -> None:
        self._provider = provider
        self._warned = False

    @property
    def supported(self) -> bool:
        """Whether this SDK has the shape :meth:`forget` relies on (checked on the live provider)."""
        consumer = getattr(self._provider, "_measurement_consumer", None)
        storages = getattr(consumer, "_reader_storages", None)
        if getattr(consumer, "_lock", None) is None or not isinstance(storages, dict):
            return False
        for storage in storages.values():
            matches_by_instrument = getattr(storage, "_instrument_view_instrument_matches", None)
            if not isinstance(matches_by_instrument, dict):
                return False
            for matches in matches_by_instrument.values():
                for match in matches:
                    if not isinstance(getattr(match, "_attributes_aggregation", None), dict):
                        return False
                    if getattr(match, "_lock", None) is None:
                        return False
        return not self._warned

    def forget(self, is_live: Callable[[str], bool]) -> int:
        """Forget every attribute set whose ``k8s.pod.uid`` is not live; returns how many were forgotten."""
        consumer = getattr(self._provider, "_measurement_consumer", None)
        lock = getattr(consumer, "_lock", None)
        storages = getattr(consumer, "_reader_storages", None)
        if lock is None or not isinstance(storages, dict):
            self._unsupported("no measurement consumer")
            return 0
        forgotten = 0
        with lock:  # the lock held for a whole collection: no reader is collecting now
            for storage in list(storages.values()):
                matches_by_instrument = getattr(storage, "_instrument_view_instrument_matches", None)
                if not isinstance(matches_by_instrument, dict):
                    self._unsupported("no view-instrument matches")
                    return forgotten
                for matches in list(matches_by_instrument.values()):
                    for match in matches:
                        forgotten += self._forget_in(match, is_live)
        return forgotten

    def _forget_in(self, match: Any, is_live: Callable[[str], bool]) -> int:
        aggregations = getattr(match, "_attributes_aggregation", None)
        match_lock = getattr(match, "_lock", None)
        if not isinstance(aggregations, dict) or match_lock is None:
            self._unsupported("no attribute aggregations")
            return 0
        with match_lock:
            aggregations = match._attributes_aggregation
            kept = {}
            for key, aggregation in aggregations.items():
                attributes = getattr(aggregation, "_attributes", None)
                uid = attributes.get(POD_UID) if isinstance(attributes, dict) else None
                if not isinstance(uid, str) or is_live(uid):
                    kept[key] = aggregation
            if len(kept) == len(aggregations):
                return 0
            # a new dict swapped in whole: a reader that looks an aggregation up without the lock sees one or
            # the other, never a dict being changed
            match._attributes_aggregation = kept
            return len(aggregations) - len(kept)

    def _unsupported(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "cannot forget departed pods' series with this OpenTelemetry SDK (%s); "
                "the cardinality limit bounds them instead",
                why,
            )


# Cheaper per-series paths ---------------------------------------------------------------------------
#
# The instruments hand the SDK the same attribute dict objects for a series from one collection to the
# next (otel_numa.instruments.base). The SDK and the two Prometheus libraries redo per-series work that
# depends only on those attributes on every collection; these memoised stand-ins do it once per dict (or
# per label name). Each wraps the original function, so results are the library's own; each is installed
# only when the module attribute it replaces has the expected shape (tests/test_sdk_private.py).

_MEASUREMENT_MODULE = "opentelemetry.sdk.metrics._internal.measurement"
_MATCH_MODULE = "opentelemetry.sdk.metrics._internal._view_instrument_match"
_PROMETHEUS_EXPORTER_MODULE = "opentelemetry.exporter.prometheus"
_OPENMETRICS_MODULE = "prometheus_client.openmetrics.exposition"


class _CleanedAttributes:
    """``_clean_attribute_value`` remembered per attribute dict object, for the dicts seen in this or the
    previous collection (each entry holds its dict, so an id cannot be reused while it is remembered)."""

    def __init__(self, clean: Callable[..., Any]) -> None:
        self._clean = clean
        self._current: dict[int, tuple[object, Any]] = {}
        self._previous: dict[int, tuple[object, Any]] = {}

    def __call__(self, value: Any, max_length: int | None) -> Any:
        if max_length is not None or not isinstance(value, dict):
            return self._clean(value, max_length)
        key = id(value)
        entry = self._current.get(key)
        if entry is None or entry[0] is not value:
            entry = self._previous.get(key)
            if entry is None or entry[0] is not value:
                cleaned = self._clean(value, None)
                # nothing to clean (the agent's own dicts): the dict itself, not a copy, per series
                entry = (value, value if cleaned == value else cleaned)
            self._current[key] = entry
        return entry[1]

    def new_collection(self) -> None:
        self._previous, self._current = self._current, {}


class _HashedAttributes:
    """The SDK's attribute-set key, remembered by the attributes' items (cheap to form for the flat
    string/number attributes the agent uses; anything unhashable takes the SDK's own path)."""

    def __init__(self, hash_attributes: Callable[[Any], Any]) -> None:
        self._hash = hash_attributes
        self._known: dict[tuple[Any, ...], Any] = {}
        self._previous: dict[tuple[Any, ...], Any] = {}

    def __call__(self, attributes: Any) -> Any:
        if not isinstance(attributes, dict):
            return self._hash(attributes)
        try:
            items = tuple(attributes.items())
            found = self._known.get(items)
        except TypeError:  # an unhashable value (a list): no memo
            return self._hash(attributes)
        if found is None:
            found = self._previous.get(items)
            if found is None:
                found = self._hash(attributes)
            self._known[items] = found
        return found

    def new_collection(self) -> None:
        self._previous, self._known = self._known, {}


class FastPaths:
    """The memoised stand-ins, installed once per process; :meth:`new_collection` ages their memory."""

    def __init__(self) -> None:
        self.installed: list[str] = []
        self._rotating: list[_CleanedAttributes | _HashedAttributes] = []

    def install(self) -> None:
        if self.installed:
            return
        import importlib

        measurement = importlib.import_module(_MEASUREMENT_MODULE)
        match = importlib.import_module(_MATCH_MODULE)
        exporter = importlib.import_module(_PROMETHEUS_EXPORTER_MODULE)
        openmetrics = importlib.import_module(_OPENMETRICS_MODULE)
        cleaned = self._replace(measurement, "_clean_attribute_value", _CleanedAttributes)
        hashed = self._replace(match, "_hash_attributes", _HashedAttributes)
        self._rotating = [memo for memo in (cleaned, hashed) if memo is not None]
        self._replace(exporter, "sanitize_attribute", lambda f: functools.lru_cache(maxsize=4096)(f))
        self._replace(openmetrics, "escape_label_name", lambda f: functools.lru_cache(maxsize=4096)(f))

    def _replace(self, module: Any, name: str, wrap: Callable[[Any], Any]) -> Any:
        original = getattr(module, name, None)
        if not callable(original) or getattr(original, "__module__", "").startswith("otel_numa"):
            log.warning("cannot speed up %s.%s with this library version", module.__name__, name)
            return None
        replacement = wrap(original)
        setattr(module, name, replacement)
        self.installed.append(f"{module.__name__}.{name}")
        return replacement

    def new_collection(self) -> None:
        for memo in self._rotating:
            memo.new_collection()


FAST_PATHS = FastPaths()


# Unchanged families: translated and rendered once ------------------------------------------------------
#
# The OTel Prometheus exporter translates every metric into a prometheus_client family on every scrape,
# and prometheus_client renders every sample again. Most of a node's series (allocation, per-container
# usage between cgroup rounds) do not change from one scrape to the next. The translation of a metric is
# reused while its data points have the same attribute dicts (the SDK keeps one per series) and the same
# values; a reused family's rendered text is reused too. Both go through the libraries' own code for
# anything that changed, so the page stays byte for byte what they would write.

_EOF = b"# EOF\n"


@dataclass
class _Translation:
    attributes: tuple[object, ...]  # held, so that their ids cannot be reused while remembered
    values: tuple[object, ...]
    families: tuple[tuple[str, object], ...]  # (family id, prometheus_client family)


class _TranslatedMetrics:
    """Wraps the exporter collector's ``_translate_metric``."""

    def __init__(self, translate: Callable[..., None], labels: _CollectedDataPoints) -> None:
        self._translate = translate
        self._labels = labels
        self._known: dict[str, _Translation] = {}

    def __call__(
        self,
        metric: Any,
        scope_attrs: Any,
        resource_attrs: Any,
        metric_family_id_metric_family: dict[str, object],
    ) -> None:
        points = getattr(metric.data, "data_points", ())
        attributes = tuple(point.attributes for point in points)
        values = tuple(getattr(point, "value", None) for point in points)
        key = f"{metric.name}|{metric.description}|{metric.unit}|{type(metric.data).__name__}"
        known = self._known.get(key)
        if (
            known is not None
            and known.values == values
            and len(known.attributes) == len(attributes)
            and all(a is b for a, b in zip(known.attributes, attributes, strict=True))
            and not any(family_id in metric_family_id_metric_family for family_id, _ in known.families)
        ):
            metric_family_id_metric_family.update(known.families)
            return
        before = set(metric_family_id_metric_family)
        self._labels.metric.key = key
        try:
            self._translate(metric, scope_attrs, resource_attrs, metric_family_id_metric_family)
        finally:
            self._labels.metric.key = None
        added = tuple((fid, fam) for fid, fam in metric_family_id_metric_family.items() if fid not in before)
        if None in values or any(fid in before for fid, _ in added) or not added:
            self._known.pop(key, None)  # histograms, merged families: translated every time
        else:
            self._known[key] = _Translation(attributes, values, added)


@dataclass
class _Labels:
    attributes: tuple[object, ...]  # held, so that their ids cannot be reused while remembered
    context: tuple[object, ...]  # the resource and scope labels they were made with
    keys: list[str]
    rows: list[list[str]]


class _CollectedDataPoints:
    """Wraps the exporter collector's ``_collect_data_points``: the label names and values of a metric
    whose data points have the same attribute dicts as last time (only the values changed, e.g. fresh
    cgroup readings) are reused; only the values are read again."""

    def __init__(self, collect: Callable[..., Any]) -> None:
        self._collect = collect
        self._known: dict[str, _Labels] = {}  # one entry per metric
        self.metric = threading.local()  # the metric being translated in this thread (_TranslatedMetrics)

    def __call__(self, metric_data: Any, scope_attrs: Any, resource_attrs: Any) -> Any:
        points = getattr(metric_data, "data_points", ())
        key = getattr(self.metric, "key", None)
        if key is None or any(not hasattr(point, "value") for point in points):  # e.g. histograms
            return self._collect(metric_data, scope_attrs, resource_attrs)
        attributes = tuple(point.attributes for point in points)
        context = (tuple(resource_attrs.items()), tuple(scope_attrs.items()))
        known = self._known.get(key)
        if (
            known is not None
            and known.context == context
            and len(known.attributes) == len(attributes)
            and all(a is b for a, b in zip(known.attributes, attributes, strict=True))
        ):
            return known.keys, known.rows, [point.value for point in points]
        keys, rows, values = self._collect(metric_data, scope_attrs, resource_attrs)
        self._known[key] = _Labels(attributes, context, keys, rows)
        return keys, rows, values


class _OneFamily:
    def __init__(self, family: object) -> None:
        self._family = family

    def collect(self) -> list[object]:
        return [self._family]


class RenderedFamilies:
    """A stand-in for prometheus_client's text and OpenMetrics encoders that renders, for registries that
    ask for it, each family it has not rendered in the previous scrape, and reuses the text of the rest."""

    def __init__(self, text_encoder: Callable[..., bytes], openmetrics_encoder: Callable[..., bytes]) -> None:
        self.text_encoder = text_encoder
        self.openmetrics_encoder = openmetrics_encoder
        self._last: dict[tuple[object, ...], dict[int, tuple[object, bytes]]] = {}

    def text(self, registry: Any, **options: str) -> bytes:
        if not getattr(registry, "renders_by_family", False):
            return self.text_encoder(registry, **options)
        form = ("text", *sorted(options.items()))
        return self._render(registry, form, lambda one: self.text_encoder(one, **options))

    def openmetrics(self, registry: Any, **options: str) -> bytes:
        if not getattr(registry, "renders_by_family", False):
            return self.openmetrics_encoder(registry, **options)

        def render(one: _OneFamily) -> bytes:
            return self.openmetrics_encoder(one, **options).removesuffix(_EOF)

        return self._render(registry, ("openmetrics", *sorted(options.items())), render) + _EOF

    def _render(
        self, registry: Any, form: tuple[object, ...], render: Callable[[_OneFamily], bytes]
    ) -> bytes:
        last = self._last.get(form, {})
        now: dict[int, tuple[object, bytes]] = {}
        parts: list[bytes] = []
        for family in registry.collect():
            known = last.get(id(family))
            text = known[1] if known is not None and known[0] is family else render(_OneFamily(family))
            now[id(family)] = (family, text)
            parts.append(text)
        self._last[form] = now
        return b"".join(parts)


def speed_up_prometheus_reader(reader: Any) -> bool:
    """Reuse unchanged metrics' translations in this reader; False when the exporter's shape differs."""
    collector = getattr(reader, "_collector", None)
    translate = getattr(collector, "_translate_metric", None)
    if collector is None or not callable(translate):
        log.warning("cannot reuse unchanged translations with this Prometheus exporter version")
        return False
    collect = getattr(collector, "_collect_data_points", None)
    if not callable(collect):
        log.warning("cannot reuse label rows with this Prometheus exporter version")
        return False
    labels = _CollectedDataPoints(collect)
    collector._collect_data_points = labels
    collector._translate_metric = _TranslatedMetrics(translate, labels)
    return True


def install_family_rendering() -> RenderedFamilies | None:
    """Route prometheus_client's encoders through :class:`RenderedFamilies` (once per process)."""
    import prometheus_client.exposition as exposition
    import prometheus_client.openmetrics.exposition as openmetrics

    current = exposition.generate_latest
    owner = getattr(current, "__self__", None)
    if isinstance(owner, RenderedFamilies):
        return owner
    if not callable(current) or not callable(getattr(openmetrics, "generate_latest", None)):
        log.warning("cannot reuse rendered families with this prometheus_client version")
        return None
    rendered = RenderedFamilies(current, openmetrics.generate_latest)
    setattr(exposition, "generate_latest", rendered.text)  # noqa: B010  (a module global, replaced)
    setattr(openmetrics, "generate_latest", rendered.openmetrics)  # noqa: B010
    return rendered
