"""``ckptstore index HF_DIR --name-map RULES``: an index store over a Hugging Face folder.

Nothing is copied: the store is one ``ckptstore.json`` of the ``index`` kind whose chunks are
byte ranges of the folder's shards, its parameters named by a rule set
(:mod:`ckptstore.formats.hf_rules`). A renamed tensor is one chunk, the tensor's bytes; a fused
one (QKV, gate/up) is a *view*, an ordinary chunk table in the fused tensor's global frame whose
chunks are row blocks of its sources: along the fused axis each chunk is as long as the greatest
common divisor of the segments (:func:`~ckptstore.formats.hf_rules.segment_gcd`), so it lies
inside one source segment, and it spans whole trailing axes, so it is one contiguous range of
its source (with one row per leading index when the fused axis is not the first). A reader's
slice of a fused parameter then reads only the rows and columns it needs, like any store's.
The manifest records each shard's size, modification time and version, as any index does
(:mod:`ckptstore.store.index`), and the folder's ``config.json`` and the rule set, for export.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from math import prod
from typing import Any

import numpy as np

from ckptstore.checkpoint.selection import select_params
from ckptstore.errors import InvalidOptionError
from ckptstore.formats.hf_folder import HFFolder, read_hf_folder
from ckptstore.formats.hf_rules import NameMap, Target, load_name_map, segment_gcd
from ckptstore.io import open_location
from ckptstore.io.sink import open_sink
from ckptstore.store import index as ib
from ckptstore.store import zarr as zb
from ckptstore.store.manifest import ChunkTable, ParamManifest, dtype_label
from ckptstore.store.work import CommitPlan, write_commit_plan
from ckptstore.version import __version__
from ckptstore.write.commit import commit_if_last, mark_done
from ckptstore.write.output_folder import claim
from ckptstore.write.records import whole_entry
from ckptstore.write.summary import ConvertSummary

#: The manifest's ``source.format`` of an index over a Hugging Face folder.
SOURCE_FORMAT = "huggingface"


def view_manifest(target: Target, folder: HFFolder) -> ParamManifest:
    """The manifest of ``target`` (a rename or a fusion of the folder's tensors) as an index's
    chunk table: byte ranges of the source tensors, in the target's global frame."""
    infos = [folder.tensors[s].info for s in target.sources]
    files = [folder.tensors[s].file for s in target.sources]
    dtype, item = infos[0].dtype, infos[0].dtype.itemsize
    if not target.fused:
        shape = infos[0].shape
        chunk_shape = tuple(max(1, n) for n in shape)
        n = 0 if 0 in shape else 1
        table = ChunkTable((files[0],) * n, (infos[0].start,) * n, (infos[0].nbytes,) * n, None, (0,) * n, (1,) * n)
        return ParamManifest(target.name, zb.array_path(target.name), dtype_label(dtype), shape, chunk_shape, table)
    a = target.axis
    src_shape = infos[0].shape
    total = sum(target.sizes)
    shape = src_shape[:a] + (total,) + src_shape[a + 1:]
    run = segment_gcd(target.sizes, target.groups)
    inner = prod(shape[a + 1:])
    chunk_shape = (1,) * a + (run,) + tuple(max(1, n) for n in shape[a + 1:])
    lead = prod(shape[:a])
    if 0 in shape:
        empty = ChunkTable((), (), (), None, (), ())
        return ParamManifest(target.name, zb.array_path(target.name), dtype_label(dtype), shape, chunk_shape, empty)
    segs = target.segments()
    starts = [d for _, _, _, d in segs]
    # along the fused axis: chunk j starts at row j*run, inside segment k (source s, from row r)
    rows = np.arange(total // run, dtype=np.int64) * run
    k = np.searchsorted(np.asarray(starts, dtype=np.int64), rows, side="right") - 1
    seg = np.asarray(segs, dtype=np.int64).reshape(-1, 4)
    src, src_row = seg[k, 0], seg[k, 1] + rows - seg[k, 3]
    sizes = np.asarray(target.sizes, dtype=np.int64)
    begins = np.asarray([i.start for i in infos], dtype=np.int64)
    # C order over the grid: leading index (one chunk each) outer, the fused axis inner
    li = np.repeat(np.arange(lead, dtype=np.int64), len(rows))
    s_all, r_all = np.tile(src, lead), np.tile(src_row, lead)
    offsets = begins[s_all] + ((li * sizes[s_all] + r_all) * inner) * item
    nbytes = run * inner * item
    names = [files[i] for i in s_all.tolist()]
    count = len(names)
    table = ChunkTable(tuple(names), tuple(offsets.tolist()), (nbytes,) * count, None, (0,) * count, (1,) * count)
    return ParamManifest(target.name, zb.array_path(target.name), dtype_label(dtype), shape, chunk_shape, table)


def index_hf(src: str | os.PathLike[str], out: str | os.PathLike[str], *, name_map: str | os.PathLike[str] | NameMap,
             include: Sequence[str] = (), exclude: Sequence[str] = (), overwrite: bool = False,
             on_wait: Callable[[str], None] | None = None, quiet: bool = True) -> ConvertSummary:
    """Index the Hugging Face folder ``src`` (local or ``s3://``) into a store at ``out``, its
    tensors named by ``name_map`` (``"llama"``, ``"qwen2"``, ``"mcore"``, a rule file, or a
    parsed :class:`~ckptstore.formats.hf_rules.NameMap`); nothing is copied.

    ``include``/``exclude`` are globs over the *mapped* names. The store opens, reads, loads
    and plans like any other (:func:`ckptstore.open`, ``read_rank``, ``load_into_net``): a
    rank's slice of a fused parameter reads only its rows of the source tensors. As with every
    index, a shard changed after indexing is refused at open. A complete store of the same
    folder and rules is left as is; anything else at ``out`` needs ``overwrite``. Returns a
    :class:`~ckptstore.write.summary.ConvertSummary` (``stored_bytes``: the shard bytes referred to).
    """
    started = time.monotonic()
    rules = name_map if isinstance(name_map, NameMap) else load_name_map(name_map)
    source = open_location(os.fspath(src))
    folder = read_hf_folder(source)
    dtypes = {n: t.info.dtype for n, t in folder.tensors.items()}
    targets = rules.apply({n: t.info.shape for n, t in folder.tensors.items()}, folder.config, dtypes)
    if include or exclude:
        keep = set(select_params([t.name for t in targets], include=include, exclude=exclude))
        if include and not keep:
            raise InvalidOptionError(f"--include {' '.join(map(repr, include))} matches none of the "
                                     f"{len(targets)} mapped parameters")
        targets = [t for t in targets if t.name in keep]
    params = {t.name: view_manifest(t, folder) for t in targets}
    for p in params.values():
        p.validate()
    sink = open_sink(os.fspath(out))
    keys = sorted({f for p in params.values() for f in p.chunks.files})
    header = {"format": SOURCE_FORMAT, "world_size": 1, "folder": source.url, "name_map": rules.path,
              "hf_config": dict(folder.config), "strategy": None, "step": None, "integrated_save": True,
              "unsaved": [], "created_by": f"ckptstore {__version__}",
              "views": {t.name: {"sources": list(t.sources), "axis": t.axis, "groups": t.groups,
                                 "sizes": list(t.sizes), "rule": t.rule} for t in targets if t.fused}}
    extra = ib.extra_fields(sink.url, source, keys)
    what = {"files": extra[ib.SOURCE_FILES], "params": {n: p.to_json() for n, p in params.items()}, "header": header}
    fingerprint = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()
    header["fingerprint"] = fingerprint
    hold = claim(sink, fingerprint, overwrite=overwrite, on_wait=on_wait, writer="index",
                 sources=[source.key_url(f) for f in folder.files])
    try:
        if not hold.complete:  # the commit protocol of every writer, with nothing to write before the marker
            write_commit_plan(sink, CommitPlan("index", tuple(params), header, extra))
            mark_done(sink, hold.part, fingerprint, header, {n: whole_entry(p) for n, p in params.items()})
            commit_if_last(hold, fingerprint, params)
    finally:
        hold.release()
    referenced = sum(p.stored_bytes for p in params.values())
    chunks = sum(len(p.chunks) for p in params.values())
    done = hold.complete
    return ConvertSummary(store=sink.url, params=len(params), chunks=chunks, chunks_written=0 if done else chunks,
                          chunks_resumed=chunks if done else 0, params_resumed=len(params) if done else 0,
                          source_bytes=sum(t.info.nbytes for t in folder.tensors.values()), unique_bytes=referenced,
                          stored_bytes=referenced, seconds=round(time.monotonic() - started, 3),
                          already_complete=done)


def source_views(source: Mapping[str, Any]) -> Mapping[str, Any]:
    """The fused views an index over a Hugging Face folder records (name -> sources, axis, groups, sizes)."""
    views = source.get("views") if source.get("format") == SOURCE_FORMAT else None
    return views if isinstance(views, Mapping) else {}


__all__ = ["index_hf", "view_manifest"]

