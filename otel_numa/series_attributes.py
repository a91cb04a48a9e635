"""One series' attributes as one immutable, hashable mapping: a tuple of its sorted keys, then its values.

The agent keeps one attribute mapping per series for the series' life, shared by its instruments, the
OpenTelemetry SDK's aggregation and the exporters. A dict of six to eight attributes takes 272 bytes, and the
SDK needs a hashable key for it besides (another ~100). This tuple is both, in ~100 bytes: equal attribute
sets are equal tuples (the keys come sorted, and one keys tuple is shared by every series with those keys),
and comparing two series is one comparison. Only flat attributes, string
keys with string or integer values (the agent's), take this form.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.util.types import Attributes, AttributeValue

from otel_numa.model import SmallMap

FLAT_VALUE_TYPES = frozenset({str, int})  # exactly these: bool and float compare equal to ints
_MAX_LAYOUTS = 4096  # key layouts remembered; the agent's instruments have a few dozen
_VALUES = slice(1, None)  # a SeriesAttributes' values, after its keys


class SeriesAttributes(SmallMap[str, AttributeValue]):
    """An immutable mapping of string keys to string or integer values, stored as ``(sorted keys, *values)``.

    Hash and equality are the tuple's: equal for equal attribute sets, whatever order they were built in.
    Compared with another mapping, it is equal when the items are."""

    __slots__ = ()


# a series with no attributes (the agent's own gauges): one shared mapping, so it takes the same paths
EMPTY_ATTRIBUTES = tuple.__new__(SeriesAttributes, ((),))

_Layout = tuple[tuple[str, ...], Callable[[Mapping[str, Any]], Any]]
_layouts: dict[tuple[str, ...], _Layout] = {}


def series_attributes(attributes: Mapping[str, AttributeValue]) -> Mapping[str, AttributeValue]:
    """``attributes`` as :class:`SeriesAttributes`, or as they are when they are not flat (or empty)."""
    if type(attributes) is SeriesAttributes or not attributes:
        return attributes
    flat = _sorted_flat(attributes)
    if flat is None:
        return attributes
    sorted_keys, values = flat
    return tuple.__new__(SeriesAttributes, (sorted_keys, *values))


def series_maker(
    base: Mapping[str, AttributeValue], keys: tuple[str, ...]
) -> Callable[..., Mapping[str, AttributeValue]]:
    """What makes the attributes of the series one object gives an instrument: its own attributes
    (``base``, a container's) and a value for each of ``keys`` (a NUMA id, a memory type), given in that
    order. Each series comes out as :class:`SeriesAttributes` made from tuples, with no dict per series to
    build and sort again: a node of 1,000 containers observes ~13,000 such series a round. The values
    given for ``keys`` must be strings or integers (never bools); attributes that are not flat, or a key
    given twice, come out as a dict."""
    names = (*base, *keys)
    values = tuple(base.values())
    order = _order(names)
    flat = FLAT_VALUE_TYPES.issuperset(map(type, values))
    if order is None or not flat or any(key in base for key in keys):
        return lambda *extra: {**base, **dict(zip(keys, extra, strict=True))}
    sorted_keys, pick = order
    return lambda *extra: tuple.__new__(SeriesAttributes, (sorted_keys, *pick(values + extra)))


_Order = tuple[tuple[str, ...], Callable[[tuple[Any, ...]], tuple[Any, ...]]]
_orders: dict[tuple[str, ...], _Order] = {}


def _order(names: tuple[str, ...]) -> _Order | None:
    """The sorted keys of ``names`` (the object their layout shares) and what picks the values given in
    ``names``' order in sorted order."""
    order = _orders.get(names)
    if order is None:
        layout = _layout(names)
        if layout is None or len(_orders) >= _MAX_LAYOUTS:
            return None
        sorted_keys = layout[0]
        positions = [names.index(key) for key in sorted_keys]
        getter = operator.itemgetter(*positions)
        pick = getter if len(positions) > 1 else (lambda values: (getter(values),))
        order = _orders[names] = (sorted_keys, pick)
    return order


def same_attributes(stable: Attributes, attributes: Attributes) -> bool:
    """Whether ``attributes`` (as an instrument made them) are the set ``stable`` holds."""
    if type(attributes) is SeriesAttributes:  # made by a series_maker: one comparison of two tuples
        return tuple.__eq__(stable, attributes) if type(stable) is SeriesAttributes else stable == attributes
    if type(stable) is SeriesAttributes and attributes:
        flat = _sorted_flat(attributes)
        if flat is not None:
            # what series_attributes(attributes) == stable says, without making that tuple
            sorted_keys, values = flat
            kept_keys, kept_values = tuple.__getitem__(stable, 0), tuple.__getitem__(stable, _VALUES)
            return bool(sorted_keys == kept_keys and values == kept_values)
    return stable == attributes


def _sorted_flat(attributes: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[Any, ...]] | None:
    """``attributes``' sorted keys and their values in that order, or None when they are not flat."""
    layout = _layout(tuple(attributes))
    if layout is None:
        return None
    sorted_keys, values_of = layout
    values = values_of(attributes)
    if not FLAT_VALUE_TYPES.issuperset(map(type, values)):
        return None
    return sorted_keys, values


def _layout(keys: tuple[str, ...]) -> _Layout | None:
    layout = _layouts.get(keys)
    if layout is None:
        if len(_layouts) >= _MAX_LAYOUTS or not all(type(key) is str for key in keys):
            return None
        sorted_keys = tuple(sorted(keys))
        getter = operator.itemgetter(*sorted_keys)
        values_of = getter if len(keys) > 1 else (lambda attributes: (getter(attributes),))
        layout = _layouts[keys] = (sorted_keys, values_of)
    return layout
