"""Local files (and mounted shared filesystems) as a byte source.

Keys are opened component by component below the source's root with ``O_NOFOLLOW``, so a key
can reach neither outside the root (``..`` and absolute keys are refused before any system
call) nor through a symbolic link planted inside it. Open files are cached per key and shared
by threads; vectored requests become ``preadv`` calls, one per run of requests that are
contiguous in the file (many buffers per call), straight into the callers' buffers.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat as stat_mod
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ckptstore.errors import FileAccessError, MissingFileError, NotRegularFileError, ShortReadError, UnsafePathError
from ckptstore.io.base import LOCAL_COST, ByteSource, FileStat, ReadableFile, Request, check_key
from ckptstore.io.schemes import PATH, Scheme

#: Buffers per preadv call (Linux's IOV_MAX is 1024).
_IOV_MAX = 1024
#: Where the gaps inside a planned request are read to and dropped (shared by every thread:
#: nobody reads it back, so concurrent writes into it do no harm).
_DISCARD = bytearray(LOCAL_COST.max_gap_bytes or 1 << 20)


class LocalFile(ReadableFile):
    """An open local file; reads with ``preadv``."""

    def __init__(self, fd: int, key: str, url: str, size: int) -> None:
        self.fd, self.key, self._url, self.size = fd, key, url, size
        self._random = False

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> LocalFile:
        """Open a file the user named (symbolic links followed); the caller closes it.

        Paths read from metadata go through :meth:`LocalSource.open` instead, which confines them.
        """
        p = os.fspath(path)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise MissingFileError(errno.ENOENT, f"file {p} does not exist", p) from None
        except OSError as e:
            raise FileAccessError(e.errno, f"cannot open {p}: {e.strerror}") from None
        st = _regular_file(fd, p)
        return cls(fd, os.path.basename(p), p, st.st_size)

    @property
    def url(self) -> str:
        return self._url

    def pread(self, offset: int, nbytes: int) -> bytes:
        # one system call for the small reads of a header scan (hundreds of thousands of them)
        try:
            data = os.pread(self.fd, max(0, min(nbytes, self.size - offset)), offset)
        except OSError as e:
            raise FileAccessError(e.errno, f"cannot read {self.url} at byte offset {offset}: {e.strerror}") from None
        return data

    def expect_holes(self) -> None:
        # The kernel reads ahead of each read (read_ahead_kb: 128 KiB by default, 8 MiB on the
        # benchmark machine) into the holes a sparse plan skips: a cold load of a 346 MiB slice read
        # 757 MiB from disk. POSIX_FADV_RANDOM makes each read fetch its own pages only; it holds
        # for this descriptor (shared by the plans that read the file) until it is closed. Plans
        # that read a file in one run do not set it, and keep the readahead that streams them.
        if not self._random and hasattr(os, "posix_fadvise"):
            self._random = True
            try:
                os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)
            except OSError:
                pass  # a hint only: a file system that refuses it reads as before

    def read_requests(self, requests: Sequence[Request]) -> None:
        i, n = 0, len(requests)
        while i < n:
            # one vectored read per run of requests that follow each other in the file
            offset, first = requests[i]
            bufs, end, j = [first], offset + len(first), i + 1
            while j < n and requests[j][0] == end:
                bufs.append(requests[j][1])
                end += len(requests[j][1])
                j += 1
            self.readv(offset, bufs)
            i = j

    def read_span(self, requests: Sequence[Request]) -> None:
        """One ``preadv`` from the first offset to the last end, the gaps read into a discard
        buffer (several calls only beyond ``IOV_MAX`` buffers, which the planner avoids)."""
        if len(requests) == 1:
            offset, buf = requests[0]
            self.readv(offset, [buf])
            return
        start = requests[0][0]
        bufs: list[Any] = []
        end = start
        discard = memoryview(_DISCARD)
        for offset, buf in requests:
            gap = offset - end
            while gap > 0:
                take = min(gap, len(discard))
                bufs.append(discard[:take])
                gap -= take
            bufs.append(buf)
            end = offset + len(buf)
        self.readv(start, bufs)

    def readv(self, offset: int, buffers: Sequence[Any]) -> None:
        for i in range(0, len(buffers), _IOV_MAX):
            part = list(buffers[i:i + _IOV_MAX])
            offset += self._preadv(offset, part)

    def _preadv(self, offset: int, bufs: list[Any]) -> int:
        want = sum(map(len, bufs))  # buffers are flat byte buffers: len is their size
        done = 0
        while done < want:
            try:
                got = os.preadv(self.fd, bufs, offset + done)
            except OSError as e:
                raise FileAccessError(e.errno, f"cannot read {self.url} at byte offset {offset + done}: "
                                      f"{e.strerror}") from None
            if got <= 0:  # the file ends at offset + done, or before it when the read began past its end
                raise ShortReadError(self.url, offset, want, min(offset + done, os.fstat(self.fd).st_size))
            done += got
            if done < want:  # drop what was filled, keep reading into the rest
                bufs = [memoryview(b).cast("B") for b in bufs]
                while got >= len(bufs[0]):
                    got -= len(bufs[0])
                    bufs = bufs[1:]
                bufs = [bufs[0][got:], *bufs[1:]]
        return want

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def local_stat(st: os.stat_result) -> FileStat:
    """The :class:`FileStat` of a local file's ``os.stat``/``os.fstat`` result."""
    return FileStat(st.st_size, st.st_mtime_ns, f"{st.st_dev}:{st.st_ino}:{st.st_ctime_ns}", st.st_ino,
                    st.st_ctime_ns)


def _regular_file(fd: int, url: str) -> os.stat_result:
    """The status of ``fd``, opened with ``O_NONBLOCK``, if it is a regular file; else close it and raise.

    Files are opened non-blocking so that a FIFO (or a device) in place of a file is refused here
    instead of blocking ``open()`` for ever; the flag is cleared again for the reads that follow.
    """
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            kind = "a folder" if stat_mod.S_ISDIR(st.st_mode) else "a FIFO" if stat_mod.S_ISFIFO(st.st_mode) else \
                "a device or socket"
            raise NotRegularFileError(errno.EISDIR if kind == "a folder" else errno.EINVAL,
                                  f"{url} is not a regular file ({kind}); ckptstore reads only regular files")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return st
    except BaseException:
        os.close(fd)
        raise


class HeldDescriptor:
    """A folder's descriptor, opened on first use and held until :meth:`drop` (or until its
    holder is collected); users get duplicates, made under the lock so that a ``drop()``
    meanwhile cannot hand out a reused number."""

    def __init__(self) -> None:
        self._fd = -1
        self._closer: weakref.finalize | None = None
        self._lock = threading.Lock()

    def dup(self, open_fd: Callable[[], int]) -> int:
        """A new descriptor (the caller closes it) of the held one, which ``open_fd`` opens the first time."""
        with self._lock:
            if self._fd < 0:
                fd = open_fd()
                self._fd, self._closer = fd, weakref.finalize(self, os.close, fd)
            return os.dup(self._fd)

    def drop(self) -> None:
        """Close the held descriptor (the next :meth:`dup` opens it again)."""
        with self._lock:
            closer, self._closer, self._fd = self._closer, None, -1
        if closer is not None:
            closer()


class LocalSource(ByteSource):
    """A local directory as a byte source; see the module docstring."""

    pins_open_files = True

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        # what str(root / key) is for a key check_key accepted (no empty, '.' or '..' part), joined
        # without pathlib, which cost half of opening a file (a load opens one per parameter)
        top = str(self.root)
        self._prefix = "" if top == "." else top if top.endswith("/") else top + "/"
        self._files: dict[str, LocalFile] = {}
        self._lock = threading.Lock()
        self._held_root = HeldDescriptor()

    @property
    def url(self) -> str:
        return str(self.root)

    def key_url(self, key: str) -> str:
        return str(self.root / key)

    def open(self, key: str) -> LocalFile:
        with self._lock:
            cached = self._files.get(key)
        if cached is not None:
            return cached
        f = self._open(key)
        with self._lock:
            if key in self._files:  # another thread opened it meanwhile
                f.close()
                return self._files[key]
            self._files[key] = f
            return f

    def _open(self, key: str) -> LocalFile:
        fd = self._walk(key, os.O_RDONLY)
        url = self._prefix + key
        st = _regular_file(fd, url)
        return LocalFile(fd, key, url, st.st_size)

    def _root_fd(self) -> int:
        """A new descriptor (the caller closes it) of the root folder, which is opened once and
        held until :meth:`close` (a sink's source uses the one its sink holds).

        Every key is reached from it: a store's files all come from the folder its manifest was
        read from even if the path is renamed or swapped for a link meanwhile, and a load does not
        resolve the root's whole path again for each of its few hundred files (two opens of three
        per file were the root's).
        """
        return self._held_root.dup(lambda: os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))

    def _walk(self, key: str, flags: int) -> int:
        """Open ``key`` below the root, refusing symbolic links at every step; return the fd."""
        parts = check_key(key, str(self.root)).split("/")
        try:
            dir_fd = self._root_fd()
        except FileNotFoundError:
            raise MissingFileError(errno.ENOENT, f"folder {self.root} does not exist", str(self.root)) from None
        except OSError as e:
            raise FileAccessError(e.errno, f"cannot open folder {self.root}: {e.strerror}") from None
        try:
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                # O_NONBLOCK: opening a FIFO planted in place of a file must not wait for a writer
                mode = ((flags | os.O_NONBLOCK) if last else os.O_RDONLY | os.O_DIRECTORY) | os.O_NOFOLLOW | \
                    os.O_CLOEXEC
                try:
                    fd = os.open(part, mode, dir_fd=dir_fd)
                except OSError as e:
                    raise self._open_error(e, key, "/".join(parts[:i + 1])) from None
                os.close(dir_fd)
                dir_fd = fd
            return dir_fd
        except BaseException:
            os.close(dir_fd)
            raise

    def _open_error(self, e: OSError, key: str, reached: str) -> Exception:
        where = self.key_url(key)
        if e.errno == errno.ELOOP or (e.errno == errno.ENOTDIR and os.path.islink(self.root / reached)):
            return UnsafePathError(f"{self.root / reached} is a symbolic link; ckptstore follows no links inside "
                                   f"{self.root} (reading {where})")
        if e.errno == errno.ENOENT:
            return MissingFileError(errno.ENOENT, f"file {where} is missing", where)
        if e.errno == errno.ENOTDIR:
            return FileAccessError(e.errno, f"{self.root / reached} is not a folder (reading {where})")
        return FileAccessError(e.errno, f"cannot open {where}: {e.strerror}")

    def stat(self, key: str) -> FileStat | None:
        try:
            fd = self._walk(key, os.O_RDONLY)
        except MissingFileError:
            return None
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return local_stat(st)

    def read_bytes(self, key: str, *, limit: int) -> bytes | None:
        try:
            f = self._open(key)
        except MissingFileError:
            return None
        try:
            if f.size > limit:
                raise FileAccessError(errno.EFBIG, f"{f.url} is {f.size} bytes, more than the {limit} a metadata "
                                      "file may have")
            return f.pread(0, f.size)
        finally:
            f.close()

    def list(self, prefix: str = "") -> tuple[list[str], list[str]]:
        fd = self._walk(prefix, os.O_RDONLY | os.O_DIRECTORY) if prefix else self._root_fd()
        folders, files = [], []
        try:
            for entry in os.scandir(fd):
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.name)
                elif entry.is_file(follow_symlinks=False):
                    files.append(entry.name)
        finally:
            os.close(fd)
        return sorted(folders), sorted(files)

    def close(self) -> None:
        with self._lock:
            files, self._files = list(self._files.values()), {}
        for f in files:
            f.close()
        self._held_root.drop()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


#: Plain paths are read from the local (or a shared) file system.
BYTE_SOURCE = Scheme((PATH,), LocalSource, "a local or shared-filesystem path")
