"""How each kind of store is written: its parameters, then the commit that makes it complete.

* :class:`ZarrWriter`: a Zarr v3 array per parameter (one chunk or shard file each), the root
  ``zarr.json`` last;
* :class:`SafetensorsWriter`: whole global tensors in pre-sized ``model-*.safetensors`` files,
  ``ckptstore.json`` last;
* :class:`IndexWriter`: no data at all, each chunk a list of byte ranges in the original rank
  files (optionally checksummed by reading them once), ``ckptstore.json`` last.

Writers are shared by the worker threads (``write_param`` per parameter). A parameter finished
by an earlier, interrupted run is recorded in the work folder and skipped, while its data files
are still there at their full size; everything becomes readable only at :meth:`commit`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import crc32c

from .atomic_file import write_atomic
from .backends import MANIFEST, ROOT_METADATA
from .backends import index_backend as ib
from .backends import safetensors_backend as sb
from .backends import zarr_backend as zb
from .chunk_plan import ParamPlan
from .manifest import ChunkTable, ParamManifest, StoreManifest, dtype_label
from .output_folder import Claim, write_error
from .store_writer import BLOCK, ChunkCopier, load_done, str_manifest, write_dense_param, write_zarr_param

#: Test hook: SIGKILL this process at a named point ("commit": data files final, manifest not written).
KILL_AT_ENV = "CKPTSTORE_KILL_AT"


def _kill_point(name: str) -> None:
    if os.environ.get(KILL_AT_ENV) == name:
        os.kill(os.getpid(), 9)


class StoreWriter:
    """Writes parameters (shared by the worker threads), remembering finished ones for a rerun."""

    def __init__(self, hold: Claim, copier: ChunkCopier) -> None:
        self.hold, self.out, self.work, self.copier = hold, hold.out, hold.work, copier

    def _done_path(self, name: str) -> Path:
        return self.work / "done" / f"{zb.array_path(name)}.json"

    def write_param(self, plan: ParamPlan) -> ParamManifest:
        name = plan.param.name
        done = self._done_path(name)
        finished = load_done(done, name)
        if finished is not None and self._still_there(finished):
            self.copier.count(resumed=len(plan.chunks), params_resumed=1)
            self.copier.progress.add(plan.nbytes, 1)
            return finished
        try:
            manifest = str_manifest(plan, zb.array_path(name), self.copier) if plan.param.is_str else self._write(plan)
            write_atomic(done, json.dumps(manifest.to_json()).encode(), sync_folder=False)
        except OSError as e:
            raise write_error(e, self.out / zb.array_path(name), name) from e
        self.copier.progress.add(0, 1)
        return manifest

    def _still_there(self, finished: ParamManifest) -> bool:
        """A finished parameter is trusted only while its data files are there at their full size."""
        return True

    def _write(self, plan: ParamPlan) -> ParamManifest:
        raise NotImplementedError

    def extra(self) -> dict[str, Any]:
        """Manifest fields this kind adds (an index's record of the rank files)."""
        return {}

    def commit(self, manifest: StoreManifest) -> None:
        """Make the store complete: data files final and synced, the manifest last, the work folder gone."""
        raise NotImplementedError

    def _commit(self, name: str, data: bytes) -> None:
        try:
            os.sync()  # every data file's rename is durable before the manifest that names it
            _kill_point("commit")
            write_atomic(self.out / name, data)
        except OSError as e:
            raise write_error(e, self.out / name) from e
        self.hold.drop_work()


class ZarrWriter(StoreWriter):
    def _write(self, plan: ParamPlan) -> ParamManifest:
        return write_zarr_param(plan, self.out, zb.array_path(plan.param.name), self.copier)

    def _still_there(self, finished: ParamManifest) -> bool:
        if finished.is_str:
            return True
        sizes: dict[str, int] = {}
        for f, o, n in zip(finished.chunks.files, finished.chunks.offsets, finished.chunks.nbytes):
            sizes[f] = max(sizes.get(f, 0), o + n)
        return all((self.out / f).is_file() and (self.out / f).stat().st_size >= n for f, n in sizes.items())

    def commit(self, manifest: StoreManifest) -> None:
        self._commit(ROOT_METADATA, zb.group_metadata({"ckptstore": manifest.to_json()}))


class SafetensorsWriter(StoreWriter):
    def __init__(self, hold: Claim, copier: ChunkCopier, plans: Sequence[ParamPlan]) -> None:
        super().__init__(hold, copier)
        tensors = [(p.param.name, p.param.dtype, p.param.shape) for p in plans if not p.param.is_str]
        self.files = sb.plan_files(tensors)
        self.slots = {s.name: s for f in self.files for s in f.slots}
        try:
            for f in self.files:
                if not sb.reuse_file(self.out, f):
                    # a new (zero-filled) data file: nothing recorded for its tensors holds any more
                    for slot in f.slots:
                        self._done_path(slot.name).unlink(missing_ok=True)
                        self._journal(slot.name).unlink(missing_ok=True)
        except OSError as e:
            raise write_error(e, self.out) from e

    def _journal(self, name: str) -> Path:
        return self.work / "journal" / f"{zb.array_path(name)}.journal"

    def _write(self, plan: ParamPlan) -> ParamManifest:
        slot = self.slots[plan.param.name]
        return write_dense_param(plan, slot, sb.partial(self.out, slot.file), self._journal(slot.name), self.copier)

    def commit(self, manifest: StoreManifest) -> None:
        try:
            for f in self.files:
                sb.finish_file(self.out, f)
        except OSError as e:
            raise write_error(e, self.out) from e
        self._commit(MANIFEST, manifest.dumps().encode())




class IndexWriter(StoreWriter):
    """An index: each chunk is its slice's byte ranges in the rank file that holds it."""

    def __init__(self, hold: Claim, copier: ChunkCopier, plans: Sequence[ParamPlan], checksum: bool) -> None:
        super().__init__(hold, copier)
        self.checksum = checksum
        real = {c.path: os.path.realpath(c.path) for p in plans for c in p.chunks}
        # the rank files' folder: where they really are, so no key crosses a symbolic link
        self.source_root = Path(os.path.commonpath([os.path.dirname(r) for r in real.values()])) if real \
            else Path(hold.out)
        self.keys = {path: os.path.relpath(r, self.source_root) for path, r in real.items()}

    def _write(self, plan: ParamPlan) -> ParamManifest:
        p = plan.param
        files, offsets, nbytes, crcs, pieces = [], [], [], [], {}
        for c in plan.chunks:
            key = self.keys[c.path]
            parts = [(key, o, n) for o, n in c.entry.pieces] or [(key, 0, 0)]
            files.append(key)
            offsets.append(parts[0][1])
            nbytes.append(c.nbytes)
            if len(parts) > 1:
                pieces[c.index] = tuple(parts)
            crcs.append(self._crc(c) if self.checksum else 0)
            self.copier.count(written=1)
            self.copier.progress.add(c.nbytes)
        table = ChunkTable(tuple(files), tuple(offsets), tuple(nbytes), tuple(crcs) if self.checksum else None,
                           tuple(c.rank for c in plan.chunks), tuple(len(c.slice.ranks) for c in plan.chunks), pieces)
        return ParamManifest(p.name, zb.array_path(p.name), dtype_label(p.dtype), p.shape, plan.chunk_shape, table)

    def _crc(self, chunk: Any) -> int:
        buf = bytearray(min(BLOCK, chunk.nbytes))
        crc, done = 0, 0
        while done < chunk.nbytes:
            view = memoryview(buf)[:min(len(buf), chunk.nbytes - done)]
            self.copier.files.read(chunk.path, chunk.entry, chunk.byte_start + done, view)
            crc = crc32c.crc32c(view, crc)
            done += len(view)
        return crc

    def extra(self) -> dict[str, Any]:
        return ib.extra_fields(self.out, self.source_root, sorted(set(self.keys.values())))

    def commit(self, manifest: StoreManifest) -> None:
        self._commit(MANIFEST, manifest.dumps().encode())
