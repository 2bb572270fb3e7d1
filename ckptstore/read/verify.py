"""``ckptstore verify``: re-read a store and prove it is intact (and equal to its source).

Every chunk is read whole and its CRC-32C compared with the manifest. With a source, every
chunk is also compared byte for byte (decoded, if compressed) with the bytes of *each* rank
file that holds its slice (replicas included), one chunk in memory at a time.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from math import prod
from typing import Sequence

from ckptstore.store.checksum import crc32c_of
from ckptstore.store.chunking import plan_chunks
from ckptstore.formats.ckpt_reader import CkptEntry
from ckptstore.store.codecs import decode
from ckptstore.errors import AccessDeniedError, CkptStoreError, InvalidOptionError, StoreUnavailableError
from ckptstore.store.manifest import ParamManifest
from ckptstore.checkpoint.source import DistributedSource, resolve_source
from ckptstore.checkpoint.rank_bytes import RankFiles
from ckptstore.store.store import Store, StoreLike, store_argument


@dataclass
class VerifyReport:
    """What was checked, and every problem found (empty when the store is good)."""

    params: int = 0
    chunks: int = 0
    bytes_checked: int = 0
    #: chunks the store keeps no checksum of (an index made without ``--checksum``)
    without_checksum: int = 0
    compared_with_source: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(store: StoreLike, *, against: str | os.PathLike[str] | None = None,
           strategy: Sequence[str | os.PathLike[str]] = (), step: int | None = None,
           prefix: str | None = None, src_format: str | None = None) -> VerifyReport:
    """Check every chunk's checksum; with ``against`` (the source folder or file), also its bytes.

    ``store`` is a path, an ``s3://``/``obs://`` URL or a :class:`~ckptstore.store.store.Store`.
    ``strategy``, ``step``, ``prefix`` and ``src_format`` choose the source's files, so they need
    ``against`` (given alone, they are refused rather than ignored). Returns a
    :class:`VerifyReport`; problems are listed, not raised, so one run finds them all.
    """
    given = [n for n, v in (("strategy", strategy or None), ("step", step), ("prefix", prefix),
                            ("src_format", src_format)) if v is not None]
    if against is None and given:
        raise InvalidOptionError(f"{', '.join(n + '=' for n in given)} without against= (--against SRC): these pick "
                                 "the source files to compare the store with; pass the source too, or leave them out "
                                 "to check the checksums only")
    with store_argument(store) as st:
        return _verify(st, against, strategy, step, prefix, src_format)


def _verify(store: Store, against: str | os.PathLike[str] | None, strategy: Sequence[str | os.PathLike[str]],
            step: int | None, prefix: str | None, src_format: str | None) -> VerifyReport:
    report = VerifyReport()
    for name in store.names():
        info = store.info(name)
        report.params += 1
        for i in range(len(info.chunks)):
            report.chunks += 1
            if info.chunks.crc32c is None:
                report.without_checksum += 1
                continue
            report.bytes_checked += info.chunks.nbytes[i]
            problem = _check_chunk(store, info, i)
            if problem:
                report.problems.append(problem)
    if against is not None:
        _compare_source(store, against, strategy, step, prefix, src_format, report)
    return report


verify_store = verify


def _check_chunk(store: Store, info: ParamManifest, i: int) -> str | None:
    if info.chunks.crc32c is None:
        return None
    try:
        crc = crc32c_of(store.data.open, info.chunk_pieces(i))
    except (AccessDeniedError, StoreUnavailableError):
        raise  # the server refused or did not answer: nothing was checked, nothing is known wrong
    except CkptStoreError as e:
        return f"parameter {info.name!r}: chunk {i}: {e}"
    if crc != info.chunks.crc32c[i]:
        t = info.chunks
        return (f"parameter {info.name!r}: chunk {i}: checksum mismatch in {store.data.key_url(t.files[i])} at byte "
                f"offset {t.offsets[i]} ({t.nbytes[i]} bytes)")
    return None


def _compare_source(store: Store, against: str | os.PathLike[str], strategy: Sequence[str | os.PathLike[str]],
                    step: int | None, prefix: str | None, src_format: str | None, report: VerifyReport) -> None:
    # every byte of every replica is compared below, so no sampled layout check first
    source = resolve_source(against, strategy, step=step, prefix=prefix, check_layout=False, src_format=src_format)
    try:
        _compare_params(store, source, report)
    finally:
        source.close()


def _compare_params(store: Store, source: DistributedSource, report: VerifyReport) -> None:
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
        plan = plan_chunks(param, max_chunk_bytes=max(1, prod(info.chunk_shape) * info.np_dtype.itemsize))
        for chunk in plan.chunks:
            try:
                stored = _stored_chunk(store, info, chunk.index)
            except (AccessDeniedError, StoreUnavailableError):
                raise
            except CkptStoreError as e:
                report.problems.append(f"parameter {name!r}: chunk {chunk.index}: {e}")
                continue
            for rank, entry, path in zip(chunk.slice.ranks, chunk.slice.entries, chunk.slice.paths):
                if not _same_bytes(source.files, stored, path, entry, chunk.byte_start):
                    report.problems.append(
                        f"parameter {name!r}: chunk {chunk.index} differs from rank {rank} ({path})")
            report.compared_with_source += 1


def _stored_chunk(store: Store, info: ParamManifest, i: int) -> bytes:
    """Chunk ``i``'s bytes as the source holds them (decoded when compressed)."""
    pieces = info.chunk_pieces(i)
    buf = bytearray(sum(n for _, _, n in pieces))
    pos = 0
    for key, offset, nbytes in pieces:
        store.data.open(key).read_into(offset, memoryview(buf)[pos:pos + nbytes])
        pos += nbytes
    if info.codec is None:
        return bytes(buf)
    return bytes(decode(info.codec, buf, info.chunk_box(i).size * info.np_dtype.itemsize, info.name, i))


def _same_bytes(files: RankFiles, stored: bytes, path: str, entry: CkptEntry, start: int) -> bool:
    buf = bytearray(len(stored))
    files.read(path, entry, start, memoryview(buf))
    return bytes(buf) == stored
