"""Pure N-d box math: hyper-rectangles of a tensor, their overlaps, and their C-order bytes.

A :class:`Box` is half-open per axis, ``start[a] <= i < stop[a]``, always in a named frame:
*global* (indices of the whole tensor), *chunk-local* or *destination-local*. Functions here
never touch files; the planner and the converter use them to decide which bytes go where.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from math import prod

import numpy as np


@dataclass(frozen=True)
class Box:
    """A half-open hyper-rectangle ``[start, stop)`` of a tensor's index space."""

    start: tuple[int, ...]
    stop: tuple[int, ...]
    #: ``stop - start`` per axis, worked out once: planning a 128-rank job asks for it ~10^6 times.
    shape: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.start) != len(self.stop):
            raise ValueError(f"box start {self.start} and stop {self.stop} differ in rank")
        shape = []
        for lo, hi in zip(self.start, self.stop, strict=True):  # a loop: boxes are built in hot planning paths
            if lo < 0 or hi < lo:
                raise ValueError(f"box [{self.start}, {self.stop}) is not a valid box")
            shape.append(hi - lo)
        object.__setattr__(self, "shape", tuple(shape))

    @classmethod
    def full(cls, shape: Sequence[int]) -> Box:
        """The box covering a whole tensor of ``shape``."""
        return cls((0,) * len(shape), tuple(int(s) for s in shape))

    @property
    def ndim(self) -> int:
        return len(self.start)

    @property
    def size(self) -> int:
        return prod(self.shape)

    def intersect(self, other: Box) -> Box | None:
        """The overlap of two boxes in the same frame, or ``None`` when they do not overlap."""
        start = tuple(map(max, self.start, other.start))
        stop = tuple(map(min, self.stop, other.stop))
        for lo, hi in zip(start, stop, strict=True):
            if lo >= hi:
                return None
        return Box(start, stop)

    def contains(self, other: Box) -> bool:
        """True when ``other`` lies inside this box."""
        return all(a <= b and d <= c for a, b, c, d in zip(self.start, other.start, self.stop, other.stop, strict=True))

    def relative_to(self, origin: Box) -> Box:
        """This box expressed in the frame whose origin is ``origin.start``."""
        start = tuple(a - o for a, o in zip(self.start, origin.start, strict=True))
        stop = tuple(a - o for a, o in zip(self.stop, origin.start, strict=True))
        return Box(start, stop)

    def slices(self) -> tuple[slice, ...]:
        """numpy index selecting this box."""
        return tuple(slice(lo, hi) for lo, hi in zip(self.start, self.stop, strict=True))


def even_part(lo: int, hi: int, parts: int, index: int) -> tuple[int, int]:
    """Part ``index`` of ``[lo, hi)`` cut into ``parts`` equal pieces (MindSpore splits evenly)."""
    length = hi - lo
    if parts <= 0 or length % parts:
        raise ValueError(f"cannot split extent {length} evenly into {parts} parts")
    step = length // parts
    return lo + index * step, lo + (index + 1) * step


def paired_runs(box: Box, src: Box, dst: Box) -> tuple[np.ndarray, np.ndarray, int]:
    """Element runs copying ``box`` from C-order container ``src`` into C-order container ``dst``.

    All three boxes are in the same (global) frame and ``box`` lies inside both containers.
    Returns ``(src_starts, dst_starts, run_length)``: element offsets into each flattened
    container of runs that are contiguous in *both*, as long as possible.
    """
    if not (src.contains(box) and dst.contains(box)):
        raise ValueError(f"box [{box.start}, {box.stop}) is not inside both containers")
    if box.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, 0
    if box.ndim == 0:
        zero = np.zeros(1, dtype=np.int64)
        return zero, zero.copy(), 1
    sshape, dshape = src.shape, dst.shape
    k = box.ndim - 1
    while k > 0 and box.shape[k] == sshape[k] == dshape[k]:
        k -= 1
    run = prod(box.shape[k:])
    s_strides = [prod(sshape[a + 1:]) for a in range(box.ndim)]
    d_strides = [prod(dshape[a + 1:]) for a in range(box.ndim)]
    s_starts = np.array([(box.start[k] - src.start[k]) * s_strides[k]], dtype=np.int64)
    d_starts = np.array([(box.start[k] - dst.start[k]) * d_strides[k]], dtype=np.int64)
    for a in range(k - 1, -1, -1):
        idx = np.arange(box.shape[a], dtype=np.int64)
        s_starts = ((idx + box.start[a] - src.start[a]) * s_strides[a])[:, None] + s_starts[None, :]
        d_starts = ((idx + box.start[a] - dst.start[a]) * d_strides[a])[:, None] + d_starts[None, :]
        s_starts, d_starts = s_starts.ravel(), d_starts.ravel()
    return s_starts, d_starts, run


def byte_pieces(box: Box, container: Box, itemsize: int, base: int) -> list[tuple[int, int]]:
    """``(offset, length)`` byte ranges, in ``box``'s C order, of ``box`` inside a C-order
    ``container`` whose first byte is at ``base``."""
    _, dst, run = paired_runs(box, box, container)
    return [(base + d * itemsize, run * itemsize) for d in dst.tolist()]
