"""The byte-sink seam: everything ckptstore writes goes through a :class:`ByteSink`.

A byte sink is the writing twin of a :class:`~ckptstore.io.base.ByteSource`: one folder (or
object-store prefix) holding files addressed by keys, checked by
:func:`~ckptstore.io.base.check_key` (no ``..``, nothing absolute). Store data files, safetensors
files, manifests, work records, journals, the output lock and exported rank files are all
written through one, so a store writer never knows where its bytes go and the confinement rules
(no symbolic link followed, temporary names created exclusively) live in one place per kind of
storage.

Two ways to write a file:

* **whole**: :meth:`ByteSink.put` (a small file, atomically), :meth:`ByteSink.put_if_absent`
  (a conditional create: the first writer wins) and :meth:`ByteSink.put_stream` (a large file
  from an iterable of buffers: one streamed or multipart upload on object storage);
* **at offsets** (only where :attr:`ByteSink.seekable`): :meth:`ByteSink.create` opens the
  temporary file ``<key>.partial``, which a later run may reopen (``resume=True``) to carry on
  where an interrupted one stopped, and :meth:`ByteSink.publish` moves it to ``key``.

Durability is explicit: :meth:`publish` makes the file durable and remembers its folder;
:meth:`ByteSink.sync` makes every folder changed since durable (the renames in them survive a
power loss), so a commit syncs exactly what it wrote, never the whole node (no ``os.sync()``).
"""
from __future__ import annotations

import errno
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from ckptstore.errors import StoreUnavailableError, StoreWriteError
from ckptstore.io.base import ByteSource, ReadableFile
from ckptstore.limits import MAX_METADATA_BYTES

PARTIAL_SUFFIX = ".partial"
#: The folder under a sink's root that holds the locks of :meth:`ByteSink.lock`: the store's work
#: folder (:data:`ckptstore.store.kinds.WORK_DIR` is this name; :mod:`ckptstore.store.work` names
#: its files), declared here because the sinks, below the store, keep the locks in it.
LOCK_FOLDER = ".ckptstore-work"


def partial_key(key: str) -> str:
    """The temporary name ``key`` is written under until it is published."""
    return key + PARTIAL_SUFFIX


def write_error(e: OSError, where: Path | str, param: str | None = None) -> StoreWriteError | StoreUnavailableError:
    """A :class:`StoreWriteError` that says what failed and that a rerun resumes (an object store
    that did not answer stays a :class:`StoreUnavailableError`, which says so already)."""
    if isinstance(e, (StoreWriteError, StoreUnavailableError)):
        return e
    what = "no space left on the device" if e.errno == errno.ENOSPC else e.strerror or str(e)
    at = f" (parameter {param!r})" if param else ""
    return StoreWriteError(e.errno or 0, f"{what} while writing {where}{at}; free space or fix the "
                           "problem, then rerun the same command to resume")


class Lock(Protocol):
    """A held exclusive lock; :meth:`release` gives it up (a holder's death does too)."""

    def release(self) -> None: ...


class NoLock:
    """The lock of a sink that has none (object storage: see :class:`~ckptstore.io.s3_sink.S3Sink`)."""

    def release(self) -> None:
        pass


class SinkFile(ReadableFile):
    """A file being written at offsets under its temporary name; readable too (a resumed run
    checks what an earlier one wrote). Close it, then :meth:`ByteSink.publish` its key."""

    key: str

    @abstractmethod
    def pwrite(self, data: Any, offset: int) -> None:
        """Write all of ``data`` (a byte buffer) at ``offset``."""

    @abstractmethod
    def truncate(self, size: int) -> None:
        """Cut (or extend with zeros) the file to ``size`` bytes."""

    @abstractmethod
    def close(self) -> None:
        """Stop writing (the temporary file stays; publish or delete it)."""

    def __enter__(self) -> SinkFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ByteSink(ABC):
    """A folder of files written by key; see the module docstring."""

    #: Whether files can be written at offsets (:meth:`create`) and resumed by a later run.
    seekable: bool = False
    #: Reads back what was written (metadata, sizes, a resumed file's bytes).
    source: ByteSource
    #: Threads that read many small work records at once (object storage wants many).
    record_workers: int = 1

    @property
    def url(self) -> str:
        """The sink's own location (a path or a URL), for messages and metadata."""
        return self.source.url

    def key_url(self, key: str) -> str:
        """The location of ``key``, for messages."""
        return self.source.key_url(key)

    def read(self, key: str) -> bytes | None:
        """A small file's bytes (at most :data:`~ckptstore.limits.MAX_METADATA_BYTES`), or ``None``."""
        return self.source.read_bytes(key, limit=MAX_METADATA_BYTES)

    # --- whole files ---------------------------------------------------------------------------

    @abstractmethod
    def put(self, key: str, data: bytes, *, durable: bool = True) -> None:
        """Write a file whole and atomically (a reader sees the old or the new content).

        Its bytes are durable before it appears; like a publish, the rename itself is made
        durable by the next :meth:`sync`. ``durable=False`` (work records a rerun redoes if they
        are lost, or files :meth:`make_durable` syncs later, many at once) skips the fsync: after
        a power loss before that, the file may be missing or torn.
        """

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` (durably) only if it does not exist; return whether this call did."""

    @abstractmethod
    def put_stream(self, key: str, pieces: Iterable[Any], *, durable: bool = True) -> int:
        """Write ``key`` from an iterable of byte buffers; it appears, durable, only when complete
        (if ``pieces`` raises, nothing does). Returns its size. ``durable=False`` skips the fsync,
        as :meth:`put`'s does (:meth:`make_durable` does it later)."""

    # --- files at offsets ----------------------------------------------------------------------

    def create(self, key: str, *, resume: bool = False) -> SinkFile:
        """Open ``<key>.partial`` for writing at offsets: a new, empty one (created exclusively),
        or with ``resume`` the one an earlier run left (created if absent)."""
        raise StoreWriteError(errno.EOPNOTSUPP, f"{self.url} cannot write files at offsets")

    def append_log(self, key: str, *, keep: bytes = b"") -> SinkFile:
        """Open ``key`` itself (not a temporary name) holding ``keep``, to append records to
        (journals: a torn last line is ignored by their reader)."""
        raise StoreWriteError(errno.EOPNOTSUPP, f"{self.url} cannot append to files")

    def publish(self, key: str) -> None:
        """Move a closed ``<key>.partial`` to ``key``, durably (its folder is synced by :meth:`sync`)."""
        raise StoreWriteError(errno.EOPNOTSUPP, f"{self.url} has no partial files to publish")

    def unpublish(self, key: str) -> None:
        """Move a published ``key`` back to ``<key>.partial`` (to fill it again before a commit)."""
        raise StoreWriteError(errno.EOPNOTSUPP, f"{self.url} has no partial files")

    # --- the folder itself ---------------------------------------------------------------------

    def contains(self, location: str) -> bool:
        """Whether the file or folder ``location`` (a path or a URL) lies inside this sink, where
        writing could destroy it."""
        from ckptstore.io import is_url

        here = self.url.rstrip("/") + "/"
        return is_url(location) and (str(location).rstrip("/") + "/").startswith(here)

    def folder(self, name: str) -> ByteSink:
        """The sink of folder ``name`` inside this one (a step of a store root). A local folder's is
        reached from this sink's folder without following a link, so a folder planted there as a
        link to elsewhere is refused (:class:`~ckptstore.errors.UnsafePathError`) before anything
        is written; object storage has no links."""
        from ckptstore.io.locations import join

        return open_sink(join(self.url, name))

    def listing(self) -> tuple[list[str], list[str]]:
        """``(folders, files)`` directly in the sink (both empty when it does not exist yet)."""
        return self.source.list()

    def links(self) -> list[str]:
        """The names directly in the sink that are symbolic links (never followed), sorted; object
        storage has none."""
        return []

    def make_root(self) -> None:  # noqa: B027  (an optional hook: the default has nothing to do)
        """Create the sink's folder if it does not exist (nothing to do on object storage)."""

    def remove_root(self) -> None:  # noqa: B027  (an optional hook: the default has nothing to do)
        """Remove the sink's folder if it is empty (nothing to do on object storage)."""

    # --- everything else -----------------------------------------------------------------------

    @abstractmethod
    def size(self, key: str) -> int | None:
        """The size of file ``key``, or ``None`` when there is none."""

    @abstractmethod
    def keys(self, prefix: str = "") -> list[str]:
        """Every file below folder ``prefix`` (recursively; ``""`` is the whole sink), sorted.

        Symbolic links are listed (so they can be deleted), never followed.
        """

    def files(self, prefix: str = "") -> list[tuple[str, int, int]]:
        """Every file below folder ``prefix`` as ``(key, size, mtime_ns)``, sorted by key (what
        :meth:`keys` lists; a link's own size and time, never its target's)."""
        out = []
        for key in self.keys(prefix):
            st = self.source.stat(key)
            if st is not None:
                out.append((key, st.size, st.mtime_ns))
        return out

    @abstractmethod
    def delete(self, keys: Sequence[str]) -> None:
        """Delete files (missing ones are fine; a link is removed, not what it points to), and
        the folders this leaves empty."""

    def versions(self) -> dict[str, tuple[str, int]]:
        """``{key: (version, size)}`` of every file of the sink that has a version a reader can
        ask for (an object's ETag, from one listing); empty where files have none (a folder: an
        open file keeps its bytes, so a reader pins it by opening it)."""
        return {}

    def sync(self) -> None:  # noqa: B027  (an optional hook: the default has nothing to do)
        """Make every publish and new folder since the last call durable (sync their folders)."""

    def make_durable(self, keys: Sequence[str]) -> None:  # noqa: B027  (an optional hook: the default has nothing to do)
        """Make files durable, with the folders that name them: files an earlier run published, or
        files put with ``durable=False`` whose fsyncs are done here together (at once on a local
        folder)."""

    def lock(self, name: str, on_wait: Callable[[str], None] | None = None, *, wait: bool = True) -> Lock | None:
        """Hold the exclusive lock ``name`` of the work folder :data:`LOCK_FOLDER` (``None`` if
        ``wait=False`` and it is held)."""
        return NoLock()

    def close(self) -> None:
        """Release cached files (the sink stays usable)."""
        self.source.close()


def open_sink(out: str | Any) -> ByteSink:
    """The sink of ``--out``: a folder, an ``s3://``/``obs://`` prefix, or a location of another
    scheme some module declares a sink for (:mod:`ckptstore.io.schemes`); a sink is itself."""
    from ckptstore.io.locations import handler, is_url
    from ckptstore.io.schemes import BYTE_SINKS

    if isinstance(out, ByteSink):
        return out
    sink: ByteSink = handler(BYTE_SINKS, out).open(str(out) if is_url(out) else out)
    return sink
