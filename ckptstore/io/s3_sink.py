"""An object-store prefix (``s3://`` or ``obs://``) as a byte sink, over :class:`~ckptstore.io.s3.S3Source`.

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

from typing import Any, Iterable, Sequence

from ckptstore.io.s3 import SCHEMES, S3Source
from ckptstore.io.schemes import Scheme
from ckptstore.io.sink import ByteSink


class S3Sink(ByteSink):
    """A bucket prefix as a byte sink; see the module docstring."""

    seekable = False
    record_workers = 16  # each small record is one GET: many in flight

    def __init__(self, url: str) -> None:
        self.source = S3Source(url)

    def put(self, key: str, data: bytes, *, durable: bool = True) -> None:
        self.source.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.source.put_if_absent(key, data)

    def put_stream(self, key: str, pieces: Iterable[Any], *, durable: bool = True) -> int:
        return self.source.put_stream(key, pieces)  # an object is durable once it appears

    def size(self, key: str) -> int | None:
        st = self.source.stat(key)
        return None if st is None else st.size

    def keys(self, prefix: str = "") -> list[str]:
        return sorted(k for k, _ in self.source.walk(prefix))

    def files(self, prefix: str = "") -> list[tuple[str, int, int]]:
        return sorted((k, st.size, st.mtime_ns) for k, st in self.source.walk(prefix))  # the listing's sizes: no HEADs

    def delete(self, keys: Sequence[str]) -> None:
        self.source.delete(list(keys))


#: ``s3://`` and ``obs://`` URLs are written to object storage.
BYTE_SINK = Scheme(SCHEMES, S3Sink, "s3://bucket/prefix (obs://bucket/prefix for Huawei OBS)")
