"""Every byte sink passes :class:`ckptstore.testing.sink_tests.ByteSinkTests`: a local folder, a
dict in memory, and an S3 prefix on the test server (moto behind the counting proxy)."""
from __future__ import annotations

import errno

import pytest

from ckptstore.io.local_sink import LocalSink
from ckptstore.io.memory_sink import Crash, MemorySink
from ckptstore.io.sink import partial_key
from ckptstore.testing.sink_tests import ByteSinkTests


class TestLocalSink(ByteSinkTests):
    @pytest.fixture
    def sink(self, tmp_path):
        sink = LocalSink(tmp_path / "out")
        yield sink
        sink.close()


class TestMemorySink(ByteSinkTests):
    @pytest.fixture
    def sink(self):
        yield MemorySink()


class TestS3Sink(ByteSinkTests):
    has_locks = False

    @pytest.fixture
    def sink(self, bucket):
        from ckptstore.io.s3_sink import S3Sink

        yield S3Sink(bucket.url("out"))


def test_a_memory_sink_fails_the_call_its_hook_names_and_does_nothing_of_it():
    def fail(op, key):
        if op == "publish" and key == "zarr.json":
            raise Crash
        if op == "put" and key.endswith("full"):
            raise OSError(errno.ENOSPC, "No space left on device")

    sink = MemorySink(fail=fail)
    with sink.create("zarr.json") as f:
        f.pwrite(b"{}", 0)
    with pytest.raises(Crash):
        sink.publish("zarr.json")
    with pytest.raises(OSError, match="No space"):
        sink.put("disk/full", b"x")
    assert sink.keys() == [partial_key("zarr.json")]


def test_a_local_sink_syncs_only_the_folders_it_changed(tmp_path, monkeypatch):
    """No os.sync(): the folders fsynced at a commit are those a publish or a new folder changed."""
    import os

    sink = LocalSink(tmp_path / "out")
    sink.put("a/b/x", b"1", durable=False)
    with sink.create("c/y") as f:
        f.pwrite(b"2", 0)
    sink.publish("c/y")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))
    monkeypatch.setattr(os, "sync", lambda: pytest.fail("os.sync() flushes every file system of the node"))
    sink.sync()
    out = tmp_path / "out"
    assert sorted(synced) == sorted(map(str, [out, out / "a", out / "c"]))


# ---------------------------------------------------------------------------------------------
# a writer crashed at any call of its sink resumes to the same store


def _crash_at(op: str, nth: int):
    seen = []

    def fail(call, key):
        if call == op:
            seen.append(key)
            if len(seen) == nth:
                raise Crash(f"{op} {key}")

    return fail


@pytest.mark.mindspore
@pytest.mark.parametrize("fmt,op,nth", [("zarr", "publish", 3), ("zarr", "put", 4), ("zarr", "pwrite", 5),
                                        ("safetensors", "pwrite", 30), ("safetensors", "publish", 1)])
def test_a_conversion_crashed_at_a_sink_call_resumes_to_the_same_store(saved_layout, tmp_path, fmt, op, nth):
    import ckptstore
    from convert_fixtures import store_files

    layout = saved_layout("dp2_mp4")
    ckptstore.convert(layout.root, tmp_path / "reference", strategy=layout.strategy_files, format=fmt)
    sink = MemorySink(fail=_crash_at(op, nth))
    with pytest.raises(Crash):
        ckptstore.convert(layout.root, sink, strategy=layout.strategy_files, format=fmt, workers=1)
    assert any(k.startswith(".ckptstore-work/") for k in sink.files)  # an unfinished store, not a complete one
    assert not {"zarr.json", "ckptstore.json"} & set(sink.files)
    sink.fail = None
    summary = ckptstore.convert(layout.root, sink, strategy=layout.strategy_files, format=fmt, workers=1)
    assert summary.chunks_resumed + summary.chunks_written == summary.chunks and summary.chunks_resumed > 0
    assert {k: bytes(v) for k, v in sink.files.items()} == store_files(tmp_path / "reference")
