"""Write MindSpore ``.ckpt`` files record by record, exactly as ``save_checkpoint`` lays them out.

Each parameter is one or more ``Checkpoint.value`` records (a tensor over ``slice_bytes`` is
cut into several consecutive records with the full dims in each, as MindSpore does above
``SLICE_SIZE``); ``crc=True`` appends MindSpore's ``crc_num`` trailer. The file is written under
a temporary name and renamed when complete, so a reader never sees half a checkpoint.
"""
from __future__ import annotations

import os
import zlib
from collections.abc import Sequence

import numpy as np

from ckptstore.dtypes import STR_TYPE, mindspore_name
from ckptstore.formats.protowire import encode_varint
from ckptstore.io.atomic_file import AtomicFile, SinkKey

#: MindSpore's default ``SLICE_SIZE`` (512 MiB) in bytes.
DEFAULT_SLICE_BYTES = 512 * 1024 * 1024


def _field(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload


def record_header(name: str, dims: Sequence[int], tensor_type: str, content_bytes: int) -> bytes:
    """The bytes of one ``Checkpoint.value`` record up to its ``tensor_content`` payload, as
    ``save_checkpoint`` writes them: ``Checkpoint{value=1: Value{tag=1, tensor=2: TensorProto{dims=1
    (one varint each, unpacked, as MindSpore's proto2 schema writes them), tensor_type=2,
    tensor_content=3}}}``; the payload of ``content_bytes`` follows. The one .ckpt record encoder
    (the benchmarks' sparse fixture files use it too)."""
    tensor_prefix = (b"".join(encode_varint(1 << 3) + encode_varint(int(d)) for d in dims)
                     + _field(2, tensor_type.encode()) + encode_varint(3 << 3 | 2) + encode_varint(content_bytes))
    tensor_len = len(tensor_prefix) + content_bytes
    value_prefix = _field(1, name.encode()) + encode_varint(2 << 3 | 2) + encode_varint(tensor_len)
    return encode_varint(1 << 3 | 2) + encode_varint(len(value_prefix) + tensor_len) + value_prefix + tensor_prefix


class CheckpointWriter(AtomicFile):
    """Appends parameters to a new ``.ckpt`` file; use as a context manager."""

    def __init__(self, path: str | os.PathLike[str] | SinkKey, *, crc: bool = False,
                 slice_bytes: int = DEFAULT_SLICE_BYTES) -> None:
        super().__init__(path)
        self._crc = 0 if crc else None
        self._slice = slice_bytes

    def _write(self, data: bytes | memoryview) -> None:
        self._f.write(data)
        if self._crc is not None:
            self._crc = zlib.crc32(data, self._crc)

    def _record(self, name: str, dims: tuple[int, ...], tensor_type: str, content: memoryview) -> None:
        self._write(record_header(name, dims, tensor_type, len(content)))
        self._write(content)

    def add(self, name: str, value: np.ndarray | str) -> None:
        """Append one parameter (a numpy array of a MindSpore dtype, or a string value)."""
        if isinstance(value, str):
            text = np.array(value).tobytes()  # UTF-32-LE, as MindSpore stores str values
            self._record(name, (0,), STR_TYPE, memoryview(text))
            return
        arr = value if value.flags.c_contiguous else value.copy()  # (ascontiguousarray makes 0-d arrays 1-d)
        tensor_type = mindspore_name(arr.dtype)
        raw = arr.reshape(-1).view(np.uint8).data if arr.size else memoryview(b"")
        for start in range(0, max(len(raw), 1), self._slice):
            self._record(name, tuple(arr.shape), tensor_type, raw[start:start + self._slice])

    def _finish(self) -> None:
        if self._crc is not None:
            self._f.write(b"crc_num" + self._crc.to_bytes(10, "big"))
