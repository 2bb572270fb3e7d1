"""Properties of the pure box math (ckptstore.boxes): runs, intersections, tiling."""
from __future__ import annotations

import itertools
from math import prod

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ckptstore.boxes import Box, c_order_runs, even_part, tiles_exactly

SHAPES = st.lists(st.integers(min_value=0, max_value=6), min_size=0, max_size=4).map(tuple)
NONEMPTY_SHAPES = st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=4).map(tuple)


@st.composite
def box_in(draw, shape: tuple[int, ...]) -> Box:
    start, stop = [], []
    for n in shape:
        lo = draw(st.integers(min_value=0, max_value=n))
        hi = draw(st.integers(min_value=lo, max_value=n))
        start.append(lo)
        stop.append(hi)
    return Box(tuple(start), tuple(stop))


@st.composite
def shape_and_box(draw, shapes=SHAPES) -> tuple[tuple[int, ...], Box]:
    shape = draw(shapes)
    return shape, draw(box_in(shape))


@st.composite
def grid(draw) -> tuple[tuple[int, ...], list[Box], tuple[int, ...]]:
    """An even grid split: a shape, its boxes, and the parts per axis."""
    ndim = draw(st.integers(min_value=1, max_value=3))
    parts = tuple(draw(st.integers(min_value=1, max_value=4)) for _ in range(ndim))
    shape = tuple(k * draw(st.integers(min_value=1, max_value=3)) for k in parts)
    boxes = []
    for index in itertools.product(*(range(k) for k in parts)):
        lo_hi = [even_part(0, n, k, i) for n, k, i in zip(shape, parts, index)]
        boxes.append(Box(tuple(lo for lo, _ in lo_hi), tuple(hi for _, hi in lo_hi)))
    return shape, boxes, parts


def _mask(box: Box, shape: tuple[int, ...]) -> np.ndarray:
    m = np.zeros(shape, dtype=bool)
    m[box.slices()] = True
    return m


@settings(max_examples=300)
@given(shape_and_box())
def test_c_order_runs_concatenate_to_the_box_in_c_order(case):
    shape, box = case
    a = np.arange(prod(shape), dtype=np.int64).reshape(shape)
    starts, run = c_order_runs(box, shape)
    flat = a.ravel()
    got = np.concatenate([flat[s:s + run] for s in starts]) if len(starts) else np.zeros(0, np.int64)
    assert np.array_equal(got, a[box.slices()].ravel())
    assert starts.dtype == np.int64
    assert len(starts) * run == box.size


@settings(max_examples=300)
@given(shape_and_box())
def test_c_order_runs_are_maximal_and_ascending(case):
    shape, box = case
    starts, run = c_order_runs(box, shape)
    ends = starts + run
    # a gap between every two consecutive runs: no two runs touch or overlap
    assert np.all(ends[:-1] < starts[1:])
    if box.size:
        assert run >= 1


@pytest.mark.parametrize(
    "shape,box,starts,run",
    [
        ((4, 6), Box((0, 0), (4, 6)), [0], 24),
        ((4, 6), Box((1, 0), (3, 6)), [6], 12),
        ((4, 6), Box((1, 2), (3, 5)), [8, 14], 3),
        ((2, 3, 4), Box((0, 1, 0), (2, 3, 4)), [4, 16], 8),
        ((), Box((), ()), [0], 1),
        ((3, 0), Box((0, 0), (3, 0)), [], 0),
    ],
    ids=["whole", "row-range", "inner-box", "trailing-whole-axes", "scalar", "empty"],
)
def test_c_order_runs_examples(shape, box, starts, run):
    got_starts, got_run = c_order_runs(box, shape)
    assert (got_starts.tolist(), got_run) == (starts, run)


@pytest.mark.parametrize(
    "shape,box",
    [((4, 6), Box((0, 0), (5, 6))), ((4, 6), Box((0,), (4,))), ((4,), Box((0, 0), (4, 1)))],
    ids=["past-the-end", "fewer-axes", "more-axes"],
)
def test_c_order_runs_rejects_a_box_outside_the_shape(shape, box):
    with pytest.raises(ValueError, match="is not inside shape"):
        c_order_runs(box, shape)


@st.composite
def two_boxes(draw):
    shape = draw(NONEMPTY_SHAPES)
    return shape, draw(box_in(shape)), draw(box_in(shape))


@settings(max_examples=300)
@given(two_boxes())
def test_intersect_is_commutative(case):
    _, a, b = case
    assert a.intersect(b) == b.intersect(a)


@settings(max_examples=300)
@given(two_boxes())
def test_intersect_is_contained_in_both_and_is_exactly_the_common_elements(case):
    shape, a, b = case
    overlap = a.intersect(b)
    common = _mask(a, shape) & _mask(b, shape)
    if overlap is None:
        assert not common.any()
    else:
        assert a.contains(overlap) and b.contains(overlap)
        assert np.array_equal(_mask(overlap, shape), common)
        assert overlap.size > 0


@settings(max_examples=200)
@given(grid())
def test_even_grid_split_tiles_exactly(case):
    shape, boxes, _ = case
    assert tiles_exactly(boxes, shape)


@settings(max_examples=200)
@given(grid(), st.data())
def test_replicated_boxes_still_tile(case, data):
    shape, boxes, _ = case
    dup = data.draw(st.sampled_from(boxes))
    assert tiles_exactly(boxes + [dup, dup], shape)


@settings(max_examples=200)
@given(grid(), st.data())
def test_grid_with_a_box_dropped_does_not_tile(case, data):
    shape, boxes, _ = case
    drop = data.draw(st.integers(min_value=0, max_value=len(boxes) - 1))
    assert not tiles_exactly(boxes[:drop] + boxes[drop + 1:], shape)


@settings(max_examples=200)
@given(grid(), st.data())
def test_grid_plus_an_overlapping_box_does_not_tile(case, data):
    shape, boxes, parts = case
    axes = [a for a, k in enumerate(parts) if k >= 2]
    assume(axes)
    axis = data.draw(st.sampled_from(axes))
    first = next(b for b in boxes if b.start[axis] == 0)
    # the same box grown by one index along `axis`: it overlaps its neighbour and is a new box
    grown = Box(first.start, tuple(hi + (a == axis) for a, hi in enumerate(first.stop)))
    assert grown not in boxes
    assert not tiles_exactly(boxes + [grown], shape)
    assert not tiles_exactly([grown if b == first else b for b in boxes], shape)


def test_a_box_sticking_out_of_the_shape_does_not_tile():
    assert not tiles_exactly([Box((0,), (4,)), Box((4,), (9,))], (8,))


@pytest.mark.parametrize(
    "lo,hi,parts,index,expected",
    [(0, 8, 4, 0, (0, 2)), (0, 8, 4, 3, (6, 8)), (16, 32, 2, 1, (24, 32)), (0, 5, 1, 0, (0, 5))],
    ids=["first", "last", "offset-range", "one-part"],
)
def test_even_part(lo, hi, parts, index, expected):
    assert even_part(lo, hi, parts, index) == expected


@pytest.mark.parametrize("lo,hi,parts", [(0, 7, 2), (0, 8, 0), (0, 8, -2)], ids=["uneven", "zero", "negative"])
def test_even_part_refuses_uneven_splits(lo, hi, parts):
    with pytest.raises(ValueError, match="cannot split extent"):
        even_part(lo, hi, parts, 0)


@pytest.mark.parametrize(
    "start,stop", [((0, 1), (2,)), ((-1,), (2,)), ((3,), (2,))], ids=["rank-mismatch", "negative", "reversed"]
)
def test_box_refuses_invalid_bounds(start, stop):
    with pytest.raises(ValueError):
        Box(start, stop)


@settings(max_examples=200)
@given(shape_and_box(NONEMPTY_SHAPES), st.data())
def test_relative_to_expresses_a_sub_box_in_the_outer_box_frame(case, data):
    shape, outer = case
    inner_local = data.draw(box_in(outer.shape))
    inner = Box(tuple(o + s for o, s in zip(outer.start, inner_local.start)),
                tuple(o + s for o, s in zip(outer.start, inner_local.stop)))
    a = np.arange(prod(shape)).reshape(shape)
    assert inner.relative_to(outer) == inner_local
    assert np.array_equal(a[outer.slices()][inner_local.slices()], a[inner.slices()])
