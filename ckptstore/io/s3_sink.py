"""An object-store prefix (``s3://`` or ``obs://``) as a byte sink: the writes of object storage.

Objects are written whole: a PUT is atomic by itself (a reader sees the old object or the new
one), a large file is one multipart upload that appears only when it is complete, and a
conditional PUT (``If-None-Match: *``) creates a file only if it is absent. Nothing can be
written at offsets, so writers stream each file once (:attr:`ByteSink.seekable` is false)
and an interrupted upload is redone whole. Object storage has no symbolic links to plant and
no folders to sync.

Object storage has no locks either: two conversions of *different* files into one prefix are
kept apart by the work folder's fingerprint, created with a conditional PUT (the second one
finds another fingerprint and stops); runs of the *same* conversion (parts on several hosts, or
a rerun while an old run is still alive) write identical objects, so they cannot corrupt each
other.
"""
from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ckptstore.errors import CkptStoreError
from ckptstore.io.s3_client import REQUEST_STATS, request
from ckptstore.io.s3_errors import client_error
from ckptstore.io.s3_source import S3Source
from ckptstore.io.schemes import Scheme
from ckptstore.io.sink import ByteSink
from ckptstore.io.urls import SCHEMES

#: Parts of a multipart upload (S3 needs at least 5 MiB per part but the last).
UPLOAD_PART = 16 << 20
#: Uploads in flight at once per sink: a request waits on the network, not on a core, and one
#: connection's throughput is what limits one upload.
UPLOAD_CONCURRENCY = 8
#: Bytes of uploads in flight per sink (each holds its own copy: the caller may reuse its buffer).
UPLOAD_BUDGET = 64 << 20


class S3Sink(ByteSink):
    """A bucket prefix as a byte sink; see the module docstring. Its :attr:`source` reads the
    same prefix (and holds the bucket's client)."""

    seekable = False
    record_workers = 16  # each small record is one GET: many in flight
    source: S3Source

    def __init__(self, url: str) -> None:
        self.source = S3Source(url)
        self._uploads = _Uploads(UPLOAD_CONCURRENCY, UPLOAD_BUDGET)

    def put(self, key: str, data: bytes | memoryview, *, durable: bool = True) -> None:
        """Write the object ``key`` whole (one PUT, or a multipart upload of parts sent at once
        when it is larger than :data:`UPLOAD_PART`); an object is durable once it appears.

        ``durable=False`` (a save's data files, whose :meth:`make_durable` follows) starts the
        upload and returns: up to :data:`UPLOAD_CONCURRENCY` run at once, holding copies of at
        most :data:`UPLOAD_BUDGET` bytes. Every other call of the sink waits for them first and
        raises the first one's error, so what is written or read after an upload finds it done
        (a save's record and done-marker are written after its data files exist).
        """
        if durable:
            self._uploads.wait()
            self._upload(key, data)
            return
        copy = data if isinstance(data, bytes) else bytes(data)  # the caller may refill its buffer
        self._uploads.start(len(copy), lambda: self._upload(key, copy))

    def _upload(self, key: str, data: bytes | memoryview) -> None:
        import obstore

        src = self.source
        n = memoryview(data).nbytes
        with request(src.key_url(key), "write", puts=max(1, -(-n // UPLOAD_PART))):
            obstore.put(src.store, src.path(key), data, use_multipart=n > UPLOAD_PART, chunk_size=UPLOAD_PART,
                        max_concurrency=UPLOAD_CONCURRENCY)
        REQUEST_STATS.add(bytes_out=n)

    def read(self, key: str) -> bytes | None:
        self._uploads.wait()
        return super().read(key)

    def listing(self) -> tuple[list[str], list[str]]:
        self._uploads.wait()
        return super().listing()

    def make_durable(self, keys: Sequence[str]) -> None:
        """Wait for the uploads started by :meth:`put` (an object is durable once it appears)."""
        self._uploads.wait()

    def sync(self) -> None:
        self._uploads.wait()

    def close(self) -> None:
        self._uploads.wait()
        super().close()

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` only if no object has that name (a conditional PUT); return whether it did."""
        self._uploads.wait()
        import obstore
        import obstore.exceptions as oe

        src = self.source
        with request(src.key_url(key), "write", puts=1):
            try:
                obstore.put(src.store, src.path(key), data, mode="create")
            except (FileExistsError, oe.AlreadyExistsError):
                return False
        REQUEST_STATS.add(bytes_out=len(data))
        return True

    def put_stream(self, key: str, pieces: Iterable[Any], *, durable: bool = True) -> int:
        """Write ``key`` from an iterable of byte buffers (a multipart upload); return its size.

        The object appears only when the last piece is uploaded; if ``pieces`` raises, the upload
        is abandoned and nothing becomes visible. ``pieces`` runs in this thread, one piece each
        time the upload asks for one, so it may itself read from object storage (a conversion
        from a bucket into a bucket): obstore drives the iterator it is given from inside its
        runtime, where another obstore call would panic ("Cannot start a runtime from within a
        runtime"), so the upload runs in a helper thread and is handed the pieces from here.

        ``durable=False`` (a save's data files): a file of at most :data:`UPLOAD_PART` bytes is
        gathered and uploaded in the background, as :meth:`put` does, so a rank's many small
        files are in flight together instead of one PUT after another (each waits a round trip);
        a larger one is streamed as above.
        """
        if not durable:
            it = iter(pieces)
            head, small = _gather(it, UPLOAD_PART)
            if small:
                data = b"".join(head)
                self.put(key, data, durable=False)
                return len(data)
            pieces = itertools.chain(head, it)
        self._uploads.wait()
        import obstore

        src = self.source
        handoff = _Handoff(pieces)
        path = src.path(key)
        uploader = threading.Thread(
            target=handoff.upload, name="ckptstore-upload", daemon=True,
            args=(lambda it: obstore.put(src.store, path, it, chunk_size=UPLOAD_PART, max_concurrency=4),))
        uploader.start()
        try:
            handoff.produce()
        finally:
            uploader.join()
            REQUEST_STATS.add(puts=max(1, -(-handoff.nbytes // UPLOAD_PART)), bytes_out=handoff.nbytes)
        if handoff.error is not None:
            raise handoff.error
        e = handoff.upload_error
        if e is not None:
            if isinstance(e, CkptStoreError):
                raise e
            raise client_error(e, src.key_url(key), "write") from None
        return handoff.nbytes

    def size(self, key: str) -> int | None:
        self._uploads.wait()
        st = self.source.stat(key)
        return None if st is None else st.size

    def keys(self, prefix: str = "") -> list[str]:
        self._uploads.wait()
        return sorted(k for k, _ in self.source.walk(prefix))

    def files(self, prefix: str = "") -> list[tuple[str, int, int]]:
        return sorted((k, st.size, st.mtime_ns) for k, st in self.source.walk(prefix))  # the listing's sizes: no HEADs

    def versions(self) -> dict[str, tuple[str, int]]:
        """``{key: (ETag, size)}`` of every object under the prefix: one LIST (a page per 1,000
        objects). Objects whose listing carries no ETag are left out."""
        self._uploads.wait()
        return {k: (st.version, st.size) for k, st in self.source.walk() if st.version}

    def delete(self, keys: Sequence[str]) -> None:
        """Delete objects (missing ones are fine)."""
        self._uploads.wait()
        import obstore

        src = self.source
        paths = [src.path(k) for k in keys]
        for i in range(0, len(paths), 1000):
            with request(src.url, "delete objects in", deletes=1):
                try:
                    obstore.delete(src.store, paths[i:i + 1000])
                except FileNotFoundError:
                    pass



def _gather(pieces: Iterator[Any], most: int) -> tuple[list[bytes], bool]:
    """Copies of the first pieces, taken until they hold more than ``most`` bytes or the pieces
    end; and whether they ended (the whole file is then in the list)."""
    head, n = [], 0
    for piece in pieces:
        head.append(bytes(piece))  # the caller may refill its buffer once it asks for the next
        n += len(head[-1])
        if n > most:
            return head, False
    return head, True


class _Uploads:
    """Uploads run by a few threads: at most ``workers`` at once and ``budget`` bytes in flight
    (one larger upload runs alone). :meth:`wait` waits for every upload started before it
    (by any thread of the sink) and raises the first error one of them met."""

    def __init__(self, workers: int, budget: int) -> None:
        self.workers, self.budget = workers, budget
        self._pool: ThreadPoolExecutor | None = None
        self._cond = threading.Condition()
        self._bytes = 0
        self._pending: list[Future[None]] = []

    def start(self, nbytes: int, upload: Callable[[], None]) -> None:
        def run() -> None:
            try:
                upload()
            finally:
                with self._cond:
                    self._bytes -= nbytes
                    self._cond.notify_all()

        with self._cond:
            while self._bytes and self._bytes + nbytes > self.budget:
                self._cond.wait()
            self._bytes += nbytes
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="ckptstore-upload")
            self._pending.append(self._pool.submit(run))

    def wait(self) -> None:
        with self._cond:
            if not self._pending:
                return
            pending, self._pending = self._pending, []
        error: BaseException | None = None
        for f in pending:
            e = f.exception()
            error = error or e
        with self._cond:  # idle again: no threads kept between one batch of uploads and the next
            pool = self._pool if not self._pending else None
            if pool is not None:
                self._pool = None
        if pool is not None:
            pool.shutdown(wait=False)
        if error is not None:
            raise error


class _Handoff:
    """Hands the pieces of an upload, produced in the caller's thread, to an upload that runs in
    another thread, one at a time: the producer makes a piece only when the upload asks for the
    next one (as a generator would run), so nothing is read ahead and a piece's producer never
    runs inside obstore's runtime. Keeps the producer's error and the upload's."""

    _END = object()

    def __init__(self, pieces: Iterable[Any]) -> None:
        self.pieces = pieces
        self.nbytes = 0
        self.error: BaseException | None = None  # raised by the producer of the pieces
        self.upload_error: BaseException | None = None  # raised by the upload
        self._wanted: queue.SimpleQueue[bool] = queue.SimpleQueue()  # True: next piece, please; False: upload over
        self._given: queue.SimpleQueue[Any] = queue.SimpleQueue()  # a piece, _END, or the producer's error

    def consume(self) -> Iterator[Any]:
        """The iterator the upload is given (runs wherever obstore drives it)."""
        while True:
            self._wanted.put(True)
            item = self._given.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise RuntimeError("the producer of the upload's pieces failed")  # obstore abandons the upload
            yield item

    def upload(self, put: Any) -> None:
        """Run ``put(iterator)`` (the helper thread's body)."""
        try:
            put(self.consume())
        except BaseException as e:  # a Rust panic is a BaseException; reported by the caller
            self.upload_error = e
        finally:
            self._wanted.put(False)

    def produce(self) -> None:
        """Make pieces as the upload asks for them, until it has them all or is over."""
        it = iter(self.pieces)
        try:
            while self._wanted.get():
                try:
                    piece = next(it)
                except StopIteration:
                    self._given.put(self._END)
                    continue
                self.nbytes += memoryview(piece).nbytes
                self._given.put(piece)
        except BaseException as e:
            self.error = e
            self._given.put(e)  # the upload is abandoned, then says it is over
            while self._wanted.get():
                pass



#: ``s3://`` and ``obs://`` URLs are written to object storage.
BYTE_SINK = Scheme(SCHEMES, S3Sink, "s3://bucket/prefix (obs://bucket/prefix for Huawei OBS)")
