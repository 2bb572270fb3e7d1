"""Files that appear whole or not at all: the one atomic-write mechanism of ckptstore.

Every file ckptstore writes — a store's data files and metadata, exported checkpoints — is
written under ``<name>.partial`` and renamed over its final name, so a reader never sees half a
file. Files that must survive a crash are flushed to disk (``fsync``) before the rename and their
folder is synced after it (or, with ``sync_folder=False``, by the caller before it commits).
``durable=False`` skips both fsyncs: for work-folder records that a rerun redoes when a power
loss takes them. Store data files are *resumable*: ``resume=True`` keeps what an interrupted run already
wrote in the partial file (its journal says which bytes are good) instead of starting over.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

PARTIAL_SUFFIX = ".partial"


def partial_path(path: str | os.PathLike[str]) -> Path:
    """Where the unfinished ``path`` is written."""
    p = Path(path)
    return p.with_name(p.name + PARTIAL_SUFFIX)


def fsync_folder(folder: str | os.PathLike[str]) -> None:
    """fsync a folder, so renames and new files in it are durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_partial(path: str | os.PathLike[str], *, sync_folder: bool = True) -> None:
    """Move the finished partial file of ``path`` into place: fsync it, rename it, sync the folder."""
    final = Path(path)
    work = partial_path(final)
    fd = os.open(work, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(work, final)
    if sync_folder:
        fsync_folder(final.parent)


class AtomicFile:
    """A file written under a temporary name and moved into place only when complete.

    Write through :attr:`file` (sequential) or :attr:`fd` (``pwrite`` at offsets); :meth:`close`
    finishes (subclasses may append a trailer in :meth:`_finish`), fsyncs and renames; leaving a
    ``with`` block by an exception, or :meth:`abort`, removes the partial file unless
    ``resume=True``, which keeps it (and opens an existing one without truncating it).
    ``sync_folder=False`` skips syncing the folder after the rename, for callers that sync the
    whole file system once before they commit (a store's many data files).
    """

    def __init__(self, path: str | os.PathLike[str], *, resume: bool = False, sync_folder: bool = True,
                 durable: bool = True) -> None:
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self.resume, self.sync_folder, self.durable = resume, sync_folder and durable, durable
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | (0 if resume else os.O_TRUNC)
        self.fd = os.open(self.partial, flags, 0o644)
        self._f: BinaryIO = os.fdopen(self.fd, "r+b", closefd=True)

    @property
    def file(self) -> BinaryIO:
        return self._f

    def _finish(self) -> None:
        """Last writes before the file is synced (a trailer, a check)."""

    def close(self) -> None:
        """Finish, fsync and move the file into place."""
        self._finish()
        self._f.flush()
        if self.durable:
            os.fsync(self.fd)
        self._f.close()
        os.replace(self.partial, self.path)
        if self.sync_folder:
            fsync_folder(self.path.parent)

    def abort(self) -> None:
        """Stop writing; drop the partial file unless it is resumable."""
        self._f.close()
        if not self.resume:
            self.partial.unlink(missing_ok=True)

    def __enter__(self) -> "AtomicFile":
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_atomic(path: str | os.PathLike[str], data: bytes, *, sync_folder: bool = True, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (small files: metadata, markers).

    ``durable=False`` skips the fsyncs: after a power loss the file may be missing or empty, which
    suits records that only save work on a rerun (it is redone when they are lost).
    """
    with AtomicFile(path, sync_folder=sync_folder, durable=durable) as f:
        f.file.write(data)
