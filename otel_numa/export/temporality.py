"""The OTLP push's temporality, from the standard variable, as the agent hands it to the exporter and to
the readers that wrap it (read once here, so both agree without asking the exporter)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import AggregationTemporality

log = logging.getLogger(__name__)

VARIABLE = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
Temporality = dict[type, AggregationTemporality]
_C, _D = AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA
# the OpenTelemetry specification's three presets
_PRESETS: Mapping[str, tuple[AggregationTemporality, ...]] = {
    #             Counter, UpDown, Histogram, ObsCounter, ObsUpDown, ObsGauge
    "cumulative": (_C, _C, _C, _C, _C, _C),
    "delta": (_D, _C, _D, _D, _C, _C),
    "lowmemory": (_D, _C, _D, _C, _C, _C),
}
_KINDS = (Counter, UpDownCounter, Histogram, ObservableCounter, ObservableUpDownCounter, ObservableGauge)


def preferred_temporality(environ: Mapping[str, str] = os.environ) -> Temporality:
    preference = environ.get(VARIABLE, "cumulative").strip().lower()
    if preference not in _PRESETS:
        log.warning("unknown %s=%s, using cumulative", VARIABLE, preference)
        preference = "cumulative"
    return dict(zip(_KINDS, _PRESETS[preference], strict=True))


def is_cumulative(temporality: Temporality) -> bool:
    """Whether every instrument kind is cumulative, as on the Prometheus page."""
    return all(value is _C for value in temporality.values())
