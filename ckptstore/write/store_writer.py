"""The base of every store kind's writer, and the records it keeps in the work folder.

A :class:`StoreWriter` writes parameters (shared by the worker threads: ``write_param`` per
parameter) and commits a store of its kind. A parameter finished by an earlier, interrupted run
is noted in the work folder (:func:`~ckptstore.store.work.done_key`) and skipped, while its
data files are still there at their full size. A part that has finished records what it wrote
in the one record form of save ranks and conversion parts (:mod:`ckptstore.write.records`);
everything becomes readable only at :meth:`StoreWriter.commit`, which merges those records. Each kind's writer is
one module of :mod:`ckptstore.write.kinds`; the conversion-wide protocol around it (the plan,
each part's share and marker, which writer commits) is :mod:`ckptstore.write.commit`.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ckptstore.errors import CkptStoreError, IncompleteStoreError
from ckptstore.io.sink import ByteSink, write_error
from ckptstore.store import zarr as zb
from ckptstore.store.kinds import MANIFEST, store_kind
from ckptstore.store.manifest import ParamManifest, StoreManifest
from ckptstore.store.versions import record_versions
from ckptstore.store.work import DONE_DIR, CommitPlan, done_key, unfinished_parts, what_finishes
from ckptstore.write.chunk_plan import ParamPlan
from ckptstore.write.chunk_writer import ChunkCopier, str_manifest
from ckptstore.write.output_folder import Claim, drop_work
from ckptstore.write.records import merge_records, read_records


def load_done(sink: ByteSink, name: str) -> ParamManifest | None:
    """The manifest an earlier run (or another part) recorded for a finished parameter, if any (a
    record that does not parse is ignored: the parameter is written again)."""
    try:
        raw = sink.read(done_key(name))
        return None if raw is None else ParamManifest.from_json(name, json.loads(raw))
    except (ValueError, RecursionError, CkptStoreError, OSError):
        return None


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
        self._recorded = set(self.sink.keys(DONE_DIR)) if self.records_each else set()

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
        """Make this part's data final (before its record and marker say it is done)."""

    # --- the commit ----------------------------------------------------------------------------

    @classmethod
    def commit(cls, sink: ByteSink, plan: CommitPlan, known: Mapping[str, ParamManifest]) -> StoreManifest:
        """Make the store complete: every parameter's record, the data files final and durable,
        then the manifest, last; then drop the work folder."""
        manifest = StoreManifest(_collect(sink, plan, known), dict(plan.source), kind=plan.kind, extra=dict(plan.extra))
        cls.finish_store(sink, manifest)
        sink.sync()  # every data file and folder this process changed is durable before the manifest names them
        manifest = record_versions(sink, manifest)  # objects' ETags, so readers pin them without a request
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


def _collect(sink: ByteSink, plan: CommitPlan, known: Mapping[str, ParamManifest]) -> dict[str, ParamManifest]:
    """Every parameter's manifest, from ``known`` (this process's, in memory) or the parts'
    records (:mod:`ckptstore.write.records`: the one form of conversion parts and save ranks),
    in the plan's order (a save's plan names none: its ranks' records give the order)."""
    have = dict(known)
    if plan.names and all(n in have for n in plan.names):
        return {n: have[n] for n in plan.names}
    merged = merge_records(read_records(sink, plan), sink.url, skip=list(have), names=plan.names)
    if not plan.names:
        return merged
    lost = [n for n in plan.names if n not in have and n not in merged]
    if lost:
        raise IncompleteStoreError(_unfinished(sink, plan.parts, lost, len(plan.names)))
    return {n: have[n] if n in have else merged[n] for n in plan.names}


def _unfinished(sink: ByteSink, count: int, lost: Sequence[str], total: int) -> str:
    """Why a commit cannot complete the store: the parts that have not finished (what a user
    reruns, :func:`~ckptstore.store.work.what_finishes`), else the parameters not written yet."""
    written = f"{total - len(lost)} of {total} parameters written"
    if count == 1 or unfinished_parts(sink.source, count):
        said = what_finishes(sink.source, written)
        if said is not None:
            return said
    return (f"the conversion into {sink.url} is not finished: parameter {lost[0]!r}"
            f"{f' (and {len(lost) - 1} more)' if len(lost) > 1 else ''} not written yet; "
            "run (or rerun) the parts that convert them, then commit")
