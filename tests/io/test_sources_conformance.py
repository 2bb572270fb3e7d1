"""Every byte source passes :class:`ckptstore.testing.source_tests.ByteSourceTests`: a local folder,
an S3 prefix on the test server (SeaweedFS), the rank files an index points into (over a local
folder) and the files of a memory sink read back, plus what only the index's source does."""
from __future__ import annotations

import os
from typing import Any

import pytest

from ckptstore.errors import SourceChangedError, StoreCorruptError
from ckptstore.io.base import ByteSource
from ckptstore.io.local import LocalSource
from ckptstore.io.memory_sink import MemorySink
from ckptstore.store.index import IndexSource, file_records
from ckptstore.testing.source_tests import ByteSourceTests


def _replace_local(root: str | os.PathLike[str], key: str, data: bytes) -> None:
    """Write ``data`` at ``root/key`` as a writer does: a new file renamed over any old one."""
    path = os.path.join(root, key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class TestLocalSource(ByteSourceTests):
    @pytest.fixture
    def source(self, tmp_path):
        source = LocalSource(tmp_path / "src")
        (tmp_path / "src").mkdir()
        yield source
        source.close()

    def put(self, source: ByteSource, key: str, data: bytes) -> None:
        _replace_local(source.url, key, data)

    def plant_link(self, source: ByteSource, key: str, target: str) -> None:
        os.symlink(target, os.path.join(source.url, key))


class TestS3Source(ByteSourceTests):
    @pytest.fixture
    def source(self, bucket):
        from ckptstore.io.s3_sink import S3Sink

        yield S3Sink(bucket.url("src")).source

    def put(self, source: Any, key: str, data: bytes) -> None:
        from ckptstore.io.s3_sink import S3Sink

        S3Sink(source.url).put(key, data)


class TestMemorySource(ByteSourceTests):
    @pytest.fixture
    def source(self):
        yield MemorySink().source

    def put(self, source: Any, key: str, data: bytes) -> None:
        source.sink.put(key, data)


class TestIndexSource(ByteSourceTests):
    """The index's source over a local folder; :meth:`put` records the file as ``ckptstore index``
    does. A key the index has no record of is a damaged index, not a missing file."""

    missing_error = StoreCorruptError

    @pytest.fixture
    def source(self, tmp_path):
        (tmp_path / "ranks").mkdir()
        source = IndexSource(LocalSource(tmp_path / "ranks"), {})
        yield source
        source.close()

    def put(self, source: Any, key: str, data: bytes) -> None:
        _replace_local(source.url, key, data)
        source.records.update(file_records(source.inner, [key]))

    def plant_link(self, source: Any, key: str, target: str) -> None:
        os.symlink(target, os.path.join(source.url, key))
        # as if the index had been made through the link: it records the key and every file below it
        below = [k for k in source.records if k.startswith(target + "/")]
        for k in [key, *(key + k[len(target):] for k in below)]:
            source.records[k] = {"size": 0, "mtime_ns": 0}

    def test_a_file_replaced_since_it_was_recorded_is_refused_at_open(self, source):
        self.put(source, "rank_0/net.ckpt", b"indexed bytes")
        _replace_local(source.url, "rank_0/net.ckpt", b"other bytes!!")
        changed = r"rank_0/net.ckpt changed since the index was made \(.*ino \d+, was \d+"
        with pytest.raises(SourceChangedError, match=changed):
            source.open("rank_0/net.ckpt")
        with pytest.raises(SourceChangedError, match="rank_0/net.ckpt changed since the index was made"):
            source.check_all()
