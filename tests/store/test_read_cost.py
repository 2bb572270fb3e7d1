"""Reads priced by requests and bytes: the planner's choice of requests, and the executor sending exactly them.

Stores are laid out here with numpy (tests/store/test_planner.py's ``write_store``); a counting source
records every request the executor hands to a file, so the properties speak of what the source
is asked, not of what the executor says it did.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_planner import _values, case, write_store

from ckptstore.boxes import Box
from ckptstore.errors import InvalidOptionError
from ckptstore.io import LocalSource
from ckptstore.io.base import LOCAL_COST, ReadableFile, ReadCost, SourceWrapper
from ckptstore.io.s3_redirects import PROBE_KEY
from ckptstore.store.executor import Executor, IOStats
from ckptstore.store.manifest import ChunkTable, ParamManifest, StoreManifest
from ckptstore.store.read_plan import plan_param
from ckptstore.store.store import Store
from conftest import examples

#: An object store's price on this scale: a request costs what 20 ms of a 200 MB/s link moves.
OBJECT_COST = ReadCost(request_seconds=0.02, bytes_per_second=200e6, in_flight=32, max_request_bytes=64 << 20)


class _CountingFile(ReadableFile):
    def __init__(self, inner: ReadableFile, seen: list) -> None:
        self.inner, self.key, self.size, self.seen = inner, inner.key, inner.size, seen

    @property
    def url(self) -> str:
        return self.inner.url

    def read_requests(self, requests) -> None:  # pragma: no cover - the executor sends spans
        raise AssertionError("the executor reads through read_span")

    def read_span(self, requests) -> None:
        offsets = [o for o, _ in requests]
        assert offsets == sorted(offsets)
        self.seen.append((self.key, requests[0][0], requests[-1][0] + len(requests[-1][1])))
        self.inner.read_span(requests)


class CountingSource(SourceWrapper):
    """A source that records ``(key, start, end)`` of every request sent to its files."""

    def __init__(self, inner, cost: ReadCost) -> None:
        super().__init__(inner)
        self._cost, self.seen = cost, []

    @property
    def cost(self) -> ReadCost:
        return self._cost

    def read_cost(self) -> ReadCost:
        return self._cost

    def open(self, key: str) -> ReadableFile:
        return _CountingFile(self.inner.open(key), self.seen)


costs = st.builds(
    ReadCost, request_seconds=st.sampled_from([0.0, 5e-6, 1e-3, 0.05]), bytes_per_second=st.sampled_from([1e3, 1e9]),
    in_flight=st.integers(1, 64), max_request_bytes=st.integers(1, 64),
    max_buffers=st.one_of(st.none(), st.integers(2, 6)), max_gap_bytes=st.one_of(st.none(), st.integers(0, 16)))


def _extents(store: Store, plan) -> list[tuple[str, int, int]]:
    """The bytes of the chunks ``plan`` reads from: each chunk's pieces, or the tensor for the dense layout."""
    info = store.info("w")
    out = []
    for i in plan.chunks:
        _, pieces = info.container(i)
        out += [(f, o, o + n) for f, o, n in pieces]
    return out


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case(), costs, st.sampled_from(["auto", "exact", "merged", "whole"]), st.integers(1, 3),
       st.sampled_from([None, 1, 40]), st.booleans())
def test_the_requests_sent_are_the_plans_and_read_only_inside_its_chunks(tmp_path_factory, c, cost, coalesce, workers,
                                                                         unit, cast):
    shape, chunk, dtype, box, layout, seed = c
    values = _values(shape, dtype, seed)
    store = write_store(tmp_path_factory.mktemp("s"), values, chunk, layout, seed)
    source = CountingSource(store.data, cost)
    out_dtype = np.dtype("float64") if cast else dtype
    plan = plan_param(store.info("w"), box, out_dtype=out_dtype, cost=cost, coalesce=coalesce)
    out, stats = np.empty(box.shape, dtype=out_dtype), IOStats()
    Executor(source, workers=workers, unit_bytes=unit, pool_min_bytes=0, stats=stats).run([(plan, out)])
    assert np.array_equal(out, values[box.slices()].astype(out_dtype))
    assert len(source.seen) == stats.requests == plan.requests
    assert sum(end - start for _, start, end in source.seen) == stats.bytes_fetched == plan.fetched
    assert stats.bytes_read == plan.nbytes <= plan.fetched
    inside: dict[str, set[int]] = {}
    for key, a, b in _extents(store, plan):
        inside.setdefault(key, set()).update(range(a, b))
    for key, start, end in source.seen:
        assert end - start <= 2 * cost.max_request_bytes
        assert set(range(start, end)) <= inside[key], (key, start, end)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case(), costs)
def test_auto_models_no_slower_than_any_one_coalesce_mode(tmp_path_factory, c, cost):
    shape, chunk, dtype, box, layout, seed = c
    store = write_store(tmp_path_factory.mktemp("s"), _values(shape, dtype, seed), chunk, layout, seed)
    plans = {s: plan_param(store.info("w"), box, cost=cost, coalesce=s) for s in ("auto", "exact", "merged", "whole")}
    times = {s: cost.seconds(p.requests, p.fetched) for s, p in plans.items()}
    assert times["auto"] <= min(times.values()) * (1 + 1e-9)
    assert plans["exact"].fetched == plans["exact"].nbytes


def _transposed(tmp_path) -> tuple[Store, np.ndarray]:
    """A [4096, 1024] float32 weight saved split by rows over 2 ranks: two [2048, 1024] chunks, one per rank file."""
    values = np.arange(4096 * 1024, dtype=np.float32).reshape(4096, 1024)
    half = values.nbytes // 2
    (tmp_path / "rank_0.bin").write_bytes(values[:2048].tobytes())
    (tmp_path / "rank_1.bin").write_bytes(values[2048:].tobytes())
    table = ChunkTable(("rank_0.bin", "rank_1.bin"), (0, 0), (half, half), None, (0, 1), (1, 1))
    manifest = StoreManifest({"w": ParamManifest("w", "w", "float32", (4096, 1024), (2048, 1024), table)})
    return Store(LocalSource(tmp_path), manifest), values


def test_a_weight_loaded_by_columns_is_read_in_few_requests(tmp_path):
    store, values = _transposed(tmp_path)
    cols = Box((0, 0), (4096, 512))  # rank 0 of the same weight split by columns
    exact = plan_param(store.info("w"), cols, cost=OBJECT_COST, coalesce="exact")
    chosen = plan_param(store.info("w"), cols, cost=OBJECT_COST)
    assert (exact.requests, exact.fetched) == (4096, 8 << 20)
    assert chosen.requests == 2 and chosen.fetched == (16 << 20) - 2 * 2048  # each chunk but its last half row
    local = plan_param(store.info("w"), cols, cost=LOCAL_COST)
    assert local.requests <= 64
    out = np.empty(cols.shape, dtype=np.float32)
    Executor(store.data, workers=2).run([(local, out)])
    assert np.array_equal(out, values[:, :512])


def test_gaps_longer_than_a_request_is_worth_are_not_read(tmp_path):
    store, _ = _transposed(tmp_path)
    one_column = Box((0, 0), (4096, 1))  # 4 bytes wanted per 4 KiB row
    slow_bytes = replace(OBJECT_COST, bytes_per_second=1e5)  # a 4 KiB gap costs 40 ms > 20 ms / 32
    assert plan_param(store.info("w"), one_column, cost=slow_bytes).requests == 4096
    assert plan_param(store.info("w"), one_column, cost=OBJECT_COST).requests == 2


def test_the_environment_sets_what_a_request_and_a_byte_cost():
    env = {"CKPTSTORE_REQUEST_LATENCY_MS": "50", "CKPTSTORE_BANDWIDTH_MBPS": "125", "CKPTSTORE_REQUESTS_IN_FLIGHT": "8"}
    got = LOCAL_COST.from_environment(env)
    assert (got.request_seconds, got.bytes_per_second, got.in_flight) == (0.05, 125e6, 8)
    assert got.max_request_bytes == LOCAL_COST.max_request_bytes
    assert LOCAL_COST.from_environment({}) is LOCAL_COST


@pytest.mark.parametrize("value", ["fast", "0", "-3"])
def test_a_bad_cost_in_the_environment_names_the_variable(value):
    with pytest.raises(InvalidOptionError, match=f"CKPTSTORE_BANDWIDTH_MBPS='{value}' is not a positive number"):
        LOCAL_COST.from_environment({"CKPTSTORE_BANDWIDTH_MBPS": value})


def _on_s3(store: Store, folder, bucket) -> Store:
    from ckptstore.io.s3_source import S3Source
    from ckptstore.testing.s3_server import upload

    url = bucket.url(f"s{next(_PREFIXES)}")
    upload(folder, url)
    return Store(S3Source(url), store.manifest)


_PREFIXES = iter(range(1 << 30))


@pytest.mark.slow
@settings(max_examples=examples(25), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case(), st.sampled_from(["auto", "exact", "whole"]))
def test_an_object_store_is_sent_exactly_the_planned_gets(tmp_path_factory, watched_bucket, c, coalesce):
    shape, chunk, dtype, box, layout, seed = c
    values = _values(shape, dtype, seed)
    folder = tmp_path_factory.mktemp("s")
    store = _on_s3(write_store(folder, values, chunk, layout, seed), folder, watched_bucket)
    cost = replace(store.data.read_cost(), max_request_bytes=64)  # small pieces: several GETs per chunk
    plan = plan_param(store.info("w"), box, cost=cost, coalesce=coalesce)
    watched_bucket.proxy.reset()
    out, stats = np.empty(box.shape, dtype=dtype), IOStats()
    Executor(store.data, workers=4, pool_min_bytes=0, stats=stats).run([(plan, out)])
    assert np.array_equal(out, values[box.slices()])
    gets = _data(watched_bucket.proxy.requests("GET"))
    assert len(_data(watched_bucket.proxy.requests())) == len(gets) == stats.requests == plan.requests
    assert sum(g.nbytes for g in gets) == plan.fetched



def _data(requests: list) -> list:
    """The requests for store data: the redirect probe's (once per bucket client, on its own key) left out."""
    return [r for r in requests if PROBE_KEY not in r.path]


@pytest.mark.slow
def test_a_weight_loaded_by_columns_from_an_object_store_takes_two_gets(tmp_path, watched_bucket):
    folder = tmp_path / "s"
    folder.mkdir()
    store, values = _transposed(folder)
    store = _on_s3(store, folder, watched_bucket)
    watched_bucket.proxy.reset()
    got = store.read("w", (slice(None), slice(0, 512)), workers=4)
    assert np.array_equal(got, values[:, :512])
    assert len(_data(watched_bucket.proxy.requests("GET"))) == 2 == len(_data(watched_bucket.proxy.requests()))


@st.composite
def _ranges(draw):
    n = draw(st.integers(1, 12))
    files = [draw(st.integers(0, 1)) for _ in range(n)]
    offsets = [draw(st.integers(0, 60)) for _ in range(n)]
    lengths = [draw(st.integers(1, 8)) for _ in range(n)]
    extents = draw(st.one_of(st.none(), st.lists(st.tuples(st.integers(0, 1), st.integers(0, 40), st.integers(1, 40)),
                                                  min_size=1, max_size=4)))
    within = None if extents is None else [(f, a, a + m) for f, a, m in extents]
    return [np.array(c, dtype=np.int64) for c in (files, offsets, lengths, list(range(n)))], within


@settings(max_examples=examples(300), deadline=None)
@given(_ranges(), costs, st.sampled_from(["auto", "exact", "merged", "whole"]))
def test_few_ranges_are_planned_with_plain_ints_as_with_numpy(monkeypatch_module, r, cost, coalesce):
    from ckptstore.store import requests

    cols, within = r
    few = requests.plan_requests(cols, cost, coalesce, within)
    monkeypatch_module.setattr(requests, "FEW_RANGES", 0)
    try:
        many = requests.plan_requests(cols, cost, coalesce, within)
    finally:
        monkeypatch_module.undo()
    assert [c.tolist() for c in few] == [c.tolist() for c in many]


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp
