"""``ByteSinkTests``: the behaviour every :class:`~ckptstore.io.sink.ByteSink` shares.

A new sink is reached by the URL schemes its module declares (``BYTE_SINK = Scheme(...)``, see
:mod:`ckptstore.io.schemes`; a third party's through the entry-point group
``ckptstore.byte_sinks``). It passes by subclassing (pytest collects ``Test*`` classes) and
providing a ``sink`` fixture that yields an empty sink; ``has_locks = False`` for storage
without locks. The link rules (a name shared with another by a hard link is never written
through; a folder planted as a symbolic link is refused) run on every sink whose files are local
paths (a ``root`` attribute naming a folder); object storage has no links and skips them::

    class TestMySink(ByteSinkTests):
        @pytest.fixture
        def sink(self, tmp_path):
            yield MySink(tmp_path)
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptstore.errors import UnsafePathError
from ckptstore.io.sink import ByteSink, partial_key

#: The bytes of a file outside the sink that a hard link planted in it shares.
OUTSIDE = b"a snapshot's file, shared by a hard link\n"


class ByteSinkTests:
    """Conformance tests of a byte sink; see the module docstring."""

    has_locks = True

    def test_put_writes_a_file_that_reads_back(self, sink: ByteSink) -> None:
        sink.put("a/b/c.json", b"{}")
        assert sink.read("a/b/c.json") == b"{}"
        assert sink.size("a/b/c.json") == 2

    def test_put_replaces_a_file_whole(self, sink: ByteSink) -> None:
        sink.put("m.json", b"first version")
        sink.put("m.json", b"second", durable=False)
        assert sink.read("m.json") == b"second"

    def test_a_missing_file_has_no_size_and_no_bytes(self, sink: ByteSink) -> None:
        assert sink.size("nothing/here") is None
        assert sink.read("nothing/here") is None

    def test_put_if_absent_creates_only_once(self, sink: ByteSink) -> None:
        assert sink.put_if_absent("w/fingerprint", b"one") is True
        assert sink.put_if_absent("w/fingerprint", b"two") is False
        assert sink.read("w/fingerprint") == b"one"

    def test_put_stream_writes_the_pieces_in_order(self, sink: ByteSink) -> None:
        pieces = [b"ab", bytearray(b"cd"), memoryview(b"efg")]
        assert sink.put_stream("x/data", iter(pieces)) == 7
        assert sink.read("x/data") == b"abcdefg"

    def test_a_stream_that_fails_leaves_no_file(self, sink: ByteSink) -> None:
        def pieces():
            yield b"half"
            raise RuntimeError("source died")

        with pytest.raises(RuntimeError, match="source died"):
            sink.put_stream("x/data", pieces())
        assert sink.size("x/data") is None
        assert sink.keys("x") == []

    def test_keys_lists_files_below_a_folder_recursively(self, sink: ByteSink) -> None:
        for key in ("w/done/a.json", "w/done/b/c.json", "w/plan.json", "other"):
            sink.put(key, b"1")
        assert sink.keys("w/done") == ["w/done/a.json", "w/done/b/c.json"]
        assert sink.keys() == ["other", "w/done/a.json", "w/done/b/c.json", "w/plan.json"]
        assert sink.keys("absent") == []

    def test_files_lists_keys_below_a_folder_with_their_sizes(self, sink: ByteSink) -> None:
        sink.put("w/done/a.json", b"1")
        sink.put("w/done/b/c.json", b"22")
        sink.put("other", b"333")
        assert [(key, size) for key, size, _ in sink.files("w/done")] == [("w/done/a.json", 1), ("w/done/b/c.json", 2)]

    def test_delete_removes_files_and_ignores_missing_ones(self, sink: ByteSink) -> None:
        sink.put("w/a", b"1")
        sink.put("w/b", b"2")
        sink.delete(["w/a", "w/never"])
        assert sink.keys("w") == ["w/b"]

    @pytest.mark.parametrize("key", ["../outside", "/etc/passwd", "a/../../b", "a//b", ""])
    def test_keys_that_leave_the_sink_are_refused(self, sink: ByteSink, key: str) -> None:
        with pytest.raises(UnsafePathError):
            sink.put(key, b"x")

    def test_a_created_file_is_invisible_until_published(self, sink: ByteSink) -> None:
        if not sink.seekable:
            pytest.skip("this sink writes whole files only")
        f = sink.create("p/data")
        f.pwrite(b"world", 6)
        f.pwrite(b"hello ", 0)
        f.close()
        assert sink.size("p/data") is None
        assert sink.read(partial_key("p/data")) == b"hello world"
        sink.publish("p/data")
        sink.sync()
        assert sink.read("p/data") == b"hello world"
        assert sink.size(partial_key("p/data")) is None

    def test_resume_reopens_the_partial_file_and_create_starts_over(self, sink: ByteSink) -> None:
        if not sink.seekable:
            pytest.skip("this sink writes whole files only")
        with sink.create("p/data") as f:
            f.pwrite(b"12345678", 0)
        with sink.create("p/data", resume=True) as f:
            assert f.size == 8
            assert f.pread(2, 3) == b"345"
            f.truncate(4)
        assert sink.read(partial_key("p/data")) == b"1234"
        with sink.create("p/data") as f:
            assert f.size == 0

    def test_unpublish_moves_a_file_back_to_its_partial_name(self, sink: ByteSink) -> None:
        if not sink.seekable:
            pytest.skip("this sink writes whole files only")
        with sink.create("d") as f:
            f.pwrite(b"abc", 0)
        sink.publish("d")
        sink.unpublish("d")
        assert sink.size("d") is None
        assert sink.size(partial_key("d")) == 3

    def test_an_appended_log_keeps_what_it_was_given(self, sink: ByteSink) -> None:
        if not sink.seekable:
            pytest.skip("this sink writes whole files only")
        sink.put("j.journal", b"old line\ntorn")
        with sink.append_log("j.journal", keep=b"old line\n") as f:
            f.pwrite(b"new line\n", f.size)
        assert sink.read("j.journal") == b"old line\nnew line\n"

    def test_a_held_lock_is_not_taken_twice(self, sink: ByteSink) -> None:
        if not self.has_locks:
            pytest.skip("this sink has no locks")
        held = sink.lock("lock")
        assert held is not None
        assert sink.lock("lock", wait=False) is None
        held.release()
        again = sink.lock("lock", wait=False)
        assert again is not None
        again.release()

    # --- links (issue 24.5, 24.6) --------------------------------------------------------------

    def _root(self, sink: ByteSink) -> Path:
        root = getattr(sink, "root", None)
        if not isinstance(root, Path):
            pytest.skip("this sink's files are not local paths: it has no links")
        root.mkdir(parents=True, exist_ok=True)
        return root

    def _hard_link(self, sink: ByteSink, key: str) -> Path:
        """Plant at ``key`` a hard link to a file outside the sink holding :data:`OUTSIDE`; return
        that file (a ``cp -al`` snapshot's copy of a file the writer resumes)."""
        root = self._root(sink)
        outside = root.parent / f"snapshot-{key.replace('/', '_')}"
        outside.write_bytes(OUTSIDE)
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        os.link(outside, root / key)
        return outside

    def test_a_resumed_partial_file_shared_by_a_hard_link_is_written_in_a_copy(self, sink: ByteSink) -> None:
        outside = self._hard_link(sink, partial_key("p/c.0.0"))
        with sink.create("p/c.0.0", resume=True) as f:
            assert f.size == len(OUTSIDE) and f.pread(0, 11) == OUTSIDE[:11]
            f.pwrite(b"NEW", 0)
            f.truncate(5)
        assert outside.read_bytes() == OUTSIDE
        assert sink.read(partial_key("p/c.0.0")) == b"NEWna"

    def test_an_appended_log_shared_by_a_hard_link_is_written_in_a_new_file(self, sink: ByteSink) -> None:
        outside = self._hard_link(sink, "p/c.0.0.journal")
        with sink.append_log("p/c.0.0.journal", keep=b"kept\n") as f:
            f.pwrite(b"line\n", f.size)
        assert outside.read_bytes() == OUTSIDE
        assert sink.read("p/c.0.0.journal") == b"kept\nline\n"

    @pytest.mark.parametrize("name", ["lock", "lock.part-1"])
    def test_a_lock_file_shared_by_a_hard_link_is_replaced_not_written(self, sink: ByteSink, name: str) -> None:
        if not self.has_locks:
            pytest.skip("this sink has no locks")
        outside = self._hard_link(sink, f".ckptstore-work/{name}")
        held = sink.lock(name)
        assert held is not None
        assert sink.lock(name, wait=False) is None  # the new file is the lock now
        held.release()
        assert outside.read_bytes() == OUTSIDE
        assert os.stat(self._root(sink) / ".ckptstore-work" / name).st_nlink == 1

    def test_a_file_put_over_a_hard_link_leaves_the_linked_file_alone(self, sink: ByteSink) -> None:
        outside = self._hard_link(sink, "m.json")
        sink.put("m.json", b"{}")
        with sink.create("d") as f:
            f.pwrite(b"x", 0)
        sink.publish("d")
        assert outside.read_bytes() == OUTSIDE
        assert sink.read("m.json") == b"{}"

    def test_a_folder_planted_as_a_symbolic_link_is_refused_naming_it(self, sink: ByteSink) -> None:
        root = self._root(sink)
        elsewhere = root.parent / "elsewhere"
        elsewhere.mkdir()
        (root / "step_9").symlink_to(elsewhere, target_is_directory=True)
        step = sink.folder("step_9")
        with pytest.raises(UnsafePathError, match=f"^{root / 'step_9'} is a symbolic link"):
            step.put("zarr.json", b"{}")
        with pytest.raises(UnsafePathError, match=f"^{root / 'step_9'} is a symbolic link"):
            step.make_root()
        assert list(elsewhere.iterdir()) == []
        assert sink.links() == ["step_9"]

    def test_a_folder_of_the_sink_writes_below_it(self, sink: ByteSink) -> None:
        if getattr(sink, "root", None) is None and not sink.url.startswith(("s3://", "obs://")):
            pytest.skip("this sink has no folders of its own")
        sink.folder("step_1").put("w/zarr.json", b"{}")
        assert sink.read("step_1/w/zarr.json") == b"{}"
