"""``ByteSinkTests``: the behaviour every :class:`~ckptstore.io.sink.ByteSink` shares.

A new sink is reached by the URL schemes its module declares (``BYTE_SINK = Scheme(...)``, see
:mod:`ckptstore.io.schemes`; a third party's through the entry-point group
``ckptstore.byte_sinks``). It passes by subclassing (pytest collects ``Test*`` classes) and
providing a ``sink`` fixture that yields an empty sink; ``has_locks = False`` for storage
without locks::

    class TestMySink(ByteSinkTests):
        @pytest.fixture
        def sink(self, tmp_path):
            yield MySink(tmp_path)
"""
from __future__ import annotations

import pytest

from ckptstore.errors import UnsafePathError
from ckptstore.io.sink import ByteSink, partial_key


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
