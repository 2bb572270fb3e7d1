"""``ckptstore verify``: re-read a store and prove it is intact (and equal to its source).

Every chunk is read whole and its CRC-32C compared with the manifest. With a source, every
chunk is also compared byte for byte (decoded, if compressed) with the bytes of *each* rank
file that holds its slice (replicas included), one chunk in memory at a time.
"""
from __future__ import annotations

import os
from math import prod
from dataclasses import dataclass, field
from typing import Sequence

import numcodecs
import numcodecs.abc

from .backends.zarr_backend import numcodecs_codec
from .checksum import ShortFileError, crc32c_of
from .chunk_plan import plan_param as plan_chunks
from .ckpt_reader import CkptEntry, read_into
from .convert import resolve_source
from .errors import StoreCorruptError
from .manifest import ParamManifest
from .store import Store


@dataclass
class VerifyReport:
    """What was checked, and every problem found (empty when the store is good)."""

    params: int = 0
    chunks: int = 0
    bytes_checked: int = 0
    compared_with_source: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_store(store: Store, *, against: str | os.PathLike[str] | None = None,
                 strategy: Sequence[str | os.PathLike[str]] = (), step: int | None = None,
                 prefix: str | None = None) -> VerifyReport:
    """Check every chunk's checksum; with ``against`` (the source folder or file), also its bytes."""
    report = VerifyReport()
    for name in store.names():
        info = store.info(name)
        report.params += 1
        for i in range(len(info.chunks)):
            report.chunks += 1
            report.bytes_checked += info.chunks.nbytes[i]
            problem = _check_chunk(store, name, i)
            if problem:
                report.problems.append(problem)
    if against is not None:
        _compare_source(store, against, strategy, step, prefix, report)
    return report


def _check_chunk(store: Store, name: str, i: int) -> str | None:
    info = store.info(name)
    t = info.chunks
    path = store.root / t.files[i]
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return f"parameter {name!r}: chunk {i}: file {path} is missing"
    try:
        crc = crc32c_of(fd, info.chunk_pieces(i))
    except ShortFileError as e:
        return (f"parameter {name!r}: chunk {i}: file {path} ends at byte offset {e.at}, "
                f"expected {e.nbytes} bytes from offset {e.offset}")
    finally:
        os.close(fd)
    if crc != t.crc32c[i]:
        return (f"parameter {name!r}: chunk {i}: checksum mismatch in {path} at byte offset {t.offsets[i]} "
                f"({t.nbytes[i]} bytes)")
    return None


def _compare_source(store: Store, against: str | os.PathLike[str], strategy: Sequence[str | os.PathLike[str]],
                    step: int | None, prefix: str | None, report: VerifyReport) -> None:
    source = resolve_source(against, strategy, step=step, prefix=prefix)
    for name in store.names():
        info = store.info(name)
        if name not in source.params:
            report.problems.append(f"parameter {name!r} is in the store but not in the source")
            continue
        param = source.params[name]
        if info.is_str:
            report.compared_with_source += 1
            continue
        if tuple(param.shape) != info.shape:
            report.problems.append(f"parameter {name!r}: shape {list(info.shape)} in the store, "
                                   f"{list(param.shape)} in the source")
            continue
        plan = plan_chunks(param, max_chunk_bytes=max(1, _chunk_bytes(info)))
        codec = numcodecs_codec(info.codec)
        for chunk in plan.chunks:
            stored = _stored_chunk(store, name, chunk.index, codec)
            for rank, entry, path in zip(chunk.slice.ranks, chunk.slice.entries, chunk.slice.paths):
                if not _same_bytes(stored, path, entry, chunk.byte_start):
                    report.problems.append(
                        f"parameter {name!r}: chunk {chunk.index} differs from rank {rank} ({path})")
            report.compared_with_source += 1


def _chunk_bytes(info: ParamManifest) -> int:
    return prod(info.chunk_shape) * info.np_dtype.itemsize


def _stored_chunk(store: Store, name: str, i: int, codec: numcodecs.abc.Codec | None) -> bytes:
    info = store.info(name)
    t = info.chunks
    with open(store.root / t.files[i], "rb") as f:
        parts = []
        for offset, nbytes in info.chunk_pieces(i):
            f.seek(offset)
            parts.append(f.read(nbytes))
    data = b"".join(parts)
    if len(data) != t.nbytes[i]:
        raise StoreCorruptError(f"parameter {name!r}: chunk {i} is truncated in {store.root / t.files[i]}")
    return bytes(codec.decode(data)) if codec is not None else data


def _same_bytes(stored: bytes, path: str, entry: CkptEntry, start: int) -> bool:
    buf = bytearray(len(stored))
    fd = os.open(path, os.O_RDONLY)
    try:
        read_into(fd, entry.pieces, start, memoryview(buf), path=path, param=entry.name)
    finally:
        os.close(fd)
    return bytes(buf) == stored
