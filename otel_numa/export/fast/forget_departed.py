"""Patch ``forget_departed``: forget departed pods' series in the agent's own MeterProvider.

The SDK keeps one aggregation per attribute set an observable instrument ever reported, for the life of
the MeterProvider, and counts them towards the cardinality limit: after enough pod churn, new pods' series
would land in the overflow series and memory would grow with every pod ever seen. The SDK has no public
call to forget an attribute set; the public path rebuilds its readers instead (otel_numa.export.rebuild),
which gives every counter a new start time. This patch removes, from each of the provider's reader
storages, exactly the aggregations whose ``k8s.pod.uid`` belongs to no live pod, holding the lock the SDK
itself holds for a whole collection. Series of live pods keep their state and start time.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import Any

from otel_numa.export.fast.patch import Patch

log = logging.getLogger(__name__)

POD_UID = "k8s.pod.uid"


class DepartedSeriesJanitor:
    def __init__(self, provider: Any, *, quiet: bool = False) -> None:
        self._provider = provider  # an SDK MeterProvider
        self._warned = False
        self._quiet = quiet  # a check's janitor says nothing: the start-up choice warns once
        # per view-instrument match, its aggregations when they were all of live pods, and how many there
        # were: the SDK only ever adds to that dict, so while it and the live pods stay the same, only a
        # longer dict has anything to forget
        self._live: frozenset[str] = frozenset()
        self._all_live: weakref.WeakKeyDictionary[Any, tuple[dict[Any, Any], int]] = (
            weakref.WeakKeyDictionary()
        )

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

    def forget(self, live_pods: frozenset[str]) -> int:
        """Forget every attribute set whose ``k8s.pod.uid`` is not in ``live_pods``; returns how many were
        forgotten."""
        if live_pods != self._live:
            self._live = live_pods
            self._all_live.clear()
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
                        forgotten += self._forget_in(match, live_pods)
        return forgotten

    def _forget_in(self, match: Any, live_pods: frozenset[str]) -> int:
        aggregations = getattr(match, "_attributes_aggregation", None)
        match_lock = getattr(match, "_lock", None)
        if not isinstance(aggregations, dict) or match_lock is None:
            self._unsupported("no attribute aggregations")
            return 0
        with match_lock:
            aggregations = match._attributes_aggregation
            checked = self._all_live.get(match)
            if checked is not None and checked[0] is aggregations and checked[1] == len(aggregations):
                return 0
            kept = {}
            for key, aggregation in aggregations.items():
                attributes = getattr(aggregation, "_attributes", None)
                uid = attributes.get(POD_UID) if isinstance(attributes, Mapping) else None
                if not isinstance(uid, str) or uid in live_pods:
                    kept[key] = aggregation
            forgotten = len(aggregations) - len(kept)
            if forgotten:
                # a new dict swapped in whole: a reader that looks an aggregation up without the lock sees one
                # or the other, never a dict being changed
                match._attributes_aggregation = kept
            self._all_live[match] = (match._attributes_aggregation, len(kept))
            return forgotten

    def _unsupported(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            if not self._quiet:
                log.warning(
                    "cannot forget departed pods' series with this OpenTelemetry SDK (%s); "
                    "the cardinality limit bounds them until the readers are rebuilt",
                    why,
                )


def _check() -> str | None:
    """The janitor on a throwaway provider: it must find the shape and forget exactly one departed pod."""
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    pods = ["alive", "gone"]

    def observe(_options: CallbackOptions) -> list[Observation]:
        return [Observation(1, {POD_UID: uid}) for uid in pods]

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    try:
        provider.get_meter("otel_numa.check").create_observable_gauge("check", callbacks=[observe])
        reader.collect()
        janitor = DepartedSeriesJanitor(provider, quiet=True)
        if not janitor.supported:
            return "the SDK's reader storages have another shape"
        pods.remove("gone")
        if janitor.forget(frozenset({"alive"})) != 1 or janitor.forget(frozenset({"alive"})) != 0:
            return "forgetting a departed pod's series did not work"
        data = reader.get_metrics_data()
        points = [
            point.attributes
            for resource in (data.resource_metrics if data is not None else ())
            for scope in resource.scope_metrics
            for metric in scope.metrics
            for point in metric.data.data_points
        ]
        return None if points == [{POD_UID: "alive"}] else "the live pod's series changed"
    finally:
        provider.shutdown()


PATCH = Patch(
    name="forget_departed",
    replaces="the planned rebuild of the readers when departed pods' series pile up",
    private_names=(
        "MeterProvider._measurement_consumer",
        "SynchronousMeasurementConsumer._lock",
        "SynchronousMeasurementConsumer._reader_storages",
        "MetricReaderStorage._instrument_view_instrument_matches",
        "_ViewInstrumentMatch._attributes_aggregation",
        "_ViewInstrumentMatch._lock",
        "_Aggregation._attributes",
    ),
    check=_check,
    kept_for="live pods' series keep their start times through pod churn, and the readers are never rebuilt",
)
