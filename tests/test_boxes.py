"""Properties of the pure box math (ckptstore.boxes): byte runs between containers, intersections,
tiling (the last through the tests' independent ``tiles_exactly``)."""
from __future__ import annotations

import itertools
from math import prod

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from box_checks import tiles_exactly
from ckptstore.boxes import Box, byte_pieces, even_part, paired_runs
from conftest import examples

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
        lo_hi = [even_part(0, n, k, i) for n, k, i in zip(shape, parts, index, strict=True)]
        boxes.append(Box(tuple(lo for lo, _ in lo_hi), tuple(hi for _, hi in lo_hi)))
    return shape, boxes, parts


def _mask(box: Box, shape: tuple[int, ...]) -> np.ndarray:
    m = np.zeros(shape, dtype=bool)
    m[box.slices()] = True
    return m


@st.composite
def box_in_two_containers(draw) -> tuple[Box, Box, Box]:
    """A box and two containers (C-order blocks of a bigger tensor) that both hold it."""
    ndim = draw(st.integers(min_value=0, max_value=4))
    box_start, box_stop, src_start, src_stop, dst_start, dst_stop = [], [], [], [], [], []
    for _ in range(ndim):
        lo = draw(st.integers(min_value=0, max_value=5))
        hi = draw(st.integers(min_value=lo, max_value=lo + 5))
        box_start.append(lo), box_stop.append(hi)
        for start, stop in ((src_start, src_stop), (dst_start, dst_stop)):
            start.append(draw(st.integers(min_value=0, max_value=lo)))
            stop.append(draw(st.integers(min_value=hi, max_value=hi + 4)))
    return (Box(tuple(box_start), tuple(box_stop)), Box(tuple(src_start), tuple(src_stop)),
            Box(tuple(dst_start), tuple(dst_stop)))


@settings(max_examples=examples(400))
@given(box_in_two_containers())
def test_paired_runs_copy_exactly_the_box_between_containers(case):
    box, src, dst = case
    source = np.arange(src.size, dtype=np.int64).reshape(src.shape)
    target = np.full(dst.shape, -1, dtype=np.int64)
    starts, dests, run = paired_runs(box, src, dst)
    assert len(starts) == len(dests) and len(starts) * run == box.size
    for s, d in zip(starts.tolist(), dests.tolist(), strict=True):
        target.reshape(-1)[d:d + run] = source.reshape(-1)[s:s + run]
    expected = np.full(dst.shape, -1, dtype=np.int64)
    expected[box.relative_to(dst).slices()] = source[box.relative_to(src).slices()]
    assert np.array_equal(target, expected)


@settings(max_examples=examples(300))
@given(box_in_two_containers())
def test_paired_runs_are_maximal_and_ascending(case):
    box, src, dst = case
    starts, dests, run = paired_runs(box, src, dst)
    assert np.all(np.diff(starts) > 0) and np.all(np.diff(dests) > 0)
    # two neighbours that are contiguous on both sides would have been one run
    assert not np.any((starts[:-1] + run == starts[1:]) & (dests[:-1] + run == dests[1:]))


@pytest.mark.parametrize("box, src, dst, starts, dests, run", [
    (Box((0, 0), (4, 8)), Box((0, 0), (4, 8)), Box((0, 0), (4, 8)), [0], [0], 32),
    (Box((1, 0), (3, 8)), Box((0, 0), (4, 8)), Box((1, 0), (3, 8)), [8], [0], 16),
    (Box((0, 2), (2, 5)), Box((0, 0), (2, 8)), Box((0, 2), (2, 5)), [2, 10], [0, 3], 3),
    (Box((0, 2), (2, 5)), Box((0, 2), (2, 5)), Box((0, 0), (2, 8)), [0, 3], [2, 10], 3),
    (Box((), ()), Box((), ()), Box((), ()), [0], [0], 1),
    (Box((2,), (2,)), Box((0,), (4,)), Box((0,), (4,)), [], [], 0),
], ids=["whole", "rows", "columns-from-wide", "columns-into-wide", "scalar", "empty"])
def test_paired_runs_examples(box, src, dst, starts, dests, run):
    got_starts, got_dests, got_run = paired_runs(box, src, dst)
    assert (got_starts.tolist(), got_dests.tolist(), got_run) == (starts, dests, run)


def test_paired_runs_refuse_a_box_outside_a_container():
    with pytest.raises(ValueError, match="is not inside both containers"):
        paired_runs(Box((0,), (5,)), Box((0,), (4,)), Box((0,), (8,)))


@settings(max_examples=examples(300))
@given(shape_and_box(), st.sampled_from([1, 2, 4, 8]), st.integers(min_value=0, max_value=100))
def test_byte_pieces_concatenate_to_the_box_in_c_order(case, itemsize, base):
    shape, box = case
    data = np.arange(prod(shape) * itemsize, dtype=np.int64).astype(np.uint8) if shape else np.arange(itemsize,
                                                                                                    dtype=np.uint8)
    blob = bytes(base) + data.tobytes()
    pieces = byte_pieces(box, Box.full(shape), itemsize, base)
    got = b"".join(blob[o:o + n] for o, n in pieces)
    typed = np.frombuffer(data.tobytes(), dtype=f"V{itemsize}").reshape(shape)
    assert got == typed[box.slices()].tobytes()


@st.composite
def two_boxes(draw):
    shape = draw(NONEMPTY_SHAPES)
    return shape, draw(box_in(shape)), draw(box_in(shape))


@settings(max_examples=examples(300))
@given(two_boxes())
def test_intersect_is_commutative(case):
    _, a, b = case
    assert a.intersect(b) == b.intersect(a)


@settings(max_examples=examples(300))
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


@settings(max_examples=examples(200))
@given(grid())
def test_even_grid_split_tiles_exactly(case):
    shape, boxes, _ = case
    assert tiles_exactly(boxes, shape)


@settings(max_examples=examples(200))
@given(grid(), st.data())
def test_replicated_boxes_still_tile(case, data):
    shape, boxes, _ = case
    dup = data.draw(st.sampled_from(boxes))
    assert tiles_exactly(boxes + [dup, dup], shape)


@settings(max_examples=examples(200))
@given(grid(), st.data())
def test_grid_with_a_box_dropped_does_not_tile(case, data):
    shape, boxes, _ = case
    drop = data.draw(st.integers(min_value=0, max_value=len(boxes) - 1))
    assert not tiles_exactly(boxes[:drop] + boxes[drop + 1:], shape)


@settings(max_examples=examples(200))
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


@settings(max_examples=examples(200))
@given(shape_and_box(NONEMPTY_SHAPES), st.data())
def test_relative_to_expresses_a_sub_box_in_the_outer_box_frame(case, data):
    shape, outer = case
    inner_local = data.draw(box_in(outer.shape))
    inner = Box(tuple(o + s for o, s in zip(outer.start, inner_local.start, strict=True)),
                tuple(o + s for o, s in zip(outer.start, inner_local.stop, strict=True)))
    a = np.arange(prod(shape)).reshape(shape)
    assert inner.relative_to(outer) == inner_local
    assert np.array_equal(a[outer.slices()][inner_local.slices()], a[inner.slices()])
