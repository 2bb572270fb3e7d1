"""The record a save rank leaves for the commit, and the merge of every rank's record into the
step's manifest.

A conversion's part records whole parameters (:mod:`ckptstore.write.store_writer`); a save rank
writes *chunks* of parameters that other ranks also hold, so it records, for every parameter it
holds, the chunks it wrote (index, offset in its slice's file, bytes, CRC-32C) in
``.ckptstore-work/saved/<rank>-of-<world>.json`` (:func:`~ckptstore.store.work.save_record_key`). The commit (:meth:`StoreWriter.commit
<ckptstore.write.store_writer.StoreWriter.commit>` for a plan whose ``records`` is ``"ranks"``)
merges the records of one attempt: a record whose header is not the plan's (another attempt,
another world size, strategy or chunk size) is refused.
"""
from __future__ import annotations

import json
from math import prod
from typing import Any, Mapping, Sequence

from ckptstore.errors import IncompleteStoreError, LayoutMismatchError
from ckptstore.io.sink import ByteSink
from ckptstore.store import zarr as zb
from ckptstore.store.manifest import ChunkTable, ParamManifest
from ckptstore.store.work import SAVE_RECORDS_DIR, CommitPlan, save_record_key


def recorded_files(sink: ByteSink, keys: Sequence[str]) -> list[str]:
    """The files named by the save ranks' records among ``keys`` (a listing of the store): what
    those ranks wrote (a record that does not parse names nothing)."""
    names = []
    for key in keys:
        if key.startswith(SAVE_RECORDS_DIR + "/"):
            try:
                record = json.loads(sink.read(key) or b"{}")
                names += [d["file"] for d in record["params"].values() if isinstance(d, dict) and "file" in d]
            except (ValueError, RecursionError, KeyError, TypeError, AttributeError):
                continue
    present = set(keys)
    return [n for n in names if isinstance(n, str) and n in present]


def read_records(sink: ByteSink, plan: CommitPlan) -> list[dict[str, Any]]:
    """Every rank's record, checked to belong to the plan's attempt (its header)."""
    header, world = plan.source, plan.parts
    records = []
    for i in range(world):
        raw = sink.read(save_record_key(i, world))
        try:
            record = json.loads(raw) if raw is not None else None
        except (ValueError, RecursionError):
            record = None
        if not isinstance(record, dict) or record.get("header") != header:
            raise IncompleteStoreError(f"step {header.get('step')} in {sink.url}: rank {i} finished but its record is "
                                       "missing or from another save attempt; save that rank again")
        records.append(record)
    return records


def merge_records(records: Sequence[Mapping[str, Any]], where: str) -> dict[str, ParamManifest]:
    """Every parameter's manifest from the ranks' records (in rank 0's order, then the others')."""
    merged: dict[str, dict[str, Any]] = {}
    for rec in records:
        rank = int(rec["rank"])
        for name, d in rec["params"].items():
            m = merged.setdefault(name, {"dtype": d["dtype"], "shape": d.get("shape"), "rank": rank, "chunks": {},
                                         "chunk_shape": None, "path": d.get("path"), "value": None})
            if (m["dtype"], m["shape"]) != (d["dtype"], d.get("shape")):
                raise LayoutMismatchError(
                    f"parameter {name!r} is {m['dtype']} {m['shape']} on rank {m['rank']} but {d['dtype']} "
                    f"{d.get('shape')} on rank {rank} (global shapes from each rank's slice and layout); the ranks "
                    "must save the same model with the same strategy")
            if "value" in d:
                m["value"] = d["value"]
            for index, offset, nbytes, crc in d.get("chunks", []):  # in the slice's one file
                if m["chunk_shape"] not in (None, d["chunk_shape"]):
                    raise LayoutMismatchError(f"parameter {name!r}: ranks cut it into chunks of different shapes")
                m["chunk_shape"] = d["chunk_shape"]
                m["chunks"][index] = (d["file"], offset, nbytes, crc, rank, d["replicas"])
    return {name: _param_manifest(name, m, where) for name, m in merged.items()}


def _param_manifest(name: str, m: Mapping[str, Any], where: str) -> ParamManifest:
    if m["dtype"] == "str":
        if m["value"] is None:
            raise IncompleteStoreError(f"{where}: no rank saved the value of {name!r}")
        return ParamManifest(name, zb.array_path(name), "str", (), (), ChunkTable((), (), (), (), (), ()), None,
                             m["value"])
    shape = tuple(m["shape"])
    if m["chunk_shape"] is None:
        if prod(shape) == 0:
            return ParamManifest(name, m["path"], m["dtype"], shape, tuple(max(s, 1) for s in shape),
                                 ChunkTable((), (), (), (), (), ()))
        raise IncompleteStoreError(f"{where}: no rank wrote parameter {name!r}; every rank of the stage that holds "
                                   "it (stage 0 for values outside the strategy) must pass it to save_rank")
    chunk_shape = tuple(m["chunk_shape"])
    n = prod(-(-s // c) for s, c in zip(shape, chunk_shape))
    chunks = m["chunks"]
    if sorted(chunks) != list(range(n)):
        lost = next(i for i in range(n) if i not in chunks)
        raise IncompleteStoreError(f"{where}: chunk {lost} of parameter {name!r} was written by no rank; every rank "
                                   "must save its slices of the same parameters")
    rows = [chunks[i] for i in range(n)]
    table = ChunkTable(*(tuple(r[k] for r in rows) for k in range(6)))
    manifest = ParamManifest(name, m["path"], m["dtype"], shape, chunk_shape, table)
    manifest.validate()
    return manifest
