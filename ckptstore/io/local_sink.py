"""A local (or shared-filesystem) folder as a byte sink.

Whoever can create files in a shared output folder must not be able to make ckptstore write
anywhere else. So every path is reached component by component from a descriptor of the root
folder: folders are opened with ``O_DIRECTORY | O_NOFOLLOW`` and made with ``mkdirat``; new
temporary files are created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a name planted there is
removed first: unlinking a link never touches its target); files that are reopened (a resumed
partial file, a journal, the lock file) with ``O_NOFOLLOW``; renames and links go from one
folder descriptor to another. A symbolic link where ckptstore would write, lock or descend is
refused with :class:`~ckptstore.errors.UnsafePathError` naming it, before anything is written
through it. The root itself is the user's choice and may be reached through links; its
descriptor is opened once (made if needed) and held for the sink's life, so a parent folder
swapped for a link during a run changes nothing. A step folder (:meth:`LocalSink.folder`) is
reached from its root's descriptor like any other folder: a planted link there is refused. A
file that is reopened but shares its inode with another name (link count above 1: a ``cp -al``
or ``rsync --link-dest`` snapshot, or a planted hard link) is never written through: a resumed
file goes on in a copy of its own renamed over the name, a journal starts in a new file, and a
lock file is replaced by a new one locked before the rename.

A published file is fsynced before its rename (unless it is put with ``durable=False``: a
saving rank renames its files at once and fsyncs them together, concurrently, with
:meth:`LocalSink.make_durable` before it says it has finished); the folders that changed
(renames, new folders) are remembered and fsynced by :meth:`LocalSink.sync`, which a commit
calls once before it writes the manifest. The lock is an ``flock`` on a file of the work folder (see
:class:`FolderLock`).
"""
from __future__ import annotations

import errno
import fcntl
import itertools
import os
import socket
import stat as stat_mod
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from ckptstore.errors import StoreExistsError, UnsafePathError
from ckptstore.io.base import check_key
from ckptstore.io.local import HeldDescriptor, LocalFile, LocalSource
from ckptstore.io.schemes import PATH, Scheme
from ckptstore.io.sink import ByteSink, SinkFile, partial_key, write_error

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Fsyncs run at once by :meth:`LocalSink.sync` and :meth:`LocalSink.make_durable`.
SYNC_THREADS = 16
_unique = itertools.count()


class LocalSinkFile(LocalFile, SinkFile):
    """A partial file open for reading and writing at offsets."""

    def pwrite(self, data: Any, offset: int) -> None:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], offset + done)
        self.size = max(self.size, offset + len(view))

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        self.size = size


class _SinkSource(LocalSource):
    """The sink's own reads: from the root descriptor it holds (a resumed run reads back its work
    records from the folder it writes, not from wherever the path leads now; a step folder that
    is a link is refused for reading too)."""

    def __init__(self, sink: "LocalSink") -> None:
        super().__init__(sink.root)
        self._sink = weakref.ref(sink)  # no cycle: a sink dropped closes its root at once

    def _root_fd(self) -> int:
        sink = self._sink()
        return sink._root_fd(create=False) if sink is not None else super()._root_fd()


class LocalSink(ByteSink):
    """A local folder as a byte sink; see the module docstring."""

    seekable = True

    def __init__(self, root: str | os.PathLike[str], *, within: "tuple[LocalSink, str] | None" = None) -> None:
        self.root = Path(root)
        self.source = _SinkSource(self)
        self._touched: set[str] = set()
        self._lock = threading.Lock()
        #: ``(parent sink, folder name)`` when this sink is a folder of another (a step of a root):
        #: its own folder is then reached from the parent's descriptor, no link followed.
        self._within = within
        self._held_root = HeldDescriptor()

    def folder(self, name: str) -> "LocalSink":
        return LocalSink(self.root / check_key(name, str(self.root)), within=(self, name))

    # --- folders -------------------------------------------------------------------------------

    def _root_fd(self, *, create: bool) -> int:
        """A new descriptor (the caller closes it) of the root, which is opened (and made, if
        ``create``) once and held for the sink's life: a parent folder swapped for a link during a
        run then changes nothing (every other path is reached from it)."""
        return self._held_root.dup(lambda: self._open_root(create=create))

    def _open_root(self, *, create: bool) -> int:
        """Open (and make, if ``create``) the root; return its descriptor."""
        if self._within is not None:
            parent, name = self._within
            fd = parent._folder(name.split("/"), create=create)
        else:
            try:
                fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:
                if not create:
                    raise
                os.makedirs(self.root, exist_ok=True)
                fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return fd

    def close(self) -> None:
        self._held_root.drop()
        super().close()

    def _folder(self, parts: Sequence[str], *, create: bool) -> int:
        """A descriptor of folder ``parts`` below the root, made (with the root) if ``create``."""
        fd = self._root_fd(create=create)
        try:
            for i, part in enumerate(parts):
                try:
                    sub = os.open(part, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                        self._touch("/".join(parts[:i]))
                    except FileExistsError:
                        pass  # another writer made it meanwhile (or planted something: the open says)
                    sub = self._open_folder(part, fd, parts[:i + 1])
                except OSError as e:
                    raise self._refusal(e, fd, part, "/".join(parts[:i + 1])) from None
                os.close(fd)
                fd = sub
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _open_folder(self, part: str, fd: int, parts: Sequence[str]) -> int:
        try:
            return os.open(part, _DIR, dir_fd=fd)
        except OSError as e:
            raise self._refusal(e, fd, part, "/".join(parts)) from None

    def _refusal(self, e: OSError, dfd: int, name: str, reached: str) -> OSError | UnsafePathError:
        """An ``UnsafePathError`` when ``name`` in folder ``dfd`` (``reached`` below the root) is a
        link (``O_NOFOLLOW`` said so), else ``e``."""
        path = self.root / reached
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK) and _is_link(dfd, name):
            return UnsafePathError(f"{path} is a symbolic link; ckptstore writes through no links inside "
                                   f"{self.root} (someone else may have planted it): remove it, or choose "
                                   "another output folder")
        return e

    def _parent(self, key: str, *, create: bool = True) -> tuple[int, str]:
        """``(descriptor of the folder of key, file name)``."""
        parts = check_key(key, str(self.root)).split("/")
        return self._folder(parts[:-1], create=create), parts[-1]

    def _touch(self, folder: str) -> None:
        with self._lock:
            self._touched.add(folder)

    def contains(self, location: str) -> bool:
        from ckptstore.io import is_url

        if is_url(location):
            return False
        root = os.path.realpath(self.root)
        return os.path.commonpath([root, os.path.realpath(location)]) == root

    def listing(self) -> tuple[list[str], list[str]]:
        if not self.root.exists():
            return [], []
        if not self.root.is_dir():
            raise StoreExistsError(f"output path {self.root} is a file, not a folder; choose another")
        return self.source.list()

    def links(self) -> list[str]:
        try:
            fd = self._folder([], create=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        try:
            return sorted(e.name for e in os.scandir(fd) if e.is_symlink())
        finally:
            os.close(fd)

    def make_root(self) -> None:
        try:
            os.close(self._root_fd(create=True))
        except OSError as e:
            raise write_error(e, self.root) from e

    def remove_root(self) -> None:
        try:
            if self._within is not None:
                parent, name = self._within
                dfd, last = parent._parent(name, create=False)
                try:
                    os.rmdir(last, dir_fd=dfd)
                finally:
                    os.close(dfd)
            else:
                os.rmdir(self.root)
        except (OSError, UnsafePathError):
            return  # not empty (files ckptstore did not write), gone already, or a link (not ours)
        self._held_root.drop()

    # --- whole files ---------------------------------------------------------------------------

    def put(self, key: str, data: bytes, *, durable: bool = True) -> None:
        try:
            dfd, name = self._parent(key)
            try:
                # one temporary name per file, which a rerun reuses: a killed writer leaves no litter
                tmp = self._write_temp(dfd, name, partial_key(name), data, durable)
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            raise write_error(e, self.key_url(key)) from e
        if durable:
            self._touch(key.rsplit("/", 1)[0] if "/" in key else "")

    def put_if_absent(self, key: str, data: bytes) -> bool:
        try:
            dfd, name = self._parent(key)
            try:
                if _exists(dfd, name):
                    # another writer's (or planted: not ours either way). Looked up first, so that
                    # the writers that lose (every part but one) write and fsync no file of their
                    # own: an fsync while other writers hold unsynced data waits for theirs too
                    return False
                # a name of this call's own: several writers may race to create the same file
                tmp = self._write_temp(dfd, name, partial_key(f"{name}.{os.getpid()}-{next(_unique)}"), data, True)
                try:
                    os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
                except FileExistsError:
                    return False  # another writer got there first (or a link is there: not ours)
                finally:
                    os.unlink(tmp, dir_fd=dfd)
                os.fsync(dfd)
                return True
            finally:
                os.close(dfd)
        except OSError as e:
            raise write_error(e, self.key_url(key)) from e

    def _write_temp(self, dfd: int, name: str, tmp: str, data: bytes, durable: bool) -> str:
        """A new file ``tmp`` of ``data``, created exclusively (a leftover is replaced); returns ``tmp``."""
        fd = self._open_in(dfd, tmp, resume=False, where=self.root / name)
        try:
            view, done = memoryview(data).cast("B"), 0
            while done < len(view):
                done += os.write(fd, view[done:])
            if durable:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=dfd)
            raise
        os.close(fd)
        return tmp

    def put_stream(self, key: str, pieces: Iterable[Any], *, durable: bool = True) -> int:
        f = self.create(key)
        try:
            offset = 0
            for piece in pieces:
                f.pwrite(piece, offset)
                offset += memoryview(piece).nbytes
        except BaseException:
            f.close()
            self.delete([partial_key(key)])
            raise
        f.close()
        self._publish(key, durable)
        return offset

    # --- files at offsets ----------------------------------------------------------------------

    def create(self, key: str, *, resume: bool = False) -> LocalSinkFile:
        return self._open_file(key, partial_key(key.rsplit("/", 1)[-1]), resume=resume, truncate=False)

    def append_log(self, key: str, *, keep: bytes = b"") -> LocalSinkFile:
        f = self._open_file(key, key.rsplit("/", 1)[-1], resume=True, truncate=True)
        if keep:
            f.pwrite(keep, 0)
        return f

    def _open_file(self, key: str, name: str, *, resume: bool, truncate: bool) -> LocalSinkFile:
        try:
            dfd, _ = self._parent(key)
            try:
                fd = self._open_in(dfd, name, resume=resume, where=self._beside(key, name))
                st = os.fstat(fd)
                if not stat_mod.S_ISREG(st.st_mode):
                    os.close(fd)
                    raise UnsafePathError(f"{self.key_url(key)} ({name}) is not a regular file; remove it, or choose "
                                          "another output folder")
                if st.st_nlink > 1:
                    # another name shares the file (a `cp -al` or `rsync --link-dest` snapshot, or a
                    # planted link): writing would change it there too, so continue in a copy of our own
                    fd = _own_copy(dfd, name, fd, 0 if truncate else st.st_size)
                elif truncate and st.st_size:
                    os.ftruncate(fd, 0)
            finally:
                os.close(dfd)
        except OSError as e:
            raise write_error(e, self.key_url(key)) from e
        folder = key[:len(key) - len(key.rsplit("/", 1)[-1])]
        return LocalSinkFile(fd, key, self.key_url(folder + name), 0 if truncate else st.st_size)

    def _beside(self, key: str, name: str) -> Path:
        """The path of file ``name`` in the folder of ``key`` (for messages)."""
        return (self.root / key).parent / name

    def _open_in(self, dfd: int, name: str, *, resume: bool, where: Path) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        if resume:
            try:
                return os.open(name, flags, 0o644, dir_fd=dfd)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise UnsafePathError(f"{where} is a symbolic link; ckptstore writes through no links inside "
                                          f"{self.root} (someone else may have planted it): remove it, or choose "
                                          "another output folder") from None
                raise
        try:
            return os.open(name, flags | os.O_EXCL, 0o644, dir_fd=dfd)
        except FileExistsError:
            # a leftover (of an interrupted run, or planted): unlinking a name never touches a target
            os.unlink(name, dir_fd=dfd)
            return os.open(name, flags | os.O_EXCL, 0o644, dir_fd=dfd)

    def publish(self, key: str) -> None:
        self._publish(key, True)

    def _publish(self, key: str, durable: bool) -> None:
        try:
            dfd, name = self._parent(key, create=False)
            try:
                if durable:
                    fd = os.open(partial_key(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                os.rename(partial_key(name), name, src_dir_fd=dfd, dst_dir_fd=dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            raise write_error(e, self.key_url(key)) from e
        if durable:
            self._touch(key.rsplit("/", 1)[0] if "/" in key else "")

    def unpublish(self, key: str) -> None:
        try:
            dfd, name = self._parent(key, create=False)
            try:
                os.rename(name, partial_key(name), src_dir_fd=dfd, dst_dir_fd=dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            raise write_error(e, self.key_url(key)) from e

    # --- everything else -----------------------------------------------------------------------

    def size(self, key: str) -> int | None:
        try:
            dfd, name = self._parent(key, create=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        finally:
            os.close(dfd)
        return st.st_size if stat_mod.S_ISREG(st.st_mode) else None

    def keys(self, prefix: str = "") -> list[str]:
        parts = check_key(prefix, str(self.root)).split("/") if prefix else []
        try:
            fd = self._folder(parts, create=False)
        except (FileNotFoundError, NotADirectoryError, UnsafePathError):
            return []
        return sorted(self._walk(fd, prefix))

    def files(self, prefix: str = "") -> list[tuple[str, int, int]]:
        out = []
        for key in self.keys(prefix):
            try:
                dfd, name = self._parent(key, create=False)
            except (OSError, UnsafePathError):
                continue  # removed meanwhile
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                out.append((key, st.st_size, st.st_mtime_ns))
            except OSError:
                continue
            finally:
                os.close(dfd)
        return out

    def _walk(self, fd: int, prefix: str) -> Iterator[str]:
        try:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in os.scandir(fd)]
            for name, is_dir in entries:
                key = f"{prefix}/{name}" if prefix else name
                if not is_dir:
                    yield key
                    continue
                try:
                    sub = os.open(name, _DIR, dir_fd=fd)
                except OSError:
                    continue  # replaced meanwhile
                yield from self._walk(sub, key)
        finally:
            os.close(fd)

    def _in_folder(self, key: str, op: Callable[[int, str], None]) -> bool:
        """Run ``op(folder descriptor, file name)`` for ``key`` in its folder (opened without
        following links). ``False`` when the folder or the file is missing; any other failure is
        a :class:`~ckptstore.errors.StoreWriteError` naming the key."""
        try:
            dfd, name = self._parent(key, create=False)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            op(dfd, name)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise write_error(e, self.key_url(key)) from e
        finally:
            os.close(dfd)
        return True

    def delete(self, keys: Sequence[str]) -> None:
        folders: set[str] = set()
        for key in keys:
            self._in_folder(key, _unlink_file)
            if "/" in key:
                folders.add(key.rsplit("/", 1)[0])
        for folder in sorted(folders, key=lambda f: -f.count("/")):
            self._prune(folder)

    def _prune(self, folder: str) -> None:
        """Remove ``folder`` and its parents while they are empty (never the root)."""
        parts = folder.split("/")
        while parts:
            try:
                dfd = self._folder(parts[:-1], create=False)
            except (OSError, UnsafePathError):
                return
            try:
                os.rmdir(parts[-1], dir_fd=dfd)
            except OSError:
                return  # not empty (or not ours to remove)
            finally:
                os.close(dfd)
            parts = parts[:-1]

    def sync(self) -> None:
        if self._within is not None:
            self._within[0].sync()  # the parent's folder names this one (made by this sink, maybe)
        with self._lock:
            folders, self._touched = sorted(self._touched), set()
        # on this machine 950 folders took 2.8 s fsynced one after another
        _fsync_all(self._sync_folder, folders)

    def _sync_folder(self, folder: str) -> None:
        try:
            fd = self._folder(folder.split("/") if folder else [], create=False)
        except FileNotFoundError:
            return  # removed since (a work folder)
        except OSError as e:
            raise write_error(e, self.key_url(folder) if folder else self.url) from e
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def make_durable(self, keys: Sequence[str]) -> None:
        # a saving rank's few hundred files fsynced one after another cost ~9 ms each here
        _fsync_all(self._make_durable, keys)

    def _make_durable(self, key: str) -> None:
        if not self._in_folder(key, _fsync_file):
            return
        parts = key.split("/")[:-1]
        for i in range(len(parts) + 1):  # its folder, and each folder that names the next
            self._touch("/".join(parts[:i]))

    def lock(self, name: str, on_wait: Callable[[str], None] | None = None, *,
             wait: bool = True) -> "FolderLock | None":
        from ckptstore.io.sink import LOCK_FOLDER as WORK_DIR

        lock = FolderLock(self, f"{WORK_DIR}/{name}", on_wait=on_wait)
        return lock.acquire() if wait else lock.try_acquire()


def _fsync_all(fsync: Callable[[str], None], names: Sequence[str]) -> None:
    """Run ``fsync`` on each of ``names``, several at once when there are several: a journaling
    file system commits concurrent fsyncs together, in a few batches instead of one each."""
    if len(names) <= 1:
        for name in names:
            fsync(name)
        return
    with ThreadPoolExecutor(min(SYNC_THREADS, len(names))) as pool:
        list(pool.map(fsync, names))


def _temp_name(name: str) -> str:
    """A name beside ``name`` that no other writer uses (created exclusively)."""
    return f"{name}.{os.getpid()}-{next(_unique)}.tmp"


def _own_copy(dfd: int, name: str, fd: int, nbytes: int) -> int:
    """Replace file ``name`` (open as ``fd``, which other names share) by a new file of its first
    ``nbytes`` bytes and return the new file's descriptor (``fd`` is closed): the shared file is
    left as it was, and only the name now points elsewhere."""
    tmp = _temp_name(name)
    new = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
    try:
        done = 0
        while done < nbytes:
            n = os.copy_file_range(fd, new, nbytes - done, done, done)
            if n == 0:
                break  # the shared file is shorter than it was (changed meanwhile): keep what there is
            done += n
        os.fsync(new)  # the copy is durable before its name replaces the shared file's
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        os.close(new)
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)
    return new


def _exists(dfd: int, name: str) -> bool:
    """Whether ``name`` is in folder ``dfd`` (as anything, a link included: not followed)."""
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _is_link(dfd: int, name: str) -> bool:
    try:
        return stat_mod.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _unlink_file(dfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except IsADirectoryError:
        pass  # a folder in place of a file we wrote: not ours to remove


def _fsync_file(dfd: int, name: str) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FolderLock:
    """An exclusive ``flock`` on the lock file ``key`` of a :class:`LocalSink`.

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

    def __init__(self, sink: LocalSink, key: str, *, on_wait: Callable[[str], None] | None = None) -> None:
        self.sink, self.key, self.on_wait = sink, key, on_wait
        self.path = sink.root / key
        self._fd = -1

    def acquire(self) -> "FolderLock":
        """Block until this process holds the lock."""
        held = self._take(wait=True)
        if held is None:  # waiting always ends holding the lock
            raise RuntimeError(f"could not lock {self.path}")
        return held

    def try_acquire(self) -> "FolderLock | None":
        """Take the lock if no one holds it; ``None`` if someone does."""
        return self._take(wait=False)

    def _take(self, *, wait: bool) -> "FolderLock | None":
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

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _open(self) -> int:
        while True:
            try:
                dfd, name = self.sink._parent(self.key)
            except FileNotFoundError:
                continue  # a committing holder removed a folder while it was being made
            except OSError as e:
                raise write_error(e, f"the lock file {self.path}") from e
            try:
                return self.sink._open_in(dfd, name, resume=True, where=self.path)
            except FileNotFoundError:
                continue  # a committing holder removed the folder between the two calls
            except OSError as e:
                raise write_error(e, f"the lock file {self.path}") from e
            finally:
                os.close(dfd)

    def _own_file(self, fd: int) -> int:
        """``fd`` (held, locked), or when other names share the lock file (a snapshot made with
        ``cp -al``, or a planted link) a new file locked before it replaces the name: the holder's
        line is never written into a file another name shows, and a process that opens the name
        meanwhile waits on the new file while the old one is still held."""
        if os.fstat(fd).st_nlink <= 1:
            return fd
        try:
            dfd, name = self.sink._parent(self.key, create=False)
        except OSError as e:
            os.close(fd)
            raise write_error(e, f"the lock file {self.path}") from e
        tmp, new = _temp_name(name), -1
        try:
            new = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
            fcntl.flock(new, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: no one else can hold it
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as e:
            if new >= 0:
                os.close(new)
                os.unlink(tmp, dir_fd=dfd)
            raise write_error(e, f"the lock file {self.path}") from e
        finally:
            os.close(dfd)
            os.close(fd)
        return new

    def _still_named(self, fd: int) -> bool:
        try:
            dfd, name = self.sink._parent(self.key, create=False)
        except OSError:
            return False
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        finally:
            os.close(dfd)
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


#: Plain paths are written on the local (or a shared) file system.
BYTE_SINK = Scheme((PATH,), LocalSink, "a local or shared-filesystem path")
