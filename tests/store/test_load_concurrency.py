"""Many processes load their ranks from one store at the same time (no locks, shared page cache):
8 subprocesses, one per rank of an 8-rank target, each ``load_rank`` + materialize everything at
once (a file barrier releases them together); each reads exactly its plan and its result
equals ``mindspore.transform_checkpoints``'s for that rank.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

pytest.importorskip("mindspore")
pytestmark = pytest.mark.mindspore

from load_fixtures import assert_same_dict

_WORKER = textwrap.dedent("""
    import os, sys, time
    os.environ["GLOG_v"] = "3"
    import numpy as np
    import ckptstore, mindspore
    from ckptstore.store.executor import IO_STATS

    store, strategy, rank, out, sync = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    open(os.path.join(sync, f"ready_{rank}"), "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(sync, "go")):  # start loading together
        if time.monotonic() > deadline:
            sys.exit("no go signal")
        time.sleep(0.01)
    params = ckptstore.load_rank(store, strategy, rank)
    arrays = {name: np.array(params[name].asnumpy(), copy=True) for name in params}
    if IO_STATS.bytes_read != params.plan.nbytes:
        sys.exit(f"read {IO_STATS.bytes_read} bytes, planned {params.plan.nbytes}")
    np.savez(out, **arrays)
""")


@pytest.mark.slow
def test_eight_processes_load_their_ranks_at_once(load_env, tmp_path):
    t = load_env.target("dp2_mp4->dp4_mp2")
    assert t.world == 8
    sync = tmp_path / "sync"
    sync.mkdir()
    # one thread per worker: the 8 MindSpore imports share the CPUs
    env = {**os.environ, "GLOG_v": "3", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(t.store_path), str(t.target_file), str(j),
                               str(tmp_path / f"rank_{j}.npz"), str(sync)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for j in range(8)]
    try:
        # eight MindSpore imports on two shared cores: 60 s was not always enough under load
        deadline = time.monotonic() + 240
        while len(list(sync.glob("ready_*"))) < 8:
            assert time.monotonic() < deadline, "workers did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
            time.sleep(0.02)
        (sync / "go").touch()
        results = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for j, (p, (_, err)) in enumerate(zip(procs, results, strict=True)):
        assert p.returncode == 0, f"rank {j}: {err[-2000:]}"
    for j in range(8):
        with np.load(tmp_path / f"rank_{j}.npz") as npz:
            got = {name: npz[name] for name in npz.files}
        assert_same_dict(got, t.oracle(j), f"rank {j}")


def test_threads_share_one_store_and_one_rank_parameters(load_env):
    """One Store (shared file descriptors) read by 8 threads, one per rank, while 4 more threads
    race to build the same RankParameters entries: every value equals the oracle, each
    parameter is built once."""
    from concurrent.futures import ThreadPoolExecutor

    import ckptstore
    from load_fixtures import to_numpy

    t = load_env.target("dp2_mp4->dp4_mp2")
    store = ckptstore.open(t.store_path)

    def load(rank):
        params = ckptstore.load_rank(store, t.strategy, rank, workers=4)
        return {name: to_numpy(params[name]) for name in params}

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(load, range(8)))
    for j, got in enumerate(results):
        assert_same_dict(got, t.oracle(j), f"rank {j}")

    shared = ckptstore.load_rank(store, t.strategy, 6)
    with ThreadPoolExecutor(4) as pool:
        built = list(pool.map(lambda _: [shared[n] for n in shared], range(4)))
    for other in built[1:]:
        assert all(a is b for a, b in zip(built[0], other, strict=True))
    assert_same_dict({n: to_numpy(p) for n, p in zip(shared, built[0], strict=True)}, t.oracle(6), "shared")


def test_threads_sharing_one_rank_parameters_build_each_parameter_once(load_env):
    import threading

    import ckptstore
    from load_fixtures import to_numpy

    t = load_env.target("mixed_dtypes->dp2_mp2_optshard")
    params = ckptstore.load_rank(t.store, t.strategy, 1)
    names = list(params)
    seen: list[dict] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker(i: int) -> None:
        try:
            start.wait()
            order = names[i % len(names):] + names[:i % len(names)]
            got = params.materialize() if i % 3 == 0 else {n: params[n] for n in order}
            seen.append(got)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for got in seen:  # every thread got the very same Parameter objects
        assert all(got[n] is seen[0][n] for n in names)
    assert_same_dict({n: to_numpy(v) for n, v in seen[0].items()}, t.oracle(1), "threads")
