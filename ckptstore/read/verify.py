"""``ckptstore verify``: re-read a store and prove it is intact (and equal to its source).

Every chunk is read whole and its CRC-32C compared with the manifest (the check a load with
``fallback=True`` makes of the chunks it reads: :func:`~ckptstore.store.fallback.chunk_problem`). A Zarr store is also
checked the way a Zarr reader (zarr-python, tensorstore) reads it, which is not through the
manifest: each array's ``zarr.json`` must cut it into the manifest's chunks, each chunk file must
be where its key says and of the size the manifest gives, and each shard's index (checked by its
CRC-32C) must point at the manifest's bytes, inside the file. With a source, every chunk is also
compared byte for byte (decoded, if compressed) with the bytes of *each* rank file that holds its
slice (replicas included), one chunk in memory at a time.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import prod

import crc32c as crc32c_lib

from ckptstore.checkpoint.rank_bytes import RankFiles
from ckptstore.checkpoint.source import DistributedSource, resolve_source
from ckptstore.errors import AccessDeniedError, CkptStoreError, InvalidOptionError, StoreUnavailableError
from ckptstore.formats.ckpt_reader import CkptEntry
from ckptstore.store.codecs import decode
from ckptstore.store.fallback import chunk_problem
from ckptstore.store.kinds import zarr as zarr_kind
from ckptstore.store.manifest import ParamManifest
from ckptstore.store.store import Store, StoreLike, store_argument
from ckptstore.store.zarr import EMPTY_ENTRY as _EMPTY
from ckptstore.store.zarr import grid_key


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
                report.without_checksum += 1  # (its bytes are still checked to lie within its files)
            else:
                report.bytes_checked += info.chunks.nbytes[i]
            problem = chunk_problem(store.data, info, i)
            if problem:
                report.problems.append(problem)
        if store.kind == "zarr" and len(info.chunks):
            report.problems += _zarr_layout_problems(store, info)
    if against is not None:
        _compare_source(store, against, strategy, step, prefix, src_format, report)
    return report


verify_store = verify


def _zarr_layout_problems(store: Store, info: ParamManifest) -> list[str]:
    """Where a Zarr reader of ``info``'s array would read other bytes than the manifest's chunks."""
    layout = zarr_kind.read_array_layout(store.data, info)
    if isinstance(layout, str):
        return [layout]
    problem = zarr_kind.layout_mismatch(store.data, info, layout)
    if problem is not None:
        return [problem]
    if layout.sharding is None:
        return _plain_chunk_problems(store, info, layout.separator)
    if layout.sharding.get("index_location", "end") != "end" or len(layout.sharding.get("index_codecs", [])) != 2:
        return []  # not a layout ckptstore writes; its chunks were checked through the manifest
    return _shard_problems(store, info, layout.grid_shape, layout.separator)


def _plain_chunk_problems(store: Store, info: ParamManifest, separator: str) -> list[str]:
    """Unsharded chunks: a Zarr reader reads file ``c.<i>.<j>`` whole as chunk ``(i, j)``."""
    problems = []
    t = info.chunks
    # an uncompressed chunk is read at the full chunk shape, an edge chunk's padding included
    full = prod(info.chunk_shape) * info.np_dtype.itemsize if info.codec is None else None
    for i, coords in enumerate(_c_order(info.grid)):
        key = grid_key(info.path, coords, separator)
        if (t.files[i], t.offsets[i]) != (key, 0) or i in t.pieces:
            problems.append(f"parameter {info.name!r}: chunk {i}: the manifest reads it from {t.files[i]} at byte "
                            f"{t.offsets[i]}, a Zarr reader from {key} whole")
            continue
        st = store.data.stat(key)
        size = t.nbytes[i] if full is None else full
        if st is None or st.size != size:
            problems.append(f"parameter {info.name!r}: chunk {i}: {store.data.key_url(key)} holds "
                            f"{'nothing' if st is None else f'{st.size} bytes'}, a Zarr reader reads {size} "
                            f"(the manifest's chunk: {t.nbytes[i]}); a Zarr reader reads the whole file")
    return problems


def _shard_problems(store: Store, info: ParamManifest, shard_shape: tuple[int, ...], separator: str) -> list[str]:
    """Each shard file's index (at its end: ``(offset, nbytes)`` per inner chunk, then a CRC-32C)
    must give the manifest's chunks, within the file."""
    per = tuple(s // c for s, c in zip(shard_shape, info.chunk_shape, strict=False))
    shards = tuple(-(-g // p) for g, p in zip(info.grid, per, strict=False))
    index_of = {coords: i for i, coords in enumerate(_c_order(info.grid))}
    t = info.chunks
    problems: list[str] = []
    for shard in _c_order(shards):
        key = grid_key(info.path, shard, separator)
        inside = [(i, c) for i, c in enumerate(_c_order(per))
                  if tuple(s * p + x for s, p, x in zip(shard, per, c, strict=False)) in index_of]
        n = prod(per)
        st = store.data.stat(key)
        index_bytes = 16 * n + 4
        if st is None or st.size < index_bytes:
            problems.append(f"parameter {info.name!r}: shard {key} is {'missing' if st is None else 'too short'} "
                            f"for its index of {n} chunk(s); a Zarr reader cannot read it")
            continue
        buf = bytearray(index_bytes)
        store.data.open(key).read_into(st.size - index_bytes, memoryview(buf))
        if crc32c_lib.crc32c(bytes(buf[:-4])) != struct.unpack("<I", buf[-4:])[0]:
            problems.append(f"parameter {info.name!r}: the index of shard {store.data.key_url(key)} fails its "
                            "checksum; a Zarr reader cannot read it")
            continue
        entries = struct.unpack(f"<{2 * n}Q", bytes(buf[:-4]))
        data_end = st.size - index_bytes
        for j, coords in inside:
            i = index_of[tuple(s * p + x for s, p, x in zip(shard, per, coords, strict=False))]
            offset, nbytes = entries[2 * j], entries[2 * j + 1]
            if (offset, nbytes) == (_EMPTY, _EMPTY):
                problems.append(f"parameter {info.name!r}: chunk {i}: the index of shard {key} says it is not "
                                "there, so a Zarr reader gives the fill value")
            elif offset + nbytes > data_end:
                problems.append(f"parameter {info.name!r}: chunk {i}: the index of shard {key} points past its "
                                f"data (bytes {offset}..{offset + nbytes} of {data_end}); a Zarr reader fails there")
            elif (key, offset, nbytes) != (t.files[i], t.offsets[i], t.nbytes[i]) or i in t.pieces:
                problems.append(f"parameter {info.name!r}: chunk {i}: the index of shard {key} gives bytes "
                                f"{offset}..{offset + nbytes}, the manifest {t.files[i]} bytes "
                                f"{t.offsets[i]}..{t.offsets[i] + t.nbytes[i]}: a Zarr reader reads other bytes")
    return problems


def _c_order(shape: Sequence[int]) -> list[tuple[int, ...]]:
    """Every coordinate of a grid of ``shape``, in C order."""
    import itertools

    return list(itertools.product(*(range(s) for s in shape)))


def _compare_source(store: Store, against: str | os.PathLike[str], strategy: Sequence[str | os.PathLike[str]],
                    step: int | None, prefix: str | None, src_format: str | None, report: VerifyReport) -> None:
    # every byte of every replica is compared below, so no sampled layout check first
    source = resolve_source(against, strategy, step=step, prefix=prefix, check_layout=False, src_format=src_format)
    try:
        _compare_params(store, source, report)
    finally:
        source.close()


def _compare_params(store: Store, source: DistributedSource, report: VerifyReport) -> None:
    # the conversion's chunk plan, imported on first use: reading or verifying a store alone imports no writer
    from ckptstore.write.chunk_plan import plan_chunks

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
            for rank, entry, path in zip(chunk.slice.ranks, chunk.slice.entries, chunk.slice.paths, strict=True):
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
