"""Write ``.safetensors`` files tensor by tensor (the header is known before any data).

The safetensors format is an 8-byte little-endian header length, a JSON header giving each
tensor's dtype, shape and byte range, then the raw little-endian C-order data. Since every
tensor's size is known from the read plan, the header is written first and tensors are then
streamed in, one at a time, so memory stays at one tensor. String values have no safetensors
dtype; they go into the ``__metadata__`` map. Files are written under a temporary name.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from ckptstore.formats.safetensors_header import build_header
from ckptstore.io.atomic_file import AtomicFile, SinkKey


class SafetensorsWriter(AtomicFile):
    """Declare all tensors up front, then :meth:`add` them in the declared order."""

    def __init__(self, path: str | os.PathLike[str] | SinkKey, tensors: Sequence[tuple[str, np.dtype, tuple[int, ...]]],
                 metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(path)
        head, infos = build_header(tensors, metadata)
        self._order = [(t.name, t.dtype, t.shape) for t in infos]
        self._f.write(head)
        self._next = 0

    def add(self, name: str, array: np.ndarray) -> None:
        """Write the next declared tensor's data."""
        want = self._order[self._next]
        if (name, array.dtype, tuple(array.shape)) != want:
            raise ValueError(f"expected tensor {want}, got {(name, array.dtype, tuple(array.shape))}")
        arr = array if array.flags.c_contiguous else array.copy()
        self._f.write(arr.reshape(-1).view(np.uint8).data if arr.size else b"")
        self._next += 1

    def _finish(self) -> None:
        if self._next != len(self._order):
            raise ValueError(f"{len(self._order) - self._next} declared tensors were not written")
