"""Properties of the converter's chunk plan (ckptstore.write.chunk_plan): pure, no MindSpore.

A parameter is split evenly into source slices (as MindSpore's layouts split it); the plan cuts
each slice into chunks of at most ``max_chunk_bytes`` that are contiguous byte ranges of the
slice, so converting is a plain byte copy. The parameter selection (``--drop-optimizer``) is here too.
"""
from __future__ import annotations

import itertools
from math import prod

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from box_checks import tiles_exactly
from ckptstore.boxes import Box, even_part
from ckptstore.checkpoint.params import SourceParam, SourceSlice
from ckptstore.checkpoint.selection import select_params
from ckptstore.formats.ckpt_reader import CkptEntry
from ckptstore.write.chunk_plan import chunk_shape_for, plan_chunks
from conftest import examples

SHAPES = st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=4).map(tuple)


@settings(max_examples=examples(400))
@given(SHAPES, st.sampled_from([1, 2, 4, 8]), st.integers(min_value=1, max_value=4096))
def test_chunk_shape_for_is_a_contiguous_block_of_the_slice_within_the_bound(shape, itemsize, max_bytes):
    chunk = chunk_shape_for(shape, itemsize, max_bytes)
    assert len(chunk) == len(shape) and all(n % c == 0 for n, c in zip(shape, chunk, strict=True))
    # [1, ..., 1, c, full, ..., full]: one contiguous byte range of the slice
    k = next((a for a, c in enumerate(chunk) if c != 1), len(chunk))
    assert all(c == 1 for c in chunk[:k]) and tuple(chunk[k + 1:]) == tuple(shape[k + 1:])
    if chunk != (1,) * len(shape):
        assert prod(chunk) * itemsize <= max_bytes or chunk == tuple(shape)
    if prod(shape) * itemsize <= max_bytes:
        assert chunk == tuple(shape)


@settings(max_examples=examples(300))
@given(SHAPES, st.sampled_from([1, 2, 4, 8]), st.integers(min_value=1, max_value=2048))
def test_chunk_shape_for_is_as_large_as_the_bound_allows_on_its_cut_axis(shape, itemsize, max_bytes):
    chunk = chunk_shape_for(shape, itemsize, max_bytes)
    k = next((a for a, c in enumerate(chunk) if c != 1), None)
    if k is None or chunk == tuple(shape):
        return
    inner = prod(shape[k + 1:]) * itemsize
    bigger = [d for d in range(chunk[k] + 1, shape[k] + 1) if shape[k] % d == 0]
    assert all(d * inner > max_bytes for d in bigger)


@st.composite
def split_param(draw):
    """A global shape split evenly into a grid of slices, with the global values."""
    ndim = draw(st.integers(min_value=1, max_value=3))
    parts = tuple(draw(st.integers(min_value=1, max_value=3)) for _ in range(ndim))
    shape = tuple(k * draw(st.integers(min_value=1, max_value=4)) for k in parts)
    dtype = np.dtype(draw(st.sampled_from(["int8", "float16", "float32", "float64"])))
    max_bytes = draw(st.integers(min_value=1, max_value=256))
    return shape, parts, dtype, max_bytes


def _source_param(shape, parts, dtype) -> SourceParam:
    slices = []
    for rank, index in enumerate(itertools.product(*(range(k) for k in parts))):
        bounds = [even_part(0, n, k, i) for n, k, i in zip(shape, parts, index, strict=True)]
        box = Box(tuple(lo for lo, _ in bounds), tuple(hi for _, hi in bounds))
        entry = CkptEntry("w", "Float32", box.shape, ((0, box.size * dtype.itemsize),), 0)
        slices.append(SourceSlice(box, (rank,), (entry,), (f"rank_{rank}",)))
    return SourceParam("w", "Float32", dtype, shape, tuple(slices), True)


@settings(max_examples=examples(300))
@given(split_param())
def test_chunks_tile_the_tensor_and_each_is_one_byte_range_of_its_slice(case):
    shape, parts, dtype, max_bytes = case
    values = np.arange(prod(shape), dtype=np.int64).astype(dtype).reshape(shape)
    plan = plan_chunks(_source_param(shape, parts, dtype), max_chunk_bytes=max_bytes)
    assert tiles_exactly([c.box for c in plan.chunks], shape)
    grid = tuple(n // c for n, c in zip(shape, plan.chunk_shape, strict=True))
    assert len(plan.chunks) == prod(grid)
    for c in plan.chunks:
        coords = np.unravel_index(c.index, grid)
        # C order over the grid
        assert c.box.start == tuple(int(i) * k for i, k in zip(coords, plan.chunk_shape, strict=True))
        assert c.slice.box.contains(c.box)
        slice_bytes = values[c.slice.box.slices()].tobytes()
        assert slice_bytes[c.byte_start:c.byte_start + c.nbytes] == values[c.box.slices()].tobytes()
    assert plan.nbytes == values.nbytes


def test_drop_optimizer_drops_state_and_counters_and_keeps_weights():
    # (the names MindSpore's own optimizers give their state are checked in test_convert.py)
    names = ["layer0.w", "adam_m.layer0.w", "adam_v.layer0.w", "moments.fc.weight", "accum.fc.weight", "global_step",
             "learning_rate", "beta1_power", "beta2_power", "scale_sense", "fc.weight", "adam_mode.flag"]
    assert select_params(names, drop_optimizer=True) == ["layer0.w", "fc.weight", "adam_mode.flag"]


def test_drop_optimizer_keeps_a_parameter_named_like_a_state_prefix_alone():
    # MindSpore's and MindFormers' Adam name their moments adam_m.P / adam_v.P, never a bare
    # adam_m: one of that name is the network's own, not a counter
    names = ["adam_m", "adam_v", "w", "adam_m.w", "adam_v.w"]
    assert select_params(names, drop_optimizer=True) == ["adam_m", "adam_v", "w"]


def test_drop_optimizer_keeps_state_named_parameters_of_no_other_parameter():
    # 'linear.weight' would be FTRL's state of a parameter 'weight': there is none, so it is a weight
    names = ["linear.weight", "accum.bias", "mu_x", "linear.linear.weight"]
    assert select_params(names, drop_optimizer=True) == ["linear.weight", "accum.bias", "mu_x"]
