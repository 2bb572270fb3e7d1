"""Where a store is written: a local (or shared-filesystem) folder, or an object-store prefix.

The converter's bookkeeping — the work folder's fingerprint and records of finished
parameters, the markers of finished parts, the manifest written last — goes through an
:class:`OutputTarget`, so one protocol (:mod:`ckptstore.write.output_folder`, :mod:`ckptstore.write.parts`)
runs on both. Small files are written whole and atomically (a local file is written under a
temporary name and renamed; an object PUT is atomic by itself). ``create=True`` writes a file
only if it does not exist yet (``O_EXCL`` locally, a conditional PUT, ``If-None-Match: *``, on
object storage): the first writer wins, the others read what it wrote.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ckptstore.io.atomic_file import write_atomic
from ckptstore.store.kinds import MANIFEST, ROOT_METADATA, WORK_DIR, read_manifest
from ckptstore.errors import CkptStoreError, StoreExistsError, StoreUnavailableError, StoreWriteError
from ckptstore.limits import MAX_METADATA_BYTES
from ckptstore.write.output_lock import OutputLock
from ckptstore.io import ByteSource, LocalSource, is_url
from ckptstore.io.s3 import S3Source

SAFETENSORS_FILE = re.compile(r"^model-\d+-of-\d+\.safetensors(\.partial)?$")


def write_error(e: OSError, path: Path | str, param: str | None = None) -> StoreWriteError | StoreUnavailableError:
    """A :class:`StoreWriteError` that says what failed and that a rerun resumes (an object store
    that did not answer stays a :class:`StoreUnavailableError`, which says so already)."""
    if isinstance(e, (StoreWriteError, StoreUnavailableError)):
        return e
    what = "no space left on the device" if e.errno == errno.ENOSPC else e.strerror or str(e)
    where = f" (parameter {param!r})" if param else ""
    return StoreWriteError(e.errno or 0, f"{what} while writing {path}{where}; free space or fix the "
                           "problem, then rerun the same command to resume")


class _NoLock:
    def release(self) -> None:
        pass


class OutputTarget(ABC):
    """A store's location, for writing; see the module docstring."""

    #: Whether files live in object storage (no locks, no partial files, whole-object writes).
    remote = False
    source: ByteSource

    @property
    def url(self) -> str:
        return self.source.url

    def key_url(self, key: str) -> str:
        return self.source.key_url(key)

    def read(self, key: str) -> bytes | None:
        """A small file's bytes, or ``None`` when it does not exist."""
        return self.source.read_bytes(key, limit=MAX_METADATA_BYTES)

    def manifest(self) -> dict | None:
        """The manifest of a *complete* store here, else ``None``."""
        try:
            doc = read_manifest(self.source)
        except CkptStoreError:
            return None
        return doc if isinstance(doc, dict) and doc.get("complete") is True else None

    @abstractmethod
    def write(self, key: str, data: bytes, *, create: bool = False, durable: bool = True) -> bool:
        """Write a small file whole; with ``create``, only if it is absent. Returns whether it wrote.

        ``durable=False`` (work-folder records, which a rerun redoes if they are lost) skips the
        fsyncs a local file would otherwise cost: thousands of parameters, thousands of fsyncs.
        """

    @abstractmethod
    def size(self, key: str) -> int | None:
        """The size of ``key``, or ``None`` when it does not exist."""

    @abstractmethod
    def keys(self, prefix: str) -> list[str]:
        """Every file below folder ``prefix`` (recursively), as keys of the target."""

    @abstractmethod
    def delete(self, keys: Sequence[str]) -> None:
        """Delete files (missing ones are fine)."""

    @abstractmethod
    def prepare(self, sources: Iterable[str]) -> None:
        """Refuse a location that holds the source or foreign files; create the folder."""

    @abstractmethod
    def clear_store(self) -> None:
        """Delete what a conversion writes here (the lock excepted), and nothing else."""

    @abstractmethod
    def lock(self, name: str, on_wait: Callable[[str], None] | None = None, *, wait: bool = True) -> Any:
        """Hold the exclusive lock ``name`` of the work folder (``None`` if ``wait=False`` and it is held)."""

    def drop_work(self) -> None:
        """Remove the work folder (after a commit)."""
        self.delete(self.keys(WORK_DIR))

    def drop_idle_work(self) -> None:
        """Remove the work folder if it holds nothing but lock files."""


class LocalTarget(OutputTarget):
    """A local or shared-filesystem folder."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.source = LocalSource(self.root)

    def write(self, key: str, data: bytes, *, create: bool = False, durable: bool = True) -> bool:
        path = self.root / key
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if create:
                if path.exists():
                    return False
                tmp = path.with_name(f"{path.name}.{os.getpid()}.new")
                write_atomic(tmp, data, sync_folder=False, durable=durable)
                try:
                    os.link(tmp, path)  # fails if another writer got there first
                except FileExistsError:
                    return False
                finally:
                    tmp.unlink(missing_ok=True)
                return True
            write_atomic(path, data, sync_folder=key in (MANIFEST, ROOT_METADATA), durable=durable)
        except OSError as e:
            raise write_error(e, path) from e
        return True

    def size(self, key: str) -> int | None:
        try:
            st = (self.root / key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return st.st_size

    def keys(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file() or p.is_symlink())

    def delete(self, keys: Sequence[str]) -> None:
        for k in keys:
            (self.root / k).unlink(missing_ok=True)

    def drop_work(self) -> None:
        work = self.root / WORK_DIR
        try:
            entries = list(work.iterdir())
        except OSError:
            return
        # The lock files go last: a process that takes the lock while this runs then finds only
        # lock files left and removes them itself (drop_idle_work), instead of leaving a fresh
        # lock file behind in the complete store.
        for p in entries:
            if not p.name.startswith("lock"):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)

    def drop_idle_work(self) -> None:
        work = self.root / WORK_DIR
        if work.is_dir() and all(p.name.startswith("lock") for p in work.iterdir()):
            shutil.rmtree(work, ignore_errors=True)

    def prepare(self, sources: Iterable[str]) -> None:
        out = self.root
        if out.exists() and not out.is_dir():
            raise StoreExistsError(f"output path {out} is a file, not a folder; choose another --out")
        root = os.path.realpath(out)
        for src in sources:
            if not is_url(src) and os.path.commonpath([root, os.path.realpath(src)]) == root:
                raise StoreExistsError(f"output folder {out} contains the source checkpoint ({src}); choose an "
                                       "output folder outside it")
        if out.is_dir() and any(out.iterdir()) and not (out / WORK_DIR).is_dir() and self.manifest() is None:
            raise StoreExistsError(f"output folder {out} is not empty and is not a ckptstore store; choose an empty "
                                   "or new folder")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise write_error(e, out) from e

    def clear_store(self) -> None:
        out = self.root
        for child in out.iterdir():
            if child.name == WORK_DIR and child.is_dir() and not child.is_symlink():
                for sub in child.iterdir():
                    if not sub.name.startswith("lock"):
                        shutil.rmtree(sub) if sub.is_dir() and not sub.is_symlink() else sub.unlink()
            elif child.name in (ROOT_METADATA, MANIFEST) or SAFETENSORS_FILE.match(child.name):
                if not child.is_dir():
                    child.unlink()
            elif child.is_dir() and not child.is_symlink() and (child / ROOT_METADATA).is_file():
                shutil.rmtree(child)  # a Zarr array folder

    def lock(self, name: str, on_wait: Callable[[str], None] | None = None, *, wait: bool = True) -> Any:
        lock = OutputLock(self.root / WORK_DIR, name, on_wait=on_wait)
        return lock.acquire() if wait else lock.try_acquire()


class ObjectTarget(OutputTarget):
    """A bucket prefix (``s3://`` or ``obs://``).

    Object storage has no locks: two conversions of *different* files into one prefix are kept
    apart by the work folder's fingerprint, created with a conditional PUT (the second one finds
    another fingerprint and stops); runs of the *same* conversion (parts on several hosts, or a
    rerun while an old run is still alive) write identical objects, so they cannot corrupt
    each other.
    """

    remote = True

    def __init__(self, url: str) -> None:
        self.source = S3Source(url)

    def write(self, key: str, data: bytes, *, create: bool = False, durable: bool = True) -> bool:
        if create:
            return self.source.put_if_absent(key, data)
        self.source.put(key, data)
        return True

    def size(self, key: str) -> int | None:
        st = self.source.stat(key)
        return None if st is None else st.size

    def keys(self, prefix: str) -> list[str]:
        return sorted(k for k, _ in self.source.walk(prefix))

    def delete(self, keys: Sequence[str]) -> None:
        self.source.delete(list(keys))

    def prepare(self, sources: Iterable[str]) -> None:
        here = self.url.rstrip("/") + "/"
        for src in sources:
            if is_url(src) and (src.rstrip("/") + "/").startswith(here):
                raise StoreExistsError(f"output location {self.url} contains the source checkpoint ({src}); choose "
                                       "an output prefix outside it")
        folders, files = self.source.list()
        if (folders or files) and WORK_DIR not in folders and self.manifest() is None:
            raise StoreExistsError(f"output location {self.url} is not empty and is not a ckptstore store; choose an "
                                   "empty or new prefix")

    def clear_store(self) -> None:
        keys = [k for k, _ in self.source.walk()]
        arrays = {k.rsplit("/", 1)[0] for k in keys if k.endswith("/" + ROOT_METADATA)}
        mine = [k for k in keys
                if k.split("/")[0] == WORK_DIR or k in (ROOT_METADATA, MANIFEST) or SAFETENSORS_FILE.match(k)
                or any(k.startswith(a + "/") for a in arrays)]
        self.delete(mine)

    def lock(self, name: str, on_wait: Callable[[str], None] | None = None, *, wait: bool = True) -> Any:
        return _NoLock()


def open_target(out: str | os.PathLike[str]) -> OutputTarget:
    """The output target of ``--out``: a folder, or an ``s3://``/``obs://`` prefix."""
    return ObjectTarget(str(out)) if is_url(out) else LocalTarget(out)
