"""A conversion's chunks read from the rank files: the source half of a conversion's writers.

A chunk's bytes are a contiguous range of one rank file's entry (see :mod:`ckptstore.write.chunk_plan`).
:class:`ChunkCopier` reads them a bounded block at a time, or small chunks in batches, through
the same read plan and executor as a load (:class:`~ckptstore.checkpoint.rank_bytes.RankFiles`),
counts progress, encodes with the store's codec and checks replicas; the kind writers
(:mod:`ckptstore.write.kinds`) place the bytes: the Zarr one through
:func:`~ckptstore.write.kinds.zarr.write_zarr_data`, the dense one at fixed offsets.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import crc32c
import numpy as np

from ckptstore.checkpoint.rank_bytes import RankFiles
from ckptstore.errors import ReplicaMismatchError
from ckptstore.formats.ckpt_reader import CkptEntry
from ckptstore.io.sink import SinkFile
from ckptstore.progress import Progress
from ckptstore.store.checksum import BLOCK, crc32c_read
from ckptstore.store.codecs import numcodecs_codec
from ckptstore.store.manifest import ChunkTable, ParamManifest
from ckptstore.write.chunk_plan import ChunkSource, ParamPlan
from ckptstore.write.journal import JournalEntry

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

    def reader(self, chunk: ChunkSource) -> Callable[[int, memoryview], None]:
        """``read(offset, view)`` of a raw chunk's bytes, from its rank file."""
        return self._reader(chunk.path, chunk.entry, chunk.byte_start)

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
        self.check_replicas(chunk, crc)
        return crc

    def streamed(self, chunk: ChunkSource, data: memoryview) -> int:
        """A raw chunk's CRC-32C, its bytes ``data`` (from :meth:`batches`) written or about to be
        sent on: counted as progress, and checked against its replicas."""
        crc = crc32c.crc32c(data)
        self.progress.add(len(data))
        self.check_replicas(chunk, crc)
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
        self.check_replicas(chunk, crc32c.crc32c(raw))
        # typed view: Blosc shuffles by the element size, as the array's zarr.json declares
        data = self._compressor.encode(np.frombuffer(raw, dtype=f"u{chunk.entry.dtype.itemsize}"))
        self.progress.add(chunk.nbytes)
        return bytes(data)

    def check_replicas(self, chunk: ChunkSource, crc: int) -> None:
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


def chunk_table(files: Sequence[str], entries: Sequence[JournalEntry], plan: ParamPlan) -> ChunkTable:
    """A parameter's chunk table from its chunks' entries (in chunk order) and the files holding them."""
    return ChunkTable(tuple(files), tuple(e.offset for e in entries), tuple(e.nbytes for e in entries),
                      tuple(e.crc for e in entries), tuple(e.rank for e in entries),
                      tuple(len(c.slice.ranks) for c in plan.chunks))
