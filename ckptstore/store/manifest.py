"""The store manifest: for each parameter, its global shape, dtype and where each chunk's bytes lie.

The manifest is JSON (see docs/FORMAT.md): the root ``zarr.json`` attributes of a Zarr store,
``ckptstore.json`` of a safetensors store or an index. It is everything a reader needs to plan
byte reads: chunks form a regular grid over the global tensor; chunk ``i`` (C order over the
grid) is ``nbytes[i]`` bytes at ``offset[i]`` of file ``files[i]`` (a key relative to the
store's data folder), or, for chunks listed in ``pieces``, the concatenation of several byte
ranges (a tensor MindSpore wrote as several records). Loading validates it before anything is
read: types, bounds on every number (:mod:`ckptstore.limits`), file keys that stay inside the
data folder, codecs from a closed list, a grid that the chunk table covers exactly, raw chunks
of exactly their element bytes, and no two chunks overlapping in one file.
"""
from __future__ import annotations

import array
import itertools
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from math import prod
from typing import TYPE_CHECKING, Any

import numpy as np

from ckptstore.boxes import Box, byte_pieces
from ckptstore.dtypes import STR_TYPE, dtype_name, numpy_dtype
from ckptstore.errors import StoreCorruptError, UnsafePathError
from ckptstore.io.base import check_key
from ckptstore.limits import MAX_CHUNKS, MAX_NAME_BYTES, MAX_NDIM, MAX_STR_BYTES, MAX_TENSOR_BYTES, check, product

FORMAT_NAME = "ckptstore"
FORMAT_VERSION = 1
#: Largest stored size of a compressed chunk, relative to its raw size (zstd/blosc never expand
#: more than a few bytes per block; this bounds the buffer a read allocates).
_MAX_EXPANSION = 2
_MAX_OFFSET = 1 << 62
#: Codecs a manifest may name, with the settings each may carry. numcodecs can build many more
#: (some of them, like pickle, run code when decoding): a manifest is data, so only these.
CODEC_SETTINGS: dict[str, dict[str, type]] = {
    "zstd": {"level": int},
    "blosc": {"cname": str, "clevel": int, "shuffle": str, "blocksize": int, "typesize": int},
}

Piece = tuple[str, int, int]  # (file key, offset, length)


if TYPE_CHECKING:
    _Int64Array = array.array[int]
else:  # array.array takes no type argument at run time before Python 3.12
    _Int64Array = array.array


class IntColumn(_Int64Array):
    """A column of 64-bit integers: 8 bytes an entry where a tuple of ints costs about 40 (a
    130B index has 174,110 chunks, and every loader holds the whole manifest). Indexing gives
    Python ints, and it equals a tuple or list of the same values, as the tuples it replaces did."""

    __slots__ = ()

    def __new__(cls, values: Sequence[int] = ()) -> IntColumn:
        return super().__new__(cls, "q", values)  # type: ignore[return-value]  # typeshed: array, not the subclass

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (tuple, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return super().__eq__(other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # a column is mutable, like the array it is

    def __reduce__(self) -> tuple[Any, ...]:
        return IntColumn, (self.tolist(),)


@dataclass(frozen=True)
class ChunkTable:
    """Per-chunk columns, in C order over the chunk grid.

    ``crc32c`` is ``None`` when the store holds no checksums (an index made without
    ``--checksum``). ``pieces`` lists, for chunks whose bytes are not one contiguous range,
    every ``(file, offset, length)`` in order; such a chunk's columns give its first piece's file
    and offset and its total length.
    """

    files: tuple[str, ...]
    offsets: Sequence[int]
    nbytes: Sequence[int]
    crc32c: Sequence[int] | None
    ranks: Sequence[int]
    replicas: Sequence[int]
    pieces: Mapping[int, tuple[Piece, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The integer columns are kept as IntColumns whatever sequence was given (see IntColumn).
        for name in ("offsets", "nbytes", "crc32c", "ranks", "replicas"):
            v = getattr(self, name)
            if v is not None and type(v) is not IntColumn:
                object.__setattr__(self, name, IntColumn(v))
        if type(self.files) is not tuple:
            object.__setattr__(self, "files", tuple(self.files))

    def __len__(self) -> int:
        return len(self.offsets)

    def chunk_pieces(self, i: int) -> tuple[Piece, ...]:
        """Where chunk ``i``'s stored bytes lie: ``(file, offset, length)`` in order."""
        extra = self.pieces.get(i)
        return extra if extra is not None else ((self.files[i], self.offsets[i], self.nbytes[i]),)

    def to_json(self) -> dict[str, Any]:
        # Files repeat (one shard file per parameter): store distinct names and an index column.
        names = list(dict.fromkeys([*self.files, *(p[0] for ps in self.pieces.values() for p in ps)]))
        pos = {n: i for i, n in enumerate(names)}
        d: dict[str, Any] = {
            "files": names, "file": [pos[f] for f in self.files], "offset": list(self.offsets),
            "nbytes": list(self.nbytes), "crc32c": None if self.crc32c is None else list(self.crc32c),
            "rank": list(self.ranks), "replicas": list(self.replicas)}
        if self.pieces:
            d["pieces"] = {str(i): [[pos[f], o, n] for f, o, n in ps] for i, ps in sorted(self.pieces.items())}
        return d


@dataclass(frozen=True)
class ParamManifest:
    """One parameter of the store: a global array cut into a regular grid of chunks.

    ``codec`` is ``None`` for raw little-endian C-order chunks (readable by byte offset) or a
    numcodecs config dict (``{"id": "zstd", ...}``) for compressed ones, which must be decoded
    whole. ``value`` holds the text of string parameters, which have no chunks.

    ``layout`` is ``"chunks"`` (each chunk's bytes are contiguous at its offset, or the
    concatenation of its pieces) or ``"dense"`` (the whole tensor is contiguous in C order at
    ``data_offset`` of the one file, as in safetensors; chunks are then logical boxes with their
    own checksums and provenance, and ``offsets`` give where each chunk's first element lies).
    """

    name: str
    path: str
    dtype: str
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    chunks: ChunkTable
    codec: Mapping[str, Any] | None = None
    value: str | None = None
    layout: str = "chunks"
    data_offset: int = 0

    @property
    def dense(self) -> bool:
        return self.layout == "dense"

    @property
    def is_str(self) -> bool:
        return self.dtype == STR_TYPE

    @property
    def np_dtype(self) -> np.dtype:
        return numpy_dtype(self.dtype)

    @cached_property
    def grid(self) -> tuple[int, ...]:
        return tuple(-(-s // c) for s, c in zip(self.shape, self.chunk_shape, strict=True))

    @cached_property
    def _grid_strides(self) -> tuple[int, ...]:
        return tuple(prod(self.grid[a + 1:]) for a in range(len(self.grid)))

    def chunk_sizes(self) -> np.ndarray:
        """Element count of every chunk, in C order over the grid (edge chunks may be smaller)."""
        sizes = np.ones((), dtype=np.int64)
        for n, k, g in zip(self.shape, self.chunk_shape, self.grid, strict=True):
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

    def container(self, index: int) -> tuple[Box, tuple[Piece, ...]]:
        """The C-order block holding chunk ``index`` and where its bytes lie, in order: the chunk
        itself for the chunked layout, the whole tensor for the dense one."""
        if self.dense:
            return Box.full(self.shape), ((self.chunks.files[0], self.data_offset, self.nbytes),)
        return self.chunk_box(index), self.chunks.chunk_pieces(index)

    def chunk_pieces(self, index: int) -> list[Piece]:
        """Where chunk ``index``'s stored bytes lie: ``(file, offset, length)`` in chunk byte order."""
        if self.dense:
            file = self.chunks.files[index]
            return [(file, o, n) for o, n in byte_pieces(self.chunk_box(index), Box.full(self.shape),
                                                          self.np_dtype.itemsize, self.data_offset)]
        return list(self.chunks.chunk_pieces(index))

    def chunk_box(self, index: int) -> Box:
        """The global box of chunk ``index`` (C order over the grid)."""
        if len(self.shape) == 1:  # a vector (a converter's row of chunks) needs no grid
            first = index * self.chunk_shape[0]
            return Box((first,), (min(first + self.chunk_shape[0], self.shape[0]),))
        if not index:  # the first (often the only) chunk needs no grid
            stop = tuple(map(min, self.chunk_shape, self.shape))
            return Box((0,) * len(stop), stop)
        start = tuple((index // st) % g * k
                      for st, g, k in zip(self._grid_strides, self.grid, self.chunk_shape, strict=True))
        stop = tuple(min(s + k, n) for s, k, n in zip(start, self.chunk_shape, self.shape, strict=True))
        return Box(start, stop)

    def chunks_overlapping(self, box: Box) -> list[int]:
        """Indices of the chunks that intersect the global ``box``."""
        if all(k >= n for n, k in zip(self.shape, self.chunk_shape, strict=True)):
            return [0]  # one chunk (or a scalar): nothing to search
        if len(self.shape) == 1:
            k, lo, hi = self.chunk_shape[0], box.start[0], box.stop[0]
            return list(range(lo // k, -(-hi // k))) if hi > lo else []
        ranges = [range(lo // k, -(-hi // k)) if hi > lo else range(0)
                  for lo, hi, k in zip(box.start, box.stop, self.chunk_shape, strict=True)]
        strides = self._grid_strides
        return [sum(c * st for c, st in zip(coords, strides, strict=True)) for coords in itertools.product(*ranges)]

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
    def from_json(cls, name: str, d: Any) -> ParamManifest:
        """Parse and validate one parameter's entry; raises :class:`StoreCorruptError` naming it."""
        return _ParamParser(name).parse(d)

    def validate(self) -> None:
        """Raise :class:`StoreCorruptError` unless the chunk table covers the tensor consistently."""
        _ParamParser(self.name).check(self)


@dataclass(frozen=True)
class StoreManifest:
    """The whole store: header fields and every parameter's manifest, in source order."""

    params: Mapping[str, ParamManifest]
    source: Mapping[str, Any] = field(default_factory=dict)
    #: The store kind: ``"zarr"``, ``"safetensors"``, ``"index"`` (written as ``"kind"``).
    kind: str = "zarr"
    format_version: int = FORMAT_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT_NAME, "format_version": self.format_version, "complete": True,
                "kind": self.kind, "checksum": "crc32c", "source": dict(self.source), **self.extra,
                "params": {n: p.to_json() for n, p in self.params.items()}}

    @classmethod
    def from_json(cls, d: Any, *, where: str) -> StoreManifest:
        """Parse and validate a whole manifest; raises :class:`StoreCorruptError` naming ``where``."""
        if not isinstance(d, Mapping) or d.get("format") != FORMAT_NAME:
            raise StoreCorruptError(f"{where} is not a ckptstore store (no 'ckptstore' manifest)")
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise StoreCorruptError(f"{where} has format version {version!r}; this ckptstore reads version "
                                    f"{FORMAT_VERSION}. Convert again with this version")
        params, source, kind = d.get("params"), d.get("source", {}), _kind(d, where)
        if not isinstance(params, Mapping) or not isinstance(source, Mapping):
            raise StoreCorruptError(f"{where}: malformed manifest ('params' and 'source' must be JSON objects)")
        parsed = {}
        for n, p in params.items():
            try:
                parsed[n] = ParamManifest.from_json(n, p)
            except StoreCorruptError as e:
                raise StoreCorruptError(f"{where}: {e}") from None
        extra = {k: v for k, v in d.items() if k not in _HEADER_KEYS}
        return cls(parsed, source, kind, version, extra)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))


_HEADER_KEYS = {"format", "format_version", "complete", "kind", "checksum", "source", "params"}


def _kind(d: Mapping[str, Any], where: str) -> str:
    """The manifest's store kind, its ``"kind"`` (required: a string)."""
    kind = d.get("kind")
    if kind is None:
        raise StoreCorruptError(f"{where}: the manifest names no store kind (no 'kind' field)")
    if not isinstance(kind, str):
        raise StoreCorruptError(f"{where}: the store kind {kind!r} is not a string")
    return kind


def dtype_label(dtype: np.dtype | str | None) -> str:
    """The dtype name written in manifests (``"str"`` for string values, whose dtype a save plan
    gives as ``None``)."""
    if dtype is None:
        return "str"
    return dtype if isinstance(dtype, str) else dtype_name(dtype)


#: The keys of a chunk table's JSON object (:meth:`ChunkTable.to_json`) and its integer columns.
_TABLE_KEYS = frozenset({"files", "file", "offset", "nbytes", "crc32c", "rank", "replicas", "pieces"})
_TABLE_COLUMNS = ("file", "offset", "nbytes", "crc32c", "rank", "replicas")
_INT64_MAX = (1 << 63) - 1


def compact_columns(d: dict[str, Any]) -> dict[str, Any]:
    """``json.loads``' ``object_hook`` for a manifest: each chunk table's integer columns become
    :class:`IntColumn`\\ s, and its file names interned, as soon as the table is parsed, so that a
    130B index never holds all its parsed ints (about 40 bytes each, 570,405 of them) and file names
    (222,188) at once, and a loader's resident memory after :func:`ckptstore.open` is the compact
    manifest, not the high-water mark of the parse. Lists that are not all integers in 0..2**63-1
    are left as they are, for the parser to refuse with its message."""
    if "offset" in d and "files" in d and d.keys() <= _TABLE_KEYS:
        files = d["files"]
        if type(files) is list:  # one string per file name, not one per table (see _ParamParser._table)
            d["files"] = [sys.intern(f) if type(f) is str else f for f in files]
        for k in _TABLE_COLUMNS:
            v = d.get(k)
            if type(v) is list and all(type(x) is int and 0 <= x <= _INT64_MAX for x in v):
                d[k] = IntColumn(v)
    return d


class _ParamParser:
    """Type- and bounds-checks one parameter's JSON before a number of it sizes anything."""

    def __init__(self, name: object) -> None:
        if not isinstance(name, str) or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            raise StoreCorruptError(f"a parameter name in the manifest is not a string of at most "
                                    f"{MAX_NAME_BYTES} bytes")
        self.name = name
        self.where = f"parameter {name!r} in the store manifest"

    def fail(self, problem: str) -> StoreCorruptError:
        return StoreCorruptError(f"{self.where}: {problem}")

    def _int(self, v: Any, what: str, limit: int = _MAX_OFFSET) -> int:
        if type(v) is not int:
            raise self.fail(f"{what} is {v!r}, not an integer")
        return check(v, limit, what, self.fail)

    def _column(self, v: Any, what: str, *, length: int, limit: int = _MAX_OFFSET) -> Sequence[int]:
        """A chunk table's integer column: :meth:`_ints`, or an :class:`IntColumn` that
        :func:`compact_columns` made as it was parsed (integers already) checked the same way."""
        if type(v) is not IntColumn:
            return self._ints(v, what, length=length, limit=limit)
        if len(v) != length:
            raise self.fail(f"{what} is not a list of {length} integers")
        if len(v) and not 0 <= min(v) <= max(v) <= limit:
            raise self.fail(f"{what} holds an entry that is not an integer in 0..{limit}")
        return v

    def _ints(self, v: Any, what: str, *, length: int | None = None, limit: int = _MAX_OFFSET) -> tuple[int, ...]:
        if not isinstance(v, list) or (length is not None and len(v) != length):
            want = "a list" if length is None else f"a list of {length}"
            raise self.fail(f"{what} is not {want} integers")
        if not all(type(x) is int and 0 <= x <= limit for x in v):
            raise self.fail(f"{what} holds an entry that is not an integer in 0..{limit}")
        return tuple(v)

    def _str(self, v: Any, what: str, limit: int = MAX_NAME_BYTES) -> str:
        if not isinstance(v, str) or len(v) > limit:
            raise self.fail(f"{what} is not a string of at most {limit} characters")
        return v

    def parse(self, d: Any) -> ParamManifest:
        if not isinstance(d, Mapping):
            raise self.fail("its entry is not a JSON object")
        dtype = self._str(d.get("dtype"), "dtype")
        path = self._str(d.get("path", ""), "path")
        if dtype == STR_TYPE:
            value = self._str(d.get("value"), "value", MAX_STR_BYTES)
            return ParamManifest(self.name, path, STR_TYPE, (), (), ChunkTable((), (), (), (), (), ()), None, value)
        try:
            itemsize = numpy_dtype(dtype).itemsize
        except ValueError as e:
            raise self.fail(str(e)) from None
        shape = self._ints(d.get("shape"), "shape", limit=MAX_TENSOR_BYTES)
        check(len(shape), MAX_NDIM, "the number of dimensions", self.fail)
        product((*shape, itemsize), MAX_TENSOR_BYTES, "shape", self.fail)
        chunk_shape = self._ints(d.get("chunk_shape"), "chunk_shape", length=len(shape), limit=MAX_TENSOR_BYTES)
        layout = d.get("layout", "chunks")
        if layout not in ("chunks", "dense"):
            raise self.fail(f"unknown layout {layout!r}")
        table = self._table(d.get("chunks"), shape, chunk_shape)
        p = ParamManifest(self.name, path, dtype, shape, chunk_shape, table, self._codec(d.get("codec")), None,
                          layout, self._int(d.get("data_offset", 0), "data_offset"))
        self.check(p)
        return p

    def _codec(self, codec: Any) -> dict[str, Any] | None:
        if codec is None:
            return None
        if not isinstance(codec, Mapping) or codec.get("id") not in CODEC_SETTINGS:
            raise self.fail(f"codec {codec!r} is not one of {', '.join(CODEC_SETTINGS)}")
        allowed = CODEC_SETTINGS[codec["id"]]
        for k, v in codec.items():
            if k != "id" and (k not in allowed or type(v) is not allowed[k]):
                raise self.fail(f"codec {codec['id']!r} setting {k}={v!r} is not allowed")
        return dict(codec)

    def _table(self, t: Any, shape: tuple[int, ...], chunk_shape: tuple[int, ...]) -> ChunkTable:
        if not isinstance(t, Mapping):
            raise self.fail("'chunks' is not a JSON object")
        if any(c == 0 for c in chunk_shape):
            raise self.fail(f"chunk shape {list(chunk_shape)} has a zero entry")
        n = product([-(-s // c) for s, c in zip(shape, chunk_shape, strict=True)], MAX_CHUNKS, "chunk grid", self.fail)
        names = t.get("files")
        if not isinstance(names, list) or len(names) > MAX_CHUNKS:
            raise self.fail("'files' is not a list of file names")
        try:
            # interned: the same file names recur in every parameter's table (an index of 128 rank
            # files would otherwise hold one copy per parameter, 222,188 strings for the 130B one)
            keys = [sys.intern(check_key(f, self.where)) for f in names]
        except UnsafePathError as e:
            raise StoreCorruptError(str(e)) from None
        file_ids = self._column(t.get("file"), "file column", length=n, limit=max(len(keys) - 1, 0))
        if n and not keys:
            raise self.fail("chunks are listed but no files")
        crc = t.get("crc32c")
        return ChunkTable(
            tuple(keys[i] for i in file_ids), self._column(t.get("offset"), "offset column", length=n),
            self._column(t.get("nbytes"), "nbytes column", length=n),
            None if crc is None else self._column(crc, "crc32c column", length=n, limit=0xFFFFFFFF),
            self._column(t.get("rank", [0] * n), "rank column", length=n),
            self._column(t.get("replicas", [1] * n), "replicas column", length=n),
            self._pieces(t.get("pieces", {}), keys, n))

    def _pieces(self, raw: Any, keys: list[str], n: int) -> dict[int, tuple[Piece, ...]]:
        if not isinstance(raw, Mapping) or len(raw) > n:
            raise self.fail("'pieces' is not an object of at most one entry per chunk")
        out = {}
        for k, ps in raw.items():
            i = int(k) if isinstance(k, str) and k.isdigit() else -1
            if not 0 <= i < n or not isinstance(ps, list) or not ps or len(ps) > MAX_CHUNKS:
                raise self.fail(f"'pieces' entry {k!r} does not name a chunk or lists no pieces")
            pieces = []
            for piece in ps:
                f, o, m = self._ints(piece, f"a piece of chunk {i}", length=3)
                if f >= len(keys):
                    raise self.fail(f"a piece of chunk {i} names file {f} of {len(keys)}")
                pieces.append((keys[f], o, m))
            out[i] = tuple(pieces)
        return out

    def check(self, p: ParamManifest) -> None:
        """Consistency of a parsed (or built) parameter: sizes, pieces, overlaps."""
        if p.is_str:
            return
        itemsize, t = p.np_dtype.itemsize, p.chunks
        n = product(p.grid, MAX_CHUNKS, "chunk grid", self.fail)
        if len(t) != n or len(t.files) != n or len(t.nbytes) != n or (t.crc32c is not None and len(t.crc32c) != n):
            raise self.fail(f"{len(t)} chunks listed but the grid {list(p.grid)} has {n}")
        if any(not 0 <= v <= _MAX_OFFSET for v in (*t.offsets, *t.nbytes)):
            raise self.fail(f"a chunk has a negative offset or size, or one beyond {_MAX_OFFSET}")
        raw_sizes = p.chunk_sizes() * itemsize
        stored = np.asarray(t.nbytes, dtype=np.int64)
        if p.codec is None:
            wrong = np.flatnonzero(stored != raw_sizes)
            if wrong.size:
                i = int(wrong[0])
                raise self.fail(f"chunk {i} has {t.nbytes[i]} bytes, its box needs {int(raw_sizes[i])}")
        elif np.any(stored > raw_sizes * _MAX_EXPANSION + (1 << 20)):
            raise self.fail("a compressed chunk is larger than its data could ever compress to")
        for i, ps in t.pieces.items():
            if sum(m for _, _, m in ps) != t.nbytes[i] or ps[0][:2] != (t.files[i], t.offsets[i]):
                raise self.fail(f"the pieces of chunk {i} do not add up to its size and position")
        if p.dense:
            if p.codec is not None or t.pieces or len(set(t.files)) > 1:
                raise self.fail("a dense (safetensors) parameter must be raw, in one file")
            return
        self._no_overlap(p)

    def _no_overlap(self, p: ParamManifest) -> None:
        t = p.chunks
        spans = [(f, o, o + m) for i in range(len(t)) for f, o, m in t.chunk_pieces(i)] if t.pieces else \
            list(zip(t.files, t.offsets, (o + m for o, m in zip(t.offsets, t.nbytes, strict=True)), strict=True))
        if len(spans) < 2 or all(a[0] == b[0] and a[2] <= b[1] for a, b in zip(spans, spans[1:], strict=False)):
            return  # the common case: chunks one after another in one file
        ids = {f: i for i, f in enumerate(dict.fromkeys(s[0] for s in spans))}
        file_id = np.array([ids[s[0]] for s in spans], dtype=np.int64)
        start = np.array([s[1] for s in spans], dtype=np.int64)
        end = np.array([s[2] for s in spans], dtype=np.int64)
        order = np.lexsort((start, file_id))
        clash = (file_id[order][1:] == file_id[order][:-1]) & (end[order][:-1] > start[order][1:])
        if clash.any():
            raise self.fail(f"chunks overlap in {spans[int(order[1:][clash][0])][0]}")
