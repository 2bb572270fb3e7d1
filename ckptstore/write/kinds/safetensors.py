"""The writer of the ``safetensors`` store kind (:mod:`ckptstore.store.kinds.safetensors`): whole
global tensors in pre-sized ``model-*.safetensors`` files, ``ckptstore.json`` last.

A dense parameter scatters each chunk's rows into the whole tensor at fixed positions
(:func:`write_dense_param`, journalled per chunk), or, where the sink cannot write at offsets,
is assembled a block of rows at a time into one streamed file (:func:`dense_rows`)."""
from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from math import prod
from typing import Any

import crc32c
import numpy as np

from ckptstore.boxes import Box, byte_pieces
from ckptstore.io.sink import ByteSink, partial_key
from ckptstore.store import safetensors as sb
from ckptstore.store.manifest import ParamManifest, StoreManifest, dtype_label
from ckptstore.store.safetensors import TensorSlot
from ckptstore.store.work import dense_journal_key, done_key
from ckptstore.write.chunk_plan import ParamPlan
from ckptstore.write.chunk_writer import ChunkCopier, chunk_table
from ckptstore.write.journal import JournalEntry, JournalWriter, good_prefix, read_journal
from ckptstore.write.output_folder import Claim
from ckptstore.write.store_writer import StoreWriter


class SafetensorsWriter(StoreWriter):
    """Whole global tensors in pre-sized files, filled chunk by chunk where the sink writes at
    offsets (published at the commit); else each file is one streamed upload of its header and
    tensors, assembled a block of rows at a time."""

    kind = "safetensors"

    def __init__(self, hold: Claim, copier: ChunkCopier, plans: Sequence[ParamPlan], *, checksum: bool = True) -> None:
        super().__init__(hold, copier, plans)
        self.files = _layouts(plans)
        self.slots = {s.name: s for f in self.files for s in f.slots}
        self.plans = {p.param.name: p for p in plans}
        self._uploads: dict[str, Future[dict[str, ParamManifest]]] = {}
        self._lock = threading.Lock()

    def units(self, plans: Sequence[ParamPlan]) -> list[list[ParamPlan]]:
        by_name = {p.param.name: p for p in plans}
        in_files = [[by_name[s.name] for s in f.slots] for f in self.files]
        return in_files + [[p] for p in plans if p.param.is_str]

    def _files_of(self, plans: Sequence[ParamPlan]) -> list[sb.FileLayout]:
        names = {p.param.name for p in plans}
        return [f for f in self.files if any(s.name in names for s in f.slots)]

    def prepare(self, plans: Sequence[ParamPlan]) -> None:
        if not self.sink.seekable:
            return  # each file is streamed whole
        for f in self._files_of(plans):
            if not sb.reuse_file(self.sink, f):
                # a new (zero-filled) data file: nothing recorded for its tensors holds any more
                self.sink.delete([done_key(slot.name) for slot in f.slots])
                self.sink.delete([dense_journal_key(slot.name) for slot in f.slots])

    def _write(self, plan: ParamPlan) -> ParamManifest:
        slot = self.slots[plan.param.name]
        if self.sink.seekable:
            return write_dense_param(plan, slot, self.sink, dense_journal_key(slot.name), self.copier)
        return self._upload(slot.file)[slot.name]

    def _still_there(self, finished: ParamManifest) -> bool:
        if finished.is_str:
            return True
        layout = next(f for f in self.files if f.name == finished.path)
        return layout.size in (self.sink.size(layout.name), self.sink.size(partial_key(layout.name)))

    def _upload(self, name: str) -> dict[str, ParamManifest]:
        """Upload file ``name`` once (the first of its tensors' writers does it, the others wait)."""
        with self._lock:
            job = self._uploads.get(name)
            mine = job is None
            if job is None:
                job = self._uploads[name] = Future()
        if mine:
            try:
                job.set_result(self._stream_file(next(f for f in self.files if f.name == name)))
            except BaseException as e:
                job.set_exception(e)
        return job.result()

    def _stream_file(self, layout: sb.FileLayout) -> dict[str, ParamManifest]:
        crcs: dict[str, dict[int, int]] = {}

        def pieces() -> Any:
            yield layout.header
            for slot in layout.slots:
                crcs[slot.name] = yield from dense_rows(self.plans[slot.name], self.copier)
                self.copier.count(written=len(self.plans[slot.name].chunks))

        self.sink.put_stream(layout.name, pieces())
        return {s.name: dense_manifest(self.plans[s.name], s, crcs[s.name]) for s in layout.slots}

    def finish_part(self, plans: Sequence[ParamPlan], done: Mapping[str, ParamManifest]) -> None:
        if self.hold.part.count > 1:  # else the commit finishes every file
            for f in self._files_of(plans):
                sb.finish_file(self.sink, f)

    @classmethod
    def finish_store(cls, sink: ByteSink, manifest: StoreManifest) -> None:
        tensors = [(p.name, p.np_dtype, p.shape) for p in manifest.params.values() if not p.is_str]
        for f in sb.plan_files(tensors):
            sb.finish_file(sink, f)


def _layouts(plans: Sequence[ParamPlan]) -> list[sb.FileLayout]:
    return sb.plan_files([(p.param.name, p.param.dtype, p.param.shape) for p in plans if not p.param.is_str])


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
        copier.check_replicas(c, crcs[c.index])
    return crcs


def dense_manifest(plan: ParamPlan, slot: TensorSlot, crcs: Mapping[int, int]) -> ParamManifest:
    """The manifest of a parameter written whole into ``slot`` of a safetensors file."""
    p = plan.param
    whole = Box.full(p.shape)
    entries = [JournalEntry(c.index, byte_pieces(c.box, whole, p.dtype.itemsize, slot.data_offset)[0][0], c.nbytes,
                            crcs[c.index], c.rank) for c in plan.chunks]
    return ParamManifest(p.name, slot.file, dtype_label(p.dtype), p.shape, plan.chunk_shape,
                         chunk_table([slot.file] * len(entries), entries, plan), None, None, "dense", slot.data_offset)


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
                         chunk_table([slot.file] * len(entries), entries, plan), None, None, "dense", slot.data_offset)
