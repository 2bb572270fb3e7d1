"""Verified fallback: a load of a root of steps with ``fallback=True`` takes the newest committed
step whose chunks it reads verify, says in one line which step it skipped and why, and raises an
outage instead of falling back (issue 35, item 2)."""
from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

import ckptstore
from ckptstore.checkpoint.layout import Layout
from ckptstore.checkpoint.strategy import Strategy
from ckptstore.errors import StoreCorruptError, StoreUnavailableError
from ckptstore.read import loader
from ckptstore.store.fallback import FAILED, choose_step
from ckptstore.testing.kill_at import run_cli

#: Two ranks, ``w`` split by rows (rank 0 saves rows 0-1, rank 1 rows 2-3), ``b`` replicated.
TWO = Strategy({"w": {0: Layout((2,), ((0,), ()))}}, stage_devices=2)


def _values(step: int, rank: int) -> dict[str, np.ndarray]:
    w = np.arange(16, dtype=np.float32).reshape(4, 4) + 100 * step
    return {"w": w[2 * rank:2 * rank + 2], "b": np.full(3, step, np.float32)}


def _save_steps(root: Path | str, steps: tuple[int, ...] = (1, 2)) -> None:
    for step in steps:
        for rank in (0, 1):
            ckptstore.save_rank(_values(step, rank), root, step=step, strategy=TWO, rank=rank, attempt=f"a{step}")


def _chunk_of(root: Path, step: int, name: str, rank: int) -> Path:
    """The file of the chunk of ``name`` that rank ``rank`` of ``TWO`` reads, in step ``step``."""
    with ckptstore.open(root / f"step_{step}") as store:
        info = store.info(name)
        box = loader.target_boxes(store, TWO, rank)[name]
        (i,) = info.chunks_overlapping(box) if box is not None else range(len(info.chunks))
        return root / f"step_{step}" / info.chunks.files[i]


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-3])


def _delete(path: Path) -> None:
    path.unlink()


DAMAGE = {"flipped": (_flip, "checksum mismatch in"), "truncated": (_truncate, "ends at byte offset"),
          "deleted": (_delete, "")}


def _fallback_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "failed verification" in r.getMessage()]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_chunk_of_the_newest_step_makes_the_load_take_the_step_before(tmp_path, caplog, damage):
    _save_steps(tmp_path)
    hurt, said = DAMAGE[damage]
    chunk = _chunk_of(tmp_path, 2, "w", 0)
    hurt(chunk)
    with caplog.at_level("WARNING", logger="ckptstore"):
        got = ckptstore.read_rank(tmp_path, TWO, 0, fallback=True)
    direct = ckptstore.read_rank(tmp_path / "step_1", TWO, 0)
    assert sorted(got) == sorted(direct) == ["b", "w"]
    for name in got:
        assert got[name].tobytes() == direct[name].tobytes(), name
    (line,) = _fallback_lines(caplog)
    assert line.startswith(f"ckptstore: {tmp_path}: loading step 1, not the newer committed step(s) that failed "
                           "verification: step 2: parameter 'w': chunk ")
    assert said in line and chunk.name in line


def test_an_intact_newest_step_loads_as_without_fallback_and_says_nothing(tmp_path, caplog):
    _save_steps(tmp_path)
    with caplog.at_level("WARNING", logger="ckptstore"):
        got = ckptstore.read_rank(tmp_path, TWO, 1, fallback=True)
    assert got["w"].tobytes() == _values(2, 1)["w"].tobytes()
    assert caplog.records == []


def test_only_the_chunks_the_rank_reads_are_verified(tmp_path, caplog):
    _save_steps(tmp_path)
    _flip(_chunk_of(tmp_path, 2, "w", 1))  # rank 1's rows of w
    with caplog.at_level("WARNING", logger="ckptstore"):
        rank0 = ckptstore.read_rank(tmp_path, TWO, 0, fallback=True)
        rank1 = ckptstore.read_rank(tmp_path, TWO, 1, fallback=True)
    assert rank0["w"].tobytes() == _values(2, 0)["w"].tobytes()  # (no collectives here: see the msrun test)
    assert rank1["w"].tobytes() == _values(1, 1)["w"].tobytes()
    assert len(_fallback_lines(caplog)) == 1


def test_several_damaged_steps_are_skipped_in_one_line(tmp_path, caplog):
    _save_steps(tmp_path, (1, 2, 3))
    _delete(_chunk_of(tmp_path, 3, "b", 0))
    _truncate(_chunk_of(tmp_path, 2, "w", 0))
    with caplog.at_level("WARNING", logger="ckptstore"):
        got = ckptstore.read_rank(tmp_path, TWO, 0, fallback=True)
    assert got["b"].tobytes() == _values(1, 0)["b"].tobytes()
    (line,) = _fallback_lines(caplog)
    assert "loading step 1, not" in line and "step 3: parameter 'b'" in line and "; step 2: parameter 'w'" in line


def test_no_step_that_verifies_is_an_error_naming_each_step(tmp_path):
    _save_steps(tmp_path)
    _flip(_chunk_of(tmp_path, 2, "w", 0))
    _flip(_chunk_of(tmp_path, 1, "w", 0))
    with pytest.raises(StoreCorruptError, match=r"no committed step verifies for the chunks this load reads \(step "
                                                r"2: parameter 'w': chunk \d+: checksum mismatch .*; step 1: "):
        ckptstore.read_rank(tmp_path, TWO, 0, fallback=True)


def test_without_fallback_the_damaged_newest_step_is_loaded_and_fails(tmp_path):
    _save_steps(tmp_path)
    _flip(_chunk_of(tmp_path, 2, "w", 0))
    with pytest.raises(StoreCorruptError):
        ckptstore.read_rank(tmp_path, TWO, 0, verify=True)


def test_open_with_fallback_takes_the_newest_step_all_of_whose_chunks_verify(tmp_path, caplog):
    _save_steps(tmp_path)
    _truncate(_chunk_of(tmp_path, 2, "w", 1))
    with caplog.at_level("WARNING", logger="ckptstore"):
        with ckptstore.open(tmp_path, fallback=True) as store:
            assert store.step == 1
            assert store.read("w").tobytes() == np.concatenate([_values(1, r)["w"] for r in (0, 1)]).tobytes()
    assert len(_fallback_lines(caplog)) == 1
    with ckptstore.open(tmp_path) as store:
        assert store.step == 2  # without fallback: the newest committed step, as before


def test_one_damaged_store_that_is_no_root_of_steps_has_nothing_to_fall_back_to(tmp_path):
    _save_steps(tmp_path)
    _flip(_chunk_of(tmp_path, 2, "w", 0))
    with pytest.raises(StoreCorruptError, match="it is one store, not a root of steps, so there is no earlier step"):
        ckptstore.read_rank(tmp_path / "step_2", TWO, 0, fallback=True)


def test_fallback_needs_the_roots_path_not_an_open_store(tmp_path):
    _save_steps(tmp_path)
    with ckptstore.open(tmp_path) as store, pytest.raises(ckptstore.errors.InvalidOptionError,
                                                          match="fallback=True needs the path or URL of the root"):
        ckptstore.read_rank(store, TWO, 0, fallback=True)


# ---- an index: the chunks are the rank files MindSpore saved -------------------------------------


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_rank_file_under_the_newest_index_step_falls_back(saved_layout, tmp_path, caplog, damage):
    layout = saved_layout("dp2_mp4")
    for step in (1, 2):
        src = shutil.copytree(layout.root, tmp_path / f"src{step}")
        ckptstore.index(src, tmp_path / "run" / f"step_{step}", strategy=layout.strategy_files, checksum=True)
    with ckptstore.open(tmp_path / "run" / "step_2") as store:  # a rank file rank 3 reads
        boxes = loader.target_boxes(store, loader.resolve_target(store, None), 3)
        name, box = next((n, b) for n, b in boxes.items() if b is not None)
        rank_file = tmp_path / "src2" / store.info(name).chunks.files[store.info(name).chunks_overlapping(box)[0]]
    DAMAGE[damage][0](rank_file)
    with caplog.at_level("WARNING", logger="ckptstore"):
        got = ckptstore.read_rank(tmp_path / "run", rank=3, fallback=True)
    direct = ckptstore.read_rank(tmp_path / "run" / "step_1", rank=3)
    assert {n: np.asarray(v).tobytes() for n, v in got.items()} == {n: np.asarray(v).tobytes()
                                                                      for n, v in direct.items()}
    (line,) = _fallback_lines(caplog)
    assert "loading step 1, not the newer committed step(s) that failed verification: step 2: " in line
    assert rank_file.name in line


# ---- an outage is no damage -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("status", [500, 403])
def test_an_outage_while_verifying_is_raised_not_fallen_back_from(watched_bucket, quick_retries, caplog, status):
    root = watched_bucket.url("run")
    _save_steps(root)
    watched_bucket.proxy.fail_next(1000, status=status, path="/step_2/w")
    with caplog.at_level("WARNING", logger="ckptstore"), pytest.raises(ckptstore.errors.FileAccessError) as e:
        ckptstore.read_rank(root, TWO, 0, fallback=True)
    assert not isinstance(e.value, StoreCorruptError)
    assert isinstance(e.value, StoreUnavailableError) == (status == 500)
    assert _fallback_lines(caplog) == []


@pytest.mark.slow
def test_an_outage_is_no_truncation_whatever_number_its_url_holds(watched_bucket, quick_retries):
    # the client's error text names the URL: "416" in a key (or in the endpoint's port, 41699) is
    # no HTTP 416, and taking it for one made this outage a truncated chunk, fallen back from
    root = watched_bucket.url("run416")
    _save_steps(root)
    watched_bucket.proxy.fail_next(1000, status=500, path="/step_2/w")
    with pytest.raises(StoreUnavailableError, match="unavailable: it answered HTTP 500"):
        ckptstore.read_rank(root, TWO, 0, fallback=True)


# ---- the agreement of the ranks (the all-reduce, here between two threads) --------------------------------


class _TwoRanks:
    """The agreement's all-reduce between two threads: each offer waits for the other rank's."""

    def __init__(self) -> None:
        self.offers: list[int] = []
        self.barrier = threading.Barrier(2)
        self.rounds = 0

    def agree(self, offer: int) -> tuple[int, int]:
        self.barrier.wait()
        self.offers.append(offer)
        self.barrier.wait()
        low, high = min(self.offers), max(self.offers)
        self.barrier.wait()
        if self.barrier.wait() == 0:
            self.offers.clear()
            self.rounds += 1
        self.barrier.wait()
        return low, high


def _run_ranks(problems: list[dict[int, str | None]], steps: list[int]) -> tuple[list[object], _TwoRanks]:
    ranks = _TwoRanks()
    out: list[object] = [None, None]

    def run(r: int) -> None:
        def problem(step: int) -> str | None:
            found = problems[r].get(step)
            if found == "outage":
                raise StoreUnavailableError("the object store did not answer")
            return found

        try:
            out[r] = choose_step(steps, problem, ranks.agree)
        except Exception as e:
            out[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out, ranks


def test_ranks_agree_on_the_newest_step_that_verifies_for_both():
    out, ranks = _run_ranks([{30: None, 20: "bad on 0", 10: None}, {30: "bad on 1", 20: None, 10: None}],
                            [30, 20, 10])
    assert [o[0] for o in out] == [10, 10]
    assert out[0][1] == [(30, "another rank of the job found damage in the chunks it reads (its log names them)"),
                         (20, "bad on 0")]
    assert ranks.rounds == 3  # 30 vs 20, then 10 vs 20, then 10 vs 10


def test_an_outage_on_one_rank_is_raised_on_both_without_a_hang():
    out, _ = _run_ranks([{30: "outage"}, {30: None}], [30, 20])
    assert isinstance(out[0], StoreUnavailableError)
    assert isinstance(out[1], ckptstore.errors.CkptStoreError) and "another rank of the job failed" in str(out[1])
    assert FAILED < 0


# ---- ckptstore steps ROOT --verify -------------------------------------------------------------------------


def test_steps_verify_states_each_committed_step_verified_or_damaged_and_exits_1(tmp_path):
    _save_steps(tmp_path, (1, 2, 3))
    ckptstore.save_rank(_values(4, 0), tmp_path, step=4, strategy=TWO, rank=0, attempt="a4")  # rank 1 never saves
    chunk = _chunk_of(tmp_path, 2, "w", 1)
    _flip(chunk)
    r = run_cli("steps", tmp_path, "--verify")
    assert r.returncode == 1, r.stderr
    states = [line.split()[:2] for line in r.stdout.splitlines()[1:5]]
    assert states == [["4", "unfinished"], ["3", "verified"], ["2", "damaged"], ["1", "verified"]]
    assert r.stdout.splitlines()[5] == (f"step 2 is damaged: parameter 'w': chunk 1: checksum mismatch in {chunk} at "
                                        f"byte offset 0 ({chunk.stat().st_size} bytes)")
    doc = json.loads(run_cli("steps", tmp_path, "--verify", "--json").stdout)
    assert [(s["step"], s["state"], "problem" in s) for s in doc["steps"]] == [
        (4, "unfinished", False), (3, "verified", False), (2, "damaged", True), (1, "verified", False)]


def test_steps_without_verify_reads_no_chunk_and_says_committed(tmp_path):
    _save_steps(tmp_path)
    _delete(_chunk_of(tmp_path, 2, "w", 1))
    r = run_cli("steps", tmp_path)
    assert r.returncode == 0, r.stderr
    assert [line.split()[:2] for line in r.stdout.splitlines()[1:]] == [["2", "committed"], ["1", "committed"]]


# ---- MindSpore: load_rank and the StoreCheckpoint resume path -------------------------------------------


@pytest.mark.mindspore
def test_load_rank_with_fallback_builds_the_parameters_of_the_step_before(tmp_path, caplog):
    _save_steps(tmp_path)
    _truncate(_chunk_of(tmp_path, 2, "b", 0))
    with caplog.at_level("WARNING", logger="ckptstore"):
        params = ckptstore.load_rank(tmp_path, TWO, 1, fallback=True)
    assert params.view.store.step == 1
    assert params["w"].asnumpy().tobytes() == _values(1, 1)["w"].tobytes()
    assert len(_fallback_lines(caplog)) == 1


@pytest.mark.mindspore
def test_store_checkpoint_resume_loads_the_newest_verified_step_and_removes_the_damaged_one(tmp_path, caplog):
    import mindspore as ms
    from mindspore import nn

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.w = ms.Parameter(ms.Tensor(np.zeros((4, 4), np.float32)), name="w")
            self.b = ms.Parameter(ms.Tensor(np.zeros(3, np.float32)), name="b")

    net = Net()
    saver = ckptstore.StoreCheckpoint(tmp_path)
    assert saver.resume(net) is None  # a first run: nothing to load
    for step in (1, 2):
        whole = {"w": np.concatenate([_values(step, r)["w"] for r in (0, 1)]), "b": _values(step, 0)["b"]}
        ckptstore.save_rank(whole, tmp_path, step=step)
    _flip(_chunk_of(tmp_path, 2, "w", 0))
    with caplog.at_level("WARNING", logger="ckptstore"):
        assert saver.resume(net) == 1
    assert net.b.asnumpy().tobytes() == _values(1, 0)["b"].tobytes()
    assert net.w.asnumpy()[2:].tobytes() == _values(1, 1)["w"].tobytes()
    assert len(_fallback_lines(caplog)) == 1
    assert not (tmp_path / "step_2").exists()  # so the resumed job's save of step 2 is no stale step
    ckptstore.save_rank({"w": np.ones((4, 4), np.float32), "b": np.ones(3, np.float32)}, tmp_path, step=2)
