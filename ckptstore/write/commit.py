"""The commit protocol of a conversion: what it records before writing, which share each part
writes, how a part says it finished, and the commit that completes the store.

Every part writes the same plan (:data:`PLAN_FILE`: parameter order, header, kind, parts) before
its parameters, and a marker when they are durable (:func:`mark_done`); :func:`commit` checks the
markers and hands the rest to the writer of the plan's store kind
(:meth:`~ckptstore.write.store_writer.StoreWriter.commit`). The writer is found by the kind's
``writer=`` (:func:`writer_class`), so nothing here names a kind.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from ckptstore.store.kinds import WORK_DIR, store_kind
from ckptstore.store.chunking import ParamPlan
from ckptstore.errors import IncompleteStoreError, InvalidOptionError
from ckptstore.store.manifest import ParamManifest, StoreManifest
from ckptstore.io.sink import ByteSink
from ckptstore.write.output_folder import Claim
from ckptstore.write.parts import Part, assign
from ckptstore.write.chunk_writer import ChunkCopier
from ckptstore.write.store_writer import StoreWriter


#: What every part of a conversion needs to commit it: written once, by the first part to start.
PLAN_FILE = f"{WORK_DIR}/plan.json"


def writer_class(fmt: str) -> type[StoreWriter]:
    """The writer class of store kind ``fmt`` (a registered kind: see :mod:`ckptstore.store.kinds`)."""
    kind = store_kind(fmt)
    if kind is None:
        raise InvalidOptionError(f"no store kind {fmt!r} is registered")
    cls = kind.writer_class()
    if not (isinstance(cls, type) and issubclass(cls, StoreWriter)):
        raise InvalidOptionError(f"the writer of store kind {fmt!r} ({kind.writer!r}) is not a StoreWriter")
    return cls


def writer_for(fmt: str, hold: Claim, copier: ChunkCopier, plans: Sequence[ParamPlan], checksum: bool) -> StoreWriter:
    """The writer of store kind ``fmt``."""
    return writer_class(fmt)(hold, copier, plans, checksum=checksum)


def my_share(writer: StoreWriter, plans: Sequence[ParamPlan], part: Part) -> list[ParamPlan]:
    """The plans part ``part`` converts: its byte-balanced share of the writer's work units."""
    if part.count == 1:
        return list(plans)
    units = writer.units(plans)
    owner = assign([sum(p.nbytes for p in u) or 1 for u in units], part.count)
    return [p for u, o in zip(units, owner) if o == part.index for p in u]


def write_plan(sink: ByteSink, fmt: str, plans: Sequence[ParamPlan], header: Mapping[str, Any],
               extra: Mapping[str, Any], part: Part) -> None:
    """Record what the commit needs (parameter order, header, kind, parts), once per conversion.

    Every part writes the same document; one that an earlier run left torn (a power loss
    before it reached the disk) is written again.
    """
    doc = json.dumps({"format": fmt, "names": [p.param.name for p in plans], "source": dict(header),
                      "extra": dict(extra), "parts": part.count}).encode()
    if not sink.put_if_absent(PLAN_FILE, doc) and read_plan(sink) is None:
        sink.put(PLAN_FILE, doc)


def read_plan(sink: ByteSink) -> dict[str, Any] | None:
    """The conversion's plan, or ``None`` when there is none or it does not parse (a torn write)."""
    raw = sink.read(PLAN_FILE)
    try:
        doc = json.loads(raw) if raw is not None else None
    except (ValueError, RecursionError):
        return None
    ok = (isinstance(doc, dict) and isinstance(doc.get("format"), str) and store_kind(doc["format"]) is not None
          and isinstance(doc.get("names"), list)
          and all(isinstance(n, str) for n in doc["names"]) and isinstance(doc.get("source"), dict)
          and isinstance(doc.get("extra"), dict))
    return doc if ok else None


def mark_done(sink: ByteSink, part: Part, fingerprint: str) -> None:
    """Say that ``part`` has written all its parameters (after making them durable: the part
    that commits may run on another host)."""
    sink.sync()
    sink.put(part.marker, fingerprint.encode())


def commit(sink: ByteSink, known: Mapping[str, ParamManifest] | None = None, *,
           parts: int | None = None) -> StoreManifest:
    """Make the store complete from the work folder: every part's records, then the manifest last.

    ``known`` are manifests this process has in memory (the others are read from the records).
    The store is complete when every parameter has its record (a record is written after the
    parameter's data) and, with ``parts``, every part of that many has said it finished. The
    writer of the plan's store kind does the rest (:meth:`StoreWriter.commit`).
    Raises :class:`~ckptstore.errors.IncompleteStoreError` naming what has not finished.
    Running it twice, or in two processes at once, writes the same manifest.
    """
    plan = read_plan(sink)
    if plan is None:
        raise IncompleteStoreError(f"{sink.url} has no unfinished conversion to commit (no readable {PLAN_FILE}); "
                                   "run 'ckptstore convert' (again) first")
    count = parts or 1
    missing = [i for i in range(count) if sink.size(Part(i, count).marker) is None] if parts else []
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        raise IncompleteStoreError(f"the conversion into {sink.url} is not finished: part(s) {shown} of {count} "
                                   "have not finished; run them (convert --part I/N), then commit")
    return writer_class(plan["format"]).commit(sink, plan, known or {})
