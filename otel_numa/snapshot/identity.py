"""Unchanged values, identical objects: what the instruments rely on to skip work.

An instrument's callback depends on one part of the snapshot (the machine's memory, the allocation, the
containers' usage, ...) and hands the SDK its last observations again while that part is *the same object*
(:class:`otel_numa.instruments.base.Instruments`): one identity check instead of rebuilding every
observation. The snapshot builder keeps that promise in one place, whatever a collector hands back: a part
equal to the last snapshot's is replaced by the last snapshot's object (:func:`kept_parts`). A collector
that already returns the same object costs one identity check; one that returns an equal new object costs
one comparison (and that same object again, one identity check), never the instruments' work.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import fields, replace
from typing import Any, TypeVar

T = TypeVar("T")

# A collector that memoizes its result hands back the same new object build after build, which the last
# snapshot replaced by its equal older one: each old object's last equal new one is remembered (both held,
# so their ids stay theirs; forgotten once a different object comes to replace the old one), so that the
# same pair again costs an identity check, not a comparison of every container.
_REMEMBERED_PAIRS = 8
_equal_pairs: OrderedDict[int, tuple[object, object]] = OrderedDict()  # id(old) -> (new, old)
_pairs_lock = threading.Lock()


def kept(new: T, old: T | None) -> T:
    """``old`` when it equals ``new``, else ``new``."""
    if old is None or new is old:
        return new
    with _pairs_lock:
        pair = _equal_pairs.get(id(old))
        if pair is not None and pair[0] is new and pair[1] is old:
            _equal_pairs.move_to_end(id(old))
            return old
    equal = new == old
    with _pairs_lock:
        if not equal:
            remembered = _equal_pairs.get(id(old))
            if remembered is not None and remembered[1] is old:
                del _equal_pairs[id(old)]
            return new
        _equal_pairs[id(old)] = (new, old)
        _equal_pairs.move_to_end(id(old))
        while len(_equal_pairs) > _REMEMBERED_PAIRS:
            _equal_pairs.popitem(last=False)
    return old


def kept_parts(new: T, old: T | None) -> T:
    """The dataclass ``new`` with every field that equals ``old``'s being ``old``'s object; ``old`` itself
    when every field is then ``old``'s."""
    if old is None or new is old:
        return new
    changes: dict[str, Any] = {}
    same = True
    for field in fields(new):  # type: ignore[arg-type]
        value, previous = getattr(new, field.name), getattr(old, field.name)
        if value is previous:
            continue
        if value == previous:
            changes[field.name] = previous
        else:
            same = False
    if same:
        return old
    return replace(new, **changes) if changes else new  # type: ignore[type-var]
