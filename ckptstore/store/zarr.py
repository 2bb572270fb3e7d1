"""Zarr v3 layout of a ckptstore store: array metadata, chunk files, shard indexes, the root group.

Each parameter is one Zarr v3 array under a path derived from its name. When the array has
one chunk, the chunk is a plain file of raw little-endian C-order bytes; with several, they go
into a single shard file (the ``sharding_indexed`` codec, index at the end, CRC-32C over the
index) so the store has one file per parameter, not one per chunk. A training step saved by
its ranks (:mod:`ckptstore.write.save`) has one shard per slice instead, the shard shape being
the slice shape, so that each rank writes files of its own. ckptstore writes chunk bytes
itself, streamed from the source ``.ckpt`` files or the ranks' arrays (zarr-python would
encode a whole shard in memory), and uses zarr-python only to produce the metadata documents,
so any Zarr v3 reader (zarr-python, tensorstore) reads the store. The root ``zarr.json`` is
written last: a directory without it is an unfinished conversion. This module is the writer's
half (it imports zarr-python); reading a store needs only the JSON manifest.
"""
from __future__ import annotations

import functools
import json
import struct
from collections.abc import Mapping, Sequence
from math import prod
from typing import Any
from urllib.parse import quote

import crc32c

from ckptstore.dtypes import numpy_dtype
from ckptstore.store.kinds import ROOT_METADATA

#: The index entry of an inner chunk a shard does not hold (a reader gives the fill value;
#: a shard at the array's edge has one for each chunk past the edge).
EMPTY_ENTRY = 2**64 - 1


def array_path(name: str) -> str:
    """A store path for parameter ``name``: the name itself when it is a safe single path segment.

    MindSpore names are dotted (``backbone.layers.0.attention.dense.weight``), which Zarr allows;
    characters that would nest or escape the store (``/``, ``\\``, a leading ``.`` or ``__``) are
    percent-encoded.
    """
    safe = quote(name, safe="._-")
    if safe.startswith(".") or safe.startswith("__") or safe in ("", "zarr.json"):
        safe = "%" + safe.encode().hex()
    return safe


#: The chunk key separator of the arrays ckptstore writes (converted stores and saved steps): a
#: chunk or shard file sits beside its array's ``zarr.json`` (``<path>/c.0.0``), so an array is one
#: folder, not a ``c/<i>/`` tree of folders to create and make durable (fsync) one by one.
SEPARATOR = "."


def chunk_key(path: str, ndim: int, separator: str = SEPARATOR) -> str:
    """The file holding all of an array's bytes (its single chunk or its single shard)."""
    return f"{path}/c" + f"{separator}0" * ndim


def grid_key(path: str, coords: Sequence[int], separator: str = SEPARATOR) -> str:
    """The Zarr v3 ``default`` key of the chunk (or shard) at grid ``coords``: ``<path>/c.<i>.<j>``
    (``<path>/c`` for a scalar)."""
    return f"{path}/c" + "".join(f"{separator}{c}" for c in coords)


def _zarr(*, bfloat16: bool = False) -> Any:
    """zarr-python (imported only when writing metadata), with the bfloat16 data type registered
    when ``bfloat16``: registering imports ml_dtypes, which costs more than a conversion's other
    imports together, so only a store that has a bfloat16 array pays for it."""
    import zarr
    import zarr.codecs
    import zarr.storage

    if bfloat16:
        from ckptstore.store import zarr_bfloat16

        zarr_bfloat16.register()  # zarr-python finds it by entry point too; the writer must not depend on that
    return zarr


def _zarr_codec(codec: Mapping[str, Any] | None, itemsize: int) -> list[Any] | None:
    if codec is None:
        return None
    zarr = _zarr()
    cid = codec["id"]
    if cid == "zstd":
        return [zarr.codecs.ZstdCodec(level=codec.get("level", 3))]
    if cid == "blosc":
        return [zarr.codecs.BloscCodec(cname=codec.get("cname", "lz4"), clevel=codec.get("clevel", 5),
                                       shuffle=codec.get("shuffle", "shuffle"), typesize=itemsize)]
    raise ValueError(f"unknown codec {cid!r}")


def array_metadata(shape: Sequence[int], dtype: str, chunk_shape: Sequence[int],
                   codec: Mapping[str, Any] | None, *, sharded: bool | None = None,
                   shard_shape: Sequence[int] | None = None, separator: str = SEPARATOR) -> bytes:
    """The ``zarr.json`` of one parameter's array, as zarr-python itself writes it.

    An array of several chunks keeps them in one shard file unless ``sharded=False`` (then each
    chunk is its own file, ``<path>/c.<i>.<j>``) or ``shard_shape`` is given (shards of that
    shape: a saving job's ranks write one shard per slice). The chunk key encoding's separator is
    :data:`SEPARATOR`: chunk files sit beside the array's ``zarr.json``, one folder per array.
    """
    dt = numpy_dtype(dtype)
    zarr = _zarr(bfloat16=dt.name == "bfloat16")
    store = zarr.storage.MemoryStore()
    if sharded is None:
        sharded = prod(-(-s // c) for s, c in zip(shape, chunk_shape, strict=True)) > 1
    shards = tuple(shard_shape) if shard_shape is not None else tuple(shape) if sharded else None
    zarr.create_array(store=store, shape=tuple(shape), dtype=dt, chunks=tuple(chunk_shape), shards=shards,
                      compressors=_zarr_codec(codec, dt.itemsize), fill_value=0, zarr_format=3,
                      chunk_key_encoding={"name": "default", "separator": separator})
    return store._store_dict[ROOT_METADATA].to_bytes()  # MemoryStore has no sync getter


def raw_array_metadata(shape: Sequence[int], dtype: str, chunk_shape: Sequence[int],
                       separator: str = SEPARATOR) -> bytes:
    """The ``zarr.json`` of an unsharded, uncompressed array (one file per chunk), as
    :func:`array_metadata` with ``sharded=False`` makes it, from a document zarr-python made once
    per data type, rank and separator (a save writes hundreds of these; each zarr-python call costs ms)."""
    doc = json.loads(_raw_template(dtype, len(shape), separator))
    doc["shape"] = [int(s) for s in shape]
    doc["chunk_grid"]["configuration"]["chunk_shape"] = [int(c) for c in chunk_shape]
    return json.dumps(doc, indent=2).encode()


@functools.lru_cache(maxsize=256)
def _raw_template(dtype: str, ndim: int, separator: str) -> str:
    return array_metadata((1,) * ndim, dtype, (1,) * ndim, None, sharded=False, separator=separator).decode()


def group_metadata(attributes: Mapping[str, Any]) -> bytes:
    """The root group's ``zarr.json`` carrying ``attributes`` (the ckptstore manifest).

    zarr-python makes the document of an empty group (once); the attributes are put into it
    here, because a round trip of a large manifest through zarr-python (serialised indented,
    parsed again) took seconds when a training job commits a step. It is serialised without
    indentation because the manifest's chunk columns make it large (a 13B model's is 4 MiB
    compact, 13 MiB indented), and parsing it is most of what opening a store costs.
    """
    doc = json.loads(_group_template())
    doc["attributes"] = dict(attributes)
    return json.dumps(doc, separators=(",", ":")).encode()


@functools.lru_cache(maxsize=1)
def _group_template() -> str:
    zarr = _zarr()
    store = zarr.storage.MemoryStore()
    zarr.create_group(store=store, attributes={}, zarr_format=3)
    return store._store_dict[ROOT_METADATA].to_bytes().decode()


def shard_index(offsets: Sequence[int], nbytes: Sequence[int], entries: int | None = None) -> bytes:
    """The sharding codec's index: ``(offset, nbytes)`` uint64 pairs in chunk order, then CRC-32C;
    padded to ``entries`` pairs with empty ones (a shard at the array's edge holds only the
    chunks inside the array, its index has one entry for every chunk of the shard shape)."""
    pairs = list(zip(offsets, nbytes, strict=True))
    pairs += [(EMPTY_ENTRY, EMPTY_ENTRY)] * ((entries or len(pairs)) - len(pairs))
    raw = b"".join(struct.pack("<QQ", o, n) for o, n in pairs)
    return raw + struct.pack("<I", crc32c.crc32c(raw))


def is_sharded(n_chunks: int) -> bool:
    """Arrays of more than one chunk keep them in one shard file."""
    return n_chunks > 1
