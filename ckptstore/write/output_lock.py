"""One writer per output folder: an advisory lock, held for the whole of a conversion in one
process; a conversion in parts holds the folder's lock only while it decides and while it
commits, and a lock of its own part (``lock.part-<i>``) for its run (see
:mod:`ckptstore.write.output_folder`).

Every rank of a job often runs the same script, so several ``ckptstore convert`` processes may
start on one ``--out`` at once (on a shared filesystem, from several hosts). Each takes an
exclusive ``flock`` on a lock file in the folder's work directory before it looks at or
touches anything else; the others wait for it (saying who holds it), then find the store
complete and have nothing to do, or resume what a crashed holder left. The kernel drops the
lock when its holder dies, even by ``kill -9``, so a crash never leaves the folder locked.

The lock file lives in the work directory, which the committing writer deletes: a waiter that
then acquires the lock on the deleted file notices (the path no longer names its file) and
takes the lock again on a fresh one.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path
from typing import Callable

from ckptstore.errors import StoreWriteError


class OutputLock:
    """An exclusive lock named ``name`` in ``work`` (a folder created if needed)."""

    def __init__(self, work: Path, name: str = "lock", *, on_wait: Callable[[str], None] | None = None) -> None:
        self.work, self.path = work, work / name
        self.on_wait = on_wait
        self._fd = -1

    def acquire(self) -> "OutputLock":
        """Block until this process holds the lock."""
        return self._take(wait=True)  # type: ignore[return-value]

    def try_acquire(self) -> "OutputLock | None":
        """Take the lock if no one holds it; ``None`` if someone does."""
        return self._take(wait=False)

    def _take(self, *, wait: bool) -> "OutputLock | None":
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
                self._fd = fd
                self._describe_self()
                return self
            os.close(fd)  # the holder committed and removed the file: lock a fresh one

    def release(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)  # closing drops the flock

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _open(self) -> int:
        try:
            while True:
                try:
                    self.work.mkdir(parents=True, exist_ok=True)
                except FileExistsError:
                    # mkdir found the folder, then a committing holder removed it before mkdir
                    # checked it was a folder: make it again (a file of that name is an error)
                    if not self.work.is_dir() and (self.work.exists() or self.work.is_symlink()):
                        raise
                    continue
                try:
                    return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                except FileNotFoundError:
                    continue  # a committing holder removed the folder between the two calls
        except OSError as e:
            what = "no space left on the device" if e.errno == errno.ENOSPC else e.strerror or str(e)
            raise StoreWriteError(e.errno or 0, f"{what} while creating the lock file {self.path}") from None

    def _still_named(self, fd: int) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
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
