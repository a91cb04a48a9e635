"""An instrument's data points as the SDK hands them on, with their attributes and values in tuples."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

_ALL = slice(None)


class PointList(Sequence[Any]):
    """The data points of one metric (what the SDK's collection hands on), carrying the tuples of their
    attribute mappings and of their values that ``repeated_points`` keeps between collections: the page's
    translations (``reused_translations``) and the kept OTLP request (``reused_requests``) take those
    instead of making tuples of their own, and find the same series by one identity check (the same
    tuple while the instrument's series are the same). Repeated points also carry their start times and
    their one time (``starts``, ``time``; else ``None``): a push writes those numbers without the points.

    Repeated points are made only when something reads them: a scrape whose series are the same needs
    the two tuples only, so it makes no point objects at all; a push makes them on first use, and a
    translation that starts afresh, which reads a first slice of them, makes only that slice (all of
    them at once would be the largest thing a first scrape holds). Equal to a list of the same points."""

    __slots__ = ("_make", "_points", "attributes", "starts", "time", "values")

    def __init__(
        self,
        points: list[Any] | None,
        attributes: tuple[Any, ...],
        values: tuple[Any, ...],
        make: Callable[[slice], list[Any]] | None = None,
        starts: tuple[int | None, ...] | None = None,
        time: int | None = None,
    ) -> None:
        self._points = points
        self._make = make  # makes the points of a slice of the series while ``points`` is None
        self.attributes = attributes
        self.values = values
        self.starts = starts  # each point's start time, when every point has this list's one ``time``
        self.time = time

    @classmethod
    def made_later(
        cls,
        make: Callable[[slice], list[Any]],
        attributes: tuple[Any, ...],
        values: tuple[Any, ...],
        starts: tuple[int | None, ...] | None = None,
        time: int | None = None,
    ) -> PointList:
        """Points that ``make`` makes when read, one per attribute mapping (``make(part)``: those of the
        series in the slice ``part``), with ``starts`` and ``time`` when known."""
        return cls(None, attributes, values, make, starts, time)

    def _made(self) -> list[Any]:
        points = self._points
        if points is None:
            assert self._make is not None
            # two readers at once make equal lists; either may stay
            points = self._points = self._make(_ALL)
            self._make = None
        return points

    def __len__(self) -> int:
        return len(self.attributes)

    def __getitem__(self, index: Any) -> Any:
        make = self._make
        if self._points is None and make is not None and isinstance(index, slice):
            return make(index)  # a part is made for its reader and not kept
        return self._made()[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._made())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PointList):
            return self._made() == other._made()
        if isinstance(other, list):
            return self._made() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a list's equality: not hashable

    def __repr__(self) -> str:
        return repr(self._made())
