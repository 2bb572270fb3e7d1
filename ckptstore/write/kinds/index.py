"""The writer of the ``index`` store kind (:mod:`ckptstore.store.kinds.index`): no data at all,
each chunk a list of byte ranges in the original rank files (optionally checksummed by reading
them once), ``ckptstore.json`` last."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import crc32c

from ckptstore.io import open_location
from ckptstore.io.sink import ByteSink
from ckptstore.store import index as ib
from ckptstore.store import zarr as zb
from ckptstore.store.manifest import ChunkTable, ParamManifest, StoreManifest, dtype_label
from ckptstore.store.work import CommitPlan
from ckptstore.write.chunk_plan import ParamPlan
from ckptstore.write.chunk_writer import ChunkCopier
from ckptstore.write.output_folder import Claim
from ckptstore.write.store_writer import StoreWriter


class IndexWriter(StoreWriter):
    """An index: each chunk is its slice's byte ranges in the rank file that holds it."""

    kind = "index"
    records_each = False  # a chunk table is computed from the headers in microseconds

    def __init__(self, hold: Claim, copier: ChunkCopier, plans: Sequence[ParamPlan], *, checksum: bool = True) -> None:
        super().__init__(hold, copier, plans)
        self.checksum = checksum
        self.source_root, self.keys = ib.common_folder([c.path for p in plans for c in p.chunks], self.sink.url)

    def _write(self, plan: ParamPlan) -> ParamManifest:
        p = plan.param
        files, offsets, nbytes, crcs, pieces = [], [], [], [], {}
        read = self.copier.batches(plan.chunks) if self.checksum else ((c, None) for c in plan.chunks)
        for c, raw in read:
            key = self.keys[c.path]
            parts = [(key, o, n) for o, n in c.entry.pieces] or [(key, 0, 0)]
            files.append(key)
            offsets.append(parts[0][1])
            nbytes.append(c.nbytes)
            if len(parts) > 1:
                pieces[c.index] = tuple(parts)
            crcs.append((self.copier.checksum(c) if raw is None else crc32c.crc32c(raw)) if self.checksum else 0)
            self.copier.count(written=1)
            self.copier.progress.add(c.nbytes)
        table = ChunkTable(tuple(files), tuple(offsets), tuple(nbytes), tuple(crcs) if self.checksum else None,
                           tuple(c.rank for c in plan.chunks), tuple(len(c.slice.ranks) for c in plan.chunks), pieces)
        return ParamManifest(p.name, zb.array_path(p.name), dtype_label(p.dtype), p.shape, plan.chunk_shape, table)

    @classmethod
    def commit(cls, sink: ByteSink, plan: CommitPlan, known: Mapping[str, ParamManifest]) -> StoreManifest:
        """An incremental step of ``save_rank`` is an index over files of its root: its commit
        checks the files it references (:func:`ckptstore.write.incremental.commit_incremental`)."""
        if plan.source.get("incremental"):
            from ckptstore.write.incremental import commit_incremental  # the save side, needed only here

            return commit_incremental(sink, plan)
        return super().commit(sink, plan, known)

    def extra(self) -> dict[str, Any]:
        return ib.extra_fields(self.sink.url, open_location(self.source_root), sorted(set(self.keys.values())))
