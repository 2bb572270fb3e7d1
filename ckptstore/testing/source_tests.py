"""``ByteSourceTests``: the behaviour every :class:`~ckptstore.io.base.ByteSource` shares.

Every read of checkpoint or store bytes goes through a byte source, and keys come from metadata
that may be hostile, so each source must: open a file by key and report its size; fill
``(offset, buffer)`` requests exactly, in any order and from many threads; refuse a key that
could leave the source (``..``, absolute, empty components, control characters) before any
access; type every failure (a missing key, a short read, a folder in place of a file) with a
:class:`~ckptstore.errors.CkptStoreError` that names the file; give a file's identity
(:class:`~ckptstore.io.base.FileStat`) that changes when its bytes are replaced; never mix two
versions of a file it says it pins (``pins_open_files``, ``pins_read_files``); and, where the
storage has symbolic links, follow none.

A new source is reached by the URL schemes its module declares (``BYTE_SOURCE = Scheme(...)``,
see :mod:`ckptstore.io.schemes`; a third party's through the entry-point group
``ckptstore.byte_sources``). It passes by subclassing (pytest collects ``Test*`` classes),
providing a ``source`` fixture that yields a source over an empty location, and
:meth:`ByteSourceTests.put`, which writes a file where that source reads (replacing any file of
that key, as a writer would, by a new one); :meth:`ByteSourceTests.plant_link` where the
storage has symbolic links::

    from ckptstore.testing.source_tests import ByteSourceTests

    class TestMySource(ByteSourceTests):
        @pytest.fixture
        def source(self, tmp_path):
            yield MySource(tmp_path)

        def put(self, source, key, data):
            ...  # write data as the file `key` of the storage `source` reads
"""
from __future__ import annotations

import random
import re
import threading

import pytest

from ckptstore.errors import (
    CkptStoreError,
    FileAccessError,
    MissingFileError,
    ShortReadError,
    StoreChangedError,
    UnsafePathError,
)
from ckptstore.io.base import ByteSource

#: Keys a source must refuse, whatever it holds: each could name something outside it.
UNSAFE_KEYS = ["..", "../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a/", "", "a\x00b", "a\nb", "a\x7fb",
               "a\\..\\b"]


def sample_bytes(n: int, seed: int = 0) -> bytes:
    """``n`` deterministic bytes in which no short run repeats (a misplaced range shows)."""
    return random.Random(seed).randbytes(n)


class ByteSourceTests:
    """Conformance tests of a byte source; see the module docstring for how to add a source."""

    #: What opening (then reading) a key that has no file raises.
    missing_error: type[CkptStoreError] = MissingFileError

    def put(self, source: ByteSource, key: str, data: bytes) -> None:
        """Write ``data`` as the file ``key`` of the storage ``source`` reads (test set-up)."""
        raise NotImplementedError(f"{type(self).__name__} must say how to write a file its source reads")

    def plant_link(self, source: ByteSource, key: str, target: str) -> None:
        """Make ``key`` a symbolic link to ``target`` (relative to the link), where the storage has links."""
        pytest.skip("this storage has no symbolic links")

    # ---- opening and reading -----------------------------------------------------------------

    def test_open_gives_the_file_of_a_key_and_its_size(self, source: ByteSource) -> None:
        self.put(source, "rank_0/net.ckpt", sample_bytes(100))
        f = source.open("rank_0/net.ckpt")
        assert f.size == 100
        assert f.url == source.key_url("rank_0/net.ckpt") and f.url.endswith("rank_0/net.ckpt")

    def test_pread_returns_the_bytes_at_an_offset_and_stops_at_the_end(self, source: ByteSource) -> None:
        data = sample_bytes(100)
        self.put(source, "f", data)
        f = source.open("f")
        assert f.pread(10, 5) == data[10:15]
        assert f.pread(95, 10) == data[95:]
        assert f.pread(100, 4) == b""

    def test_read_requests_fill_every_buffer_in_any_order(self, source: ByteSource) -> None:
        data = sample_bytes((3 << 20) + 17)  # several pieces of an object store's streamed answer
        self.put(source, "big", data)
        spans = [(2 << 20, 1 << 20), (0, 7), (7, 9), (16, 300_000), (1_000_000, 1), (len(data) - 5, 5),
                 (len(data), 0), (500_000, 1_500_000), (300_100, 4096)]
        arena = bytearray(sum(n for _, n in spans))  # one allocation cut into buffers, as the executor does
        requests, at = [], 0
        for offset, n in spans:
            requests.append((offset, memoryview(arena)[at:at + n]))
            at += n
        source.open("big").read_requests(requests)
        for (offset, n), (_, buf) in zip(spans, requests, strict=True):
            assert bytes(buf) == data[offset:offset + n], (offset, n)

    def test_readv_fills_buffers_in_turn_from_one_offset(self, source: ByteSource) -> None:
        data = sample_bytes(64)
        self.put(source, "f", data)
        bufs = [bytearray(3), bytearray(10), bytearray(1)]
        source.open("f").readv(20, bufs)
        assert b"".join(bufs) == data[20:34]
        one = bytearray(8)
        source.open("f").read_into(56, memoryview(one))
        assert bytes(one) == data[56:]

    def test_an_open_file_is_read_by_many_threads_at_once(self, source: ByteSource) -> None:
        data = sample_bytes(1 << 20, seed=3)
        self.put(source, "f", data)
        f = source.open("f")
        wrong: list[int] = []

        def read(i: int) -> None:
            for j in range(8):
                offset = (i * 8 + j) * 16384
                buf = bytearray(16384)
                f.read_into(offset, memoryview(buf))
                if bytes(buf) != data[offset:offset + 16384]:
                    wrong.append(offset)

        threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert wrong == []

    def test_read_bytes_gives_a_small_file_whole_and_refuses_a_larger_one(self, source: ByteSource) -> None:
        data = sample_bytes(100)
        self.put(source, "meta/zarr.json", data)
        assert source.read_bytes("meta/zarr.json", limit=100) == data
        with pytest.raises(FileAccessError, match="meta/zarr.json"):
            source.read_bytes("meta/zarr.json", limit=99)

    def test_list_names_the_folders_and_files_directly_below_a_prefix(self, source: ByteSource) -> None:
        for key in ("a/b/c", "a/d", "a/e", "f"):
            self.put(source, key, b"1")
        assert source.list() == (["a"], ["f"])
        assert source.list("a") == (["b"], ["d", "e"])
        assert source.list("a/b") == ([], ["c"])

    # ---- what a file is ----------------------------------------------------------------------

    def test_stat_gives_the_size_and_a_stable_version(self, source: ByteSource) -> None:
        self.put(source, "f", sample_bytes(100))
        st = source.stat("f")
        assert st is not None and st.size == 100
        assert isinstance(st.version, str) and st.version
        assert source.stat("f") == st

    def test_a_file_replaced_by_other_bytes_of_the_same_size_has_another_version(self, source: ByteSource) -> None:
        self.put(source, "f", sample_bytes(100, seed=1))
        before = source.stat("f")
        self.put(source, "f", sample_bytes(100, seed=2))
        after = source.stat("f")
        assert before is not None and after is not None and after.size == before.size
        assert after.version != before.version

    def test_after_close_a_key_opens_the_file_as_it_is_now(self, source: ByteSource) -> None:
        self.put(source, "f", b"first version")
        assert source.open("f").pread(0, 100) == b"first version"
        self.put(source, "f", b"second")
        source.close()
        f = source.open("f")
        assert f.size == 6 and f.pread(0, 100) == b"second"

    def test_an_open_file_keeps_its_bytes_when_replaced_if_the_source_says_so(self, source: ByteSource) -> None:
        if not source.pins_open_files:
            pytest.skip("this source does not promise that an open file keeps its content")
        self.put(source, "f", b"old bytes")
        f = source.open("f")
        assert f.size == 9
        self.put(source, "f", b"new bytes")
        assert f.pread(0, 9) == b"old bytes"

    def test_a_read_file_keeps_its_version_or_is_refused_when_replaced_if_the_source_says_so(
            self, source: ByteSource) -> None:
        if not source.pins_read_files:
            pytest.skip("this source does not promise that a file keeps the version it was first read at")
        self.put(source, "f", b"old bytes")
        f = source.open("f")
        assert f.pread(0, 3) == b"old"
        self.put(source, "f", b"new bytes")
        with pytest.raises(StoreChangedError, match=f"{re.escape(source.key_url('f'))} was replaced while it was read"):
            source.open("f").pread(3, 6)
        source.close()
        assert source.open("f").pread(0, 9) == b"new bytes"

    # ---- refusals ----------------------------------------------------------------------------

    def test_a_missing_key_is_a_typed_error_naming_it(self, source: ByteSource) -> None:
        self.put(source, "present", b"1")
        assert source.stat("absent/file") is None
        assert source.read_bytes("absent/file", limit=100) is None
        with pytest.raises(self.missing_error, match="absent/file"):
            source.open("absent/file").pread(0, 1)
        with pytest.raises(self.missing_error, match="absent/file"):
            source.open("absent/file").read_into(0, memoryview(bytearray(1)))

    @pytest.mark.parametrize("offset,nbytes", [(95, 10), (100, 1), (4096, 4)])
    def test_a_read_past_the_end_is_a_short_read_saying_where_the_file_ends(self, source: ByteSource, offset: int,
                                                                            nbytes: int) -> None:
        self.put(source, "f", sample_bytes(100))
        with pytest.raises(ShortReadError, match="f ends at byte offset 100") as e:
            source.open("f").read_into(offset, memoryview(bytearray(nbytes)))
        assert (e.value.path, e.value.offset, e.value.nbytes, e.value.end) == (source.key_url("f"), offset, nbytes, 100)

    def test_a_folder_is_not_a_file(self, source: ByteSource) -> None:
        self.put(source, "rank_0/net.ckpt", b"1")
        with pytest.raises(CkptStoreError, match="rank_0"):
            source.open("rank_0").pread(0, 1)

    @pytest.mark.parametrize("key", UNSAFE_KEYS)
    def test_a_key_that_could_leave_the_source_is_refused(self, source: ByteSource, key: str) -> None:
        self.put(source, "a/b", b"1")
        for call in (lambda: source.open(key), lambda: source.stat(key),
                     lambda: source.read_bytes(key, limit=100), lambda: source.list(key or "/")):
            with pytest.raises(UnsafePathError):
                call()

    def test_a_symbolic_link_to_a_file_is_not_followed(self, source: ByteSource) -> None:
        self.put(source, "real.ckpt", b"secret")
        self.plant_link(source, "link.ckpt", "real.ckpt")
        for call in (lambda: source.open("link.ckpt"), lambda: source.read_bytes("link.ckpt", limit=100)):
            with pytest.raises(UnsafePathError, match="link.ckpt is a symbolic link"):
                call()
        assert source.list() == ([], ["real.ckpt"])

    def test_a_symbolic_link_to_a_folder_is_not_followed(self, source: ByteSource) -> None:
        self.put(source, "real/net.ckpt", b"secret")
        self.plant_link(source, "rank_0", "real")
        with pytest.raises(UnsafePathError, match="rank_0 is a symbolic link"):
            source.open("rank_0/net.ckpt")
        with pytest.raises(UnsafePathError, match="rank_0 is a symbolic link"):
            source.list("rank_0")
        assert source.list() == (["real"], [])

