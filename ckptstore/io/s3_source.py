"""Object storage (S3 and Huawei OBS) as a byte source, through obstore.

``s3://bucket/prefix`` and ``obs://bucket/prefix`` are one protocol: OBS speaks S3, and
ModelArts jobs name their checkpoints ``obs://...``. The client, its configuration and its
retries are :mod:`ckptstore.io.s3_client`'s; failures become typed errors in
:mod:`ckptstore.io.s3_errors`; writing is :mod:`ckptstore.io.s3_sink`'s.

Reads are ranged GETs streamed straight into the callers' buffers: a planned request
(:meth:`S3File.read_span`) is one GET from its first byte to its last, the gaps between its
buffers dropped from the stream; what a GET and a byte cost is :data:`S3_COST`, with which the
read planner decides how ranges share GETs (ad-hoc reads, :meth:`S3File.read_requests`, use the
same price). Opening an object costs no request: its size is asked for (one HEAD) only when a
caller needs it, so reading a store's chunks costs the planned GETs. An opened object is pinned to the version
(ETag) its first request saw and kept, pinned, until the source is closed: its later GETs send
``If-Match``, so reads of one object never mix two versions (:class:`S3File`).

obstore was chosen by measurement: 256 ranged GETs of 256 KiB through 8 threads cost 0.47 s of
client CPU with obstore against 1.7-1.9 s with s3fs on this machine, and it is the client
zarr-python's object store uses.
"""
from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ckptstore.errors import (
    CkptStoreError,
    FileAccessError,
    MissingFileError,
    ObjectStoreConfigError,
    ShortReadError,
    StoreChangedError,
)
from ckptstore.io.base import ByteSource, FileStat, ReadableFile, ReadCost, Request, check_key
from ckptstore.io.s3_client import REQUEST_STATS, client, request
from ckptstore.io.s3_errors import client_error, endpoint, is_no_such_bucket, is_range_error
from ckptstore.io.schemes import Scheme
from ckptstore.io.urls import SCHEMES, split_url

if TYPE_CHECKING:  # obstore is imported on first use of a URL
    from obstore import GetOptions

#: Bytes streamed per piece of a GET (what one request holds in memory besides its destination).
STREAM_CHUNK = 256 << 10
#: Memory the answers in flight may hold at once: it, not the cores, bounds the requests in flight,
#: since they wait on the network.
READ_MEMORY = 16 << 20
#: Threads one load keeps for requests to object storage (:data:`READ_MEMORY`'s worth of small
#: answers, of two STREAM_CHUNK pieces each); how many requests run at once is the byte window's.
READ_CONCURRENCY = READ_MEMORY // (2 * STREAM_CHUNK)
#: Bytes of answers one load keeps in flight at once (:attr:`S3Source.inflight_bytes`): the executor
#: starts a request when the ones in flight leave room for it, each counted by its length up to
#: what a streaming answer holds (``executor.ANSWER_BYTES``), so many small requests hide the
#: latency together, by bytes, not by count, and runs them on as many threads as are in flight.
#: What this process pays per request in flight is mostly per thread, not per byte: a thread that
#: has read an answer keeps 0.13-0.9 MiB of the client's allocations (64 KiB to 2 MiB answers),
#: glibc's per-thread arenas (``MALLOC_ARENA_MAX=1`` removes most of it); fewer threads
#: (``CKPTSTORE_REQUESTS_IN_FLIGHT``) trade peak memory for latency hidden.
READ_WINDOW = READ_MEMORY
#: The longest ranged GET: longer runs are fetched as pieces of this size, several at once (one
#: connection's throughput is what limits a big GET; a request costs little beside 64 MiB).
GET_PIECE = 64 << 20
#: What a GET and a byte cost on an object store (OBS answers a request in 10-50 ms whatever its
#: size): 20 ms per request, 200 MB/s, :data:`READ_CONCURRENCY` in flight; a gap inside a GET is
#: dropped from the stream, so it needs no scratch. ``CKPTSTORE_REQUEST_LATENCY_MS``,
#: ``CKPTSTORE_BANDWIDTH_MBPS`` and ``CKPTSTORE_REQUESTS_IN_FLIGHT`` override it.
S3_COST = ReadCost(request_seconds=0.02, bytes_per_second=200e6, in_flight=READ_CONCURRENCY,
                   max_request_bytes=GET_PIECE)


class S3File(ReadableFile):
    """One object; reads are ranged GETs. Its size costs a HEAD, asked for only when needed.

    The object is pinned to the version its first request saw (the ETag of the HEAD or of the
    first GET's answer), or to one known beforehand (:meth:`pin`: the manifest's or an index's
    record): every later GET sends that ETag as ``If-Match``, so a replaced object answers 412
    instead of other bytes, and every answer's ETag is compared with the pin (which also catches
    GETs sent at once before any answer had pinned it, and a server that ignores ``If-Match``).
    A server that sends no ETag pins an object by its size and ``Last-Modified`` time instead
    (sent as ``If-Unmodified-Since``, and compared with every answer): one second's resolution,
    so a rewrite of the same size within the second its version was written is not seen. An
    object answered with neither is refused, as no version of it can be told from another. A
    change is a :class:`~ckptstore.errors.StoreChangedError` naming the object, as is a pinned
    object that disappeared: reads of one file never mix two versions.
    """

    read_ahead = 256 << 10

    def __init__(self, source: S3Source, key: str, size: int | None = None) -> None:
        self.source, self.key = source, key
        self._size = size
        self._etag: str | None = None
        self._modified_ns = 0  # the Last-Modified time pinned where the server sends no ETag (0: none)
        self._changed: Callable[[], Exception] | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.source.key_url(self.key)

    @property
    def etag(self) -> str | None:
        """The ETag this object is pinned to (``None`` before its first request)."""
        return self._etag

    @property
    def size(self) -> int:  # type: ignore[override]  # ReadableFile.size is an attribute; learnt on first use here
        if self._size is None:
            st = self.source.stat(self.key)
            if st is None:
                raise MissingFileError(errno.ENOENT, f"{self.url} does not exist", self.url)
            self._seen(st.version or None, st.size, st.mtime_ns)
        assert self._size is not None
        return self._size

    def pin(self, etag: str, size: int, changed: Callable[[], Exception] | None = None) -> None:
        """Pin the object to a version known beforehand (an index's record of a rank file), before
        any request: its first GET already sends ``If-Match``. ``changed`` makes the error raised
        when the object is another version (default: :class:`~ckptstore.errors.StoreChangedError`)."""
        with self._lock:
            self._changed = changed
        self._seen(etag, size, 0)

    def _seen(self, etag: str | None, size: int, modified_ns: int) -> None:
        """Take the version an answer reports (``modified_ns``: its Last-Modified, 0 if none): the
        pin if there is none yet, else compared with it."""
        with self._lock:
            if self._etag is None and not self._modified_ns:
                if etag:
                    self._etag, self._size = etag, size
                elif modified_ns:  # a server that sends no ETag: size and time are the version
                    self._modified_ns, self._size = modified_ns, size
                else:
                    raise ObjectStoreConfigError(  # the server's, not the store's: no StoreCorruptError
                        f"cannot read {self.url}: the object store at {endpoint()} answers with neither an ETag nor "
                        "a Last-Modified time, so ckptstore cannot keep its reads to one version of the object (a "
                        "store replaced meanwhile would be read as a mix of two) and refuses it")
                return
            if self._etag is not None:
                if etag == self._etag and size == self._size:
                    return
                what = f"ETag {etag}, {size} bytes, was {self._etag}, {self._size} bytes"
            else:
                if size == self._size and modified_ns == self._modified_ns:
                    return
                what = f"{size} bytes, modified at {_time(modified_ns)}, was {self._size} at {_time(self._modified_ns)}"
        raise self._replaced(what)

    def _replaced(self, what: str) -> Exception:
        if self._changed is not None:
            return self._changed()
        return StoreChangedError(f"{self.url} was replaced while it was read ({what}); open it again")

    def read_requests(self, requests: Sequence[Request]) -> None:
        """Ad-hoc reads (a header scan, a converter's ranges): sorted, and neighbours one GET
        where the source's cost says the gap is cheaper than a request (:meth:`ReadCost.spans`)."""
        for span in self.source.read_cost().spans(requests):
            self.read_span(span)

    def read_span(self, requests: Sequence[Request]) -> None:
        """One GET from the first request's offset to the last one's end, each piece of the
        answer copied into the buffers it overlaps and the gaps dropped."""
        requests = [r for r in requests if len(r[1])]
        if requests:
            self._get(requests[0][0], requests[-1][0] + len(requests[-1][1]), requests)

    def _get(self, start: int, end: int, group: list[Request]) -> None:
        import obstore
        import obstore.exceptions as oe

        path = self.source.path(self.key)
        pinned, since = self._etag, self._modified_ns
        options: GetOptions = {"range": (start, end)}
        if pinned is not None:
            options["if_match"] = pinned
        elif since:
            options["if_unmodified_since"] = datetime.fromtimestamp(since / 1e9, timezone.utc)
        try:
            result = obstore.get(self.source.store, path, options=options)
            meta = result.meta
            self._seen(meta.get("e_tag"), int(meta["size"]), _mtime_ns(meta))  # before any byte reaches a buffer
            pos = start
            # each piece of the answer goes straight into the requests it overlaps
            i = 0
            for piece in result.stream(min_chunk_size=STREAM_CHUNK):
                view = memoryview(piece)
                n = len(view)
                REQUEST_STATS.add(bytes_in=n)
                while i < len(group) and group[i][0] + len(group[i][1]) <= pos:
                    i += 1
                j = i
                while j < len(group) and group[j][0] < pos + n:
                    off, buf = group[j]
                    lo, hi = max(off, pos), min(off + len(buf), pos + n)
                    if lo < hi:
                        buf[lo - off:hi - off] = view[lo - pos:hi - pos]
                    j += 1
                pos += n
        except CkptStoreError:
            raise
        except BaseException as e:
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            if isinstance(e, oe.PreconditionError):  # 412: the object is not the pinned version
                raise self._replaced(f"its ETag is no longer {pinned}" if pinned is not None
                                     else f"it was modified after {_time(since)}") from None
            if (pinned is not None or since) and isinstance(e, (FileNotFoundError, oe.NotFoundError)):
                raise self._replaced("it no longer exists") from None
            if is_range_error(e):
                raise ShortReadError(self.url, start, end - start, self.size) from None
            raise client_error(e, self.url, "read") from None
        finally:
            REQUEST_STATS.add(gets=1)
        if pos < end:
            raise ShortReadError(self.url, start, end - start, pos)

    def close(self) -> None:
        pass



class S3Source(ByteSource):
    """A bucket prefix as a byte source (read and write); see the module docstring."""

    cost = S3_COST
    pins_read_files = True
    #: The executor keeps at most this many bytes of requests in flight (:data:`READ_WINDOW`).
    inflight_bytes = READ_WINDOW

    def __init__(self, url: str) -> None:
        self.scheme, self.bucket, self.prefix = split_url(url)
        self._url = f"{self.scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self._store: Any = None
        self._lock = threading.Lock()
        self._files: dict[str, S3File] = {}  # kept (with their pins) until close()

    @property
    def store(self) -> Any:
        """The obstore client of this bucket (shared with other sources of the same bucket and
        environment, so rank files opened one by one share its connections)."""
        with self._lock:
            if self._store is None:
                self._store = client(self.bucket, self._url)
            return self._store

    @property
    def url(self) -> str:
        return self._url

    def path(self, key: str) -> str:
        """The object path of ``key`` inside the bucket."""
        check_key(key, self._url)
        return f"{self.prefix}/{key}" if self.prefix else key

    def open(self, key: str) -> S3File:
        """The object ``key`` (no request): the same :class:`S3File`, pinned to the version its
        first request saw, for every open of ``key`` until :meth:`close`."""
        f = self._files.get(key)
        if f is None:
            check_key(key, self._url)
            with self._lock:
                f = self._files.setdefault(key, S3File(self, key))
        return f

    def close(self) -> None:
        """Forget the opened objects and their pins: the next open of a key reads it as it is then."""
        with self._lock:
            self._files = {}

    def stat(self, key: str) -> FileStat | None:
        import obstore

        with request(self.key_url(key), "look up", heads=1):
            try:
                meta = obstore.head(self.store, self.path(key))
            except FileNotFoundError:
                return None
        return _stat(meta)

    def read_bytes(self, key: str, *, limit: int) -> bytes | None:
        got = self.read_bytes_stat(key, limit=limit)
        return None if got is None else got[0]

    def read_bytes_stat(self, key: str, *, limit: int) -> tuple[bytes, FileStat | None] | None:
        """The whole object ``key`` (one GET) and the :class:`FileStat` its answer reports, the
        ETag of exactly these bytes; ``None`` when it does not exist."""
        import obstore

        with request(self.key_url(key), "read", gets=1):
            try:
                result = obstore.get(self.store, self.path(key))
            except FileNotFoundError as e:
                if is_no_such_bucket(e):  # not a missing file: the request's error names the bucket
                    raise
                return None
            size = result.meta["size"]
            if size > limit:
                raise FileAccessError(errno.EFBIG, f"{self.key_url(key)} is {size} bytes, more than the {limit} a "
                                      "metadata file may have")
            data = bytes(result.bytes())
        REQUEST_STATS.add(bytes_in=len(data))
        return data, _stat(result.meta)

    def list(self, prefix: str = "") -> tuple[list[str], list[str]]:
        import obstore

        base = self.path(prefix) if prefix else self.prefix
        with request(self.key_url(prefix) if prefix else self._url, "list", lists=1):
            listing = obstore.list_with_delimiter(self.store, base or None)
        cut = len(base) + 1 if base else 0
        folders = sorted(p[cut:].strip("/") for p in listing["common_prefixes"])
        files = sorted(o["path"][cut:] for o in listing["objects"])
        return folders, files

    def walk(self, prefix: str = "") -> Iterator[tuple[str, FileStat]]:
        """Every object below ``prefix`` (recursively): ``(key, stat)``."""
        import obstore

        base = self.path(prefix) if prefix else self.prefix
        cut = len(self.prefix) + 1 if self.prefix else 0
        with request(self.key_url(prefix) if prefix else self._url, "list"):
            for batch in obstore.list(self.store, (base + "/") if base else None, chunk_size=1000):
                REQUEST_STATS.add(lists=1)  # one request per page of the listing
                for meta in batch:
                    yield meta["path"][cut:], _stat(meta)


def _mtime_ns(meta: Any) -> int:
    """An answer's Last-Modified time in ns since the epoch; 0 when it sent none (the client
    reports the epoch then)."""
    modified = meta.get("last_modified")
    return max(0, int(modified.timestamp() * 1e9)) if modified is not None else 0


def _time(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _stat(meta: Any) -> FileStat:
    return FileStat(int(meta["size"]), _mtime_ns(meta), str(meta.get("e_tag") or meta.get("version") or ""))


#: ``s3://`` and ``obs://`` URLs are read from object storage.
BYTE_SOURCE = Scheme(SCHEMES, S3Source, "s3://bucket/prefix (obs://bucket/prefix for Huawei OBS)")
