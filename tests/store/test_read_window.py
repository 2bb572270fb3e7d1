"""A source that bounds its requests in flight by bytes (object storage, issue 36.3): the executor
starts a request only when the ones in flight leave room for its bytes, on as many threads as
ran at once, and every byte still lands where the plan says."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ckptstore.io.base import ReadableFile, Request, SourceWrapper
from ckptstore.io.local import LocalSource
from ckptstore.store.executor import Executor
from ckptstore.store.read_plan import plan_ranges

PIECE = 64 << 10
FILES = 8


class _Watched(ReadableFile):
    """A local file whose reads take 20 ms each (a round trip) and are counted while in flight."""

    def __init__(self, inner: ReadableFile, source: WindowedSource) -> None:
        self.inner, self.source = inner, source
        self.size = inner.size

    @property
    def url(self) -> str:
        return self.inner.url

    def read_requests(self, requests: list[Request]) -> None:
        raise AssertionError("the executor sends planned requests only")

    def read_span(self, requests: list[Request]) -> None:
        nbytes = requests[-1][0] + len(requests[-1][1]) - requests[0][0]
        self.source.enter(nbytes)
        try:
            time.sleep(0.02)
            self.inner.read_span(requests)
        finally:
            self.source.leave(nbytes)


class WindowedSource(LocalSource):
    """A local folder that keeps at most three pieces of requests in flight, as a bucket would its answers."""

    inflight_bytes = 3 * PIECE

    def __init__(self, root) -> None:
        super().__init__(root)
        self.now = self.peak = self.reads = 0
        self.threads: set[int] = set()
        self._count = threading.Lock()

    def open(self, key: str) -> ReadableFile:
        return _Watched(super().open(key), self)

    def enter(self, nbytes: int) -> None:
        with self._count:
            self.now += nbytes
            self.reads += 1
            self.peak = max(self.peak, self.now)
            self.threads.add(threading.get_ident())

    def leave(self, nbytes: int) -> None:
        with self._count:
            self.now -= nbytes


@pytest.fixture
def folder(tmp_path):
    rng = np.random.default_rng(3)
    data = [rng.integers(0, 256, PIECE, dtype=np.uint8) for _ in range(FILES)]
    for i, d in enumerate(data):
        (tmp_path / f"f{i}").write_bytes(d.tobytes())
    return tmp_path, np.concatenate(data)


def _read(source, workers: int = 8) -> np.ndarray:
    keys = [f"f{i}" for i in range(FILES)]
    plan = plan_ranges("x", keys, list(range(FILES)), [0] * FILES, [PIECE] * FILES)
    out = np.zeros(plan.nbytes, dtype=np.uint8)
    Executor(source, workers=workers, unit_bytes=PIECE, pool_min_bytes=0).run([(plan, out)])  # one request per unit
    return out


def test_requests_in_flight_stay_within_the_sources_window_of_bytes(folder):
    root, want = folder
    source = WindowedSource(root)
    np.testing.assert_array_equal(_read(source), want)
    assert source.peak == 3 * PIECE  # eight workers, three pieces' worth of requests at once


def test_a_windowed_load_runs_on_as_many_threads_as_requests_ran_at_once(folder):
    """A thread that has read an answer keeps the object-store client's allocations: eight
    workers waiting their turn in the window would cost eight threads' worth."""
    root, _ = folder
    source = WindowedSource(root)
    _read(source)
    assert len(source.threads) <= 3


def test_a_wrapped_source_keeps_its_inner_sources_window(folder):
    root, want = folder
    source = SourceWrapper(WindowedSource(root))
    assert source.inflight_bytes == 3 * PIECE
    np.testing.assert_array_equal(_read(source), want)
    assert source.inner.peak == 3 * PIECE


def test_a_request_larger_than_the_window_runs_alone(folder):
    root, want = folder
    source = WindowedSource(root)
    source.inflight_bytes = PIECE // 2
    np.testing.assert_array_equal(_read(source), want)
    assert source.peak == PIECE


def test_a_failed_read_stops_the_requests_still_waiting_in_the_window(folder):
    from ckptstore.errors import StoreCorruptError

    root, _ = folder
    (root / "f1").unlink()  # the second request fails; six wait behind it in a window of one piece
    source = WindowedSource(root)
    source.inflight_bytes = PIECE
    with pytest.raises(StoreCorruptError, match="f1"):
        _read(source)
    time.sleep(0.1)  # a runner still going would read the rest by now
    assert len(source.threads) == 1 and source.peak == PIECE and source.now == 0
    assert source.reads <= 2
