"""The one record form: what a part of a store wrote, for the commit.

Conversion parts and save ranks are parts alike (:mod:`ckptstore.write.commit`), and each leaves
one record, ``.ckptstore-work/records/<I>-of-<N>.json``
(:func:`~ckptstore.store.work.record_key`), before its marker: ``{"part", "parts", "header",
"params"}``, where ``header`` is the commit plan's ``source`` (the attempt included) and each
parameter's entry is its manifest entry (:meth:`ParamManifest.to_json
<ckptstore.store.manifest.ParamManifest.to_json>`) holding only the rows of the chunks this part
wrote, whose grid indices its chunk table's ``index`` column gives. A conversion part writes whole
parameters (every row); a save rank writes some chunks of parameters that other ranks also hold
(and names every parameter it holds, with the rows it wrote). The commit (:func:`read_records`,
:func:`merge_records`) merges the records of one attempt: a record whose header is not the
plan's (another attempt, world size, strategy or chunk size) is refused, every chunk MUST be
written by exactly one part, shapes and dtypes MUST agree.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from math import prod
from typing import Any

from ckptstore.errors import IncompleteStoreError, LayoutMismatchError
from ckptstore.io.sink import ByteSink
from ckptstore.store import zarr as zb
from ckptstore.store.manifest import ChunkTable, ParamManifest
from ckptstore.store.work import RECORDS_DIR, CommitPlan, record_key
from ckptstore.write.parts import Part

#: A chunk's row in a merged table: file, offset, bytes, CRC-32C, rank, replicas, pieces.
_Row = tuple[str, int, int, "int | None", int, int, "tuple[tuple[str, int, int], ...] | None"]


def whole_entry(manifest: ParamManifest) -> dict[str, Any]:
    """The record entry of a parameter written whole (every chunk: a conversion part's)."""
    entry = manifest.to_json()
    if "chunks" in entry:
        entry["chunks"]["index"] = list(range(len(manifest.chunks)))
    return entry


def write_record(sink: ByteSink, part: Part, header: Mapping[str, Any], entries: Mapping[str, Any]) -> None:
    """Record what ``part`` wrote (made durable with its marker, :func:`~ckptstore.write.commit.mark_done`)."""
    doc = {"part": part.index, "parts": part.count, "header": dict(header), "params": dict(entries)}
    sink.put(record_key(part.index, part.count), json.dumps(doc).encode(), durable=False)


def recorded_files(sink: ByteSink, keys: Sequence[str]) -> list[str]:
    """The files named by the records among ``keys`` (a listing of the store): what those parts
    wrote (a record that does not parse names nothing)."""
    names: list[Any] = []
    for key in keys:
        if key.startswith(RECORDS_DIR + "/"):
            try:
                record = json.loads(sink.read(key) or b"{}")
                names += [f for d in record["params"].values() if isinstance(d, dict)
                          for f in d.get("chunks", {}).get("files", [])]
            except (ValueError, RecursionError, KeyError, TypeError, AttributeError):
                continue
    present = set(keys)
    return [n for n in dict.fromkeys(names) if isinstance(n, str) and n in present]


def read_records(sink: ByteSink, plan: CommitPlan) -> list[dict[str, Any]]:
    """Every part's record, checked to belong to the plan's attempt (its header)."""
    records = []
    for i in range(plan.parts):
        raw = sink.read(record_key(i, plan.parts))
        try:
            record = json.loads(raw) if raw is not None else None
        except (ValueError, RecursionError):
            record = None
        if not isinstance(record, dict) or record.get("header") != plan.source or \
                not isinstance(record.get("params"), dict):
            if plan.records == "ranks":
                raise IncompleteStoreError(f"step {plan.source.get('step')} in {sink.url}: rank {i} finished but its "
                                           "record is missing or from another save attempt; save that rank again")
            raise IncompleteStoreError(f"{sink.url}: part {i} of {plan.parts} finished but its record is missing or "
                                       "from another conversion; rerun that part, then commit")
        records.append(record)
    return records


def merge_records(records: Sequence[Mapping[str, Any]], where: str, *, skip: Sequence[str] = (),
                  names: Sequence[str] = ()) -> dict[str, ParamManifest]:
    """Every parameter's manifest from the parts' records, but those in ``skip``: in the order of
    ``names`` when given (a conversion's plan), else in the first record's order, then the others'."""
    merged: dict[str, dict[str, Any]] = {}
    unwanted = set(skip)
    for rec in records:
        part = int(rec["part"])
        for name, d in rec["params"].items():
            if name in unwanted:
                continue
            m = merged.setdefault(name, {"entry": d, "part": part, "rows": {}, "chunk_shape": None, "value": None})
            first = m["entry"]
            if (first["dtype"], first.get("shape")) != (d["dtype"], d.get("shape")):
                raise LayoutMismatchError(
                    f"parameter {name!r} is {first['dtype']} {first.get('shape')} on rank {m['part']} but {d['dtype']} "
                    f"{d.get('shape')} on rank {part} (global shapes from each rank's slice and layout); the ranks "
                    "must save the same model with the same strategy")
            if "value" in d:
                m["value"] = d["value"]
            _add_rows(name, m, d)
    order = list(names) if names else list(merged)
    return {name: _param_manifest(name, merged[name], where) for name in order if name in merged}


def _add_rows(name: str, m: dict[str, Any], d: Mapping[str, Any]) -> None:
    table = d.get("chunks")
    if not table or not table.get("index"):
        return
    if m["chunk_shape"] not in (None, d["chunk_shape"]):
        raise LayoutMismatchError(f"parameter {name!r}: ranks cut it into chunks of different shapes")
    m["chunk_shape"] = d["chunk_shape"]
    files, crcs, pieces = table["files"], table.get("crc32c"), table.get("pieces") or {}
    for k, index in enumerate(table["index"]):
        extra = pieces.get(str(k))
        m["rows"][index] = (files[table["file"][k]], table["offset"][k], table["nbytes"][k],
                            None if crcs is None else crcs[k], table["rank"][k], table["replicas"][k],
                            None if extra is None else tuple((files[f], o, n) for f, o, n in extra))


def _param_manifest(name: str, m: Mapping[str, Any], where: str) -> ParamManifest:
    d = m["entry"]
    if d["dtype"] == "str":
        if m["value"] is None:
            raise IncompleteStoreError(f"{where}: no rank saved the value of {name!r}")
        return ParamManifest(name, d.get("path") or zb.array_path(name), "str", (), (),
                             ChunkTable((), (), (), (), (), ()), None, m["value"])
    shape = tuple(d["shape"])
    layout = {"layout": "dense", "data_offset": d.get("data_offset", 0)} if d.get("layout") == "dense" else {}
    if m["chunk_shape"] is None:
        if prod(shape) == 0:
            return ParamManifest(name, d["path"], d["dtype"], shape, tuple(d.get("chunk_shape") or
                                                                            (max(s, 1) for s in shape)),
                                 ChunkTable((), (), (), (), (), ()), d.get("codec"), **layout)
        raise IncompleteStoreError(f"{where}: no rank wrote parameter {name!r}; every rank of the stage that holds "
                                   "it (stage 0 for values outside the strategy) must pass it to save_rank")
    chunk_shape = tuple(m["chunk_shape"])
    n = prod(-(-s // c) for s, c in zip(shape, chunk_shape, strict=True))
    rows: dict[int, _Row] = m["rows"]
    if sorted(rows) != list(range(n)):
        lost = next(i for i in range(n) if i not in rows)
        raise IncompleteStoreError(f"{where}: chunk {lost} of parameter {name!r} was written by no rank; every rank "
                                   "must save its slices of the same parameters")
    ordered = [rows[i] for i in range(n)]
    crcs = [r[3] for r in ordered]
    table = ChunkTable(tuple(r[0] for r in ordered), tuple(r[1] for r in ordered), tuple(r[2] for r in ordered),
                       None if any(c is None for c in crcs) else tuple(crcs),  # type: ignore[arg-type]  # checked
                       tuple(r[4] for r in ordered), tuple(r[5] for r in ordered),
                       {i: r[6] for i, r in enumerate(ordered) if r[6] is not None})
    manifest = ParamManifest(name, d["path"], d["dtype"], shape, chunk_shape, table, d.get("codec"), **layout)
    manifest.validate()
    return manifest
