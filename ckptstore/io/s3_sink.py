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

import queue
import threading
from typing import Any, Iterable, Iterator, Sequence

from ckptstore.errors import CkptStoreError
from ckptstore.io.s3_client import REQUEST_STATS, request
from ckptstore.io.s3_errors import client_error
from ckptstore.io.s3_source import S3Source
from ckptstore.io.schemes import Scheme
from ckptstore.io.sink import ByteSink
from ckptstore.io.urls import SCHEMES

#: Parts of a multipart upload (S3 needs at least 5 MiB per part but the last).
UPLOAD_PART = 16 << 20


class S3Sink(ByteSink):
    """A bucket prefix as a byte sink; see the module docstring. Its :attr:`source` reads the
    same prefix (and holds the bucket's client)."""

    seekable = False
    record_workers = 16  # each small record is one GET: many in flight

    def __init__(self, url: str) -> None:
        self.source = S3Source(url)

    def put(self, key: str, data: bytes | memoryview, *, durable: bool = True) -> None:
        """Write the object ``key`` whole (one PUT); an object is durable once it appears."""
        import obstore

        src = self.source
        with request(src.key_url(key), "write", puts=1):
            obstore.put(src.store, src.path(key), data, use_multipart=False)
        REQUEST_STATS.add(bytes_out=len(data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` only if no object has that name (a conditional PUT); return whether it did."""
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
        """
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
        st = self.source.stat(key)
        return None if st is None else st.size

    def keys(self, prefix: str = "") -> list[str]:
        return sorted(k for k, _ in self.source.walk(prefix))

    def versions(self) -> dict[str, tuple[str, int]]:
        """``{key: (ETag, size)}`` of every object under the prefix: one LIST (a page per 1,000
        objects). Objects whose listing carries no ETag are left out."""
        return {k: (st.version, st.size) for k, st in self.source.walk() if st.version}

    def delete(self, keys: Sequence[str]) -> None:
        """Delete objects (missing ones are fine)."""
        import obstore

        src = self.source
        paths = [src.path(k) for k in keys]
        for i in range(0, len(paths), 1000):
            with request(src.url, "delete objects in", deletes=1):
                try:
                    obstore.delete(src.store, paths[i:i + 1000])
                except FileNotFoundError:
                    pass



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
        except BaseException as e:  # noqa: BLE001 -- a Rust panic is a BaseException; reported by the caller
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
