"""Destination memory for loaded slices.

Every slice a rank loads lands in a fresh array that MindSpore later owns, so how that memory
is allocated decides how the first touch of its pages is paid for (see benchmarks/README.md,
"Destination memory").
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def empty(shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """A new, uninitialised C-order array of ``shape`` and ``dtype``."""
    return np.empty(tuple(shape), dtype=dtype)
