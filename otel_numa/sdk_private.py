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

import logging
from collections.abc import Callable
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
