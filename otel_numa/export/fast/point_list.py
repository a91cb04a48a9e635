"""An instrument's data points as the SDK hands them on, with their attributes and values in tuples."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class PointList(list[Any]):
    """A list of data points (what the SDK's collection hands on), carrying the tuples of their attribute
    mappings and of their values that ``repeated_points`` keeps between collections: the page's
    translations (``reused_translations``) and the kept OTLP request (``reused_requests``) take those
    instead of making tuples of their own, and find the same series by one identity check (the same
    tuple while the instrument's series are the same)."""

    __slots__ = ("attributes", "values")

    def __init__(self, points: Iterable[Any], attributes: tuple[Any, ...], values: tuple[Any, ...]) -> None:
        super().__init__(points)
        self.attributes = attributes
        self.values = values
