"""One series' attributes as one immutable, hashable mapping: a tuple of its sorted keys, then its values.

The agent keeps one attribute mapping per series for the series' life, shared by its instruments, the
OpenTelemetry SDK's aggregation and the exporters. A dict of six to eight attributes takes 272 bytes, and the
SDK needs a hashable key for it besides (another ~100). This tuple is both, in ~100 bytes: equal attribute
sets are equal tuples (the keys come sorted, and one keys tuple is shared by every series with those keys),
so the SDK's attribute-set key can be the mapping itself (otel_numa.sdk_private). Only flat attributes, string
keys with string or integer values (the agent's), take this form.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Any

from opentelemetry.util.types import Attributes, AttributeValue

FLAT_VALUE_TYPES = frozenset({str, int})  # exactly these: bool and float compare equal to ints
_MAX_LAYOUTS = 4096  # key layouts remembered; the agent's instruments have a few dozen


class SeriesAttributes(tuple[Any, ...], Mapping[str, AttributeValue]):
    """An immutable mapping of string keys to string or integer values, stored as ``(sorted keys, *values)``.

    Hash and equality are the tuple's: equal for equal attribute sets, whatever order they were built in.
    Compared with another mapping, it is equal when the items are."""

    __slots__ = ()

    def __getitem__(self, key: Any) -> Any:
        keys = tuple.__getitem__(self, 0)
        for place, known in enumerate(keys, 1):
            if known == key:
                return tuple.__getitem__(self, place)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple.__getitem__(self, 0))

    def __len__(self) -> int:
        return tuple.__len__(self) - 1

    def __contains__(self, key: object) -> bool:
        return key in tuple.__getitem__(self, 0)

    def keys(self) -> KeysView[str]:
        return KeysView(self)

    def values(self) -> ValuesView[AttributeValue]:
        return _Values(self)

    def items(self) -> ItemsView[str, AttributeValue]:
        return _Items(self)

    def pairs(self) -> Iterator[tuple[str, AttributeValue]]:
        """The items, without a lookup per key."""
        return zip(tuple.__getitem__(self, 0), tuple.__getitem__(self, slice(1, None)), strict=True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SeriesAttributes):
            return tuple.__eq__(self, other)
        if isinstance(other, Mapping):
            return len(other) == len(self) and all(
                key in other and other[key] == value for key, value in self.pairs()
            )
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = tuple.__hash__

    def __repr__(self) -> str:
        return repr(dict(self.pairs()))


class _Items(ItemsView[str, AttributeValue]):
    _mapping: SeriesAttributes

    def __iter__(self) -> Iterator[tuple[str, AttributeValue]]:
        return self._mapping.pairs()


class _Values(ValuesView[AttributeValue]):
    _mapping: SeriesAttributes

    def __iter__(self) -> Iterator[AttributeValue]:
        return iter(tuple.__getitem__(self._mapping, slice(1, None)))


_Layout = tuple[tuple[str, ...], Callable[[Mapping[str, Any]], Any]]
_layouts: dict[tuple[str, ...], _Layout] = {}


def series_attributes(attributes: Mapping[str, AttributeValue]) -> Mapping[str, AttributeValue]:
    """``attributes`` as :class:`SeriesAttributes`, or as they are when they are not flat (or empty)."""
    if type(attributes) is SeriesAttributes or not attributes:
        return attributes
    layout = _layout(tuple(attributes))
    if layout is None:
        return attributes
    sorted_keys, values_of = layout
    values = values_of(attributes)
    if not FLAT_VALUE_TYPES.issuperset(map(type, values)):
        return attributes
    return tuple.__new__(SeriesAttributes, (sorted_keys, *values))


def same_attributes(stable: Attributes, attributes: Attributes) -> bool:
    """Whether ``attributes`` (as an instrument made them) are the set ``stable`` holds."""
    if type(stable) is SeriesAttributes and attributes:
        candidate = series_attributes(attributes)
        if type(candidate) is SeriesAttributes:
            return bool(tuple.__eq__(candidate, stable))
    return stable == attributes


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
