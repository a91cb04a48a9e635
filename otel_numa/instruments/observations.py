"""An instrument's observations of one collection, kept in two columns."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from opentelemetry.metrics import Observation
from opentelemetry.util.types import Attributes

from otel_numa.series_attributes import SeriesAttributes


class Observations:
    """An instrument's observations of one collection as two columns: the values, and the series'
    attribute mappings. The agent's instruments keep their last observations for as long as their inputs
    do not change, and hand the same attributes tuple again while their series are the same, with new
    values: 16 bytes a series where a list of observations takes 56, and "the same series in place" is
    one comparison. Iterated, it gives the API's observations (made then) with plain dicts, as the SDK
    reads them (it would take a :class:`SeriesAttributes`, a tuple, for a sequence)."""

    __slots__ = ("attributes", "values")

    def __init__(self, values: list[float | int], attributes: tuple[Any, ...]) -> None:
        self.values = values
        self.attributes = attributes

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[Observation]:
        return map(Observation, self.values, map(_plain, self.attributes))


def _plain(attributes: Attributes) -> Attributes:
    if type(attributes) is SeriesAttributes:
        return dict(attributes.items())
    return attributes
