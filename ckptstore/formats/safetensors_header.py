"""The safetensors file format, in one place: build a header, parse and validate one.

A safetensors file is an 8-byte little-endian header length ``N``, ``N`` bytes of JSON (padded
with spaces), then the tensors' raw little-endian C-order bytes. The header maps each tensor
name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (relative to the end of the
header) and may hold ``"__metadata__"``, a map of strings. :func:`build_header` lays tensors
out in the given order, 8-byte aligned; :func:`parse_header` reads and validates a header as
the safetensors library does (bounded size, known dtypes, sizes that match shapes, tensors that
tile the data without gaps or overlaps), reading only the header's bytes.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from ckptstore.dtypes import from_safetensors, lookup, safetensors_code
from ckptstore.errors import CheckpointFileError, CorruptCheckpointError, TruncatedCheckpointError
from ckptstore.io.base import ReadableFile
from ckptstore.limits import MAX_NDIM, MAX_SAFETENSORS_HEADER, MAX_TENSOR_BYTES, product

METADATA_KEY = "__metadata__"
_ALIGN = 8


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors file; ``start``/``end`` are absolute byte offsets in the file."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def build_header(tensors: Sequence[tuple[str, np.dtype, Sequence[int]]],
                 metadata: Mapping[str, str] | None = None) -> tuple[bytes, list[TensorInfo]]:
    """The header bytes (length prefix included) for ``tensors`` stored in this order, and where
    each tensor's data lands in the file."""
    header: dict[str, Any] = {}
    if metadata:
        header[METADATA_KEY] = dict(metadata)
    spans = []
    offset = 0
    for name, dtype, shape in tensors:
        n = prod(shape) * np.dtype(dtype).itemsize
        header[name] = {"dtype": safetensors_code(dtype), "shape": [int(s) for s in shape],
                        "data_offsets": [offset, offset + n]}
        spans.append((name, np.dtype(dtype), tuple(int(s) for s in shape), offset, offset + n))
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % _ALIGN)  # data starts 8-byte aligned
    head = len(raw).to_bytes(8, "little") + raw
    return head, [TensorInfo(n, d, s, len(head) + a, len(head) + b) for n, d, s, a, b in spans]


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of two equal keys: a tensor named twice would be read from
    # whichever entry came last, and the other's bytes left unaccounted for
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key[:200]!r} appears twice")
        out[key] = value
    return out


def parse_header(f: ReadableFile) -> tuple[dict[str, str], dict[str, TensorInfo]]:
    """``(metadata, tensors)`` of the safetensors file ``f``, validated; tensors in file order.

    Raises :class:`~ckptstore.errors.TruncatedCheckpointError` when the file is shorter than its
    header says and :class:`~ckptstore.errors.CorruptCheckpointError` for anything malformed,
    naming the file, the tensor and the byte offset.
    """
    if f.size < 8:
        raise TruncatedCheckpointError("the file is shorter than a safetensors header length", path=f.url, offset=0)
    n = int.from_bytes(f.pread(0, 8), "little")
    if n > MAX_SAFETENSORS_HEADER:
        raise CorruptCheckpointError(f"the safetensors header claims {n} bytes (more than "
                                     f"{MAX_SAFETENSORS_HEADER})", path=f.url, offset=0)
    if 8 + n > f.size:
        raise TruncatedCheckpointError(f"the file ends inside its {n}-byte safetensors header", path=f.url, offset=8)
    try:
        doc = json.loads(f.pread(8, n), object_pairs_hook=_once_each)
    except (ValueError, RecursionError) as e:
        raise CorruptCheckpointError(f"the safetensors header is not valid JSON: {e}", path=f.url, offset=8) from None
    if not isinstance(doc, dict):
        raise CorruptCheckpointError("the safetensors header is not a JSON object", path=f.url, offset=8)
    metadata = doc.pop(METADATA_KEY, None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise CorruptCheckpointError("the safetensors __metadata__ is not a map of strings", path=f.url, offset=8)
    base = 8 + n
    tensors = sorted((_tensor(name, d, base, f.url) for name, d in doc.items()), key=lambda t: (t.start, t.end))
    pos = base
    for t in tensors:
        if t.start != pos:
            raise CorruptCheckpointError(f"tensor data {'overlaps' if t.start < pos else 'leaves a gap'} at byte "
                                         f"offset {min(pos, t.start)}", path=f.url, param=t.name, offset=t.start)
        pos = t.end
    if pos > f.size:
        raise TruncatedCheckpointError(f"the file ends at byte offset {f.size}, before the tensor data does "
                                       f"(byte offset {pos})", path=f.url, param=tensors[-1].name, offset=pos)
    return metadata, {t.name: t for t in tensors}


def _tensor(name: str, d: Any, base: int, path: str) -> TensorInfo:
    def bad(problem: str) -> CheckpointFileError:
        return CorruptCheckpointError(problem, path=path, param=name, offset=8)

    if not isinstance(d, dict):
        raise bad("its header entry is not a JSON object")
    try:
        dtype = from_safetensors(d.get("dtype")).numpy  # type: ignore[arg-type]  # any JSON value: refused there
    except ValueError as e:
        raise bad(str(e)) from None
    shape, offsets = d.get("shape"), d.get("data_offsets")
    if (not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(type(s) is int for s in shape)
            or not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)):
        raise bad("its shape or data_offsets are not lists of integers")
    size = product([*shape, dtype.itemsize], MAX_TENSOR_BYTES, "shape", bad)
    begin, end = offsets
    if not 0 <= begin <= end or end - begin != size:
        raise bad(f"data_offsets {offsets} do not hold shape {shape} of {lookup(dtype).name} ({size} bytes)")
    return TensorInfo(name, dtype, tuple(shape), base + begin, base + end)
