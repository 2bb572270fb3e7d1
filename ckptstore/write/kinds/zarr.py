"""The writer of the ``zarr`` store kind (:mod:`ckptstore.store.kinds.zarr`): a Zarr v3 array per
parameter (one chunk or shard file each), the root ``zarr.json`` last.

:func:`write_zarr_data` is the one function that writes a Zarr data file (a chunk, or a shard
and its index), whatever its bytes come from, as DCP's ``WriteItem`` leaves the source to the
planner: a conversion hands it segments read from rank files (:class:`ZarrWriter`), a save
segments of the ranks' host arrays (:mod:`ckptstore.write.save`). It checksums each chunk,
places it at the file's next offset, and ends a shard with its index: at offsets of a resumable
file, each chunk journalled (a rerun continues after the last good one), or as one streamed
upload where the sink cannot write at offsets (and for a save, whose files are written whole).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from math import prod
from typing import Any

import crc32c

from ckptstore.io.sink import ByteSink
from ckptstore.store import zarr as zb
from ckptstore.store.checksum import read_blocks
from ckptstore.store.kinds import ROOT_METADATA
from ckptstore.store.manifest import ParamManifest, StoreManifest, dtype_label
from ckptstore.write.chunk_plan import ParamPlan
from ckptstore.write.chunk_writer import ChunkCopier, chunk_table
from ckptstore.write.journal import (
    JournalEntry,
    JournalWriter,
    good_prefix,
    journal_key,
    read_journal,
)
from ckptstore.write.store_writer import StoreWriter

#: A piece of one chunk's bytes, in the file's order: the chunk's index, the rank it comes from,
#: a buffer, and whether the buffer is the chunk's last.
Segment = tuple[int, int, Any, bool]

#: Zeros for an edge chunk's padding, handed out in slices of at most this (never changed, so a
#: sink may keep them until sent).
_ZEROS = bytes(1 << 20)


def write_zarr_data(sink: ByteSink, key: str, segments: Callable[[int], Iterable[Segment]], *,
                    shard_entries: int | None, resume: bool = False, durable: bool = True, fresh: bool = False,
                    on_chunk: Callable[[JournalEntry], None] | None = None, pad: int = 0) -> list[JournalEntry]:
    """Write the Zarr data file ``key``: the chunks of ``segments(n)`` one after another (``n``:
    how many chunks a resumed file holds already; they are not asked for again), then, unless
    ``shard_entries`` is ``None``, the shard index of that many entries (a shard at the array's
    edge holds fewer chunks). Returns each chunk's entry (index, offset, bytes, CRC-32C, rank)
    in file order; ``on_chunk`` sees each once it is finished (and journalled).

    ``resume``: written at offsets of ``<key>.partial``, each chunk journalled, continuing after
    the chunks an interrupted run left whose bytes still match; published when complete.
    Otherwise one streamed write that appears only complete (``durable=False``: the caller makes
    it durable later; ``fresh``: buffers are copied before they are handed on, for a sink that
    may keep them until sent). ``pad`` zero bytes follow the last chunk of an unsharded file
    (streamed only): the rest of an edge chunk, which Zarr reads at the full chunk shape; they
    belong to no chunk's size or CRC."""
    if resume:
        if pad:
            raise ValueError("a padded edge chunk is written streamed, not resumed")
        return _write_at_offsets(sink, key, segments, shard_entries, on_chunk)
    entries: list[JournalEntry] = []

    def pieces() -> Iterator[Any]:
        start = offset = crc = 0
        for index, rank, data, last in segments(0):
            view = memoryview(data).cast("B")
            crc = crc32c.crc32c(view, crc)
            offset += len(view)
            yield bytes(view) if fresh else view
            del view, data  # a staged buffer is freed before the next one is taken
            if last:
                entries.append(JournalEntry(index, start, offset - start, crc, rank))
                if on_chunk is not None:
                    on_chunk(entries[-1])
                start, crc = offset, 0
        for at in range(0, pad, len(_ZEROS)):
            yield _ZEROS[:min(len(_ZEROS), pad - at)]
        if shard_entries is not None:
            yield _index(entries, shard_entries)

    sink.put_stream(key, pieces(), durable=durable)
    return entries


def _write_at_offsets(sink: ByteSink, key: str, segments: Callable[[int], Iterable[Segment]],
                      shard_entries: int | None, on_chunk: Callable[[JournalEntry], None] | None) -> list[JournalEntry]:
    f = sink.create(key, resume=True)
    try:
        entries = good_prefix(f, read_journal(sink, journal_key(key)), lambda e: [(e.offset, e.nbytes)]) \
            if f.size else []
        log = JournalWriter(sink, journal_key(key), entries)
        try:
            start = offset = entries[-1].offset + entries[-1].nbytes if entries else 0
            f.truncate(offset)
            crc = 0
            for index, rank, data, last in segments(len(entries)):
                view = memoryview(data).cast("B")
                f.pwrite(view, offset)
                crc = crc32c.crc32c(view, crc)
                offset += len(view)
                if last:
                    entry = JournalEntry(index, start, offset - start, crc, rank)
                    log.append(entry)  # after its bytes: a journalled chunk is in the file
                    entries.append(entry)
                    if on_chunk is not None:
                        on_chunk(entry)
                    start, crc = offset, 0
            if shard_entries is not None:
                f.pwrite(_index(entries, shard_entries), offset)
        finally:
            log.close()
    finally:
        f.close()  # an interrupted file stays, with its journal, for the rerun to resume
    sink.publish(key)
    sink.delete([journal_key(key)])
    return entries


def _index(entries: list[JournalEntry], shard_entries: int) -> bytes:
    return zb.shard_index([e.offset for e in entries], [e.nbytes for e in entries], shard_entries)


class ZarrWriter(StoreWriter):
    """A Zarr v3 array per parameter: written at offsets of a resumable file where the sink
    allows it, else streamed whole (one upload per parameter); the root ``zarr.json`` last."""

    kind = "zarr"

    def _write(self, plan: ParamPlan) -> ParamManifest:
        p, copier, seekable = plan.param, self.copier, self.sink.seekable
        path = zb.array_path(p.name)
        self.sink.put(f"{path}/{ROOT_METADATA}", zb.array_metadata(p.shape, dtype_label(p.dtype), plan.chunk_shape,
                                                                   copier.codec, separator=zb.SEPARATOR))
        key = zb.chunk_key(path, len(p.shape), zb.SEPARATOR)
        by_index = {c.index: c for c in plan.chunks}

        def segments(done: int) -> Iterator[Segment]:
            if done:
                copier.count(resumed=done)
                copier.progress.add(sum(c.nbytes for c in plan.chunks[:done]))
            yield from _segments(plan, done, copier, fresh=not seekable)

        def finished(entry: JournalEntry) -> None:
            if copier.codec is None:  # a compressed chunk's raw bytes were checked as it was encoded
                copier.check_replicas(by_index[entry.index], entry.crc)
            copier.count(written=1)

        entries = write_zarr_data(self.sink, key, segments, resume=seekable, on_chunk=finished,
                                  shard_entries=len(plan.chunks) if zb.is_sharded(len(plan.chunks)) else None)
        return ParamManifest(p.name, path, dtype_label(p.dtype), p.shape, plan.chunk_shape,
                             chunk_table([key] * len(entries), entries, plan), copier.codec)

    def _still_there(self, finished: ParamManifest) -> bool:
        sizes: dict[str, int] = {}
        for f, o, n in zip(finished.chunks.files, finished.chunks.offsets, finished.chunks.nbytes, strict=True):
            sizes[f] = max(sizes.get(f, 0), o + n)
        return all((self.sink.size(f) or 0) >= n for f, n in sizes.items())

    def _resumed(self, finished: ParamManifest) -> None:
        self.sink.make_durable([f"{finished.path}/{ROOT_METADATA}", *sorted(set(finished.chunks.files))])

    @classmethod
    def finish_store(cls, sink: ByteSink, manifest: StoreManifest) -> None:
        """Give every array without data its ``zarr.json`` (a zero-size parameter: no rank of a
        save writes a chunk of it, so none wrote its metadata), so zarr-python reads the store whole."""
        for p in manifest.params.values():
            key = f"{p.path}/{ROOT_METADATA}"
            if not p.is_str and prod(p.shape) == 0 and sink.size(key) is None:
                sink.put(key, zb.raw_array_metadata(p.shape, p.dtype, p.chunk_shape, zb.SEPARATOR), durable=False)

    @classmethod
    def manifest_file(cls, manifest: StoreManifest) -> tuple[str, bytes]:
        return ROOT_METADATA, zb.group_metadata({"ckptstore": manifest.to_json()})


def _segments(plan: ParamPlan, done: int, copier: ChunkCopier, *, fresh: bool) -> Iterator[Segment]:
    """The bytes of a conversion's chunks from ``done`` on, read from the rank files: small chunks
    in batches (:meth:`ChunkCopier.batches`), a large one a block at a time, each encoded whole
    with the store's codec if it has one (one chunk in memory). ``fresh``: new buffers (a
    streamed upload may keep them until sent)."""
    for chunk, raw in copier.batches(plan.chunks[done:], fresh=fresh):
        if copier.codec is not None:
            yield chunk.index, chunk.rank, copier.compressed(chunk, raw), True
        elif raw is not None:
            copier.progress.add(len(raw))
            yield chunk.index, chunk.rank, raw, True
        elif chunk.nbytes == 0:
            yield chunk.index, chunk.rank, b"", True
        else:
            left = chunk.nbytes
            for view in read_blocks(copier.reader(chunk), chunk.nbytes, fresh=fresh):
                left -= len(view)
                copier.progress.add(len(view))
                yield chunk.index, chunk.rank, view, left == 0
