"""Chunk compression: the codecs a store may use, built with numcodecs, decoded with a bound.

A store's manifest names its codec as a numcodecs config (``{"id": "zstd", "level": 3}``). Only
the codecs in :data:`CODECS` are accepted (the manifest parser refuses any other, since
numcodecs can also build codecs that run code when decoding), and a chunk is always decoded
into a buffer of exactly its raw size, so a damaged or hostile chunk cannot make decoding
allocate more than the chunk's box.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ckptstore.errors import StoreCorruptError

#: The codecs ``convert --compress`` offers, with their settings.
CODECS: dict[str, dict[str, Any]] = {
    "zstd": {"id": "zstd", "level": 3},
    "blosc": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": "shuffle"},
}
_BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


def numcodecs_codec(codec: Mapping[str, Any] | None) -> Any:
    """The numcodecs codec for a manifest ``codec`` config (``None`` for raw chunks).

    numcodecs' Blosc takes ``shuffle`` as an int where Zarr's metadata names it.
    """
    if codec is None:
        return None
    import numcodecs

    cfg = dict(codec)
    if cfg["id"] == "blosc" and isinstance(cfg.get("shuffle"), str):
        cfg["shuffle"] = _BLOSC_SHUFFLE[cfg["shuffle"]]
    return numcodecs.get_codec(cfg)


def decode(codec: Mapping[str, Any] | None, data: bytes | bytearray | memoryview | np.ndarray, nbytes: int, name: str,
           chunk: int) -> Any:
    """Decode one stored chunk into a new buffer of exactly ``nbytes`` bytes.

    Raises :class:`~ckptstore.errors.StoreCorruptError` naming the parameter and chunk when the
    bytes do not decode to exactly that size.
    """
    out = np.empty(nbytes, dtype=np.uint8)
    try:
        got = numcodecs_codec(codec).decode(data, out=out)
    except (ValueError, RuntimeError, TypeError) as e:
        raise StoreCorruptError(f"chunk {chunk} of parameter {name!r} does not decode: {e}") from None
    if np.asarray(got).nbytes != nbytes:
        raise StoreCorruptError(f"chunk {chunk} of parameter {name!r} decodes to {np.asarray(got).nbytes} bytes, "
                                f"not {nbytes}")
    return out
