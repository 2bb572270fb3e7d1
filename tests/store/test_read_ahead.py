"""The lazy path reads ahead: parameters taken one by one from an object store (``params[k]`` in a
loop) have the next ones' GETs in flight while the caller builds the previous one.

Through the counting proxy of :mod:`ckptstore.testing.s3_server`, so what is observed is what the
server was sent.
"""
from __future__ import annotations

import time

import pytest

pytest.importorskip("mindspore")
pytest.importorskip("obstore")
pytestmark = [pytest.mark.mindspore, pytest.mark.slow]

import ckptstore
from ckptstore.store.executor import IO_STATS
from convert_fixtures import s3_store
from load_fixtures import assert_same_dict, to_numpy


def _objects_read(proxy) -> set[str]:
    """Keys (relative to the store) of the objects the proxy saw ranged GETs of."""
    return {s.path.split("/", 3)[-1] for s in proxy.requests("GET") if s.range is not None}


def test_taking_parameters_one_by_one_reads_the_next_ones_ahead(watched_bucket, load_env):
    t = load_env.target("dp2_mp4->dp2_mp2")
    url = s3_store(watched_bucket, load_env.saved_layout("dp2_mp4"), "zarr")
    params = ckptstore.load_rank(url, t.strategy, 1)
    names = [n for n in params if not params.view.store.info(n).is_str]
    watched_bucket.proxy.reset()
    params[names[0]]
    first = _objects_read(watched_bucket.proxy)
    params[names[1]]  # the second in order: what follows is read ahead
    deadline = time.monotonic() + 10
    later = {f for n in names[2:] for f in params.plan.params[n].files}
    while not (_objects_read(watched_bucket.proxy) & later - first) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _objects_read(watched_bucket.proxy) & later - first, "nothing after the second parameter was read"


def test_parameters_read_ahead_are_read_once_and_right(watched_bucket, load_env):
    t = load_env.target("dp2_mp4->dp2_mp2")
    url = s3_store(watched_bucket, load_env.saved_layout("dp2_mp4"), "zarr")
    params = ckptstore.load_rank(url, t.strategy, 1)
    IO_STATS.reset()
    names = list(params)
    got = {n: to_numpy(params[n]) for n in names[:3]}  # one by one: the rest is read ahead
    got.update({n: to_numpy(v) for n, v in params.materialize().items()})  # takes over what was read ahead
    assert_same_dict(got, t.oracle(1), "read ahead")
    assert (IO_STATS.bytes_read, IO_STATS.requests) == (params.plan.nbytes, params.plan.requests)
