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


def test_a_local_sink_fsyncs_files_put_without_durability_only_when_made_durable(tmp_path, monkeypatch):
    """A saving rank puts its files with durable=False and fsyncs them all at once at the end."""
    import os

    sink = LocalSink(tmp_path / "out")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))
    assert sink.put_stream("a/x", iter([b"12", b"3"]), durable=False) == 3
    sink.put("b/y", b"4", durable=False)
    assert synced == []
    sink.make_durable(["a/x", "b/y", "gone/z"])  # a missing file is skipped
    out = tmp_path / "out"
    assert sorted(synced) == sorted(map(str, [out / "a" / "x", out / "b" / "y"]))
    synced.clear()
    sink.sync()  # then the folders that name them
    assert sorted(synced) == sorted(map(str, [out, out / "a", out / "b"]))
    assert (out / "a" / "x").read_bytes() == b"123"


# ---------------------------------------------------------------------------------------------
# a local sink follows no link someone planted in the folder (issue 17.1)

SECRET = b"the victim's file\n"


@pytest.fixture
def planted(tmp_path):
    """``(sink, victim)``: an empty local sink and a file outside it that must stay untouched."""
    victim = tmp_path / "elsewhere" / "victim"
    victim.parent.mkdir()
    victim.write_bytes(SECRET)
    (tmp_path / "out").mkdir()
    yield LocalSink(tmp_path / "out"), victim
    assert victim.read_bytes() == SECRET


def test_a_temporary_name_planted_as_a_link_is_replaced_not_followed(planted):
    sink, victim = planted
    (sink.root / partial_key("m.json")).symlink_to(victim)
    (sink.root / partial_key("d")).symlink_to(victim)
    sink.put("m.json", b"{}")
    with sink.create("d") as f:
        f.pwrite(b"data", 0)
    sink.publish("d")
    assert sink.read("m.json") == b"{}" and sink.read("d") == b"data"


@pytest.mark.parametrize("reopen", ["resume", "log", "lock"])
def test_a_file_reopened_through_a_planted_link_is_refused_naming_it(planted, reopen):
    from ckptstore.errors import UnsafePathError

    sink, victim = planted
    name = {"resume": partial_key("d"), "log": "d.journal", "lock": ".ckptstore-work/lock"}[reopen]
    (sink.root / name).parent.mkdir(exist_ok=True)
    (sink.root / name).symlink_to(victim)
    with pytest.raises(UnsafePathError, match=str(sink.root / name)):
        if reopen == "resume":
            sink.create("d", resume=True)
        elif reopen == "log":
            sink.append_log("d.journal", keep=b"x")
        else:
            sink.lock("lock")


def test_a_folder_planted_as_a_link_is_refused_before_anything_is_written_through_it(planted):
    from ckptstore.errors import UnsafePathError

    sink, victim = planted
    (sink.root / ".ckptstore-work").symlink_to(victim.parent, target_is_directory=True)
    for write in (lambda: sink.put(".ckptstore-work/plan.json", b"{}"), lambda: sink.lock("lock"),
                  lambda: sink.create(".ckptstore-work/x")):
        with pytest.raises(UnsafePathError, match="symbolic link"):
            write()
    assert sorted(p.name for p in victim.parent.iterdir()) == ["victim"]


def test_deleting_a_planted_link_removes_the_link_and_listing_does_not_descend_it(planted):
    sink, victim = planted
    (sink.root / "w").mkdir()
    (sink.root / "w" / "file").symlink_to(victim)
    (sink.root / "w" / "folder").symlink_to(victim.parent, target_is_directory=True)
    assert sink.keys("w") == ["w/file", "w/folder"]
    sink.delete(sink.keys("w"))
    assert not (sink.root / "w").exists() and victim.parent.is_dir()


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
    assert any(k.startswith(".ckptstore-work/") for k in sink.contents)  # an unfinished store, not a complete one
    assert not {"zarr.json", "ckptstore.json"} & set(sink.contents)
    sink.fail = None
    summary = ckptstore.convert(layout.root, sink, strategy=layout.strategy_files, format=fmt, workers=1)
    assert summary.chunks_resumed + summary.chunks_written == summary.chunks and summary.chunks_resumed > 0
    assert {k: bytes(v) for k, v in sink.contents.items()} == store_files(tmp_path / "reference")


def test_a_parent_of_a_local_sink_swapped_for_a_link_is_refused_and_its_target_untouched(tmp_path):
    from ckptstore.errors import UnsafePathError

    tmp_path.chmod(0o777)  # a folder others can write into: whoever can may swap its entries
    (tmp_path / "shared").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    sink = LocalSink(tmp_path / "shared" / "out")
    (tmp_path / "shared").rmdir()  # swapped before the sink's first write
    (tmp_path / "shared").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(UnsafePathError, match=f"^{tmp_path / 'shared'} on the way to the output .* is a symbolic link "
                                              "in a folder others can change"):
        sink.put("a.json", b"{}")
    assert list(elsewhere.iterdir()) == []


def test_a_link_of_the_users_own_in_a_folder_only_they_can_change_is_followed(tmp_path):
    tmp_path.chmod(0o700)  # a home folder: only its owner changes its entries
    (tmp_path / "real").mkdir()
    (tmp_path / "mine").symlink_to(tmp_path / "real", target_is_directory=True)  # /home -> /gpfs/home, say
    sink = LocalSink(tmp_path / "mine" / "out")
    sink.put("a.json", b"{}")
    sink.close()
    assert (tmp_path / "real" / "out" / "a.json").read_bytes() == b"{}"


def test_a_link_of_the_users_own_in_a_sticky_shared_folder_is_followed_but_not_a_link_in_its_target(tmp_path):
    from ckptstore.errors import UnsafePathError

    tmp_path.chmod(0o1777)  # as /tmp: others write here, but cannot rename or remove this user's entries
    (tmp_path / "real" / "open").mkdir(parents=True)
    (tmp_path / "real" / "open").chmod(0o777)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "real" / "open" / "swapped").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "mine").symlink_to("real/open", target_is_directory=True)
    LocalSink(tmp_path / "mine" / "out").make_root()  # through the trusted link: made in real/open
    assert (tmp_path / "real" / "open" / "out").is_dir()
    with pytest.raises(UnsafePathError, match="swapped on the way to the output"):
        LocalSink(tmp_path / "mine" / "swapped" / "out").make_root()
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_local_sink_makes_its_missing_parents_one_by_one(tmp_path):
    sink = LocalSink(tmp_path / "a" / "b" / "out")
    sink.put("x/y.json", b"{}")
    sink.close()
    assert (tmp_path / "a" / "b" / "out" / "x" / "y.json").read_bytes() == b"{}"


def test_removing_a_local_sinks_root_follows_no_link_on_its_path(tmp_path):
    tmp_path.chmod(0o777)
    (tmp_path / "shared").mkdir()
    (tmp_path / "elsewhere" / "out").mkdir(parents=True)
    sink = LocalSink(tmp_path / "shared" / "out")
    sink.make_root()
    sink.close()
    (tmp_path / "shared" / "out").rmdir()
    (tmp_path / "shared").rmdir()
    (tmp_path / "shared").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    LocalSink(tmp_path / "shared" / "out").remove_root()
    assert (tmp_path / "elsewhere" / "out").is_dir()


def test_a_small_file_streamed_without_durability_is_one_put_in_the_background(watched_bucket):
    """A saving rank's many small files: each one PUT (not a multipart upload's three requests),
    started in the background and waited for by make_durable."""
    from ckptstore.io.s3_sink import S3Sink

    sink = S3Sink(watched_bucket.url("out"))
    assert sink.put_stream("a/x", iter([b"12", b"3"]), durable=False) == 3
    sink.make_durable(["a/x"])
    assert [(r.method, r.status) for r in watched_bucket.proxy.requests() if r.path.endswith("/out/a/x")] == \
        [("PUT", 200)]
    assert sink.read("a/x") == b"123"


def test_a_failed_background_upload_of_a_streamed_file_is_raised_by_make_durable(watched_bucket, quick_retries):
    from ckptstore.errors import StoreUnavailableError
    from ckptstore.io.s3_sink import S3Sink

    sink = S3Sink(watched_bucket.url("out"))
    watched_bucket.proxy.fail_next(1000, method="PUT", status=500)
    sink.put_stream("a/x", iter([b"12", b"3"]), durable=False)
    with pytest.raises(StoreUnavailableError, match="HTTP 500"):
        sink.make_durable(["a/x"])
