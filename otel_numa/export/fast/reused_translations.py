"""Patch ``reused_translations``: unchanged metrics are translated into Prometheus families once.

The OpenTelemetry Prometheus exporter translates every metric into a prometheus_client family on every
scrape. Most of a node's series (allocation, per-container usage between cgroup rounds) do not change from
one scrape to the next. The translation of a metric is reused while its data points have the same
attribute mappings (the SDK keeps one per series, so they are compared by identity) and the same values;
anything that changed goes through the exporter's own translation, so the families are the ones it makes.
The reader's collector's private ``_translate_metric`` is wrapped on the agent's own reader only.

A family of one sample per data point (gauges, counters) is kept as its values and a recipe
(:class:`SeriesRecipe`): its samples, a name and a label dict per series (~450 bytes each), are made again
by the exporter's translation only when something reads them. Such a family is translated and rendered a
slice of series at a time (SERIES_PER_SLICE), so the samples of the page's largest family never exist at
once (otel_numa.export.fast.rendered_families writes new values into the last text).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics.export import Gauge, NumberDataPoint, Sum
from prometheus_client.metrics_core import Metric as PrometheusMetric

from otel_numa.export.fast.patch import Patch
from otel_numa.export.fast.point_list import PointList
from otel_numa.series_attributes import SeriesAttributes

log = logging.getLogger(__name__)

# series translated at once: a slice's points, label dicts and sanitised label names are ~20 small objects
# a series, and the peak of a first scrape is what the allocator keeps (2x32 node: 128 series a slice
# peaked at ~7,900 more blocks than before the scrape, 32 at ~5,900)
SERIES_PER_SLICE = 32
# series translated to learn whether a metric with series of the same keys makes one plain sample per
# series: the page checks each slice again as it renders it, so a few are enough
PROBED_SERIES = 8


@dataclass(eq=False)
class SeriesRecipe:
    """What a family of one sample per data point is made from, but its values: the exporter's own
    translation of the metric (without its data points) with these attribute dicts. The same object while
    the series are the same (compared by identity)."""

    translate: Callable[..., None]  # the exporter's, unwrapped
    metric: Any  # the SDK's Metric, with no data points
    family_id: str
    attributes: tuple[Any, ...]  # the data points' attribute dicts, in order
    scope_attrs: Any
    resource_attrs: Any
    # whether every series has the same attribute keys: the exporter labels each sample with every key
    # of the metric's points ("" where a point lacks one), so only then is a slice's text the whole's
    sliced: bool

    def family(self, values: tuple[Any, ...], start: int = 0) -> Any:
        """The family the exporter makes from these series with ``values``, or from the ones from ``start``
        on, as many as ``values``."""
        return self.family_of(self.attributes[start : start + len(values)], values)

    def family_of(self, attributes: tuple[Any, ...], values: tuple[Any, ...]) -> Any:
        """The family the exporter makes from series of these attributes (some of this recipe's, in any
        order) with ``values``."""
        points = [
            NumberDataPoint(attributes=each, start_time_unix_nano=0, time_unix_nano=0, value=value)
            for each, value in zip(attributes, values, strict=True)
        ]
        families: dict[str, Any] = {}
        self.translate(_with_points(self.metric, points), self.scope_attrs, self.resource_attrs, families)
        return families[self.family_id]

    @functools.cached_property
    def keys(self) -> frozenset[str]:
        """The attribute keys of all its series: the exporter labels every sample with each of them (""
        where a series lacks one), so a series' sample line depends on them and its own attributes."""
        return keys_of(self.attributes)

    def same_family(self, other: SeriesRecipe) -> bool:
        """Whether ``other`` makes the same family from other series, the sample line of a series being
        the same in both: the same metric, scope and resource, and the same attribute keys in all."""
        return bool(
            self.family_id == other.family_id
            and self.keys == other.keys
            and self.metric == other.metric
            and self.scope_attrs == other.scope_attrs
            and self.resource_attrs == other.resource_attrs
        )

    def render(self, values: tuple[Any, ...], render: Callable[[OneFamily], bytes]) -> bytes | None:
        """The family's text, rendered a slice of series at a time: the first slice's whole, the sample
        lines of the others. None if a slice is not one plain sample per series."""
        parts: list[bytes] = []
        step = SERIES_PER_SLICE if self.sliced else len(values)
        for start in range(0, len(values), step):
            some = values[start : start + step]
            family = self.family(some, start)
            if not _one_sample_per_point(((self.family_id, family),), some):
                return None
            text = render(OneFamily(family))
            parts.append(text if start == 0 else _sample_lines(text))
        return b"".join(parts)


def keys_of(attributes: tuple[Any, ...]) -> frozenset[str]:
    keys: set[str] = set()
    seen: set[int] = set()  # SeriesAttributes of one instrument share one keys tuple
    for each in attributes:
        if type(each) is SeriesAttributes:
            of = tuple.__getitem__(each, 0)
            if id(of) not in seen:
                seen.add(id(of))
                keys.update(of)
        else:
            keys.update(each or ())
    return frozenset(keys)


def _with_points(metric: Any, points: list[Any]) -> Any:
    return dataclasses.replace(metric, data=dataclasses.replace(metric.data, data_points=points))


def _sample_lines(text: bytes) -> bytes:
    """``text`` without its leading comment lines (a family's HELP, TYPE and UNIT)."""
    at = 0
    while text.startswith(b"#", at):
        at = text.index(b"\n", at) + 1
    return text[at:]


class ValuesFamily(PrometheusMetric):
    """A family of one sample per data point, kept as its values and its recipe; its samples are made
    anew whenever they are read (and not kept)."""

    def __init__(self, family: Any, recipe: SeriesRecipe, values: tuple[object, ...]) -> None:
        # no Metric.__init__: the names were checked when ``family`` was made
        self.name = family.name
        self.documentation = family.documentation
        self.unit = family.unit
        self.type = family.type
        self.recipe = recipe
        self.values = values

    @property
    def samples(self) -> list[Any]:
        return list(self.whole().samples)

    @samples.setter  # Metric's samples are a plain attribute; these cannot be set
    def samples(self, _samples: list[Any]) -> None:
        raise AttributeError("a family made from its recipe has no samples of its own")

    def whole(self) -> Any:
        """The family the exporter makes from the recipe and these values, samples and all."""
        return self.recipe.family(self.values)


@dataclass
class _Translation:
    attributes: tuple[object, ...]  # held, so that their ids cannot be reused while remembered
    values: tuple[object, ...]
    families: tuple[tuple[str, object], ...]  # (family id, prometheus_client family) as handed over
    # set for one family whose samples are the data points' values in order: new values only need a new
    # ValuesFamily
    recipe: SeriesRecipe | None = None


def _one_sample_per_point(families: tuple[tuple[str, Any], ...], values: tuple[object, ...]) -> bool:
    if len(families) != 1:
        return False
    samples = families[0][1].samples
    return len(samples) == len(values) and all(
        plain_sample(sample) and sample.value is value for sample, value in zip(samples, values, strict=True)
    )


def _same_keys(attributes: tuple[Any, ...]) -> bool:
    """Whether every series has the same attribute keys: the exporter then puts them in one family."""
    first = attributes[0]
    if type(first) is SeriesAttributes:
        keys = tuple.__getitem__(first, 0)
        return all(
            type(each) is SeriesAttributes and ((of := tuple.__getitem__(each, 0)) is keys or of == keys)
            for each in attributes
        )
    names = set(first or ())
    return all(set(each or ()) == names for each in attributes)


class _TranslatedMetrics:
    """Wraps the exporter collector's ``_translate_metric``."""

    def __init__(self, translate: Callable[..., None]) -> None:
        self._translate = translate
        self._known: dict[str, _Translation] = {}

    def __call__(
        self,
        metric: Any,
        scope_attrs: Any,
        resource_attrs: Any,
        metric_family_id_metric_family: dict[str, object],
    ) -> None:
        points = getattr(metric.data, "data_points", ())
        # tuples from lists, made at their length: one from a generator is resized, and a scrape's worth
        # of them then moves from one of the interpreter's free lists to another (otel_numa.daemon.heap)
        if type(points) is PointList:  # repeated_points' tuples
            attributes, values = points.attributes, points.values
        else:
            attributes = tuple([point.attributes for point in points])
            values = tuple([getattr(point, "value", None) for point in points])
        key = f"{metric.name}|{metric.description}|{metric.unit}|{type(metric.data).__name__}"
        known = self._known.get(key)
        if (
            known is not None
            and (
                known.attributes is attributes
                or (
                    len(known.attributes) == len(attributes)
                    and all(a is b for a, b in zip(known.attributes, attributes, strict=True))
                )
            )
            and not any(family_id in metric_family_id_metric_family for family_id, _ in known.families)
        ):
            if known.values == values:
                metric_family_id_metric_family.update(known.families)
                return
            if known.recipe is not None and None not in values:
                ((family_id, family),) = known.families
                families = ((family_id, ValuesFamily(family, known.recipe, values)),)
                metric_family_id_metric_family.update(families)
                self._known[key] = _Translation(known.attributes, values, families, known.recipe)
                return
        by_recipe = self._by_recipe(
            metric, attributes, values, scope_attrs, resource_attrs, metric_family_id_metric_family
        )
        if by_recipe is not None:
            metric_family_id_metric_family.update(by_recipe.families)
            self._known[key] = by_recipe
            return
        before = set(metric_family_id_metric_family)
        self._translate(metric, scope_attrs, resource_attrs, metric_family_id_metric_family)
        added = tuple((fid, fam) for fid, fam in metric_family_id_metric_family.items() if fid not in before)
        if None in values or any(fid in before for fid, _ in added) or not added:
            self._known.pop(key, None)  # histograms, merged families: translated every time
        else:
            self._known[key] = _Translation(attributes, values, added)

    def _by_recipe(
        self,
        metric: Any,
        attributes: tuple[Any, ...],
        values: tuple[object, ...],
        scope_attrs: Any,
        resource_attrs: Any,
        families: dict[str, object],
    ) -> _Translation | None:
        """A gauge's or counter's translation as a recipe, when the exporter makes one family of one plain
        sample per data point of it. Seen on its first few points, the only ones translated here: the page
        checks every series again as it renders them (slice by slice when its series have the same
        attribute keys, so that the whole family's samples never exist at once; else whole)."""
        if type(metric.data) not in (Gauge, Sum) or not values or None in values:
            return None
        sliced = _same_keys(attributes)
        first = values[:PROBED_SERIES]
        translated: dict[str, object] = {}
        head = _with_points(metric, metric.data.data_points[: len(first)])
        self._translate(head, scope_attrs, resource_attrs, translated)
        probe = tuple(translated.items())
        if not _one_sample_per_point(probe, first) or probe[0][0] in families:
            return None  # not one plain sample per point, or merged into another metric's family
        ((family_id, family),) = probe
        without_points = _with_points(metric, [])
        recipe = SeriesRecipe(
            self._translate, without_points, family_id, attributes, scope_attrs, resource_attrs, sliced
        )
        kept = ((family_id, ValuesFamily(family, recipe, values)),)
        return _Translation(attributes, values, kept, recipe)


# Shared with rendered_families, which requires this patch: its families, one at a time, to a library encoder.
class OneFamily:
    """A collector of one family (what prometheus_client's encoders take)."""

    def __init__(self, family: object) -> None:
        self._family = family

    def collect(self) -> list[object]:
        return [self._family]


def plain_sample(sample: Any) -> bool:
    """Whether ``sample`` is one plain "<series> <value>" line (no timestamp, exemplar or histogram)."""
    return (
        sample.value is not None
        and sample.timestamp is None
        and sample.exemplar is None
        and getattr(sample, "native_histogram", None) is None
    )


def reuse_translations(reader: Any) -> None:
    """Reuse unchanged metrics' translations in this Prometheus reader (checked by :data:`PATCH`)."""
    collector = reader._collector
    collector._translate_metric = _TranslatedMetrics(collector._translate_metric)


def _check() -> str | None:
    """A throwaway page with and without the patch, over three collections with a value that changes and
    a series that goes: the same bytes."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    collector = getattr(PrometheusMetricReader(), "_collector", None)
    translate = getattr(collector, "_translate_metric", None)
    if not callable(translate):
        return "the Prometheus reader has no collector with _translate_metric"
    parameters = list(inspect.signature(translate).parameters)
    if len(parameters) != 4:
        return f"_translate_metric takes {parameters}"
    return page_differs(reuse_translations)


def page_differs(
    patch_reader: Callable[[Any], None],
    encoder: Callable[[Any], bytes] | None = None,
    patched_encoder: Callable[[Any], bytes] | None = None,
) -> str | None:
    """Why a throwaway page whose reader ``patch_reader`` changed, rendered by ``patched_encoder``, is not
    the public one (rendered by ``encoder``; prometheus_client's text format by default), or None."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CollectorRegistry, generate_latest

    public_encoder = encoder if encoder is not None else generate_latest
    # a value that changes, a series that goes, series that come (one with a key the others lack)
    rounds = [
        [(1, "a"), (2, "b")],
        [(1, "a"), (2, "b")],
        [(3, "a"), (2, "b")],
        [(3, "a")],
        [(3, "a"), (4, "c")],
        [(3, "a"), (4, "c"), (5, "d+")],
        [(6, "e"), (3, "a"), (5, "d+")],
        [(6, "e"), (7, "f")],
    ]
    pages: list[list[bytes]] = []
    for patched in (False, True):
        registry = CollectorRegistry(auto_describe=False)
        reader = PrometheusMetricReader(registry=registry)
        if patched:
            patch_reader(reader)
        provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
        state: list[tuple[int, str]] = []

        def observe(_options: CallbackOptions, state: list[tuple[int, str]] = state) -> list[Observation]:
            return [
                Observation(value, {"k8s.pod.uid": uid, **({"k8s.pod.name": uid} if "+" in uid else {})})
                for value, uid in state
            ]

        try:
            meter = provider.get_meter("otel_numa.check")
            meter.create_observable_gauge("check_gauge", callbacks=[observe])
            meter.create_observable_counter("check_counter", callbacks=[observe])
            render = patched_encoder if patched and patched_encoder is not None else public_encoder
            texts = []
            for state[:] in rounds:
                texts.append(render(registry))
            pages.append(texts)
        finally:
            provider.shutdown()
    return None if pages[0] == pages[1] else "the page differs from the exporter's own"


PATCH = Patch(
    name="reused_translations",
    replaces="the exporter's translation of every metric into a Prometheus family on every scrape",
    private_names=("PrometheusMetricReader._collector", "_CustomCollector._translate_metric"),
    check=_check,
)
