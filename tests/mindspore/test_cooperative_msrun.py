"""Cooperative loads in real msrun jobs on the CPU wheel (mccl collectives): every rank's values equal
its solo read_rank bit for bit (read_rank, load_rank and load_into_net), each replica group fetches the
distinct bytes once (io_counts() on each rank counts only what it fetched), a rank whose reads fail
makes every rank raise, and a worker killed mid-exchange ends the job non-zero within 60 s.
Each test starts an msrun job: slow tier."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("mindspore")
pytestmark = [pytest.mark.mindspore, pytest.mark.slow]

import ckptstore
import mindspore_fixtures as T
from msrun_helpers import msrun

SPECS = [T.ParamSpec("w", (64, 32), dev_matrix=(2, 2), tensor_map=(0, -1)),
         T.ParamSpec("emb", (48, 32), dev_matrix=(2, 2), tensor_map=(-1, -1)),
         T.ParamSpec("step", (1,), dtype="int32")]
MP4 = [T.ParamSpec("w", (64, 32), dev_matrix=(4,), tensor_map=(-1, 0)),
       T.ParamSpec("emb", (48, 32), dev_matrix=(4,), tensor_map=(-1, -1))]
DP2 = [T.ParamSpec("w", (64, 32), dev_matrix=(2,), tensor_map=(-1, -1)),  # 2 ranks, both holding everything
       T.ParamSpec("emb", (48, 32), dev_matrix=(2,), tensor_map=(-1, -1))]

JOB = '''
import json, os, sys, time
from mindspore.communication import init
init()
if os.environ.get("MS_ROLE") == "MS_SCHED":
    sys.exit(0)
import numpy as np
import ckptstore
from mindspore.communication import get_rank
from ckptstore.io.base import ReadableFile, SourceWrapper
from ckptstore.errors import StoreUnavailableError

store_path, mode = sys.argv[1], sys.argv[2]
targets = [None if s == "none" else s for s in sys.argv[3:]]
rank = get_rank()
group = os.environ.get("COOP_GROUP", "replicas")
if mode == "ok":  # the exchange conformance checks, on MindSpore's collectives among all the workers
    from ckptstore.mindspore.exchange import MindSporeExchange
    from ckptstore.mindspore.exchange import communication
    from ckptstore.testing.exchange_tests import run_checks

    print("CHECKS", rank, len(run_checks(MindSporeExchange(range(communication()[1])))), flush=True)


class Failing(ReadableFile):
    def __init__(self, inner):
        self.inner, self.key, self.size = inner, inner.key, inner.size

    @property
    def url(self):
        return self.inner.url

    def read_requests(self, requests):
        raise StoreUnavailableError(f"{self.url}: the server did not answer")


class FailingReads(SourceWrapper):
    def open(self, key):
        return Failing(self.inner.open(key))


if mode == "kill" and rank == 1:
    from ckptstore.mindspore import exchange

    def die(self, buffer, root, ranks):
        print("KILLED", time.time(), flush=True)
        os.kill(os.getpid(), 9)
    exchange.MindSporeExchange.broadcast = die

if mode == "s3":  # only the cooperative read talks to the server; the test compares digests with a solo read
    import hashlib

    got = ckptstore.read_rank(store_path, targets[0], cooperative="replicas")
    digests = {n: hashlib.sha256(v.tobytes()).hexdigest() for n, v in got.items()}
    print("RESULT", json.dumps({"rank": rank, "digests": digests, "fetched": ckptstore.io_counts().bytes_read}),
          flush=True)
    sys.exit(0)

for strategy in targets:
    solo = ckptstore.read_rank(store_path, strategy)
    store = ckptstore.open(store_path)
    if mode == "fail" and rank == 1:
        store.data = FailingReads(store.data)
    before = ckptstore.io_counts()
    started = time.time()
    try:
        got = ckptstore.read_rank(store, strategy, cooperative=group)
    except Exception as e:
        print("RAISED", rank, type(e).__name__, round(time.time() - started, 1), str(e).splitlines()[0][:300],
              flush=True)
        sys.exit(0)
    fetched = ckptstore.io_counts().bytes_read - before.bytes_read
    same = list(got) == list(solo) and all(
        isinstance(v, str) and v == solo[n] or (v.dtype == solo[n].dtype and v.shape == solo[n].shape
                                                 and v.tobytes() == solo[n].tobytes()) for n, v in got.items())
    params = ckptstore.load_rank(store_path, strategy, cooperative=group)
    built = all(params[n].asnumpy().tobytes() == solo[n].tobytes() for n in solo)
    import mindspore as ms

    class Net(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            for n, v in solo.items():
                setattr(self, n, ms.Parameter(ms.Tensor(np.zeros_like(v)), name=n))

    if strategy is not None:  # (load_into_net's strategy=None means the network's own layout, not the store's)
        net = Net()
        missing = ckptstore.load_into_net(net, store_path, strategy, cooperative=group)
        built = built and missing == ([], []) and all(
            getattr(net, n).asnumpy().tobytes() == solo[n].tobytes() for n in solo)
    print("RESULT", json.dumps({"rank": rank, "strategy": strategy, "same": same, "params_same": built,
                                "fetched": fetched, "solo": sum(v.nbytes for v in solo.values())}), flush=True)
'''


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("coop_msrun")
    T.save_distributed(root / "ckpt", SPECS, T.make_global_tensors(SPECS, seed=7), world_size=4)
    ckptstore.convert(root / "ckpt", root / "store", strategy=root / "ckpt" / "strategy.ckpt")
    T.write_strategy(root / "mp4.ckpt", MP4)
    T.write_strategy(root / "dp2.ckpt", DP2)
    (root / "job.py").write_text(JOB)
    return root


def lines(logs: dict[str, str], tag: str) -> list[str]:
    return [line for name, text in sorted(logs.items()) if name.startswith("worker")
            for line in text.splitlines() if line.startswith(tag)]


def test_four_workers_get_their_solo_values_and_each_group_fetches_the_distinct_bytes_once(job, tmp_path):
    """dp2 x mp2 -> dp2 x mp2, the store's own layout (strategy=None) and a changed layout (mp4)."""
    strategy = str(job / "ckpt" / "strategy.ckpt")
    code, logs = msrun(tmp_path, str(job / "job.py"), str(job / "store"), "ok", strategy, "none",
                       str(job / "mp4.ckpt"), workers=4)
    assert code == 0, "\n".join(logs.values())[-3000:]
    assert sorted(lines(logs, "CHECKS")) == [f"CHECKS {r} 6" for r in range(4)]
    results = [json.loads(line.split(" ", 1)[1]) for line in lines(logs, "RESULT")]
    assert len(results) == 12 and all(r["same"] and r["params_same"] for r in results)
    for target in (strategy, None):  # replica groups (0, 2) and (1, 3): each fetches its slices once
        mine = {r["rank"]: r for r in results if r["strategy"] == target}
        for group in ((0, 2), (1, 3)):
            assert sum(mine[r]["fetched"] for r in group) == mine[group[0]]["solo"] == mine[group[1]]["solo"]
    # mp4: w is split four ways (no replicas) but emb and step are whole on every rank: the 4 ranks are one
    # replica group only for the ranks whose boxes agree, i.e. none; each reads alone
    mp4 = {r["rank"]: r for r in results if r["strategy"] == str(job / "mp4.ckpt")}
    assert all(mp4[r]["fetched"] == mp4[r]["solo"] for r in range(4))


def test_a_rank_whose_reads_fail_mid_load_makes_every_rank_raise(job, tmp_path):
    code, logs = msrun(tmp_path, str(job / "job.py"), str(job / "store"), "fail", str(job / "dp2.ckpt"), workers=2)
    assert code == 0, "\n".join(logs.values())[-3000:]
    raised = sorted(line.split(" ", 4) for line in lines(logs, "RAISED"))
    assert [(r[1], r[2]) for r in raised] == [("0", "CooperativeLoadError"), ("1", "StoreUnavailableError")]
    assert all(float(r[3]) < 10 for r in raised)
    assert raised[0][4].startswith("cooperative load (reading from storage) failed on rank 1 of the group [0, 1]")


def test_a_worker_killed_mid_exchange_ends_the_job_non_zero_within_60_s(job, tmp_path):
    started = time.time()
    code, logs = msrun(tmp_path, str(job / "job.py"), str(job / "store"), "kill", str(job / "dp2.ckpt"), workers=2,
                       timeout=240)
    ended = time.time()
    killed = [float(line.split()[1]) for line in lines(logs, "KILLED")]
    assert code != 0 and len(killed) == 1 and started < killed[0] < ended
    assert ended - killed[0] < 60
    assert not lines(logs, "RESULT")


def test_from_an_s3_server_each_replica_group_gets_each_byte_once(job, tmp_path):
    """2 workers holding the same slices (dp2): the server sends the store's payload once in all, each
    rank fetches about half (io_counts), and each rank's values equal a solo read's."""
    import hashlib

    from ckptstore.testing import s3_server as S

    servers = S.iter_servers()
    server, proxy = next(servers)
    try:
        server.create_bucket("coop")
        with pytest.MonkeyPatch.context() as mp:
            for k, v in S.env_for(proxy.url).items():
                mp.setenv(k, v)
            S.upload(job / "store", "s3://coop/store")
            proxy.reset()
            code, logs = msrun(tmp_path, str(job / "job.py"), "s3://coop/store", "s3", str(job / "dp2.ckpt"),
                               workers=2, env=S.env_for(proxy.url))
        assert code == 0, "\n".join(logs.values())[-3000:]
        payload = [s for s in proxy.requests("GET") if s.range is not None]
    finally:
        servers.close()
    results = {r["rank"]: r for r in (json.loads(line.split(" ", 1)[1]) for line in lines(logs, "RESULT"))}
    distinct = (64 * 32 + 48 * 32 + 1) * 4
    assert sum(s.nbytes for s in payload) == distinct == results[0]["fetched"] + results[1]["fetched"]
    assert 0 < results[0]["fetched"] < distinct and 0 < results[1]["fetched"] < distinct
    for r in (0, 1):
        solo = ckptstore.read_rank(job / "store", job / "dp2.ckpt", r)
        assert results[r]["digests"] == {n: hashlib.sha256(v.tobytes()).hexdigest() for n, v in solo.items()}


DP2_MP4 = [T.ParamSpec("w", (256, 128), dev_matrix=(2, 4), tensor_map=(0, -1)),
           T.ParamSpec("v", (128, 256), dev_matrix=(2, 4), tensor_map=(-1, 0)),
           T.ParamSpec("emb", (512, 64), dev_matrix=(2, 4), tensor_map=(-1, -1)),
           T.ParamSpec("step", (1,), dtype="int32")]


def test_eight_workers_of_a_dp2_mp4_store_load_its_own_layout_with_the_node_reading_each_byte_once(job, tmp_path):
    """strategy=None (the store's own dp2 x mp4 layout), cooperative="node": the 8 ranks share the
    replicated emb and each dp pair its slices of w and v, so the node fetches the model once."""
    T.save_distributed(tmp_path / "ckpt", DP2_MP4, T.make_global_tensors(DP2_MP4, seed=9), world_size=8)
    ckptstore.convert(tmp_path / "ckpt", tmp_path / "store", strategy=tmp_path / "ckpt" / "strategy.ckpt")
    code, logs = msrun(tmp_path, str(job / "job.py"), str(tmp_path / "store"), "ok", "none", workers=8,
                       env={"COOP_GROUP": "node"})
    assert code == 0, "\n".join(logs.values())[-3000:]
    results = [json.loads(line.split(" ", 1)[1]) for line in lines(logs, "RESULT")]
    assert sorted(r["rank"] for r in results) == list(range(8))
    assert all(r["same"] and r["params_same"] for r in results)
    model = (256 * 128 + 128 * 256 + 512 * 64 + 1) * 4
    assert sum(r["fetched"] for r in results) == model < sum(r["solo"] for r in results) == 8 * 196612
