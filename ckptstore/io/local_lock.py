"""The lock of a local output folder: an exclusive ``flock`` on a file of its work folder.

:class:`FolderLock` reaches its file through the folder it is given (a
:class:`~ckptstore.io.local_sink.LocalSink`, or anything that has its two methods, see
:class:`LockFolder`), so the lock file, like every other file of the sink, is opened from the
root's descriptor without following links.
"""
from __future__ import annotations

import fcntl
import itertools
import os
import socket
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from ckptstore.io.sink import write_error

_unique = itertools.count()


class LockFolder(Protocol):
    """What :class:`FolderLock` needs of the folder that holds its file."""

    root: Path

    def parent_folder(self, key: str, *, create: bool = True) -> AbstractContextManager[tuple[int, str]]:
        """``(descriptor of the folder of key, file name)`` for a ``with`` block."""

    def open_in_folder(self, dfd: int, name: str, *, resume: bool, where: Path) -> int:
        """A read-write descriptor of file ``name`` of folder ``dfd``, no link followed."""


def temp_name(name: str) -> str:
    """A name beside ``name`` that no other writer uses (created exclusively)."""
    return f"{name}.{os.getpid()}-{next(_unique)}.tmp"


def _replace_locked(dfd: int, name: str) -> int:
    """A new file locked before it is renamed over ``name`` in folder ``dfd``; its descriptor."""
    tmp, new = temp_name(name), -1
    try:
        new = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        fcntl.flock(new, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: no one else can hold it
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError:
        if new >= 0:
            os.close(new)
            os.unlink(tmp, dir_fd=dfd)
        raise
    return new


class FolderLock:
    """An exclusive ``flock`` on the lock file ``key`` of a :class:`~ckptstore.io.local_sink.LocalSink`.

    A conversion in one process holds the folder's lock (``lock``) for its whole run; a
    conversion in parts holds it only while it decides and while it commits, and a lock of its
    own part (``lock.part-<i>``) for its run (see :mod:`ckptstore.write.output_folder`).
    Every rank of a job often runs the same script, so several processes may start on one
    output at once (on a shared filesystem, from several hosts). The kernel drops the lock when
    its holder dies, even by ``kill -9``, so a crash never leaves the folder locked. The lock
    file lives in the work folder, which a committing holder deletes: a waiter that then gets
    the lock on the deleted file notices (the name no longer names its file) and locks a fresh
    one. The file is opened without following links (a planted link is refused), and holds a
    line saying who holds it, for the messages of waiting processes.
    """

    def __init__(self, sink: LockFolder, key: str, *, on_wait: Callable[[str], None] | None = None) -> None:
        self.sink, self.key, self.on_wait = sink, key, on_wait
        self.path = sink.root / key
        self._fd = -1

    def acquire(self) -> FolderLock:
        """Block until this process holds the lock."""
        held = self._take(wait=True)
        if held is None:  # waiting always ends holding the lock
            raise RuntimeError(f"could not lock {self.path}")
        return held

    def try_acquire(self) -> FolderLock | None:
        """Take the lock if no one holds it; ``None`` if someone does."""
        return self._take(wait=False)

    def _take(self, *, wait: bool) -> FolderLock | None:
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    os.close(fd)
                    return None
                if self.on_wait is not None:
                    self.on_wait(self._holder(fd))
                fcntl.flock(fd, fcntl.LOCK_EX)
            if self._still_named(fd):
                self._fd = self._own_file(fd)
                self._describe_self()
                return self
            os.close(fd)  # the holder committed and removed the file: lock a fresh one

    def release(self) -> None:
        """Give the lock up (closing the file drops the ``flock``)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _open(self) -> int:
        while True:
            try:
                with self.sink.parent_folder(self.key) as (dfd, name):
                    return self.sink.open_in_folder(dfd, name, resume=True, where=self.path)
            except FileNotFoundError:
                # a committing holder removed a folder while it was being made, or between
                # reaching it and opening the file in it
                continue
            except OSError as e:
                raise write_error(e, f"the lock file {self.path}") from e

    def _own_file(self, fd: int) -> int:
        """``fd`` (held, locked), or when other names share the lock file (a snapshot made with
        ``cp -al``, or a planted link) a new file locked before it replaces the name: the holder's
        line is never written into a file another name shows, and a process that opens the name
        meanwhile waits on the new file while the old one is still held."""
        if os.fstat(fd).st_nlink <= 1:
            return fd
        try:
            with self.sink.parent_folder(self.key, create=False) as (dfd, name):
                return _replace_locked(dfd, name)
        except OSError as e:
            raise write_error(e, f"the lock file {self.path}") from e
        finally:
            os.close(fd)

    def _still_named(self, fd: int) -> bool:
        try:
            with self.sink.parent_folder(self.key, create=False) as (dfd, name):
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            return False  # the file or its folder is gone (or replaced by other than a file)
        mine = os.fstat(fd)
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def _describe_self(self) -> None:
        info = f"pid {os.getpid()} on host {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}"
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, info.encode(), 0)
        except OSError:
            pass  # only a courtesy for the messages of waiting processes

    def _holder(self, fd: int) -> str:
        try:
            who = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
        except OSError:
            who = ""
        return who or "another process"
