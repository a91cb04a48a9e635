"""``kept``: the last snapshot's object stands for an equal new one, and the same new object handed back
again (a memoized collector's) is known equal without comparing it again."""

from __future__ import annotations

from dataclasses import dataclass, field

from otel_numa.snapshot.identity import kept, kept_parts


class Compared(tuple[int, ...]):
    """A tuple that counts how often it is compared."""

    comparisons = 0

    def __eq__(self, other: object) -> bool:
        Compared.comparisons += 1
        return tuple.__eq__(self, other)

    __hash__ = tuple.__hash__


def test_an_equal_object_is_compared_once_then_known() -> None:
    old, new = Compared((1, 2)), Compared((1, 2))
    Compared.comparisons = 0
    assert kept(new, old) is old
    assert kept(new, old) is old
    assert kept(new, old) is old
    assert Compared.comparisons == 1
    other = Compared((1, 2))  # another equal object: compared
    assert kept(other, old) is old
    assert Compared.comparisons == 2


def test_a_different_object_replaces_the_old_one_and_its_pair_is_forgotten() -> None:
    old, equal, changed = Compared((1,)), Compared((1,)), Compared((2,))
    assert kept(equal, old) is old
    assert kept(changed, old) is changed
    Compared.comparisons = 0
    assert kept(equal, old) is old  # compared again: the remembered pair went with the change
    assert Compared.comparisons == 1


@dataclass(frozen=True)
class Parts:
    a: tuple[int, ...]
    b: dict[str, int] = field(default_factory=dict)


def test_parts_that_are_all_the_old_ones_give_the_old_object() -> None:
    old = Parts((1,), {"x": 1})
    assert kept_parts(Parts(old.a, old.b), old) is old
    assert kept_parts(Parts((1,), {"x": 1}), old) is old  # equal parts: the old ones, so the old object
    changed = kept_parts(Parts((1,), {"x": 2}), old)
    assert changed is not old and changed.a is old.a and changed.b == {"x": 2}
