"""Write ``.safetensors`` files tensor by tensor (the header is known before any data).

The safetensors format is an 8-byte little-endian header length, a JSON header giving each
tensor's dtype, shape and byte range, then the raw little-endian C-order data. Since every
tensor's size is known from the read plan, the header is written first and tensors are then
streamed in, one at a time, so memory stays at one tensor. String values have no safetensors
dtype; they go into the ``__metadata__`` map. Files are written under a temporary name.
"""
from __future__ import annotations

import json
import os
from math import prod
from typing import Mapping, Sequence

import numpy as np

from .atomic_file import AtomicFile
from .dtypes import BFLOAT16

SAFETENSORS_DTYPES: dict[np.dtype, str] = {
    np.dtype("float16"): "F16", np.dtype("float32"): "F32", np.dtype("float64"): "F64", BFLOAT16: "BF16",
    np.dtype("int8"): "I8", np.dtype("int16"): "I16", np.dtype("int32"): "I32", np.dtype("int64"): "I64",
    np.dtype("uint8"): "U8", np.dtype("uint16"): "U16", np.dtype("uint32"): "U32", np.dtype("uint64"): "U64",
    np.dtype("bool"): "BOOL",
}


class SafetensorsWriter(AtomicFile):
    """Declare all tensors up front, then :meth:`add` them in the declared order."""

    def __init__(self, path: str | os.PathLike[str], tensors: Sequence[tuple[str, np.dtype, tuple[int, ...]]],
                 metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(path)
        header: dict[str, object] = {}
        offset = 0
        self._order = []
        for name, dtype, shape in tensors:
            n = prod(shape) * np.dtype(dtype).itemsize
            header[name] = {"dtype": SAFETENSORS_DTYPES[np.dtype(dtype)], "shape": list(shape),
                            "data_offsets": [offset, offset + n]}
            self._order.append((name, np.dtype(dtype), tuple(shape)))
            offset += n
        if metadata:
            header["__metadata__"] = dict(metadata)
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
        self._f.write(len(raw).to_bytes(8, "little") + raw)
        self._next = 0

    def add(self, name: str, array: np.ndarray) -> None:
        """Write the next declared tensor's data."""
        want = self._order[self._next]
        if (name, array.dtype, tuple(array.shape)) != want:
            raise ValueError(f"expected tensor {want}, got {(name, array.dtype, tuple(array.shape))}")
        arr = array if array.flags.c_contiguous else array.copy()
        self._f.write(memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else b"")
        self._next += 1

    def _finish(self) -> None:
        if self._next != len(self._order):
            raise ValueError(f"{len(self._order) - self._next} declared tensors were not written")
