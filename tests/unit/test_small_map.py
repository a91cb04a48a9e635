"""SmallMap: the one-tuple mapping the agent keeps per container (node -> bytes, type -> nodes)."""

from __future__ import annotations

import sys

import pytest

from otel_numa.model import SmallMap, small_map


def test_a_small_map_is_the_mapping_it_was_made_from() -> None:
    made = small_map({1: 4096, 0: 0})
    assert isinstance(made, SmallMap)
    assert made == {0: 0, 1: 4096} and {0: 0, 1: 4096} == made  # noqa: SIM300  (both sides compare)
    assert made != {0: 0} and made != {0: 1, 1: 4096} and made != {0: 0, 2: 4096}
    assert made[1] == 4096 and made.get(2) is None and 0 in made and 2 not in made
    with pytest.raises(KeyError):
        made[2]
    assert list(made) == [1, 0] and list(made.keys()) == [1, 0]  # the order it was made in
    assert list(made.values()) == [4096, 0] and 0 in made.values()
    assert list(made.items()) == [(1, 4096), (0, 0)] and dict(made) == {0: 0, 1: 4096}
    assert len(made) == 2 and repr(made) == "{1: 4096, 0: 0}"
    empty: SmallMap[int, int] = small_map({})
    assert len(empty) == 0 and not empty and empty == {}


def test_maps_with_the_same_keys_share_one_keys_tuple_and_take_a_fraction_of_a_dict() -> None:
    a, b = small_map({0: 1 << 40, 1: 2 << 40}), small_map({0: 3 << 40, 1: 4 << 40})
    assert tuple.__getitem__(a, 0) is tuple.__getitem__(b, 0)
    assert a != b and a == small_map({0: 1 << 40, 1: 2 << 40}) and hash(a) == hash(small_map(dict(a)))
    assert small_map(a) is a
    assert sys.getsizeof(a) * 3 <= sys.getsizeof({0: 1 << 40, 1: 2 << 40})
    nested = small_map({"anon": a, "file": b})
    assert nested == {"anon": {0: 1 << 40, 1: 2 << 40}, "file": {0: 3 << 40, 1: 4 << 40}}


def test_interned_values_are_one_object_each_and_forgotten_together_past_the_limit() -> None:
    from otel_numa.model import Interned, shared_set

    interned: Interned[frozenset[int]] = Interned(limit=2)
    first = interned(frozenset({0, 1}))
    assert interned(frozenset({1, 0})) is first
    assert interned(frozenset({2})) is not first
    again = frozenset({0, 1})
    assert interned(frozenset({3})) is not first  # the third distinct value: the first two are forgotten
    assert interned(again) is again and interned(frozenset({0, 1})) is again
    assert shared_set([1, 0]) is shared_set((0, 1)) and shared_set([]) is shared_set(set())


def test_a_small_map_equals_mappings_only_so_equality_stays_transitive() -> None:
    made = small_map({0: 1, 1: 2})
    stored_as = tuple(tuple.__iter__(made))  # the plain tuple it is kept as: (keys, *values)
    assert made == {0: 1, 1: 2} and made == small_map({0: 1, 1: 2})
    assert made != stored_as and stored_as != made
    assert small_map({}) != ((),) and small_map({}) == {}
