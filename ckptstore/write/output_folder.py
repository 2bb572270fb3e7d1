"""The output of a conversion: its state, its owner, and what ckptstore may delete in it.

An output (a folder, or an object-store prefix, written through a :class:`~ckptstore.io.sink.ByteSink`) is *new*
(absent or empty), *unfinished* (it has a work folder: a conversion was interrupted or is
running), *complete* (its manifest exists) or *foreign* (anything else: it is refused).
:func:`claim` takes the folder's lock first and decides under it: a complete store of the same
conversion is left as it is (a rerun is a no-op); an unfinished one of the same conversion is
resumed; anything else needs ``overwrite``, which deletes only what ckptstore wrote (the
manifest, the work folder, Zarr array folders, ``model-*.safetensors`` files), never other
files, and never a folder that holds the source checkpoint.

A conversion in parts (:mod:`ckptstore.write.parts`) holds the folder's lock only while it decides
(and later while it commits); for its run it holds a lock of its own part, and a different
conversion may not clear the folder while any part's lock is held. With parts, ``overwrite``
replaces a store or an unfinished conversion of *other* files or options, never the one the
parts are running. A save (``restart``) starts an unfinished step of another attempt over the
same way, and never replaces a committed one (:mod:`ckptstore.write.commit` has the protocol).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ckptstore.errors import CkptStoreError, ConversionInProgressError, StoreExistsError
from ckptstore.io.sink import ByteSink, Lock, write_error
from ckptstore.store.kinds import WORK_DIR, manifest_files, read_manifest, store_kinds
from ckptstore.store.work import (
    ATTEMPT_FILE,
    FINGERPRINT_FILE,
    LOCK,
    is_lock,
    locked_part,
    part_lock,
    read_attempt,
    short,
)
from ckptstore.write.parts import Part
from ckptstore.write.records import recorded_files

__all__ = ["Claim", "claim", "write_error"]


@dataclass
class Claim:
    """This process's hold on an output (release it when done)."""

    sink: ByteSink
    lock: Lock
    complete: bool  # the same conversion is already complete: nothing to write
    part: Part = Part()

    def release(self) -> None:
        self.lock.release()


def claim(sink: ByteSink, fingerprint: str, *, overwrite: bool, sources: Iterable[str],
          on_wait: Callable[[str], None] | None = None, part: Part = Part(), restart: bool = False,
          writer: str = "convert", step: int | None = None) -> Claim:
    """Own ``sink`` for this conversion (or this part of it) and make it ready to write.

    ``fingerprint`` identifies the attempt every part of this store agrees on: a conversion's
    hash of its sources and options; a save's hash of its step, layout and attempt id (the
    ``attempt=`` of :func:`~ckptstore.write.save.save_rank` is that id, not this). It is what
    the attempt record, every part's marker and the manifest hold. ``sources`` are the source files (rank files,
    strategy files): a folder holding any of them is never written into. ``restart``: an
    unfinished store of another attempt is started over (what ckptstore wrote there is deleted),
    as a save does; without it that needs ``overwrite``. ``writer`` (``convert``, ``index``,
    ``save_rank``) and ``step`` go into the attempt record (:data:`~ckptstore.store.work.ATTEMPT_FILE`)
    for the messages of ``info``/``open``/``commit``. This part's marker of an earlier run is
    removed first: a part that runs again has not finished until it says so again, so no other
    part commits under it. Raises :class:`~ckptstore.errors.StoreExistsError` for an output that
    is not this conversion's, :class:`~ckptstore.errors.ConversionInProgressError` when this
    part is already being converted, :class:`~ckptstore.errors.UnsafePathError` when a link was
    planted where the work folder or its lock would be, and
    :class:`~ckptstore.errors.StoreWriteError` when it cannot be written.
    """
    prepare(sink, list(sources))
    setup = _lock(sink, LOCK, on_wait)
    noun = "rank" if writer == "save_rank" else "part"
    try:
        complete = _decide(sink, fingerprint, overwrite, part, noun, restart=restart)
        mine = None
        if not complete and part.count > 1:
            mine = sink.lock(part_lock(part.index), wait=False)
            if mine is None:
                raise ConversionInProgressError(f"{noun} {part} of {sink.url} is already being written by another "
                                                "process")
        if not complete:
            _start_attempt(sink, fingerprint, part, writer, step)
        if mine is None:
            return Claim(sink, setup, complete, part)
    except BaseException:
        if complete_manifest(sink) is not None:  # a complete store keeps no work folder made only for a lock
            drop_idle_work(sink)
        setup.release()
        raise
    setup.release()
    return Claim(sink, mine, False, part)


def _lock(sink: ByteSink, name: str, on_wait: Callable[[str], None] | None) -> Lock:
    held = sink.lock(name, on_wait)
    if held is None:  # waiting always ends holding the lock
        raise ConversionInProgressError(f"could not lock {sink.url}")
    return held


def lock_output(sink: ByteSink, on_wait: Callable[[str], None] | None = None) -> Lock:
    """Hold the output's lock (to commit), waiting for its holder."""
    return _lock(sink, LOCK, on_wait)


def complete_manifest(sink: ByteSink) -> dict | None:
    """The manifest of a *complete* store in ``sink``, else ``None``."""
    try:
        doc = read_manifest(sink.source)
    except CkptStoreError:
        return None
    return doc if isinstance(doc, dict) and doc.get("complete") is True else None


def prepare(sink: ByteSink, sources: Iterable[str]) -> None:
    """Refuse an output that holds the source or foreign files; create its folder."""
    for src in sources:
        if sink.contains(src):
            raise StoreExistsError(f"output location {sink.url} contains the source checkpoint ({src}); choose an "
                                   "output outside it")
    folders, files = sink.listing()
    if (folders or files) and WORK_DIR not in folders and complete_manifest(sink) is None:
        raise StoreExistsError(f"output location {sink.url} is not empty and is not a ckptstore store; choose an "
                               "empty or new one")
    sink.make_root()


def clear_store(sink: ByteSink) -> None:
    """Delete what a conversion writes here (the lock files excepted), and nothing else: the
    manifest, the work folder and the data files of every store kind (Zarr array folders,
    ``model-*.safetensors`` files: each kind's ``written``), and the files a save rank's record
    names (a slice's file in an array folder whose ``zarr.json`` another rank had still to write)."""
    keys = sink.keys()
    manifests = manifest_files()
    data = {k for kind in store_kinds() for k in kind.written(keys)} | set(recorded_files(sink, keys))
    mine = [k for k in keys
            if (k.startswith(WORK_DIR + "/") and not is_lock(k)) or k in manifests or k in data]
    # the manifest first: a reader of the old store notices the replacement before any of its
    # files is touched (see ckptstore.store.store.ReplaceGuard)
    sink.delete([k for k in mine if k in manifests])
    sink.delete(mine)


def drop_work(sink: ByteSink) -> None:
    """Remove the work folder (after a commit). The lock files go last: a process that takes the
    lock while this runs then finds only lock files left and removes them itself
    (:func:`drop_idle_work`), instead of leaving a fresh lock file behind in the complete store."""
    keys = sink.keys(WORK_DIR)
    sink.delete([k for k in keys if not is_lock(k)])
    sink.delete([k for k in keys if is_lock(k)])


def drop_idle_work(sink: ByteSink) -> None:
    """Remove the work folder if it holds nothing but lock files."""
    keys = sink.keys(WORK_DIR)
    if all(is_lock(k) for k in keys):
        sink.delete(keys)


def _decide(sink: ByteSink, fingerprint: str, overwrite: bool, part: Part, noun: str = "part", *,
            restart: bool = False) -> bool:
    """Under the folder's lock: is the store already complete? Clear or check what is there.

    ``restart`` starts an unfinished store of another attempt over; a complete store is
    replaced only by ``overwrite`` (a committed step is never: a save does not pass it)."""
    manifest = complete_manifest(sink)
    if manifest is not None:
        same = manifest.get("source", {}).get("fingerprint") == fingerprint
        if same and (not overwrite or part.count > 1):
            drop_idle_work(sink)  # the lock file we waited on; the store itself is untouched
            return True
        if not overwrite:
            raise StoreExistsError(f"{sink.url} already holds a complete store of other files or options; pass "
                                   "--overwrite to replace it")
        _refuse_running_parts(sink, noun)
        clear_store(sink)
    else:
        previous = _read_fingerprint(sink)
        if previous is not None and previous != fingerprint:
            if not (overwrite or restart):
                raise StoreExistsError(f"{sink.url} holds an unfinished conversion of other files or options; rerun "
                                       "that command to finish it, or pass --overwrite to start again")
            _refuse_running_parts(sink, noun)
            clear_store(sink)
        elif overwrite and part.count == 1:
            clear_store(sink)  # start an unfinished conversion over, even the same one
    # created only if absent: on object storage (no lock) two conversions starting at once find out here
    if not sink.put_if_absent(FINGERPRINT_FILE, fingerprint.encode()) and _read_fingerprint(sink) != fingerprint:
        raise StoreExistsError(f"another conversion of other files or options started writing into {sink.url} "
                               "at the same time; let it finish, or pass --overwrite once it has stopped")
    return False


def running_parts(sink: ByteSink) -> list[int]:
    """The parts whose lock another process holds now (they are writing), in order. On object
    storage, which has no locks, none."""
    running = []
    for key in sink.keys(WORK_DIR):
        index = locked_part(key) if is_lock(key) else None
        if index is not None:
            held = sink.lock(part_lock(index), wait=False)
            if held is None:
                running.append(index)
            else:
                held.release()
    return sorted(running)


def _refuse_running_parts(sink: ByteSink, noun: str = "part") -> None:
    """Clearing under the parts of a running conversion (the ranks of a running save) would
    destroy their work: refuse."""
    running = running_parts(sink)
    if running:
        raise ConversionInProgressError(f"{sink.url} is being written by another attempt: {noun}(s) {short(running)} "
                                        "still running (their lock is held); wait for them to finish or stop them")


def _start_attempt(sink: ByteSink, fingerprint: str, part: Part, writer: str, step: int | None) -> None:
    """Record the attempt (once, by the first part to claim) and drop this part's marker of an
    earlier run (under the folder's lock, so no part deciding to commit counts it)."""
    doc = {"attempt": fingerprint, "parts": part.count, "writer": writer,
           **({"step": step} if step is not None else {})}
    if not sink.put_if_absent(ATTEMPT_FILE, json.dumps(doc).encode()) and read_attempt(sink.source) is None:
        sink.put(ATTEMPT_FILE, json.dumps(doc).encode())  # torn by a power loss: written again
    if sink.size(part.marker) is not None:
        sink.delete([part.marker])


def _read_fingerprint(sink: ByteSink) -> str | None:
    try:
        raw = sink.read(FINGERPRINT_FILE)
        return raw.decode() if raw is not None else None
    except (UnicodeDecodeError, CkptStoreError, OSError):
        return None
