"""The store manifest: for each parameter, its global shape, dtype and where each chunk's bytes lie.

The manifest is JSON kept in the store's root ``zarr.json`` attributes under ``"ckptstore"``
(see docs/FORMAT.md). It is everything a reader needs to plan byte reads: chunks form a regular
grid over the global tensor; chunk ``i`` (C order over the grid) is ``nbytes[i]`` bytes at
``offset[i]`` in file ``files[i]`` (a path relative to the store), checksummed with CRC-32C.
Loading validates it: shapes and grids agree, every chunk is present, uncompressed chunks have
exactly their element bytes, and chunks of one file do not overlap.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from functools import cached_property
from math import prod
from typing import Any, Mapping, Sequence

import numpy as np

from .boxes import Box, byte_pieces
from .dtypes import dtype_name, numpy_dtype
from .errors import StoreCorruptError

FORMAT_NAME = "ckptstore"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class ChunkTable:
    """Per-chunk columns, in C order over the chunk grid."""

    files: tuple[str, ...]
    offsets: tuple[int, ...]
    nbytes: tuple[int, ...]
    crc32c: tuple[int, ...]
    ranks: tuple[int, ...]
    replicas: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.offsets)

    def to_json(self) -> dict[str, Any]:
        # Files repeat (one shard file per parameter): store distinct names and an index column.
        names = list(dict.fromkeys(self.files))
        pos = {n: i for i, n in enumerate(names)}
        return {"files": names, "file": [pos[f] for f in self.files], "offset": list(self.offsets),
                "nbytes": list(self.nbytes), "crc32c": list(self.crc32c), "rank": list(self.ranks),
                "replicas": list(self.replicas)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ChunkTable":
        names = d["files"]
        return cls(tuple(names[i] for i in d["file"]), tuple(d["offset"]), tuple(d["nbytes"]),
                   tuple(d["crc32c"]), tuple(d["rank"]), tuple(d["replicas"]))


@dataclass(frozen=True)
class ParamManifest:
    """One parameter of the store: a global array cut into a regular grid of chunks.

    ``codec`` is ``None`` for raw little-endian C-order chunks (readable by byte offset) or a
    numcodecs config dict (``{"id": "zstd", ...}``) for compressed ones, which must be decoded
    whole. ``value`` holds the text of string parameters, which have no chunks.

    ``layout`` is ``"chunks"`` (each chunk's bytes are contiguous at its offset: Zarr) or
    ``"dense"`` (the whole tensor is contiguous in C order at ``data_offset`` of the one file,
    as in safetensors; chunks are then logical boxes with their own checksums and provenance,
    and ``offsets`` give where each chunk's first element lies).
    """

    name: str
    path: str
    dtype: str
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    chunks: ChunkTable
    codec: dict[str, Any] | None = None
    value: str | None = None
    layout: str = "chunks"
    data_offset: int = 0

    @property
    def dense(self) -> bool:
        return self.layout == "dense"

    @property
    def is_str(self) -> bool:
        return self.dtype == "str"

    @property
    def np_dtype(self) -> np.dtype:
        return numpy_dtype(self.dtype)

    @cached_property
    def grid(self) -> tuple[int, ...]:
        return tuple(-(-s // c) if c else 1 for s, c in zip(self.shape, self.chunk_shape))

    @cached_property
    def _grid_strides(self) -> tuple[int, ...]:
        return tuple(prod(self.grid[a + 1:]) for a in range(len(self.grid)))

    def chunk_sizes(self) -> np.ndarray:
        """Element count of every chunk, in C order over the grid (edge chunks may be smaller)."""
        sizes = np.ones((), dtype=np.int64)
        for n, k, g in zip(self.shape, self.chunk_shape, self.grid):
            extent = np.minimum(k, n - np.arange(g, dtype=np.int64) * k)
            sizes = np.multiply.outer(sizes, extent)
        return sizes.reshape(-1)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole global tensor in memory."""
        return 0 if self.is_str else prod(self.shape) * self.np_dtype.itemsize

    @property
    def stored_bytes(self) -> int:
        return sum(self.chunks.nbytes)

    def container(self, index: int) -> tuple[Box, int]:
        """The C-order block holding chunk ``index`` and its byte offset in the file: the chunk
        itself for the chunked layout, the whole tensor for the dense one."""
        if self.dense:
            return Box.full(self.shape), self.data_offset
        return self.chunk_box(index), self.chunks.offsets[index]

    def chunk_pieces(self, index: int) -> list[tuple[int, int]]:
        """Where chunk ``index``'s stored bytes lie in its file: ``(offset, length)`` in order."""
        if self.dense:
            return byte_pieces(self.chunk_box(index), Box.full(self.shape), self.np_dtype.itemsize,
                               self.data_offset)
        return [(self.chunks.offsets[index], self.chunks.nbytes[index])]

    def chunk_box(self, index: int) -> Box:
        """The global box of chunk ``index`` (C order over the grid)."""
        start = tuple((index // st) % g * k for st, g, k in zip(self._grid_strides, self.grid, self.chunk_shape))
        stop = tuple(min(s + k, n) for s, k, n in zip(start, self.chunk_shape, self.shape))
        return Box(start, stop)

    def chunks_overlapping(self, box: Box) -> list[int]:
        """Indices of the chunks that intersect the global ``box``."""
        if not self.shape:
            return [0]
        ranges = [range(lo // k, -(-hi // k)) if hi > lo else range(0)
                  for lo, hi, k in zip(box.start, box.stop, self.chunk_shape)]
        strides = self._grid_strides
        return [sum(c * st for c, st in zip(coords, strides)) for coords in itertools.product(*ranges)]

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"path": self.path, "dtype": self.dtype, "shape": list(self.shape)}
        if self.is_str:
            d["value"] = self.value
            return d
        d.update({"chunk_shape": list(self.chunk_shape), "codec": self.codec, "chunks": self.chunks.to_json()})
        if self.dense:
            d.update({"layout": "dense", "data_offset": self.data_offset})
        return d

    @classmethod
    def from_json(cls, name: str, d: Mapping[str, Any]) -> "ParamManifest":
        if d["dtype"] == "str":
            return cls(name, d["path"], "str", (), (), ChunkTable((), (), (), (), (), ()), None, d["value"])
        return cls(name, d["path"], d["dtype"], tuple(d["shape"]), tuple(d["chunk_shape"]),
                   ChunkTable.from_json(d["chunks"]), d.get("codec"), None, d.get("layout", "chunks"),
                   int(d.get("data_offset", 0)))

    def validate(self) -> None:
        """Raise :class:`StoreCorruptError` unless the chunk table covers the tensor consistently."""
        if self.is_str:
            return
        where = f"parameter {self.name!r} in the store manifest"
        try:
            itemsize = self.np_dtype.itemsize
        except ValueError as e:
            raise StoreCorruptError(f"{where}: {e}") from None
        if len(self.chunk_shape) != len(self.shape) or any(c <= 0 for c in self.chunk_shape):
            raise StoreCorruptError(f"{where}: chunk shape {list(self.chunk_shape)} does not fit shape "
                                    f"{list(self.shape)}")
        expected = prod(self.grid)
        t = self.chunks
        if not (len(t.files) == len(t.offsets) == len(t.nbytes) == len(t.crc32c) == len(t.ranks) == expected):
            raise StoreCorruptError(f"{where}: {len(t.offsets)} chunks listed but the grid {list(self.grid)} "
                                    f"has {expected}")
        if any(o < 0 or n < 0 for o, n in zip(t.offsets, t.nbytes)):
            raise StoreCorruptError(f"{where}: a chunk has a negative offset or size")
        if self.layout not in ("chunks", "dense") or (self.dense and (self.codec is not None or len(set(t.files)) > 1)):
            raise StoreCorruptError(f"{where}: unknown or inconsistent layout {self.layout!r}")
        if self.codec is None:
            wrong = np.flatnonzero(np.asarray(t.nbytes, dtype=np.int64) != self.chunk_sizes() * itemsize)
            if wrong.size:
                i = int(wrong[0])
                raise StoreCorruptError(f"{where}: chunk {i} has {t.nbytes[i]} bytes, its box needs "
                                        f"{self.chunk_box(i).size * itemsize}")
        if self.dense:
            return
        ids = {f: i for i, f in enumerate(dict.fromkeys(t.files))}
        file_id = np.array([ids[f] for f in t.files], dtype=np.int64)
        start = np.asarray(t.offsets, dtype=np.int64)
        end = start + np.asarray(t.nbytes, dtype=np.int64)
        order = np.lexsort((start, file_id))
        clash = (file_id[order][1:] == file_id[order][:-1]) & (end[order][:-1] > start[order][1:])
        if clash.any():
            raise StoreCorruptError(f"{where}: chunks overlap in {t.files[int(order[1:][clash][0])]}")


@dataclass(frozen=True)
class StoreManifest:
    """The whole store: header fields and every parameter's manifest, in source order."""

    params: Mapping[str, ParamManifest]
    source: Mapping[str, Any] = field(default_factory=dict)
    backend: str = "zarr"
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT_NAME, "format_version": self.format_version, "complete": True,
                "backend": self.backend, "checksum": "crc32c", "source": dict(self.source),
                "params": {n: p.to_json() for n, p in self.params.items()}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, where: str) -> "StoreManifest":
        if d.get("format") != FORMAT_NAME:
            raise StoreCorruptError(f"{where} is not a ckptstore store (no 'ckptstore' manifest)")
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise StoreCorruptError(f"{where} has format version {version}; this ckptstore reads version "
                                    f"{FORMAT_VERSION}. Convert again with this version")
        try:
            params = {n: ParamManifest.from_json(n, p) for n, p in d["params"].items()}
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise StoreCorruptError(f"{where}: malformed manifest ({e!r})") from None
        for p in params.values():
            p.validate()
        return cls(params, d.get("source", {}), d.get("backend", "zarr"), version)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))


def dtype_label(dtype: np.dtype | str) -> str:
    """The dtype name written in manifests (``"str"`` for string values)."""
    return dtype if isinstance(dtype, str) else dtype_name(dtype)


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
