"""The one commit protocol of a store written in parts: conversion parts and save ranks alike.

Every part claims the store for one attempt (:func:`~ckptstore.write.output_folder.claim`),
writes the same commit plan (:class:`~ckptstore.store.work.CommitPlan`, with
:func:`~ckptstore.store.work.write_commit_plan`) before its data, its records, and a marker
holding the attempt's fingerprint when they are durable (:func:`mark_done`); the last part to
finish commits (:func:`commit_if_last`), and
:func:`commit` checks the markers (:func:`~ckptstore.store.work.unfinished_parts`) and hands the
rest to the writer of the plan's store kind
(:meth:`~ckptstore.write.store_writer.StoreWriter.commit`). The writer is found by the kind's
``writer=`` (:func:`writer_class`), so nothing here names a kind.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ckptstore.errors import IncompleteStoreError, InvalidOptionError
from ckptstore.io.sink import ByteSink
from ckptstore.store.kinds import store_kind
from ckptstore.store.manifest import ParamManifest, StoreManifest
from ckptstore.store.steps import step_name, step_source, steps
from ckptstore.store.work import (
    COMMIT_PLAN_FILE,
    DONE_DIR,
    RECORDS_DIR,
    CommitPlan,
    done_key,
    read_attempt,
    read_commit_plan,
    unfinished_parts,
    what_finishes,
)
from ckptstore.write.chunk_plan import ParamPlan
from ckptstore.write.chunk_writer import ChunkCopier
from ckptstore.write.output_folder import Claim, complete_manifest, drop_idle_work, lock_output
from ckptstore.write.parts import Part, assign
from ckptstore.write.records import write_record
from ckptstore.write.store_writer import StoreWriter


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
    return [p for u, o in zip(units, owner, strict=True) if o == part.index for p in u]


def mark_done(sink: ByteSink, part: Part, fingerprint: str, header: Mapping[str, Any],
              entries: Mapping[str, Any]) -> None:
    """Say that ``part`` has written all it writes: its record (``entries`` by parameter under
    the plan's ``header``, :func:`~ckptstore.write.records.write_record`), made durable with its
    data (the part that commits may run on another host), then its marker, which holds the
    attempt's ``fingerprint``. Every writer ends its part here: conversion parts, save ranks,
    ``index --name-map``."""
    write_record(sink, part, header, entries)
    sink.sync()
    sink.put(part.marker, fingerprint.encode())


def committed(sink: ByteSink, fingerprint: str) -> bool:
    """Whether ``sink`` holds a complete store of the attempt with ``fingerprint`` (its manifest's)."""
    manifest = complete_manifest(sink)
    return manifest is not None and manifest.get("source", {}).get("fingerprint") == fingerprint


def commit_if_last(hold: Claim, fingerprint: str, known: Mapping[str, ParamManifest] | None = None, *,
                   on_wait: Callable[[str], None] | None = None) -> StoreManifest | None:
    """Commit the store if every part of the attempt with ``fingerprint`` has finished (the
    fingerprint :func:`~ckptstore.write.output_folder.claim` was given); ``None`` when another
    part is still writing (the last one commits) or has committed already.

    One part: this process holds the folder's lock for its whole run and commits. Several: the
    folder's lock is taken, and which parts have finished is decided once, from one listing of
    the markers (a part that finishes while this one looks is the last then, and commits); a
    commit that fails because another committed meanwhile (object storage has no lock) is no
    error.
    """
    sink, part = hold.sink, hold.part
    if part.count == 1:
        return commit(sink, known, parts=1)
    lock = lock_output(sink, on_wait)
    try:
        if committed(sink, fingerprint):
            drop_idle_work(sink)
            return None
        if unfinished_parts(sink.source, part.count):
            return None  # another part is still writing: the last one commits
        try:
            return commit(sink, known, parts=part.count)
        except IncompleteStoreError:
            if committed(sink, fingerprint):  # another part committed meanwhile (object storage)
                return None
            raise
    finally:
        lock.release()


def _steps_to_commit(sink: ByteSink) -> str | None:
    """What to commit in a training folder (``ROOT`` holding ``step_<N>`` folders, no store of its
    own): a step folder, not the folder; ``None`` for any other folder."""
    held = steps(sink.source)
    if not held:
        return None
    unfinished = [s for s in held if read_attempt(step_source(sink.source, s)) is not None]
    if not unfinished:
        return f"{sink.url} is a folder of saved steps, none of them unfinished: nothing to commit"
    first = sink.source.key_url(step_name(unfinished[0]))
    return (f"{sink.url} is a folder of saved steps, not one store: commit one step folder ('ckptstore commit "
            f"{first}'; unfinished: step {', '.join(map(str, unfinished))}); 'ckptstore steps {sink.url}' says "
            "which ranks each is missing")


def commit(sink: ByteSink, known: Mapping[str, ParamManifest] | None = None, *,
           parts: int | None = None) -> StoreManifest:
    """Make the store complete from the work folder: every part's records, then the manifest last.

    ``known`` are manifests this process has in memory (the others are read from the records).
    The store is complete when every part of the plan's count has said it finished and every
    parameter has its record (a record is written after the parameter's data). The writer of
    the plan's store kind does the rest (:meth:`StoreWriter.commit`). Conversion parts and save
    ranks commit here alike. Raises :class:`~ckptstore.errors.IncompleteStoreError` naming what
    has not finished and what to run. Running it twice, or in two processes at once, writes the
    same manifest.
    """
    plan = read_commit_plan(sink)
    if plan is None:
        said = what_finishes(sink.source)
        if said is not None:  # a part's plan.json torn by a power loss: the next part writes it again
            raise IncompleteStoreError(f"{said} (its {COMMIT_PLAN_FILE} is missing or unreadable: the next part to "
                                       "run writes it again)")
        raise IncompleteStoreError(_steps_to_commit(sink) or f"{sink.url} has no unfinished conversion to commit "
                                   f"(no readable {COMMIT_PLAN_FILE}); run 'ckptstore convert' (again) first")
    count = parts or plan.parts
    # the markers tell which parts have not finished; for a conversion the message also counts
    # the parameters written so far (a save's ranks each hold some chunks of many parameters)
    if unfinished_parts(sink.source, count):
        detail = f"{_written(sink, plan)} of {len(plan.names)} parameters written" if plan.names else ""
        raise IncompleteStoreError(what_finishes(sink.source, detail) or f"{sink.url}: some of its {count} parts "
                                   "have not finished")
    return writer_class(plan.kind).commit(sink, plan, known or {})


def _written(sink: ByteSink, plan: CommitPlan) -> int:
    """How many of the plan's parameters the parts have written so far: those a finished part's
    record names, or a running part has noted done."""
    names = set(plan.names)
    done = {done_key(n) for n in names} & set(sink.keys(DONE_DIR))
    recorded: set[str] = set()
    for key in sink.keys(RECORDS_DIR):
        try:
            recorded.update(json.loads(sink.read(key) or b"{}").get("params", {}))
        except (ValueError, RecursionError, AttributeError, TypeError):
            continue
    return len(names & recorded) + len({n for n in names - recorded if done_key(n) in done})
