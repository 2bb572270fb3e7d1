"""The writer of the ``safetensors`` store kind (:mod:`ckptstore.store.kinds.safetensors`): whole
global tensors in pre-sized ``model-*.safetensors`` files, ``ckptstore.json`` last."""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Mapping, Sequence

from ckptstore.store import safetensors as sb
from ckptstore.store.chunking import ParamPlan
from ckptstore.store.manifest import ParamManifest, StoreManifest
from ckptstore.io.sink import partial_key
from ckptstore.write.output_folder import Claim
from ckptstore.write.chunk_writer import ChunkCopier, dense_manifest, dense_rows, write_dense_param
from ckptstore.store.work import dense_journal_key, done_key
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
            if mine:
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
