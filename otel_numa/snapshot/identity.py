"""Unchanged values, identical objects: what the instruments rely on to skip work.

An instrument's callback depends on one part of the snapshot (the machine's memory, the allocation, the
containers' usage, ...) and hands the SDK its last observations again while that part is *the same object*
(:class:`otel_numa.instruments.base.Instruments`): one identity check instead of rebuilding every
observation. The snapshot builder keeps that promise in one place, whatever a collector hands back: a part
equal to the last snapshot's is replaced by the last snapshot's object (:func:`kept_parts`). A collector
that already returns the same object costs one identity check; one that returns an equal new object costs
one comparison, never the instruments' work.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, TypeVar

T = TypeVar("T")


def kept(new: T, old: T | None) -> T:
    """``old`` when it equals ``new``, else ``new``."""
    if old is None or new is old:
        return new
    return old if new == old else new


def kept_parts(new: T, old: T | None) -> T:
    """The dataclass ``new`` with every field that equals ``old``'s being ``old``'s object (``new`` itself
    when no field changed object)."""
    if old is None or new is old:
        return new
    changes: dict[str, Any] = {}
    for field in fields(new):  # type: ignore[arg-type]
        value, previous = getattr(new, field.name), getattr(old, field.name)
        if value is not previous and value == previous:
            changes[field.name] = previous
    return replace(new, **changes) if changes else new  # type: ignore[type-var]
