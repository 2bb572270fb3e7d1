"""The byte-source seam: every read of checkpoint or store bytes goes through a :class:`ByteSource`.

A byte source is a folder-like location (a local directory, or an ``s3://``/``obs://`` prefix)
holding files addressed by *keys*: relative, ``/``-separated paths such as
``layer0.w/c/0/0`` or ``rank_3/net-1_100.ckpt``. Keys read from metadata are data, not trust:
:func:`check_key` refuses absolute paths, ``..``, empty components and control characters
before any implementation sees them, and implementations refuse symbolic links, so no key can
reach outside its source. Reads are *vectored*: a caller hands a list of ``(offset, buffer)``
requests and the source fills the buffers (a local file with ``preadv``, an object store with
concurrent ranged GETs), so the plan a caller built is exactly what is read.
"""
from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ckptstore.errors import InvalidOptionError, UnsafePathError
from ckptstore.limits import MAX_NAME_BYTES

_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f\\]")  # control characters and backslashes

#: A read request: bytes ``[offset, offset + len(buffer))`` of a file into ``buffer``.
Request = tuple[int, memoryview]


@dataclass(frozen=True)
class FileStat:
    """What identifies a file's content without reading it.

    ``version`` changes whenever the content may have changed even if size and modification
    time were restored (a local file's inode and status-change time; an object's ETag).
    ``ino`` and ``ctime_ns`` are a local file's inode number and status-change time (``None``
    for objects): a file renamed over another has another inode, and writing a file or
    restoring its modification time sets its ctime, which no user can set back.
    """

    size: int
    mtime_ns: int
    version: str
    ino: int | None = None
    ctime_ns: int | None = None


@dataclass(frozen=True)
class ReadCost:
    """What reading from a source costs: the one model the read planner prices plans with.

    A request costs ``request_seconds`` (its latency: a system call and its bookkeeping for a
    local file, a round trip for an object store) and a byte ``1 / bytes_per_second``;
    ``in_flight`` requests run at once, so a plan of ``r`` requests fetching ``b`` bytes is
    modelled as ``r * request_seconds / in_flight + b / bytes_per_second`` (:meth:`seconds`).
    The planner (:mod:`ckptstore.store.read_plan`) lets one request cover several wanted ranges
    of a file, reading the gaps between them too, when that models faster; the limits bound one
    request: at most ``max_request_bytes`` (longer runs are cut, so several threads share them),
    at most ``max_buffers`` buffers (a local ``preadv``'s ``IOV_MAX``, gaps included; ``None``:
    no limit) and gaps of at most ``max_gap_bytes`` each (the scratch a gap is read into: a local
    file reads it into a discard buffer of that size, an object store drops it from the stream).

    The defaults are each source's (:attr:`ByteSource.cost`); the environment overrides them
    for every source (:meth:`from_environment`): ``CKPTSTORE_REQUEST_LATENCY_MS``,
    ``CKPTSTORE_BANDWIDTH_MBPS`` (megabytes, 10**6 bytes, per second) and
    ``CKPTSTORE_REQUESTS_IN_FLIGHT``; a program can also set ``source.cost`` itself.
    """

    request_seconds: float
    bytes_per_second: float
    in_flight: int
    max_request_bytes: int
    max_buffers: int | None = None
    max_gap_bytes: int | None = None

    def seconds(self, requests: int, nbytes: int) -> float:
        """The modelled time of ``requests`` requests fetching ``nbytes`` bytes in all."""
        return requests * self.request_seconds / self.in_flight + nbytes / self.bytes_per_second

    @property
    def gap_bytes(self) -> int:
        """The longest gap worth reading to save a request: what a request's share of latency
        would transfer (0 when gaps cannot be read at all)."""
        worth = int(self.request_seconds / self.in_flight * self.bytes_per_second)
        return worth if self.max_gap_bytes is None else min(worth, self.max_gap_bytes)

    def spans(self, requests: Sequence[Request]) -> list[list[Request]]:
        """Ad-hoc ``requests`` (not planned by the read planner), sorted by offset and grouped into
        the spans one request each should read: neighbours share a request while the gap is at
        most :attr:`gap_bytes` and the span at most :attr:`max_request_bytes`."""
        ordered = sorted((r for r in requests if len(r[1])), key=lambda r: r[0])
        out: list[list[Request]] = []
        gap_ok, start, end = self.gap_bytes, 0, 0
        for offset, buf in ordered:
            stop = offset + len(buf)
            if out and 0 <= offset - end <= gap_ok and stop - start <= self.max_request_bytes:
                out[-1].append((offset, buf))
            else:
                out.append([(offset, buf)])
                start = offset
            end = max(end, stop) if len(out[-1]) > 1 else stop
        return out

    def from_environment(self, environ: Mapping[str, str] | None = None) -> ReadCost:
        """This cost with the ``CKPTSTORE_*`` overrides of ``environ`` (``os.environ`` when
        ``None``) applied; a malformed or non-positive value is an
        :class:`~ckptstore.errors.InvalidOptionError` naming the variable."""
        env = os.environ if environ is None else environ
        changes: dict[str, Any] = {}
        for var, field_name, scale, kind in _COST_ENV:
            text = env.get(var)
            if text is None or not text.strip():
                continue
            try:
                value = kind(text.strip())
            except ValueError:
                value = -1
            if not value > 0:
                raise InvalidOptionError(f"{var}={text!r} is not a positive number")
            changes[field_name] = kind(value * scale)
        return replace(self, **changes) if changes else self


#: The environment's overrides of a source's :class:`ReadCost`: variable, field, scale, type.
_COST_ENV = (("CKPTSTORE_REQUEST_LATENCY_MS", "request_seconds", 1e-3, float),
             ("CKPTSTORE_BANDWIDTH_MBPS", "bytes_per_second", 1e6, float),
             ("CKPTSTORE_REQUESTS_IN_FLIGHT", "in_flight", 1, int))

def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which a launcher that pins ranks to
    cores narrows), else the machine's count: what a local read's threads are capped by."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no affinity mask
        return os.cpu_count() or 1


#: A local file (page cache): a ``preadv`` call and the executor's bookkeeping for it cost a few
#: microseconds, copies run at ~9 GB/s per thread (measured on this machine: 1.5 us per bare call,
#: 9.3 GB/s for a 64 MiB read); a thread per core up to four (measured at 1, 2 and 4 on 2 cores in
#: benchmarks/results/load.md); 8 MiB per request so that threads share long runs.
LOCAL_COST = ReadCost(request_seconds=5e-6, bytes_per_second=8e9, in_flight=min(4, usable_cpus()),
                      max_request_bytes=8 << 20, max_buffers=1024, max_gap_bytes=1 << 20)


def check_key(key: object, where: str = "") -> str:
    """Return ``key`` if it is a safe relative key, else raise :class:`UnsafePathError`.

    A safe key is a non-empty string of ``/``-separated components, none of them empty, ``.``
    or ``..``, with no backslash, NUL or other control character, and not absolute.
    """
    origin = f" in {where}" if where else ""
    if not isinstance(key, str) or not key:
        raise UnsafePathError(f"file name {key!r}{origin} is not a non-empty string")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise UnsafePathError(f"file name{origin} is longer than {MAX_NAME_BYTES} bytes")
    if key.startswith("/") or _FORBIDDEN.search(key):
        raise UnsafePathError(f"file name {key!r}{origin} is absolute or holds a backslash or control "
                              "character; files must be named relative to their folder")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise UnsafePathError(f"file name {key!r}{origin} has an empty, '.' or '..' component; files must "
                              "stay inside their folder")
    return key


class ReadableFile(ABC):
    """An open file of a source: its size and vectored reads. Safe to share between threads."""

    key: str
    size: int
    #: Bytes a header scan reads ahead (``None``: the scanner's own small window). An object
    #: store pays per request, not per byte, so it reads ahead further.
    read_ahead: int | None = None

    @property
    @abstractmethod
    def url(self) -> str:
        """Where the file is, for messages."""

    @abstractmethod
    def read_requests(self, requests: Sequence[Request]) -> None:
        """Fill every buffer of ``requests`` from its offset.

        Raises :class:`~ckptstore.errors.ShortReadError` when the file ends before a request does.
        """

    def readv(self, offset: int, buffers: Sequence[Any]) -> None:
        """Fill ``buffers`` (writable byte buffers) in turn from one contiguous range at ``offset``."""
        requests = []
        for b in buffers:
            view = memoryview(b).cast("B")
            requests.append((offset, view))
            offset += len(view)
        self.read_requests(requests)

    def read_span(self, requests: Sequence[Request]) -> None:
        """Fill the buffers of ``requests`` (sorted by offset, not overlapping) with ONE request to
        the source covering them all: the bytes between them are read too and dropped. This is
        how the executor runs a planned request; the default reads them one by one, for files
        that have no cheaper way."""
        self.read_requests(requests)

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` with the bytes at ``offset``."""
        self.read_requests([(offset, buffer)])

    def pread(self, offset: int, nbytes: int) -> bytes:
        """Up to ``nbytes`` bytes at ``offset`` (fewer at the end of the file): for small headers."""
        nbytes = max(0, min(nbytes, self.size - offset))
        buf = bytearray(nbytes)
        if nbytes:
            self.read_into(offset, memoryview(buf))
        return bytes(buf)

    def expect_holes(self) -> None:  # noqa: B027  (an optional hook: the default has nothing to do)
        """Hear that this file will be read in places with holes between them (the executor says
        so for the files a plan reads that way). A local file stops the kernel reading ahead into
        the holes; the default does nothing."""

    def close(self) -> None:  # noqa: B027  (an optional hook: the default has nothing to do)
        """Release what the file holds (a descriptor, a connection); the default holds nothing.
        Whoever opened the file and owns it closes it."""


class ByteSource(ABC):
    """A folder of files addressed by keys; see the module docstring."""

    #: What a request and a byte cost (:class:`ReadCost`); the read planner prices plans with it
    #: and the executor keeps ``cost.in_flight`` requests in flight. The environment's overrides
    #: are applied by :meth:`read_cost`.
    cost: ReadCost = LOCAL_COST
    #: Whether an open file keeps its content when the file is replaced (a local file: the
    #: descriptor holds the old inode), so checking a file's identity once, at its opening, holds
    #: for every later read of it.
    pins_open_files: bool = False
    #: Whether a file of this source, once read, keeps the version it was first read at: every
    #: later read of it returns that version's bytes or raises
    #: :class:`~ckptstore.errors.StoreChangedError` (an object pinned by its ETag, sent as
    #: ``If-Match``). The version is fixed by the file's first request, not by :meth:`open`.
    pins_read_files: bool = False
    #: Bytes of requests the executor keeps in flight at once (object storage: what their answers
    #: and the threads that wait for them hold); ``None``: only the threads bound them.
    inflight_bytes: int | None = None

    @property
    @abstractmethod
    def url(self) -> str:
        """The location of the source itself (a path or a URL), for messages and metadata."""

    def read_cost(self) -> ReadCost:
        """:attr:`cost` with the environment's overrides (:meth:`ReadCost.from_environment`)."""
        return self.cost.from_environment()

    def key_url(self, key: str) -> str:
        """The location of ``key``, for messages."""
        return f"{self.url.rstrip('/')}/{key}"

    @abstractmethod
    def open(self, key: str) -> ReadableFile:
        """Open ``key`` for reading. A source may keep the file and return it again for the same key
        (a local source keeps its descriptor until :meth:`close`; an object store keeps the object
        pinned to the version its first request saw, see :attr:`pins_read_files`).

        Raises :class:`~ckptstore.errors.UnsafePathError` for keys that leave the source,
        :class:`~ckptstore.errors.MissingFileError` when there is no such file and
        :class:`~ckptstore.errors.FileAccessError` when it cannot be read as a file (an object
        store, which opens without a request, finds out at the file's first read or ``size``).
        :class:`~ckptstore.testing.source_tests.ByteSourceTests` checks all of this.
        """

    @abstractmethod
    def stat(self, key: str) -> FileStat | None:
        """Size, modification time and version of ``key``, or ``None`` when it does not exist."""

    @abstractmethod
    def read_bytes(self, key: str, *, limit: int) -> bytes | None:
        """The whole content of a small file (metadata), or ``None`` when it does not exist.

        Raises :class:`~ckptstore.errors.FileAccessError` when it is larger than ``limit``.
        """

    def read_bytes_stat(self, key: str, *, limit: int) -> tuple[bytes, FileStat | None] | None:
        """:meth:`read_bytes`, with the :class:`FileStat` of exactly the bytes read where the same
        request tells it (an object's GET answers its ETag), else ``None`` in its place."""
        data = self.read_bytes(key, limit=limit)
        return None if data is None else (data, None)

    @abstractmethod
    def list(self, prefix: str = "") -> tuple[list[str], list[str]]:
        """``(folders, files)``: the names directly under ``prefix`` (``""`` is the source itself)."""

    def close(self) -> None:  # noqa: B027  (an optional hook: the default has nothing to do)
        """Release open files (the source stays usable; files are reopened on demand)."""


class SourceWrapper(ByteSource):
    """A byte source that adds checks to another one (an index's record of its rank files, a
    store's guard against being replaced): everything not overridden goes to ``inner``, and the
    cost of reads is the inner source's."""

    def __init__(self, inner: ByteSource) -> None:
        self.inner = inner
        self.pins_open_files, self.pins_read_files = inner.pins_open_files, inner.pins_read_files

    @property
    def cost(self) -> ReadCost:
        return self.inner.cost

    @cost.setter
    def cost(self, value: ReadCost) -> None:
        # ByteSource.cost is a plain attribute a program may set: setting it here prices the inner source.
        self.inner.cost = value

    def read_cost(self) -> ReadCost:
        return self.inner.read_cost()

    @property
    def inflight_bytes(self) -> int | None:  # type: ignore[override]  # an attribute of ByteSource; the inner's here
        return self.inner.inflight_bytes

    @property
    def url(self) -> str:
        return self.inner.url

    def key_url(self, key: str) -> str:
        return self.inner.key_url(key)

    def open(self, key: str) -> ReadableFile:
        return self.inner.open(key)

    def stat(self, key: str) -> FileStat | None:
        return self.inner.stat(key)

    def read_bytes(self, key: str, *, limit: int) -> bytes | None:
        return self.inner.read_bytes(key, limit=limit)

    def read_bytes_stat(self, key: str, *, limit: int) -> tuple[bytes, FileStat | None] | None:
        return self.inner.read_bytes_stat(key, limit=limit)

    def list(self, prefix: str = "") -> tuple[list[str], list[str]]:
        return self.inner.list(prefix)

    def close(self) -> None:
        self.inner.close()
