"""The output folder of a conversion: its state, its owner, and what ckptstore may delete in it.

A folder is *new* (absent or empty), *unfinished* (it has a work directory: a conversion was
interrupted or is running), *complete* (its manifest exists) or *foreign* (anything else: it is
refused). :func:`claim` takes the folder's lock first and decides under it: a complete store
of the same conversion is left as it is (a rerun is a no-op); an unfinished one of the same
conversion is resumed; anything else needs ``overwrite``, which deletes only what ckptstore
wrote (the manifest, the work directory, Zarr array folders, ``model-*.safetensors`` files),
never other files, and never a folder that holds the source checkpoint.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from .atomic_file import write_atomic
from .backends import MANIFEST, ROOT_METADATA, WORK_DIR, read_manifest
from .errors import CkptStoreError, StoreExistsError, StoreWriteError
from .output_lock import OutputLock
from .sources import LocalSource

FINGERPRINT = "fingerprint"
_SAFETENSORS_FILE = re.compile(r"^model-\d+-of-\d+\.safetensors(\.partial)?$")


@dataclass
class Claim:
    """This process's hold on an output folder (release it when done)."""

    out: Path
    work: Path
    lock: OutputLock
    complete: bool  # the same conversion is already complete: nothing to write

    def release(self) -> None:
        self.lock.release()

    def drop_work(self) -> None:
        """Remove the work directory (after a commit, or when there was nothing to do)."""
        shutil.rmtree(self.work, ignore_errors=True)


def write_error(e: OSError, path: Path | str, param: str | None = None) -> StoreWriteError:
    """A :class:`StoreWriteError` that says what failed and that a rerun resumes."""
    what = "no space left on the device" if e.errno == errno.ENOSPC else e.strerror or str(e)
    where = f" (parameter {param!r})" if param else ""
    return StoreWriteError(e.errno or 0, f"{what} while writing {path}{where}; free space or fix the "
                           "problem, then rerun the same command to resume")


def claim(out: Path, fingerprint: str, *, overwrite: bool, sources: Iterable[str],
          on_wait: Callable[[str], None] | None = None) -> Claim:
    """Lock ``out`` for this conversion and make it ready to write (see the module docstring).

    ``sources`` are the source files (rank files, strategy files): a folder holding any of them
    is never written into. Raises :class:`~ckptstore.errors.StoreExistsError` for a folder that
    is not this conversion's and :class:`~ckptstore.errors.StoreWriteError` when it cannot be
    written.
    """
    _refuse_foreign(out, sources)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(e, out) from e
    work = out / WORK_DIR
    lock = OutputLock(work, on_wait=on_wait).acquire()
    try:
        return _decide(out, work, lock, fingerprint, overwrite)
    except BaseException:
        lock.release()
        raise


def _decide(out: Path, work: Path, lock: OutputLock, fingerprint: str, overwrite: bool) -> Claim:
    manifest = _manifest(out)
    if manifest is not None:
        if not overwrite:
            if manifest.get("source", {}).get("fingerprint") == fingerprint:
                c = Claim(out, work, lock, complete=True)
                c.drop_work()  # the lock file we waited on; the store itself is untouched
                return c
            _drop_lock_dir(work)
            raise StoreExistsError(f"{out} already holds a complete store of other files or options; pass "
                                   "--overwrite to replace it")
        clear_store(out)
    elif overwrite:
        clear_store(out)  # start an unfinished conversion over, even the same one
    else:
        previous = _read_fingerprint(work)
        if previous is not None and previous != fingerprint:
            raise StoreExistsError(f"{out} holds an unfinished conversion of other files or options; rerun "
                                   "that command to finish it, or pass --overwrite to start again")
    try:
        (work / "done").mkdir(parents=True, exist_ok=True)
        write_atomic(work / FINGERPRINT, fingerprint.encode())
    except OSError as e:
        raise write_error(e, out) from e
    return Claim(out, work, lock, complete=False)


def _drop_lock_dir(work: Path) -> None:
    # We created the work directory only to hold the lock; a complete store keeps no work files.
    if work.is_dir() and {p.name for p in work.iterdir()} <= {"lock"}:
        shutil.rmtree(work, ignore_errors=True)


def _manifest(out: Path) -> dict | None:
    try:
        doc = read_manifest(LocalSource(out))
    except CkptStoreError:
        return None
    return doc if isinstance(doc, dict) and doc.get("complete") is True else None


def _read_fingerprint(work: Path) -> str | None:
    try:
        return (work / FINGERPRINT).read_text()
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        return None


def _refuse_foreign(out: Path, sources: Iterable[str]) -> None:
    if out.exists() and not out.is_dir():
        raise StoreExistsError(f"output path {out} is a file, not a folder; choose another --out")
    root = os.path.realpath(out)
    for src in sources:
        if os.path.commonpath([root, os.path.realpath(src)]) == root:
            raise StoreExistsError(f"output folder {out} contains the source checkpoint ({src}); choose an output "
                                   "folder outside it")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if (out / WORK_DIR).is_dir() or _manifest(out) is not None:
        return
    raise StoreExistsError(f"output folder {out} is not empty and is not a ckptstore store; choose an empty or "
                           "new folder")


def clear_store(out: Path) -> None:
    """Delete what a conversion writes in ``out`` (keeping the lock file), and nothing else."""
    for child in out.iterdir():
        if child.name == WORK_DIR and child.is_dir() and not child.is_symlink():
            for sub in child.iterdir():
                if sub.name != "lock":
                    shutil.rmtree(sub) if sub.is_dir() and not sub.is_symlink() else sub.unlink()
        elif child.name in (ROOT_METADATA, MANIFEST) or _SAFETENSORS_FILE.match(child.name):
            if not child.is_dir():
                child.unlink()
        elif child.is_dir() and not child.is_symlink() and (child / ROOT_METADATA).is_file():
            shutil.rmtree(child)  # a Zarr array folder
