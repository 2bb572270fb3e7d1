"""Retention: which steps of a store root ckptstore saved (:func:`list_steps`, ``ckptstore steps``),
and deleting the old ones.

A store root (``save_rank``'s and ``StoreCheckpoint``'s ``ROOT``) holds ``step_<N>`` folders,
but the folder is the user's: other tools write beside ckptstore (``ROOT/step_1/eval_results.txt``)
and a ``step_0`` may be another tool's altogether. So retention deletes

* only steps ckptstore wrote: committed ones (their manifest says so) and unfinished saves whose
  work folder is ckptstore's (it holds the fingerprint a writer claims the folder with);
* and in them only the files ckptstore wrote: the manifest and the files it names, each array's
  ``zarr.json``, the work folder, and, in an unfinished save, the chunk files (``c.<i>...``,
  and their ``.partial``/``.journal``) of the arrays its ranks' records name.

Everything else stays, and is listed in the returned :class:`Removed` (and a warning), with the
folder kept around it. The manifest goes first, so a reader never finds a committed step with
chunks missing; a step whose work folder is locked (a rank is saving it now) is not touched.

Incremental steps (:mod:`ckptstore.write.incremental`) name files of earlier steps. A file some
step that stays references (its manifest, or the records of a step being saved: derived at each
call, under the root's reference lock, never counted) is not deleted: its step loses its manifest
and every other file, and keeps a work folder naming the arrays still held (so it reads as an
unfinished save of ckptstore's, which a later call deletes once nothing references it).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from ckptstore.errors import CkptStoreError
from ckptstore.io.locations import open_location
from ckptstore.io.sink import ByteSink, open_sink, partial_key
from ckptstore.store.kinds import ROOT_METADATA, WORK_DIR, find_manifest, read_manifest, store_kind
from ckptstore.store.manifest import StoreManifest
from ckptstore.store.steps import STEP_FOLDER, STEP_LIKE, foreign_step_names, step_name, step_sink, unfinished_ranks
from ckptstore.store.store import checked_store
from ckptstore.store.work import FINGERPRINT_FILE, RECORDS_DIR, is_lock
from ckptstore.write import incremental as inc
from ckptstore.write.save import step_location

#: A chunk or shard file of a Zarr v3 array as ckptstore writes them (``c``, ``c.0.1``, ``c/0/1``),
#: or one of its temporary files.
_CHUNK_FILE = re.compile(r"^c([./]\d+)*(\.partial|\.journal)?$")

#: The record a pruned step keeps of the arrays whose files later steps reference.
_HELD = f"{RECORDS_DIR}/held.json"

COMMITTED, UNFINISHED, FOREIGN, LINK = "committed", "unfinished", "not ckptstore's", "symbolic link"
#: A pruned step that still holds chunks later (incremental) steps reference: not loadable, deleted
#: by a later prune once nothing references them.
HELD = "held"
#: The states of a committed step checked by ``ckptstore steps --verify`` (:func:`list_steps` with ``verify=True``).
VERIFIED, DAMAGED = "verified", "damaged"


@dataclass(frozen=True)
class StepFolder:
    """One ``step_<N>`` of a store root: ``state`` is ``"committed"``, ``"unfinished"`` (a save or
    conversion some rank or part has not finished: ``missing`` lists them, of ``world``; ``world``
    is ``None`` when none has finished), ``"not ckptstore's"`` (a folder ckptstore did not write)
    or ``"symbolic link"`` (not read: ckptstore writes and reads no step through a link);
    ``bytes`` and ``files`` count every file in it, ``mtime`` is the newest one's (seconds since
    the epoch, ``None`` when empty)."""

    step: int
    state: str
    world: int | None
    missing: tuple[int, ...]
    bytes: int
    files: int
    mtime: float | None
    #: Checked (``--verify``), a committed step is ``"verified"`` or ``"damaged"``: this says the first damage.
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The fields as ``ckptstore steps --json`` prints them (``problem`` only for a damaged step)."""
        return {"step": self.step, "state": self.state, "world": self.world, "missing_ranks": list(self.missing),
                "bytes": self.bytes, "files": self.files, "mtime": self.mtime,
                **({"problem": self.problem} if self.problem is not None else {})}


def list_steps(root: str | os.PathLike[str], *, verify: bool = False) -> list[StepFolder]:
    """Every ``step_<N>`` of ``root`` (a folder or an ``s3://``/``obs://`` prefix), newest first,
    with its state, the ranks an unfinished one waits for, its bytes and when it was last written.

    ``verify=True`` reads every chunk of each committed step (bounded blocks) and states it
    ``"verified"`` or ``"damaged"`` (with its first ``problem``), by the check a load with
    ``fallback=True`` makes (:func:`~ckptstore.store.store.checked_store`); an outage is raised."""
    sink = open_sink(os.fspath(root))
    try:
        folders = sink.listing()[0]
    except (FileNotFoundError, NotADirectoryError):
        folders = []
    found = []
    for name in folders:
        m = STEP_FOLDER.match(name)
        if m:
            found.append(_step_folder(sink.folder(name), int(m.group(1))))
    for name in sink.links():
        m = STEP_FOLDER.match(name)
        if m:
            found.append(StepFolder(int(m.group(1)), LINK, None, (), 0, 0, None))
    if verify:
        found = [_verified(f, sink.folder(step_name(f.step))) if f.state == COMMITTED else f for f in found]
    return sorted(found, key=lambda f: f.step, reverse=True)


def _verified(folder: StepFolder, sink: ByteSink) -> StepFolder:
    """``folder`` (a committed step) stated ``"verified"`` or ``"damaged"``."""
    store, problem = checked_store(sink.url)
    if store is not None:
        store.close()
    return dataclasses.replace(folder, state=VERIFIED if problem is None else DAMAGED, problem=problem)


def foreign_names(root: str | os.PathLike[str]) -> list[str]:
    """The names in ``root`` that start like a step folder but are not one ckptstore writes
    (``step_03``, ``step_٣``: folders or links; files, whatever their name), sorted: retention and
    listing leave them alone (:func:`~ckptstore.store.steps.foreign_step_names`)."""
    sink = open_sink(os.fspath(root))
    try:
        folders, files = sink.listing()
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted({*foreign_step_names([*folders, *sink.links()]), *(f for f in files if STEP_LIKE.match(f))})


def _step_folder(sink: ByteSink, step: int) -> StepFolder:
    files = sink.files()
    size = sum(n for _, n, _ in files)
    mtime = max((t for _, _, t in files), default=None)
    when = None if mtime is None else round(mtime / 1e9, 3)
    doc = read_manifest(sink.source)
    if isinstance(doc, dict) and doc.get("complete") is True:
        return StepFolder(step, COMMITTED, _world(doc), (), size, len(files), when)
    keys = [k for k, _, _ in files]
    if not any(k.startswith(WORK_DIR + "/") for k in keys):
        return StepFolder(step, FOREIGN, None, (), size, len(files), when)
    if _HELD in keys:
        return StepFolder(step, HELD, None, (), size, len(files), when)
    world, missing = _waiting_for(sink)
    return StepFolder(step, UNFINISHED, world, missing, size, len(files), when)


def _world(doc: dict[str, Any]) -> int | None:
    source = doc.get("source")
    world = source.get("world_size") if isinstance(source, dict) else None
    return world if isinstance(world, int) and not isinstance(world, bool) else None


def _waiting_for(sink: ByteSink) -> tuple[int | None, tuple[int, ...]]:
    """The world size and the ranks whose marker is missing, as every reader tells them
    (:func:`~ckptstore.store.steps.unfinished_ranks`: the attempt record's count, its markers);
    ``(None, ())`` when the attempt record is missing or unreadable."""
    found = unfinished_ranks(sink.source)
    return (None, ()) if found is None else (found[1], tuple(found[0]))


@dataclass
class Removed:
    """What a retention call did: the steps whose files it deleted, the files it left in them
    because ckptstore did not write them (their folder stays), the step folders it left whole
    because ckptstore did not write them, and those it skipped because a rank is saving them."""

    steps: list[int] = field(default_factory=list)
    left: dict[int, list[str]] = field(default_factory=dict)
    foreign: list[int] = field(default_factory=list)
    busy: list[int] = field(default_factory=list)
    #: Nothing was deleted: this is what would have been (``ckptstore steps --dry-run``).
    dry_run: bool = False
    #: Files of deleted steps kept because a step that stays references them (incremental saves).
    referenced: dict[int, list[str]] = field(default_factory=dict)

    def describe(self) -> str:
        """One line: what was deleted and what was left (or would be, in a dry run)."""
        deleted, left, skipped = ("would delete", "would leave", "would skip") if self.dry_run else \
            ("deleted", "left", "skipped")
        parts = [f"{deleted} step(s) {', '.join(map(str, self.steps))}" if self.steps else f"{deleted} no step"]
        for step, files in self.left.items():
            shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
            parts.append(f"{left} {len(files)} file(s) ckptstore did not write in step_{step} ({shown})")
        if self.foreign:
            parts.append(f"{left} step folder(s) {', '.join(f'step_{s}' for s in self.foreign)} whole: ckptstore "
                         "did not save them")
        if self.referenced:
            parts.append(f"kept {sum(map(len, self.referenced.values()))} file(s) of step(s) "
                         f"{', '.join(map(str, self.referenced))} that later steps reference")
        if self.busy:
            parts.append(f"{skipped} step(s) {', '.join(map(str, self.busy))}: being saved now")
        return "; ".join(parts)


def saved_steps(root: str | os.PathLike[str]) -> list[tuple[int, bool]]:
    """Every ``step_<N>`` folder of ``root`` as ``(N, committed)``, oldest first."""
    source = open_location(root)
    try:
        folders = source.list()[0]
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in folders:
        m = STEP_FOLDER.match(name)
        if m:
            doc = read_manifest(open_location(step_location(root, int(m.group(1)))))
            out.append((int(m.group(1)), isinstance(doc, dict) and doc.get("complete") is True))
    return sorted(out)


def prune_steps(root: str | os.PathLike[str], keep: int, *, protect: Collection[int] = (),
                dry_run: bool = False) -> Removed:
    """Delete the steps older than the newest ``keep`` committed ones, except those in ``protect``.

    Only steps older than the oldest kept committed step go (committed or not), so a step being
    saved now, and every step newer than the last commit, stays; a step in ``protect`` (the
    callback passes the step it just saved) is never deleted. In each, only what ckptstore wrote
    is deleted (see the module docstring); what was left is in the returned :class:`Removed`
    and, when anything was, a warning. ``dry_run`` deletes nothing and returns what would go
    (``ckptstore steps ROOT --keep K --dry-run``).
    """
    steps = saved_steps(root)
    committed = [s for s, done in steps if done]
    if keep < 1 or len(committed) <= keep:
        return Removed(dry_run=dry_run)
    oldest_kept = committed[-keep]
    return remove_steps(root, [s for s, _ in steps if s < oldest_kept and s not in protect], dry_run=dry_run)


def remove_unfinished(root: str | os.PathLike[str], *, protect: Collection[int] = (),
                      dry_run: bool = False) -> Removed:
    """Delete the unfinished saves older than the newest committed step of ``root`` (a job killed
    mid-save leaves one), except those in ``protect``: only ckptstore's files of them, as
    :func:`prune_steps` does. A step some rank is saving now (its work folder is locked) stays."""
    steps = saved_steps(root)
    committed = [s for s, done in steps if done]
    if not committed:
        return Removed(dry_run=dry_run)
    return remove_steps(root, [s for s, done in steps if not done and s < committed[-1] and s not in protect],
                        dry_run=dry_run)


def remove_steps(root: str | os.PathLike[str], doomed: Collection[int], *, dry_run: bool = False) -> Removed:
    """Delete the steps ``doomed`` of ``root``: only ckptstore's files of each, as :func:`prune_steps` does
    (a step ckptstore did not save, or one being saved now, stays and is listed in the result);
    ``dry_run`` deletes nothing and says what would go."""
    done = Removed(dry_run=dry_run)
    lock = inc.root_lock(os.fspath(root), create=False) if doomed and not dry_run else None
    try:
        referenced = inc.referenced_files(os.fspath(root), skip=list(doomed)) if doomed else set()
        for step in doomed:
            prefix = inc.step_prefix(step)
            _remove_step(step_sink(step_location(root, step)), step, done,
                         {k[len(prefix):] for k in referenced if k.startswith(prefix)})
    finally:
        if lock is not None:
            lock.release()
    if (done.left or done.foreign) and not dry_run:
        warnings.warn(f"ckptstore: {os.fspath(root)}: {done.describe()}", stacklevel=3)
    return done


def _remove_step(sink: ByteSink, step: int, done: Removed, referenced: Collection[str] = ()) -> None:
    """Delete what ckptstore wrote in one step folder (the manifest first), noting what stays;
    files of it that another step references (``referenced``, keys in the folder) stay too."""
    keys = sink.keys()
    ours = owned_files(sink, keys)
    if ours is None:
        done.foreign.append(step)
        return
    held = _hold_work_locks(sink, keys)
    if held is None:
        done.busy.append(step)
        return
    if done.dry_run:
        for lock in held:
            lock.release()
        left = sorted(set(keys) - set(ours))
        if left:
            done.left[step] = left
        done.steps.append(step)
        return
    kept = sorted(set(ours) & set(referenced))
    try:
        if kept:  # written before anything goes: the folder stays ckptstore's, its held arrays named
            sink.put(FINGERPRINT_FILE, b"pruned: holds chunks later steps reference\n")
            sink.put(_HELD, json.dumps({"params": {a: {"path": a} for a in sorted({k.rpartition("/")[0]
                                                                                  for k in kept})}}).encode())
            ours = [k for k in ours if k not in (FINGERPRINT_FILE, _HELD)]
        manifests = [k for k in ours if "/" not in k]  # the manifest (and root metadata) go first
        sink.delete(manifests)
        sink.delete([k for k in ours if k not in manifests and not is_lock(k) and k not in kept])
    finally:
        for lock in held:
            lock.release()
    sink.delete([k for k in ours if is_lock(k)])
    left = sorted(set(keys) - set(ours))
    if kept:
        done.referenced[step] = kept
        if not manifests:
            return  # pruned before: it still holds referenced chunks, and nothing more went
    elif left:
        done.left[step] = left
    else:
        sink.remove_root()
    done.steps.append(step)


def owned_files(sink: ByteSink, keys: list[str] | None = None) -> list[str] | None:
    """The files of the step folder ``sink`` that ckptstore wrote (among ``keys``, its listing),
    or ``None`` when ckptstore did not save this folder (no manifest of ckptstore's, no work
    folder of a save)."""
    keys = sink.keys() if keys is None else keys
    work = [k for k in keys if k.startswith(WORK_DIR + "/")]
    named: set[str] = set(work)
    found = find_manifest(sink.source)
    if found is not None and isinstance(found.doc, dict) and found.doc.get("complete") is True:
        try:
            manifest = StoreManifest.from_json(found.doc, where=sink.url)
        except CkptStoreError:
            return None  # not a manifest ckptstore can read: not known to be its own
        kind = store_kind(manifest.kind)
        named.add(found.key)
        if manifest.kind == "zarr":
            named.add(ROOT_METADATA)
        files = manifest.extra.get(inc.SOURCE_FILES)
        if manifest.source.get("incremental") and manifest.extra.get(inc.SOURCE_ROOT) == inc.SOURCE_ROOT_OF_STEP \
                and isinstance(files, dict):  # its own files are named below ROOT, from its folder
            prefix = sink.url.rstrip("/").rpartition("/")[2] + "/"
            named.update(k[len(prefix):] for k in files if isinstance(k, str) and k.startswith(prefix))
        for p in manifest.params.values():
            named.add(f"{p.path}/{ROOT_METADATA}")
            if kind is not None and kind.stores_data:  # an index's chunks are the rank files: not its own
                named.update(p.chunks.files)
                for pieces in p.chunks.pieces.values():
                    named.update(key for key, _, _ in pieces)
    elif _is_save_work(sink, work):
        arrays = _recorded_arrays(sink, work)
        for k in keys:
            folder, _, name = k.rpartition("/")
            if folder in arrays and (name == ROOT_METADATA or _CHUNK_FILE.match(name)):
                named.add(k)
    else:
        return None
    named.update(partial_key(k) for k in list(named))
    return [k for k in keys if k in named]


def _is_save_work(sink: ByteSink, work: list[str]) -> bool:
    """Whether the work folder is one ckptstore made (it holds the fingerprint every writer
    claims a store with; the records, if any rank finished, name the arrays)."""
    return FINGERPRINT_FILE in work


def _recorded_arrays(sink: ByteSink, work: list[str]) -> set[str]:
    """The array folders the ranks' records of an unfinished save name."""
    arrays: set[str] = set()
    for key in work:
        if not key.startswith(RECORDS_DIR + "/"):
            continue
        raw = sink.read(key)
        try:
            record: Any = json.loads(raw) if raw is not None else {}
            params = record.get("params", {}) if isinstance(record, dict) else {}
            arrays.update(d["path"] for d in params.values() if isinstance(d, dict) and isinstance(d.get("path"), str))
        except ValueError:
            continue  # a torn record: its arrays are named by another rank's, or left
    return arrays


def _hold_work_locks(sink: ByteSink, keys: list[str]) -> list[Any] | None:
    """Every lock of the step's work folder, held (``None``, none held, if one is taken: a rank
    is saving or committing the step now)."""
    held: list[Any] = []
    for key in keys:
        if is_lock(key):
            lock = sink.lock(key.rpartition("/")[2], wait=False)
            if lock is None:
                for h in held:
                    h.release()
                return None
            held.append(lock)
    return held
