"""The output of a conversion: its state, its owner, and what ckptstore may delete in it.

An output (a folder, or an object-store prefix; see :mod:`ckptstore.io.output_target`) is *new*
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
parts are running.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ckptstore.store.kinds import WORK_DIR
from ckptstore.errors import ConversionInProgressError, StoreExistsError
from ckptstore.io.output_target import OutputTarget, write_error
from ckptstore.write.parts import Part

FINGERPRINT = f"{WORK_DIR}/fingerprint"

__all__ = ["Claim", "claim", "write_error"]


@dataclass
class Claim:
    """This process's hold on an output (release it when done)."""

    target: OutputTarget
    lock: Any
    complete: bool  # the same conversion is already complete: nothing to write
    part: Part = Part()

    @property
    def out(self) -> Any:
        """The local folder (a ``Path``), or the URL of an object-store prefix."""
        return getattr(self.target, "root", self.target.url)

    def release(self) -> None:
        self.lock.release()


def claim(target: OutputTarget, fingerprint: str, *, overwrite: bool, sources: Iterable[str],
          on_wait: Callable[[str], None] | None = None, part: Part = Part()) -> Claim:
    """Own ``target`` for this conversion (or this part of it) and make it ready to write.

    ``sources`` are the source files (rank files, strategy files): a folder holding any of them
    is never written into. Raises :class:`~ckptstore.errors.StoreExistsError` for an output that
    is not this conversion's, :class:`~ckptstore.errors.ConversionInProgressError` when this
    part is already being converted, and :class:`~ckptstore.errors.StoreWriteError` when it
    cannot be written.
    """
    target.prepare(list(sources))
    setup = target.lock("lock", on_wait)
    try:
        complete = _decide(target, fingerprint, overwrite, part)
        if complete or part.count == 1:
            return Claim(target, setup, complete, part)
        mine = target.lock(f"lock.part-{part.index}", wait=False)
        if mine is None:
            raise ConversionInProgressError(f"part {part} of the conversion into {target.url} is already running in "
                                            "another process")
    except BaseException:
        if target.manifest() is not None:  # a complete store keeps no work folder made only for a lock
            target.drop_idle_work()
        setup.release()
        raise
    setup.release()
    return Claim(target, mine, False, part)


def _decide(target: OutputTarget, fingerprint: str, overwrite: bool, part: Part) -> bool:
    """Under the folder's lock: is the store already complete? Clear or check what is there."""
    manifest = target.manifest()
    if manifest is not None:
        same = manifest.get("source", {}).get("fingerprint") == fingerprint
        if same and (not overwrite or part.count > 1):
            if not target.remote:
                target.drop_work()  # the lock file we waited on; the store itself is untouched
            return True
        if not overwrite:
            raise StoreExistsError(f"{target.url} already holds a complete store of other files or options; pass "
                                   "--overwrite to replace it")
        _refuse_running_parts(target)
        target.clear_store()
    else:
        previous = _read_fingerprint(target)
        if previous is not None and previous != fingerprint:
            if not overwrite:
                raise StoreExistsError(f"{target.url} holds an unfinished conversion of other files or options; rerun "
                                       "that command to finish it, or pass --overwrite to start again")
            _refuse_running_parts(target)
            target.clear_store()
        elif overwrite and part.count == 1:
            target.clear_store()  # start an unfinished conversion over, even the same one
    if target.remote:
        if not target.write(FINGERPRINT, fingerprint.encode(), create=True) and _read_fingerprint(target) != fingerprint:
            raise StoreExistsError(f"another conversion of other files or options started writing into {target.url} "
                                   "at the same time; let it finish, or pass --overwrite once it has stopped")
    else:
        target.write(FINGERPRINT, fingerprint.encode())
    return False


def _refuse_running_parts(target: OutputTarget) -> None:
    """Clearing under the parts of a running conversion would destroy their work: refuse."""
    for key in target.keys(WORK_DIR):
        name = key.rsplit("/", 1)[-1]
        if name.startswith("lock.part-"):
            held = target.lock(name, wait=False)
            if held is None:
                raise ConversionInProgressError(f"a conversion in parts is running into {target.url} ({name} is "
                                                "held); wait for it to finish")
            held.release()


def _read_fingerprint(target: OutputTarget) -> str | None:
    try:
        raw = target.read(FINGERPRINT)
        return raw.decode() if raw is not None else None
    except (UnicodeDecodeError, NotADirectoryError, OSError):
        return None
