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
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Mapping, Sequence

import crc32c

from ckptstore.store.kinds import MANIFEST, ROOT_METADATA, WORK_DIR, store_kind
from ckptstore.store import index as ib
from ckptstore.store import safetensors as sb
from ckptstore.store import zarr as zb
from ckptstore.store.chunking import ParamPlan
from ckptstore.errors import CkptStoreError, IncompleteStoreError, InvalidOptionError
from ckptstore.store.manifest import ChunkTable, ParamManifest, StoreManifest, dtype_label
from ckptstore.io.sink import ByteSink, partial_key, write_error
from ckptstore.write.output_folder import Claim, drop_work
from ckptstore.write.parts import Part, assign
from ckptstore.io import open_location
from ckptstore.write.chunk_writer import (
    ChunkCopier,
    dense_manifest,
    dense_rows,
    str_manifest,
    stream_zarr_param,
    write_dense_param,
    write_zarr_param,
)

#: What every part of a conversion needs to commit it: written once, by the first part to start.
PLAN_FILE = f"{WORK_DIR}/plan.json"


def done_key(name: str) -> str:
    """Where the manifest of a finished parameter is recorded until the commit."""
    return f"{WORK_DIR}/done/{zb.array_path(name)}.json"


#: Records of a whole part's parameters at once (kinds whose parameters cost nothing to redo).
PART_RECORDS = f"{WORK_DIR}/done-parts"


def load_done(sink: ByteSink, name: str) -> ParamManifest | None:
    """The manifest an earlier run (or another part) recorded for a finished parameter, if any (a
    record that does not parse is ignored: the parameter is written again)."""
    try:
        raw = sink.read(done_key(name))
        return None if raw is None else ParamManifest.from_json(name, json.loads(raw))
    except (ValueError, RecursionError, CkptStoreError, OSError):
        return None


def _part_records(sink: ByteSink) -> dict[str, Any]:
    """Every parameter recorded by a part's batch record: ``{name: manifest JSON}``."""
    out: dict[str, Any] = {}
    for key in sink.keys(PART_RECORDS):
        try:
            doc = json.loads(sink.read(key) or b"{}")
        except (ValueError, RecursionError):
            continue
        if isinstance(doc, dict):
            out.update(doc)
    return out


class StoreWriter:
    """Writes parameters (shared by the worker threads), remembering finished ones for a rerun,
    and commits a store of its kind. Subclasses set :attr:`kind` and write one parameter in
    :meth:`_write`; they write only through the claim's :class:`~ckptstore.io.sink.ByteSink`."""

    #: The store kind (the manifest's ``kind``) this writer makes.
    kind = ""
    #: Whether each finished parameter is recorded at once (so a rerun skips it); a kind whose
    #: parameters cost nothing to redo records a part's parameters together at its end instead.
    records_each = True

    def __init__(self, hold: Claim, copier: ChunkCopier, plans: Sequence[ParamPlan], *, checksum: bool = True) -> None:
        self.hold, self.sink, self.copier = hold, hold.sink, copier
        # what earlier runs recorded, listed once (not looked up with one failed open per parameter)
        self._recorded = set(self.sink.keys(f"{WORK_DIR}/done")) if self.records_each else set()

    def write_param(self, plan: ParamPlan) -> ParamManifest:
        name = plan.param.name
        if not self.records_each:
            manifest = str_manifest(plan, zb.array_path(name), self.copier) if plan.param.is_str else self._write(plan)
            self.copier.progress.add(0, 1)
            return manifest
        finished = load_done(self.sink, name) if done_key(name) in self._recorded else None
        if finished is not None and self._still_there(finished):
            self._resumed(finished)
            self.copier.count(resumed=len(plan.chunks), params_resumed=1)
            self.copier.progress.add(plan.nbytes, 1)
            return finished
        try:
            manifest = str_manifest(plan, zb.array_path(name), self.copier) if plan.param.is_str else self._write(plan)
            self.sink.put(done_key(name), json.dumps(manifest.to_json()).encode(), durable=False)
        except OSError as e:
            raise write_error(e, self.sink.key_url(zb.array_path(name)), name) from e
        self.copier.progress.add(0, 1)
        return manifest

    def _still_there(self, finished: ParamManifest) -> bool:
        """A finished parameter is trusted only while its data files are there at their full size."""
        return True

    def _resumed(self, finished: ParamManifest) -> None:
        """A parameter an earlier run finished is kept: make its files durable now (that run
        may have died before it synced them)."""

    def _write(self, plan: ParamPlan) -> ParamManifest:
        raise NotImplementedError

    def prepare(self, plans: Sequence[ParamPlan]) -> None:
        """Get ready to write ``plans`` (this process's share)."""

    def units(self, plans: Sequence[ParamPlan]) -> list[list[ParamPlan]]:
        """The work units a conversion in parts deals out: one parameter each by default."""
        return [[p] for p in plans]

    def extra(self) -> dict[str, Any]:
        """Manifest fields this kind adds (an index's record of the rank files)."""
        return {}

    def finish_part(self, plans: Sequence[ParamPlan], done: Mapping[str, ParamManifest]) -> None:
        """Make this part's data final (before its marker says it is done)."""
        if not self.records_each and self.hold.part.count > 1:
            doc = {n: m.to_json() for n, m in done.items()}
            self.sink.put(f"{PART_RECORDS}/{self.hold.part.index}-of-{self.hold.part.count}.json",
                          json.dumps(doc).encode(), durable=False)

    # --- the commit ----------------------------------------------------------------------------

    @classmethod
    def commit(cls, sink: ByteSink, plan: Mapping[str, Any], known: Mapping[str, ParamManifest]) -> StoreManifest:
        """Make the store complete: every parameter's record, the data files final and durable,
        then the manifest, last; then drop the work folder."""
        manifest = StoreManifest(_collect(sink, plan, known), plan["source"], kind=plan["format"],
                                 extra=plan["extra"])
        cls.finish_store(sink, manifest)
        sink.sync()  # every data file and folder this process changed is durable before the manifest names them
        sink.put(*cls.manifest_file(manifest))
        sink.sync()
        drop_work(sink)
        return manifest

    @classmethod
    def finish_store(cls, sink: ByteSink, manifest: StoreManifest) -> None:
        """Make the data files final before the manifest is written (nothing, by default)."""

    @classmethod
    def manifest_file(cls, manifest: StoreManifest) -> tuple[str, bytes]:
        """The key and bytes of the file that makes the store complete: the manifest as JSON, in
        the file the kind declares (``ckptstore.json`` unless it says otherwise)."""
        kind = store_kind(manifest.kind)
        return (kind.manifest_file if kind is not None else MANIFEST), manifest.dumps().encode()


def _collect(sink: ByteSink, plan: Mapping[str, Any], known: Mapping[str, ParamManifest]) -> dict[str, ParamManifest]:
    """Every parameter's manifest, from ``known`` or the records in the work folder."""
    names = plan["names"]
    have = dict(known)
    todo = [n for n in names if n not in have]
    batched = _part_records(sink) if todo else {}
    found: dict[str, ParamManifest | None] = {}
    for n in [n for n in todo if n in batched]:
        try:
            found[n] = ParamManifest.from_json(n, batched[n])
        except CkptStoreError:
            found[n] = None
    todo = [n for n in todo if n not in found]
    with ThreadPoolExecutor(sink.record_workers) as pool:
        found.update(zip(todo, pool.map(lambda n: load_done(sink, n), todo)))
    lost = [n for n, m in found.items() if m is None]
    if lost:
        raise IncompleteStoreError(_unfinished(sink, int(plan.get("parts") or 1), lost, len(names)))
    for n, m in found.items():
        if m is not None:
            have[n] = m
    return {n: have[n] for n in names}


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


def _unfinished(sink: ByteSink, count: int, lost: Sequence[str], total: int) -> str:
    """Why a commit cannot complete the store: the parts that have not finished (what a user
    reruns), else the parameters not written yet."""
    written = f"{total - len(lost)} of {total} parameters written"
    if count == 1:
        return (f"the conversion into {sink.url} is not finished ({written}): it was interrupted; run the same "
                "'ckptstore convert' command again to finish it")
    running = [i for i in range(count) if sink.size(Part(i, count).marker) is None]
    if running:
        shown = ", ".join(map(str, running[:20])) + (" ..." if len(running) > 20 else "")
        return (f"the conversion into {sink.url} is not finished ({written}): part(s) {shown} of {count} have not "
                f"finished; run (or rerun) them (convert --part I/{count}), then commit")
    return (f"the conversion into {sink.url} is not finished: parameter {lost[0]!r}"
            f"{f' (and {len(lost) - 1} more)' if len(lost) > 1 else ''} not written yet; "
            "run (or rerun) the parts that convert them, then commit")


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
        for f, o, n in zip(finished.chunks.files, finished.chunks.offsets, finished.chunks.nbytes):
            sizes[f] = max(sizes.get(f, 0), o + n)
        return all((self.sink.size(f) or 0) >= n for f, n in sizes.items())

    def _resumed(self, finished: ParamManifest) -> None:
        self.sink.make_durable([f"{finished.path}/{ROOT_METADATA}", *sorted(set(finished.chunks.files))])

    @classmethod
    def manifest_file(cls, manifest: StoreManifest) -> tuple[str, bytes]:
        return ROOT_METADATA, zb.group_metadata({"ckptstore": manifest.to_json()})


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
                self.sink.delete([self._journal(slot.name) for slot in f.slots])

    def _journal(self, name: str) -> str:
        return f"{WORK_DIR}/journal/{zb.array_path(name)}.journal"

    def _write(self, plan: ParamPlan) -> ParamManifest:
        slot = self.slots[plan.param.name]
        if self.sink.seekable:
            return write_dense_param(plan, slot, self.sink, self._journal(slot.name), self.copier)
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

    def extra(self) -> dict[str, Any]:
        return ib.extra_fields(self.sink.url, open_location(self.source_root), sorted(set(self.keys.values())))

