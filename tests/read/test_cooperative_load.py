"""Cooperative loads among threads of one process (ckptstore.testing.exchange): the ranks of a group
read each distinct byte of a real MindSpore-saved store once, every rank's values equal its solo
read_rank bit for bit, and an error on one rank is raised on every rank."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")
pytestmark = pytest.mark.mindspore

import ckptstore
import mindspore_fixtures as T
from ckptstore.errors import CooperativeLoadError, LayoutMismatchError, StoreUnavailableError
from ckptstore.io.base import ReadableFile, SourceWrapper
from ckptstore.read.group_load import LAST_PLAN
from ckptstore.read.loader import replica_ranks
from ckptstore.store.executor import IO_STATS
from ckptstore.testing.exchange import run_group

# dp2 x mp2 on 4 ranks: "w" rows split in 2 (each half held by 2 ranks), "emb" whole on every rank
SPECS = [T.ParamSpec("w", (64, 32), dev_matrix=(2, 2), tensor_map=(0, -1)),
         T.ParamSpec("emb", (48, 32), dev_matrix=(2, 2), tensor_map=(-1, -1)),
         T.ParamSpec("step", (1,), dtype="int32")]
MP4 = [T.ParamSpec("w", (64, 32), dev_matrix=(4,), tensor_map=(-1, 0)),
       T.ParamSpec("emb", (48, 32), dev_matrix=(4,), tensor_map=(-1, -1))]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("coop")
    T.save_distributed(root / "ckpt", SPECS, T.make_global_tensors(SPECS, seed=5), world_size=4)
    ckptstore.convert(root / "ckpt", root / "store", strategy=root / "ckpt" / "strategy.ckpt")
    T.write_strategy(root / "mp4.ckpt", MP4)
    return root


def same(a: object, b: object) -> bool:
    return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype \
        and a.shape == b.shape and a.tobytes() == b.tobytes()


def solo(root: Path, strategy: Path | None, rank: int) -> dict:
    return ckptstore.read_rank(root / "store", strategy, rank)


def test_replicas_of_dp2_mp2_each_read_half_and_get_their_solo_values(store):
    strategy = store / "ckpt" / "strategy.ckpt"
    st = ckptstore.open(store / "store")
    target = __import__("ckptstore.checkpoint.strategy", fromlist=["load_strategy"]).load_strategy(strategy)
    groups = sorted({replica_ranks(st, target, r, 4) for r in range(4)})
    assert groups == [(0, 2), (1, 3)]
    expected = {r: solo(store, strategy, r) for r in range(4)}
    IO_STATS.reset()
    got: dict[int, dict] = {}
    distinct = 0
    for group in groups:
        got.update(run_group(group, lambda ex: ckptstore.read_rank(store / "store", strategy, ex.rank,
                                                                   cooperative=ex)))
        assert LAST_PLAN[0].cooperative
        distinct += LAST_PLAN[0].distinct_bytes
    for r in range(4):
        assert list(got[r]) == list(expected[r]) and all(same(got[r][n], expected[r][n]) for n in got[r]), r
    slices = sum(v.nbytes for r in range(4) for v in expected[r].values())
    assert IO_STATS.bytes_read == distinct == slices // 2


def test_a_changed_layout_shares_what_is_shared_and_reads_it_once(store):
    strategy = store / "mp4.ckpt"
    expected = {r: solo(store, strategy, r) for r in range(4)}
    IO_STATS.reset()
    got = run_group(range(4), lambda ex: ckptstore.read_rank(store / "store", strategy, ex.rank, cooperative=ex))
    plan = LAST_PLAN[0]
    for r in range(4):
        assert all(same(got[r][n], expected[r][n]) for n in expected[r]), r
    emb = 48 * 32 * 4
    assert plan.cooperative and plan.independent_bytes == 4 * emb + 64 * 32 * 4 + 4 * 4
    assert IO_STATS.bytes_read == plan.distinct_bytes == emb + 64 * 32 * 4 + 4
    # each rank's column slice of w is 64 runs of 32 bytes; its owner reads them as one request with the
    # gaps between them, as a solo plan would, so the group sends what its plan says
    assert IO_STATS.requests == sum(plan.requests_by(r) for r in range(4)) <= 8


def test_a_rank_that_cannot_plan_makes_every_rank_raise(store):
    strategy, wrong = store / "ckpt" / "strategy.ckpt", store / "wrong.ckpt"
    T.write_strategy(wrong, [T.ParamSpec("w", (64, 32), dev_matrix=(3,), tensor_map=(0, -1)),
                             T.ParamSpec("emb", (48, 32), dev_matrix=(3,), tensor_map=(-1, -1))])

    def load(ex):
        return ckptstore.read_rank(store / "store", wrong if ex.rank == 2 else strategy, ex.rank % 2, cooperative=ex)

    out = run_group((0, 2), load, raise_errors=False)
    assert isinstance(out[2], LayoutMismatchError)
    assert isinstance(out[0], CooperativeLoadError)
    assert str(out[0]).startswith("cooperative load (planning) failed on rank 2 of the group [0, 2], so rank 0 "
                                  "stops too: rank 2: LayoutMismatchError: parameter 'w'")


class _Failing(ReadableFile):
    def __init__(self, inner: ReadableFile) -> None:
        self.inner, self.key, self.size = inner, inner.key, inner.size

    @property
    def url(self) -> str:
        return self.inner.url

    def read_requests(self, requests) -> None:
        raise StoreUnavailableError(f"{self.url}: the server did not answer")


class FailingReads(SourceWrapper):
    """Opens (and sizes) files as the store does, but every read fails: a store gone mid-load."""

    def open(self, key: str) -> ReadableFile:
        return _Failing(self.inner.open(key))


def test_a_rank_whose_reads_fail_midway_makes_every_rank_raise(store):
    strategy = store / "ckpt" / "strategy.ckpt"

    def load(ex):
        st = ckptstore.open(store / "store")
        if ex.rank == 1:
            st.data = FailingReads(st.data)
        return ckptstore.read_rank(st, strategy, ex.rank, cooperative=ex)

    out = run_group((1, 3), load, raise_errors=False)
    assert isinstance(out[1], StoreUnavailableError)
    assert isinstance(out[3], CooperativeLoadError)
    assert "(reading from storage) failed on rank 1 of the group [1, 3], so rank 3 stops too" in str(out[3])


def plan_cli(*args: object) -> str:
    from click.testing import CliRunner

    from ckptstore.cli import main

    done = CliRunner().invoke(main, ["plan", *map(str, args)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return done.output


def test_plan_cooperative_shows_each_replica_fetching_half_and_the_group_the_distinct_bytes_once(store):
    out = plan_cli(store / "store", "-s", store / "ckpt" / "strategy.ckpt", "--rank", 2, "--cooperative", "replicas")
    assert out.splitlines() == [
        f"group [0, 2] from {store / 'store'}: cooperative (10,244 distinct bytes of 20,488 needed (50%): each read "
        "once)",
        "  rank 0: fetches 6.0 KiB (6,144 bytes) in 1 requests, receives 4.0 KiB; needs 10.0 KiB",
        "  rank 2: fetches 4.0 KiB (4,100 bytes) in 2 requests, receives 6.0 KiB; needs 10.0 KiB",
        "  group: fetches 10,244 bytes (1.00x the 10,244 distinct) in 3 requests vs 20,488 bytes in 6 requests "
        "reading alone"]


def test_plan_cooperative_says_when_the_group_would_read_alone(store):
    out = plan_cli(store / "store", "-s", store / "mp4.ckpt", "--rank", 0, "--cooperative", "0,1", "--include", "w")
    assert out.splitlines()[0] == (f"group [0, 1] from {store / 'store'}: each rank reads alone (the ranks share "
                                   "little: 4,096 distinct bytes of 4,096 needed (100% > 95%))")
    expected = "  rank 0: fetches 2.0 KiB (2,048 bytes) in its own requests, receives 0 B; needs 2.0 KiB"
    assert out.splitlines()[1] == expected


@pytest.mark.parametrize("verify", [False, True], ids=["in place", "checked chunks"])
def test_small_windows_cut_parameters_between_windows_and_values_stay_bit_identical(store, verify):
    """Windows of 1,000 bytes and pieces of 300: a slice read in place is cut between windows (its
    ranges copied as far as each window holds them); one read through checked chunks stays whole."""
    from ckptstore.read.group_load import load_together
    from ckptstore.read.loader import rank_view
    from ckptstore.store.memory import empty

    strategy = store / "ckpt" / "strategy.ckpt"

    def load(ex):
        st = ckptstore.open(store / "store")
        view = rank_view(st, strategy, ex.rank, verify=verify)
        plans = {n: view.plan_for(n) for n in view.names()}
        outs = {n: empty(p.shape, p.dtype) for n, p in plans.items()}
        load_together(ex, st, plans, outs, window_bytes=1000, piece_bytes=300)
        return outs

    got = run_group((0, 2), load)
    plan = LAST_PLAN[0]
    split = [n for n in ("w", "emb") if sum(n in w.params for w in plan.windows) > 1]
    assert split == ([] if verify else ["w", "emb"])
    assert len(plan.windows) >= (3 if verify else 10)
    for r in (0, 2):
        expected = solo(store, strategy, r)
        assert all(same(got[r][n], expected[n]) for n in expected), r
