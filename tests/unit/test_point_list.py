"""PointList: an instrument's points made when read, equal to the list of them."""

from __future__ import annotations

from typing import Any

import pytest

from otel_numa.export.fast.point_list import PointList

ATTRIBUTES = tuple({"numa.node.id": node} for node in range(10))
VALUES = tuple(float(node * 3) for node in range(10))


def made_later() -> tuple[PointList, list[slice]]:
    parts: list[slice] = []

    def make(part: slice) -> list[Any]:
        parts.append(part)
        pairs = zip(ATTRIBUTES[part], VALUES[part], strict=True)
        return [(attributes["numa.node.id"], value) for attributes, value in pairs]

    return PointList.made_later(make, ATTRIBUTES, VALUES), parts


EVERY_POINT = [(node, float(node * 3)) for node in range(10)]


@pytest.mark.parametrize(
    "part", [slice(None, 4), slice(3, 7), slice(-3, None), slice(None, None, 2), slice(8, 20), slice(5, 2)]
)
def test_a_slice_read_before_the_points_are_made_makes_only_that_part(part: slice) -> None:
    points, parts = made_later()
    assert points[part] == EVERY_POINT[part]
    assert parts == [part]  # only the slice was made, and it was not kept
    assert points == EVERY_POINT
    assert parts == [part, slice(None)]


def test_points_read_whole_are_made_once_and_then_served_as_made() -> None:
    points, parts = made_later()
    assert len(points) == 10 and parts == []  # the length needs no point
    assert list(points) == EVERY_POINT
    assert points[-1] == EVERY_POINT[-1] and points[2:4] == EVERY_POINT[2:4]
    assert parts == [slice(None)]
    with pytest.raises(IndexError):
        points[10]


def test_points_handed_made_are_the_list() -> None:
    points = PointList(list(EVERY_POINT), ATTRIBUTES, VALUES)
    assert points == EVERY_POINT and points[1:3] == EVERY_POINT[1:3] and points != EVERY_POINT[:-1]
