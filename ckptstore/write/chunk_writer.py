"""Write one parameter's chunks into a store, resumably: the converter's I/O half.

A chunk's bytes are a contiguous range of one rank file's entry (see :mod:`ckptstore.store.chunking`).
They are read a bounded block at a time through the same read plan and executor as a load
(:class:`~ckptstore.checkpoint.rank_bytes.RankFiles`), checksummed (CRC-32C), and *placed*: a Zarr parameter appends
chunks one after another to its data file (``offset`` grows); a dense (safetensors) parameter
scatters each chunk's rows into the whole tensor at fixed positions. After each chunk, a journal
line records it; a rerun verifies journalled chunks against their checksum and continues after
the last good one.
"""
from __future__ import annotations

import threading
from math import prod
from typing import Any, Callable, Iterator, Mapping, Sequence

import crc32c
import numpy as np

from ckptstore.store.kinds import ROOT_METADATA
from ckptstore.store import zarr as zb
from ckptstore.store.checksum import BLOCK, crc32c_read, read_blocks
from ckptstore.store.codecs import numcodecs_codec
from ckptstore.store.safetensors import TensorSlot
from ckptstore.boxes import Box, byte_pieces
from ckptstore.store.chunking import ChunkSource, ParamPlan
from ckptstore.formats.ckpt_reader import CkptEntry
from ckptstore.errors import ReplicaMismatchError
from ckptstore.io.sink import ByteSink, SinkFile
from ckptstore.write.journal import JournalEntry, JournalWriter, good_prefix, journal_key, read_journal
from ckptstore.store.manifest import ChunkTable, ParamManifest, dtype_label
from ckptstore.progress import Progress
from ckptstore.checkpoint.rank_bytes import RankFiles

Pieces = list[tuple[int, int]]  # (file offset, length) in chunk byte order

#: Most bytes of small chunks read together (one plan, one buffer per thread): enough that planning
#: costs little beside the reads of a parameter's many tiny slices, small enough that the buffer
#: stays in a core's cache while each chunk is checksummed and written (a 4 MiB batch was out of
#: cache by then: CRC-32C cost +28% for the same bytes). Larger chunks are read one at a time.
BATCH = 256 << 10


def _scatter(f: SinkFile, view: memoryview, start: int, pieces: Pieces) -> None:
    """Write ``view`` (chunk bytes ``[start, start+len)``) to where ``pieces`` put them."""
    end, pos = start + len(view), 0
    for off, length in pieces:
        lo, hi = max(start, pos), min(end, pos + length)
        if lo < hi:
            f.pwrite(view[lo - start:hi - start], off + lo - pos)
        pos += length
        if pos >= end:
            break


class ChunkCopier:
    """Streams chunks from rank files to store files; shared by the worker threads."""

    def __init__(self, codec: Mapping[str, Any] | None, verify_replicas: bool, progress: Progress,
                 files: RankFiles) -> None:
        self.codec = codec
        self.files = files
        self._local = threading.local()
        self._compressor = numcodecs_codec(codec)
        self.verify_replicas = verify_replicas
        self.progress = progress
        self._lock = threading.Lock()
        self.chunks_written = self.chunks_resumed = self.params_resumed = 0

    def count(self, written: int = 0, resumed: int = 0, params_resumed: int = 0) -> None:
        with self._lock:
            self.chunks_written += written
            self.chunks_resumed += resumed
            self.params_resumed += params_resumed

    def _reader(self, path: str, entry: CkptEntry, start: int) -> Callable[[int, memoryview], None]:
        return lambda offset, view: self.files.read(path, entry, start + offset, view)

    def batches(self, chunks: Sequence[ChunkSource], *,
                fresh: bool = False) -> Iterator[tuple[ChunkSource, memoryview | None]]:
        """Each of ``chunks`` in order, with its bytes when it is at most a block
        (:data:`~ckptstore.store.checksum.BLOCK`), else ``None`` (read it a block at a time with
        :meth:`copy`, :meth:`blocks` or :meth:`checksum`).

        Consecutive chunks of one size that fit in :data:`BATCH` bytes together are read as one
        plan into one buffer: a parameter of many small slices costs one plan, not one per slice;
        a larger chunk is one plan of its own. The buffer is this thread's, reused (each view is
        valid until the next is taken; no allocation, zero-filling and page faults per chunk),
        unless ``fresh`` (a streamed upload may keep every block until it is sent).
        """
        i = 0
        while i < len(chunks):
            nbytes = chunks[i].nbytes
            if not 0 < nbytes <= BLOCK:
                yield chunks[i], None
                i += 1
                continue
            j = i + 1
            while j < len(chunks) and chunks[j].nbytes == nbytes and (j - i + 1) * nbytes <= BATCH:
                j += 1
            total = (j - i) * nbytes
            buf = memoryview(bytearray(total) if fresh else self._buffer(total))[:total]
            self.files.read_chunks([(c.path, c.entry, c.byte_start) for c in chunks[i:j]], nbytes, buf)
            for k in range(i, j):
                yield chunks[k], buf[(k - i) * nbytes:(k - i + 1) * nbytes]
            i = j

    def _buffer(self, nbytes: int) -> bytearray:
        buf = getattr(self._local, "buffer", None)
        if buf is None or len(buf) < nbytes:
            buf = self._local.buffer = bytearray(nbytes)
        return buf

    def place(self, chunk: ChunkSource, data: memoryview, f: SinkFile, pieces: Pieces) -> int:
        """Write a raw chunk's bytes ``data`` (from :meth:`batches`) to ``pieces`` of ``f``; return its CRC-32C."""
        _scatter(f, data, 0, pieces)
        return self.streamed(chunk, data)

    def copy(self, chunk: ChunkSource, f: SinkFile, pieces: Pieces) -> int:
        """Copy a raw chunk to ``pieces`` of ``f``; return its CRC-32C."""
        def place(offset: int, view: memoryview) -> None:
            _scatter(f, view, offset, pieces)
            self.progress.add(len(view))

        crc = crc32c_read(self._reader(chunk.path, chunk.entry, chunk.byte_start), chunk.nbytes, each=place)
        self._check_replicas(chunk, crc)
        return crc

    def blocks(self, chunk: ChunkSource, crc_out: list[int]) -> Any:
        """A raw chunk's bytes as fresh blocks (a streamed upload may keep each one until it is
        sent); its CRC-32C is left in ``crc_out[0]`` once the last block was taken."""
        crc = 0
        for view in read_blocks(self._reader(chunk.path, chunk.entry, chunk.byte_start), chunk.nbytes, fresh=True):
            crc = crc32c.crc32c(view, crc)
            self.progress.add(len(view))
            yield view
        self._check_replicas(chunk, crc)
        crc_out[0] = crc

    def streamed(self, chunk: ChunkSource, data: memoryview) -> int:
        """A raw chunk's CRC-32C, its bytes ``data`` (from :meth:`batches`) written or about to be
        sent on: counted as progress, and checked against its replicas."""
        crc = crc32c.crc32c(data)
        self.progress.add(len(data))
        self._check_replicas(chunk, crc)
        return crc

    def checksum(self, chunk: ChunkSource) -> int:
        """A raw chunk's CRC-32C, read from its rank file (an index's checksums)."""
        return crc32c_read(self._reader(chunk.path, chunk.entry, chunk.byte_start), chunk.nbytes)

    def compressed(self, chunk: ChunkSource, data: memoryview | None = None) -> bytes:
        """A chunk's bytes (``data`` when :meth:`batches` read them), encoded with the store's codec
        (one chunk in memory)."""
        raw: Any = data
        if raw is None:
            raw = bytearray(chunk.nbytes)
            self.files.read(chunk.path, chunk.entry, chunk.byte_start, memoryview(raw))
        self._check_replicas(chunk, crc32c.crc32c(raw))
        # typed view: Blosc shuffles by the element size, as the array's zarr.json declares
        data = self._compressor.encode(np.frombuffer(raw, dtype=f"u{chunk.entry.dtype.itemsize}"))
        self.progress.add(chunk.nbytes)
        return bytes(data)

    def _check_replicas(self, chunk: ChunkSource, crc: int) -> None:
        if not self.verify_replicas:
            return
        sl = chunk.slice
        for rank, entry, path in zip(sl.ranks[1:], sl.entries[1:], sl.paths[1:], strict=True):
            if crc32c_read(self._reader(path, entry, chunk.byte_start), chunk.nbytes) != crc:
                raise ReplicaMismatchError(
                    f"parameter {entry.name!r}: rank {rank} ({path}) holds different bytes "
                    f"from rank {chunk.rank} ({chunk.path}) for the replicated slice "
                    f"{list(sl.box.start)}..{list(sl.box.stop)}, chunk {chunk.index}")


def str_manifest(plan: ParamPlan, path: str, copier: ChunkCopier) -> ParamManifest:
    """A string parameter: its text lives in the manifest."""
    p = plan.param
    value = copier.files.read_str(p.slices[0].path, p.slices[0].entry)
    return ParamManifest(p.name, path, "str", (), (), ChunkTable((), (), (), (), (), ()), None, value)


def _resume(f: SinkFile, sink: ByteSink, key: str, pieces_of: Callable[[JournalEntry], Pieces]) -> list[JournalEntry]:
    """The chunks an earlier run wrote to ``f`` (data file ``key``) that its journal vouches for."""
    return good_prefix(f, read_journal(sink, journal_key(key)), pieces_of) if f.size else []


def _table(files: Sequence[str], entries: Sequence[JournalEntry], plan: ParamPlan) -> ChunkTable:
    return ChunkTable(tuple(files), tuple(e.offset for e in entries), tuple(e.nbytes for e in entries),
                      tuple(e.crc for e in entries), tuple(e.rank for e in entries),
                      tuple(len(c.slice.ranks) for c in plan.chunks))


def write_zarr_param(plan: ParamPlan, sink: ByteSink, path: str, copier: ChunkCopier) -> ParamManifest:
    """Write one parameter as a Zarr array at offsets of a resumable file: metadata, then its
    single chunk or shard file, each chunk journalled once written."""
    p = plan.param
    sink.put(f"{path}/{ROOT_METADATA}", zb.array_metadata(p.shape, dtype_label(p.dtype), plan.chunk_shape,
                                                          copier.codec, separator=zb.SEPARATOR))
    key = zb.chunk_key(path, len(p.shape), zb.SEPARATOR)
    f = sink.create(key, resume=True)
    try:
        entries = _resume(f, sink, key, lambda e: [(e.offset, e.nbytes)])
        copier.count(resumed=len(entries))
        copier.progress.add(sum(c.nbytes for c in plan.chunks[:len(entries)]))
        log = JournalWriter(sink, journal_key(key), entries)
        try:
            offset = entries[-1].offset + entries[-1].nbytes if entries else 0
            f.truncate(offset)
            for chunk, raw in copier.batches(plan.chunks[len(entries):]):
                if copier.codec is None:
                    crc = (copier.copy(chunk, f, [(offset, chunk.nbytes)]) if raw is None
                           else copier.place(chunk, raw, f, [(offset, chunk.nbytes)]))
                    nbytes = chunk.nbytes
                else:
                    data = copier.compressed(chunk, raw)
                    f.pwrite(data, offset)
                    crc, nbytes = crc32c.crc32c(data), len(data)
                entry = JournalEntry(chunk.index, offset, nbytes, crc, chunk.rank)
                log.append(entry)
                entries.append(entry)
                offset += nbytes
                copier.count(written=1)
            if zb.is_sharded(len(plan.chunks)):
                f.pwrite(zb.shard_index([e.offset for e in entries], [e.nbytes for e in entries]), offset)
        finally:
            log.close()
    finally:
        f.close()  # an interrupted file stays, with its journal, for the rerun to resume
    sink.publish(key)
    sink.delete([journal_key(key)])
    return ParamManifest(p.name, path, dtype_label(p.dtype), p.shape, plan.chunk_shape,
                         _table([key] * len(entries), entries, plan), copier.codec)


def stream_zarr_param(plan: ParamPlan, sink: ByteSink, path: str, copier: ChunkCopier) -> ParamManifest:
    """Write one parameter as a Zarr array into object storage: metadata, then its data object.

    The data object is one streamed (multipart) upload of the chunks in order, then the shard
    index; it becomes visible only when complete. An object upload cannot be resumed half way,
    so a rerun rewrites an unfinished parameter whole (finished ones are skipped).
    """
    p = plan.param
    sink.put(f"{path}/{ROOT_METADATA}", zb.array_metadata(p.shape, dtype_label(p.dtype), plan.chunk_shape,
                                                          copier.codec, separator=zb.SEPARATOR))
    key = zb.chunk_key(path, len(p.shape), zb.SEPARATOR)
    entries: list[JournalEntry] = []

    def pieces() -> Any:
        offset = 0
        for chunk, raw in copier.batches(plan.chunks, fresh=True):
            if copier.codec is None and raw is None:
                crc = [0]
                yield from copier.blocks(chunk, crc)
                crc_value, nbytes = crc[0], chunk.nbytes
            elif copier.codec is None and raw is not None:
                crc_value, nbytes = copier.streamed(chunk, raw), chunk.nbytes
                yield raw
            else:
                data = copier.compressed(chunk, raw)
                yield data
                crc_value, nbytes = crc32c.crc32c(data), len(data)
            entries.append(JournalEntry(chunk.index, offset, nbytes, crc_value, chunk.rank))
            offset += nbytes
            copier.count(written=1)
        if zb.is_sharded(len(plan.chunks)):
            yield zb.shard_index([e.offset for e in entries], [e.nbytes for e in entries])

    sink.put_stream(key, pieces())
    return ParamManifest(p.name, path, dtype_label(p.dtype), p.shape, plan.chunk_shape,
                         _table([key] * len(entries), entries, plan), copier.codec)


#: Bytes of one row block when a whole tensor is assembled in memory to be streamed out.
ROW_BLOCK = 64 << 20


def dense_rows(plan: ParamPlan, copier: ChunkCopier) -> Any:
    """A parameter's whole tensor in C order, assembled from its chunks a block of rows at a time.

    Rows ``[a, b)`` of a chunk are one contiguous run of its bytes, so each block reads one range
    per chunk it crosses; memory stays at one block (about :data:`ROW_BLOCK`, at least one row).
    Each chunk's CRC-32C is accumulated in its byte order; returns ``{chunk index: crc}`` once
    the generator is exhausted (as its ``StopIteration`` value).
    """
    p, chunks = plan.param, plan.chunks
    item = p.dtype.itemsize
    shape = tuple(p.shape) or (1,)  # a scalar is one row of one element
    row_bytes = prod(shape[1:]) * item
    starts = [c.box.start[0] if p.shape else 0 for c in chunks]
    stops = [c.box.stop[0] if p.shape else 1 for c in chunks]
    cuts = sorted({0, shape[0], *starts, *stops})
    step = max(1, ROW_BLOCK // max(1, row_bytes))
    crcs = {c.index: 0 for c in chunks}
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        for r0 in range(lo, hi, step):
            r1 = min(hi, r0 + step)
            block = np.empty((r1 - r0, *shape[1:], item), dtype=np.uint8)
            for c, c0, c1 in zip(chunks, starts, stops, strict=True):
                if c1 <= r0 or c0 >= r1:
                    continue
                inner = (c.box.shape[1:] if p.shape else ())
                chunk_row = prod(inner) * item
                part = bytearray((r1 - r0) * chunk_row)
                copier.files.read(c.path, c.entry, c.byte_start + (r0 - c0) * chunk_row, memoryview(part))
                crcs[c.index] = crc32c.crc32c(part, crcs[c.index])
                where = (tuple(slice(a, b) for a, b in zip(c.box.start[1:], c.box.stop[1:], strict=True))
                         if p.shape else ())
                block[(slice(None),) + where] = np.frombuffer(part, dtype=np.uint8).reshape((r1 - r0, *inner, item))
            copier.progress.add(block.nbytes)
            yield block.reshape(-1)
    for c in chunks:
        copier._check_replicas(c, crcs[c.index])
    return crcs


def dense_manifest(plan: ParamPlan, slot: TensorSlot, crcs: Mapping[int, int]) -> ParamManifest:
    """The manifest of a parameter written whole into ``slot`` of a safetensors file."""
    p = plan.param
    whole = Box.full(p.shape)
    entries = [JournalEntry(c.index, byte_pieces(c.box, whole, p.dtype.itemsize, slot.data_offset)[0][0], c.nbytes,
                            crcs[c.index], c.rank) for c in plan.chunks]
    return ParamManifest(p.name, slot.file, dtype_label(p.dtype), p.shape, plan.chunk_shape,
                         _table([slot.file] * len(entries), entries, plan), None, None, "dense", slot.data_offset)


def write_dense_param(plan: ParamPlan, slot: TensorSlot, sink: ByteSink, journal: str,
                      copier: ChunkCopier) -> ParamManifest:
    """Fill one parameter's whole-tensor region of a (pre-sized) partial safetensors file."""
    p = plan.param
    item = p.dtype.itemsize
    whole = Box.full(p.shape)
    pieces = [byte_pieces(c.box, whole, item, slot.data_offset) for c in plan.chunks]
    f = sink.create(slot.file, resume=True)
    try:
        entries = good_prefix(f, read_journal(sink, journal), lambda e: pieces[e.index])
        copier.count(resumed=len(entries))
        copier.progress.add(sum(c.nbytes for c in plan.chunks[:len(entries)]))
        log = JournalWriter(sink, journal, entries)
        try:
            for chunk, raw in copier.batches(plan.chunks[len(entries):]):
                crc = (copier.copy(chunk, f, pieces[chunk.index]) if raw is None
                       else copier.place(chunk, raw, f, pieces[chunk.index]))
                entry = JournalEntry(chunk.index, pieces[chunk.index][0][0], chunk.nbytes, crc, chunk.rank)
                log.append(entry)
                entries.append(entry)
                copier.count(written=1)
        finally:
            log.close()
    finally:
        f.close()
    return ParamManifest(p.name, slot.file, dtype_label(p.dtype), p.shape, plan.chunk_shape,
                         _table([slot.file] * len(entries), entries, plan), None, None, "dense", slot.data_offset)
