"""Which source bytes become which store chunk (pure; no I/O): the write side's chunk plan.

Every chunk of a parameter lies inside one distinct source slice (the grid is aligned to the
slices) and is a contiguous byte range of it, so each chunk is copied from exactly one rank
file: the first rank of the slice's replica group. Replicas are read once. (What a read of a
stored box fetches is the read plan, :func:`ckptstore.store.read_plan.plan_param`.)
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

from ckptstore.boxes import Box
from ckptstore.checkpoint.params import SourceParam, SourceSlice
from ckptstore.formats.ckpt_reader import CkptEntry


@dataclass(frozen=True)
class ChunkSource:
    """Chunk ``index`` of a parameter: its global box and the bytes that fill it."""

    index: int
    box: Box
    slice: SourceSlice
    byte_start: int  # within the source entry's logical bytes
    nbytes: int

    @property
    def rank(self) -> int:
        return self.slice.rank

    @property
    def entry(self) -> CkptEntry:
        return self.slice.entry

    @property
    def path(self) -> str:
        return self.slice.path


@dataclass(frozen=True)
class ParamPlan:
    """How one parameter is written: its chunk shape and each chunk's source."""

    param: SourceParam
    chunk_shape: tuple[int, ...]
    chunks: tuple[ChunkSource, ...]

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(s // c for s, c in zip(self.param.shape, self.chunk_shape, strict=True))

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)


def plan_chunks(param: SourceParam, *, max_chunk_bytes: int) -> ParamPlan:
    """Chunk a parameter along its source slices, cutting slices only to bound chunk size (the
    write side; what a read of a stored box fetches is :func:`ckptstore.store.read_plan.plan_param`)."""
    if param.is_str:
        return ParamPlan(param, (), ())
    itemsize = param.dtype.itemsize
    slice_shape = param.slices[0].box.shape
    chunk_shape = chunk_shape_for(slice_shape, itemsize, max_chunk_bytes)
    by_start = {s.box.start: s for s in param.slices}
    grid = tuple(s // c for s, c in zip(param.shape, chunk_shape, strict=True)) if param.shape else ()
    strides = _c_strides(slice_shape)
    nbytes = prod(chunk_shape) * itemsize
    chunks = []
    # Plain tuples and integer arithmetic: a 130B job has 174k chunks, and numpy's per-call
    # overhead (ndindex, ravel_multi_index) was most of this function's time.
    whole = chunk_shape == slice_shape  # usual: each slice is one chunk, its own box
    for index, coords in enumerate(itertools.product(*map(range, grid))):
        start = tuple(c * k for c, k in zip(coords, chunk_shape, strict=True))
        if whole:
            sl = by_start[start]
            chunks.append(ChunkSource(index, sl.box, sl, 0, nbytes))
            continue
        origin = tuple(s - s % k for s, k in zip(start, slice_shape, strict=True))
        sl = by_start[origin]
        # The chunk is [1,..,1,c,full..] inside the slice, so it starts at its first element.
        first = sum((s - o) * st for s, o, st in zip(start, origin, strides, strict=True))
        box = Box(start, tuple(s + k for s, k in zip(start, chunk_shape, strict=True)))
        chunks.append(ChunkSource(index, box, sl, first * itemsize, nbytes))
    return ParamPlan(param, chunk_shape, tuple(chunks))


def _c_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a C-order array of ``shape``."""
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def check_even_slices(param: SourceParam) -> str | None:
    """A reason the slices cannot form a regular chunk grid, or ``None`` when they do."""
    if param.is_str or not param.slices:
        return None
    shape = param.slices[0].box.shape
    # plain loops: a 128-rank job checks ~450k slices here
    for s in param.slices:
        if s.box.shape != shape:
            return "its slices have different shapes"
        for lo, k in zip(s.box.start, shape, strict=True):
            if (lo % k) if k else lo:  # (an axis of extent 0 has every slice at 0: nothing to align)
                return "its slices are not aligned to a grid"
    if len(param.slices) * prod(shape) != prod(param.shape):
        return "its slices do not cover the whole tensor exactly once"
    return None


def chunk_shape_for(box_shape: Sequence[int], itemsize: int, max_bytes: int) -> tuple[int, ...]:
    """The chunk shape for source slices of ``box_shape``: the slice itself, cut only to stay
    under ``max_bytes``.

    A chunk is always a contiguous byte range of its source slice (only leading axes are cut:
    ``[1, ..., 1, c, full, ..., full]``), so converting is a plain byte copy.
    """
    shape = tuple(max(int(s), 1) for s in box_shape)
    if prod(shape) * itemsize <= max_bytes or not shape:
        return shape
    for k in range(len(shape)):
        inner = prod(shape[k + 1:]) * itemsize
        if inner <= max_bytes:
            c = max(d for d in _divisors(shape[k]) if d * inner <= max_bytes)
            return (1,) * k + (c,) + shape[k + 1:]
    return (1,) * len(shape)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return small + [n // d for d in small]
