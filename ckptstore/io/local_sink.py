"""A local (or shared-filesystem) folder as a byte sink.

Whoever can create files in a shared output folder must not be able to make ckptstore write
anywhere else. So every path is reached component by component from a descriptor of the root
folder: folders are opened with ``O_DIRECTORY | O_NOFOLLOW`` and made with ``mkdirat``; new
temporary files are created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a name planted there is
removed first: unlinking a link never touches its target); files that are reopened (a resumed
partial file, a journal, the lock file) with ``O_NOFOLLOW``; renames and links go from one
folder descriptor to another. A symbolic link where ckptstore would write, lock or descend is
refused with :class:`~ckptstore.errors.UnsafePathError` naming it, before anything is written
through it. The root's own path is walked the same way, from ``/`` (or the working folder): a
link on it is followed only when no one but the user (or root) can have put it there (theirs,
in a folder of theirs that others cannot change, or a sticky one), so a parent folder someone
else swapped for a link just before a run is refused, naming the link. Its
descriptor is opened once (made if needed) and held for the sink's life, so a parent folder
swapped for a link during a run changes nothing either. A step folder (:meth:`LocalSink.folder`) is
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
:class:`~ckptstore.io.local_lock.FolderLock`).
"""
from __future__ import annotations

import errno
import itertools
import os
import stat as stat_mod
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ckptstore.errors import CkptStoreError, StoreExistsError, UnsafePathError
from ckptstore.io.base import check_key
from ckptstore.io.local import HeldDescriptor, LocalFile, LocalSource
from ckptstore.io.local_lock import FolderLock, temp_name
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

    def __init__(self, sink: LocalSink) -> None:
        super().__init__(sink.root)
        self._sink = weakref.ref(sink)  # no cycle: a sink dropped closes its root at once

    def _root_fd(self) -> int:
        sink = self._sink()
        return sink._root_fd(create=False) if sink is not None else super()._root_fd()


class LocalSink(ByteSink):
    """A local folder as a byte sink; see the module docstring."""

    seekable = True

    def __init__(self, root: str | os.PathLike[str], *, within: tuple[LocalSink, str] | None = None) -> None:
        self.root = Path(root)
        self.source = _SinkSource(self)
        self._touched: set[str] = set()
        self._lock = threading.Lock()
        #: ``(parent sink, folder name)`` when this sink is a folder of another (a step of a root):
        #: its own folder is then reached from the parent's descriptor, no link followed.
        self._within = within
        self._held_root = HeldDescriptor()

    def folder(self, name: str) -> LocalSink:
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
            fd = self._open_path(create=create)
        return fd

    def _open_path(self, *, create: bool) -> int:
        """Open (and make, if ``create``) the root's path one component at a time from ``/`` (or
        the working folder): a parent folder someone else swapped for a link before the root is
        held would otherwise send every file of the run into the link's target. A link on the way
        is followed only when it cannot be someone else's (:func:`_trusted_link`); its target is
        walked the same way."""
        absolute = self.root.is_absolute()
        fd = os.open("/" if absolute else ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        parts = self.root.parts[1:] if absolute else self.root.parts
        return self._walk_path(fd, Path("/") if absolute else Path(), parts, create=create, links=[0])

    def _walk_path(self, fd: int, base: Path, parts: Sequence[str], *, create: bool, links: list[int]) -> int:
        """Descend from folder ``fd`` (shown as ``base``; consumed) through ``parts``."""
        try:
            for part in parts:
                base = base / part
                sub = self._path_step(fd, part, base, create=create, links=links)
                os.close(fd)
                fd = sub
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _path_step(self, fd: int, part: str, shown: Path, *, create: bool, links: list[int]) -> int:
        """A descriptor of folder ``part`` of folder ``fd`` (made if ``create``), a link followed
        only when trusted."""
        try:
            return os.open(part, _DIR, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass  # made meanwhile (or planted: the next step says)
            return self._path_step(fd, part, shown, create=False, links=links)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK) or not _is_link(fd, part):
                raise
            if not _trusted_link(fd, part):
                raise UnsafePathError(
                    f"{shown} on the way to the output {self.root} is a symbolic link in a folder others can "
                    "change; ckptstore follows no link someone else may have swapped in (it would send the "
                    f"files elsewhere): name the real path {os.path.realpath(self.root)} if the link is yours"
                ) from None
            links[0] += 1
            if links[0] > _MAX_LINKS:
                raise
            target = Path(os.readlink(part, dir_fd=fd))
            start = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if target.is_absolute() else os.dup(fd)
            rest = target.parts[1:] if target.is_absolute() else target.parts
            return self._walk_path(start, Path("/") if target.is_absolute() else shown.parent, rest, create=False,
                                   links=links)

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
        """``(descriptor of the folder of key, file name)``; the caller closes the descriptor."""
        parts = check_key(key, str(self.root)).split("/")
        return self._folder(parts[:-1], create=create), parts[-1]

    @contextmanager
    def parent_folder(self, key: str, *, create: bool = True) -> Iterator[tuple[int, str]]:
        """``(descriptor of the folder of key, file name)`` for the ``with`` block, the folder
        reached from the root without following links (made if ``create``) and closed after."""
        dfd, name = self._parent(key, create=create)
        try:
            yield dfd, name
        finally:
            os.close(dfd)

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
                with parent.parent_folder(name, create=False) as (dfd, last):
                    os.rmdir(last, dir_fd=dfd)
            elif self.root.name not in ("", ".", ".."):
                parent = LocalSink(self.root.parent)  # reached as a root is: no link followed
                try:
                    with parent.parent_folder(self.root.name, create=False) as (dfd, last):
                        os.rmdir(last, dir_fd=dfd)
                finally:
                    parent.close()
            else:
                return
        except (OSError, UnsafePathError):
            return  # not empty (files ckptstore did not write), gone already, or a link (not ours)
        self._held_root.drop()

    # --- whole files ---------------------------------------------------------------------------

    def put(self, key: str, data: bytes, *, durable: bool = True) -> None:
        self.put_stream(key, (data,), durable=durable)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        try:
            with self.parent_folder(key) as (dfd, name):
                if _exists(dfd, name):
                    # another writer's (or planted: not ours either way). Looked up first, so that
                    # the writers that lose (every part but one) write and fsync no file of their
                    # own: an fsync while other writers hold unsynced data waits for theirs too
                    return False
                # a name of this call's own: several writers may race to create the same file
                tmp, _ = self._write_temp(dfd, name, partial_key(f"{name}.{os.getpid()}-{next(_unique)}"), (data,),
                                          True)
                try:
                    os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
                except FileExistsError:
                    return False  # another writer got there first (or a link is there: not ours)
                finally:
                    os.unlink(tmp, dir_fd=dfd)
                os.fsync(dfd)
                return True
        except OSError as e:
            raise write_error(e, self.key_url(key)) from e

    def _write_temp(self, dfd: int, name: str, tmp: str, pieces: Iterable[Any], durable: bool) -> tuple[str, int]:
        """A new file ``tmp`` of ``pieces`` one after another, created exclusively (a leftover is
        replaced) and removed if writing fails; returns ``(tmp, its size)``. An error of the
        pieces' own (reading the bytes to write) is raised as it is; one of the writing, as the
        ``OSError`` the caller turns into a write error."""
        fd = self.open_in_folder(dfd, tmp, resume=False, where=self.root / name)
        size = 0
        try:
            for piece in pieces:
                view, done = memoryview(piece).cast("B"), 0
                while done < len(view):
                    done += os.write(fd, view[done:])
                size += done
                del view, piece  # a staged buffer is freed before the next one is taken
            if durable:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=dfd)
            raise
        os.close(fd)
        return tmp, size

    def put_stream(self, key: str, pieces: Iterable[Any], *, durable: bool = True) -> int:
        # one walk to the folder serves the whole file (a rank's save writes hundreds of them)
        try:
            with self.parent_folder(key) as (dfd, name):
                # one temporary name per file, which a rerun reuses: a killed writer leaves no litter
                tmp, size = self._write_temp(dfd, name, partial_key(name), pieces, durable)
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except CkptStoreError:
            raise  # the pieces' source failed (or the path is unsafe): not this write
        except OSError as e:
            raise write_error(e, self.key_url(key)) from e
        if durable:
            self._touch(key.rsplit("/", 1)[0] if "/" in key else "")
        return size

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
            with self.parent_folder(key) as (dfd, _):
                fd = self.open_in_folder(dfd, name, resume=resume, where=self._beside(key, name))
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
        except OSError as e:
            raise write_error(e, self.key_url(key)) from e
        folder = key[:len(key) - len(key.rsplit("/", 1)[-1])]
        return LocalSinkFile(fd, key, self.key_url(folder + name), 0 if truncate else st.st_size)

    def _beside(self, key: str, name: str) -> Path:
        """The path of file ``name`` in the folder of ``key`` (for messages)."""
        return (self.root / key).parent / name

    def open_in_folder(self, dfd: int, name: str, *, resume: bool, where: Path) -> int:
        """A descriptor of file ``name`` of folder ``dfd``, read-write, no link followed (a link
        is an ``UnsafePathError`` naming ``where``): reopened if ``resume`` (made if missing),
        else created anew (a leftover of that name replaced)."""
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
            with self.parent_folder(key, create=False) as (dfd, name):
                if durable:
                    _fsync_file(dfd, partial_key(name))
                os.rename(partial_key(name), name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as e:
            raise write_error(e, self.key_url(key)) from e
        if durable:
            self._touch(key.rsplit("/", 1)[0] if "/" in key else "")

    def unpublish(self, key: str) -> None:
        try:
            with self.parent_folder(key, create=False) as (dfd, name):
                os.rename(name, partial_key(name), src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as e:
            raise write_error(e, self.key_url(key)) from e

    # --- everything else -----------------------------------------------------------------------

    def size(self, key: str) -> int | None:
        try:
            with self.parent_folder(key, create=False) as (dfd, name):
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
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
                with self.parent_folder(key, create=False) as (dfd, name):
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except (OSError, UnsafePathError):
                continue  # removed meanwhile
            out.append((key, st.st_size, st.st_mtime_ns))
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
            with self.parent_folder(key, create=False) as (dfd, name):
                try:
                    op(dfd, name)
                except FileNotFoundError:
                    return False
                except OSError as e:
                    raise write_error(e, self.key_url(key)) from e
        except (FileNotFoundError, NotADirectoryError):
            return False  # the folder is missing
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
             wait: bool = True) -> FolderLock | None:
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


def _own_copy(dfd: int, name: str, fd: int, nbytes: int) -> int:
    """Replace file ``name`` (open as ``fd``, which other names share) by a new file of its first
    ``nbytes`` bytes and return the new file's descriptor (``fd`` is closed): the shared file is
    left as it was, and only the name now points elsewhere."""
    tmp = temp_name(name)
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


#: Links followed on the way to a root, at most (the kernel's own limit, ``ELOOP``).
_MAX_LINKS = 40


def _trusted_link(dfd: int, name: str) -> bool:
    """Whether link ``name`` of folder ``dfd`` is one only this user or root can have put there:
    the link and the folder are theirs, and no one else may rename entries of the folder (it is
    not writable by group or others, or it is sticky, as ``/tmp``). Such a link is the user's
    own choice (``/home`` on a cluster's shared file system, a link in their home folder);
    any other may have been swapped in by whoever can write that folder."""
    me = os.geteuid()
    link, folder = os.stat(name, dir_fd=dfd, follow_symlinks=False), os.fstat(dfd)
    if link.st_uid not in (0, me) or folder.st_uid not in (0, me):
        return False
    return not folder.st_mode & (stat_mod.S_IWGRP | stat_mod.S_IWOTH) or bool(folder.st_mode & stat_mod.S_ISVTX)


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


#: Plain paths are written on the local (or a shared) file system.
BYTE_SINK = Scheme((PATH,), LocalSink, "a local or shared-filesystem path")
