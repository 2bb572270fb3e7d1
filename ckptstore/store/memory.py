"""Destination memory for loaded slices.

Every slice a rank loads lands in a fresh array that MindSpore later owns, so how that memory
is allocated decides how the first touch of its pages is paid for. Measured here (fresh
processes, 575 MB read from the page cache, benchmarks/README.md "Destination memory"): an
anonymous ``mmap`` of ordinary 4 KiB pages filled by two threads took 0.28 s, ``np.empty`` 0.27
to 0.40 s depending on whether numpy asked for transparent huge pages (it does by default, and
then the time swings with how fragmented free memory is), and one thread 0.49 s against 0.74 s
for ``np.empty`` with huge pages off. So large destinations are anonymous maps with no advice:
predictable 4 KiB pages that several threads fault in in parallel, whatever ``NUMPY_MADVISE_HUGEPAGE``
says. Small ones come from numpy's allocator.
"""
from __future__ import annotations

import mmap
from collections.abc import Sequence
from math import prod

import numpy as np

#: Arrays at least this large get their own anonymous map.
MAP_THRESHOLD = 1 << 20


def empty(shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """A new, uninitialised, writeable C-order array of ``shape`` and ``dtype``."""
    dtype = np.dtype(dtype)
    nbytes = prod(shape) * dtype.itemsize
    if nbytes < MAP_THRESHOLD:
        return np.empty(tuple(shape), dtype=dtype)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(region, dtype=dtype).reshape(tuple(shape))
