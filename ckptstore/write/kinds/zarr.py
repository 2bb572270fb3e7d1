"""The writer of the ``zarr`` store kind (:mod:`ckptstore.store.kinds.zarr`): a Zarr v3 array per
parameter (one chunk or shard file each), the root ``zarr.json`` last."""
from __future__ import annotations

from math import prod

from ckptstore.io.sink import ByteSink
from ckptstore.store.kinds import ROOT_METADATA
from ckptstore.store import zarr as zb
from ckptstore.store.chunking import ParamPlan
from ckptstore.store.manifest import ParamManifest, StoreManifest
from ckptstore.write.chunk_writer import stream_zarr_param, write_zarr_param
from ckptstore.write.store_writer import StoreWriter


class ZarrWriter(StoreWriter):
    """A Zarr v3 array per parameter: written at offsets of a resumable file where the sink
    allows it, else streamed whole (one upload per parameter); the root ``zarr.json`` last."""

    kind = "zarr"

    def _write(self, plan: ParamPlan) -> ParamManifest:
        path = zb.array_path(plan.param.name)
        if self.sink.seekable:
            return write_zarr_param(plan, self.sink, path, self.copier)
        return stream_zarr_param(plan, self.sink, path, self.copier)

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
