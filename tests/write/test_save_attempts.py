"""Save attempts: a committed step is one save, whole (issue 24 items 1-3, 9, 11, 15; issue 25 items 2, 7, 8).

Every rank's records belong to one save attempt that the ranks of one job agree on; a commit
merges only one attempt's records; a save that finds the step unfinished by another attempt
starts it over; a committed step is never written again. Rank slices are MindSpore's own (the
``saved_layout`` rank files, byte-identical to ``mindspore.save_checkpoint``'s, read by save_worker's
``local_slices``); the ranks of a job run one after another in this process, each as the
launcher would start it (its job id in the environment).
"""
from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_save import _two_column_ranks, assert_store_holds

import ckptstore
from ckptstore.errors import ConversionInProgressError, IncompleteStoreError, InvalidOptionError, StoreExistsError
from convert_fixtures import data_files, expected_values, run_cli

STEP = 7


def _other(value: Any) -> Any:
    """Another job's value of the same parameter (slicing commutes with it)."""
    if isinstance(value, str) or not isinstance(value, np.ndarray):
        return value
    return ~value if value.dtype == np.bool_ else (value + 1).astype(value.dtype)


def _slices(layout: Any, changed: bool = False) -> list[dict[str, Any]]:
    from save_worker import local_slices

    out = []
    for r in range(layout.world):
        local = local_slices(str(layout.rank_file(r)))
        out.append({n: _other(v) for n, v in local.items()} if changed else local)
    return out


def _save(layout: Any, root: Path, values: list[dict[str, Any]], rank: int, **kw: Any) -> Any:
    return ckptstore.save_rank(values[rank], root, step=STEP, strategy=layout.strategy_files, rank=rank, **kw)


def _expected(layout: Any, changed: bool = False) -> dict[str, Any]:
    return {n: _other(v) if changed else v for n, v in expected_values(layout).items()}


def _payload(step: Path) -> int:
    return sum(n for key, n in data_files(step).items() if not key.startswith(".ckptstore-work/"))


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- where the attempt comes from --------------------------------------------------------------


@pytest.mark.parametrize("explicit,world,env,want", [
    ("run-5", 4, {"OMPI_MCA_ess_base_jobid": "77"}, "run-5"),
    (None, 4, {"OMPI_MCA_ess_base_jobid": "77"}, "launch:OMPI_MCA_ess_base_jobid=77"),
    (None, 2, {"PMIX_NAMESPACE": "prterun-h-123@1"}, "launch:PMIX_NAMESPACE=prterun-h-123@1"),
    (None, 8, {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0"},
     "launch:SLURM_JOB_ID=9:SLURM_STEP_ID=0:SLURM_RESTART_COUNT="),
    (None, 4, {"MS_SCHED_HOST": "127.0.0.1", "MS_SCHED_PORT": "8118", "RANK_SIZE": "4"}, None),  # msrun: no job id
], ids=["explicit", "mpirun", "pmix", "slurm", "msrun-without-init"])
def test_the_attempt_comes_from_the_argument_else_the_launchers_job_id(explicit, world, env, want):
    from ckptstore.write.attempt import save_attempt

    assert save_attempt(explicit, world, env) == want


def test_a_job_of_one_process_draws_a_new_attempt_each_save():
    from ckptstore.write.attempt import save_attempt

    first, second = save_attempt(None, 1, {}), save_attempt(None, 1, {})
    assert len(first) == 32 and first != second


def test_an_empty_attempt_is_refused():
    with pytest.raises(InvalidOptionError, match="attempt must be a non-empty string"):
        ckptstore.save_rank({"w": np.ones(2)}, "unused", step=1, attempt=" ")


def test_a_job_of_several_ranks_with_no_attempt_says_once_a_root_that_its_saves_can_mix(tmp_path, monkeypatch,
                                                                                        caplog):
    from ckptstore.write.attempt import JOB_IDS

    for names in JOB_IDS:
        for name in names:
            monkeypatch.delenv(name, raising=False)
    w = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    with caplog.at_level("WARNING", logger="ckptstore"):
        for step in (1, 2):
            for rank in (0, 1):
                local = np.ascontiguousarray(w[:, rank * 3:(rank + 1) * 3])
                ckptstore.save_rank({"w": local}, tmp_path, step=step, strategy=_two_column_ranks(), rank=rank)
    assert [r.getMessage() for r in caplog.records] == [
        f"ckptstore: {tmp_path}: this job of 2 ranks has no save attempt id (MindSpore's communication is not "
        "initialised, no mpirun or Slurm job id, no attempt=), so every run of a step counts as one save: a restart "
        "or another job saving the same step can mix into it. Call mindspore.communication.init() (msrun's workers "
        "can), or pass attempt= (the same on every rank, new for each launch)"]


# ---- 24.1, 24.2: attempts never mix; another attempt starts an unfinished step over -----------


def test_two_jobs_saving_the_same_step_never_mix(saved_layout, tmp_path, monkeypatch):
    layout = saved_layout("dp2_mp2")
    job_a, job_b = _slices(layout), _slices(layout, changed=True)
    monkeypatch.setenv("PMIX_NAMESPACE", "job-A")
    for r in (0, 1):
        _save(layout, tmp_path, job_a, r)
    monkeypatch.setenv("PMIX_NAMESPACE", "job-B")  # another job, other values, the same step
    late = [_save(layout, tmp_path, job_b, r) for r in (2, 3)]
    assert [s.committed for s in late] == [False, False]  # job A's ranks 0-1 do not count for job B
    step = tmp_path / f"step_{STEP}"
    with pytest.raises(IncompleteStoreError, match=rf"step {STEP} at .* is not committed: rank\(s\) 0, 1 of 4 have "
                                                   "not finished saving it"):
        ckptstore.open(step)
    assert sorted(p.name for p in (step / ".ckptstore-work" / "records").iterdir()) == ["2-of-4.json", "3-of-4.json"]
    assert _payload(step) == sum(s.bytes_written for s in late)  # job A's files are gone
    assert [_save(layout, tmp_path, job_b, r).committed for r in (0, 1)] == [False, True]
    assert_store_holds(tmp_path, _expected(layout, changed=True))
    assert ckptstore.verify(tmp_path).ok


def test_a_restarted_job_starts_the_killed_jobs_step_over(saved_layout, tmp_path, monkeypatch):
    from ckptstore.write import save as save_module

    layout = saved_layout("dp2_mp2")
    first, restarted = _slices(layout), _slices(layout, changed=True)
    monkeypatch.setenv("OMPI_MCA_ess_base_jobid", "1")
    for r in (0, 1, 2):
        _save(layout, tmp_path, first, r)

    def killed(*args: Any) -> None:  # rank 3 dies after writing its files, before its done marker
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(save_module, "mark_done", killed)
        with pytest.raises(KeyboardInterrupt):
            _save(layout, tmp_path, first, 3)
    monkeypatch.setenv("OMPI_MCA_ess_base_jobid", "2")  # the restarted job: other values
    assert _save(layout, tmp_path, restarted, 3).committed is False  # not with ranks 0-2's old records
    assert [_save(layout, tmp_path, restarted, r).committed for r in (0, 1, 2)] == [False, False, True]
    assert_store_holds(tmp_path, _expected(layout, changed=True))
    assert ckptstore.verify(tmp_path).ok


def test_ranks_of_one_attempt_complete_the_step_a_rank_of_it_left(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp2")
    values = _slices(layout)
    for r in (0, 1, 2):
        _save(layout, tmp_path, values, r, attempt="run-7")
    assert _save(layout, tmp_path, values, 3, attempt="run-7").committed  # rank 3 rerun alone, same attempt
    assert_store_holds(tmp_path, _expected(layout))


# ---- 24.3: a committed step is immutable; no commit under a rank that runs again --------------


def test_no_rank_commits_while_a_rank_of_the_step_runs_again(saved_layout, tmp_path, monkeypatch):
    from ckptstore.write.save import prepare_save

    layout = saved_layout("dp2_mp2")
    first, restarted = _slices(layout), _slices(layout, changed=True)
    monkeypatch.setenv("OMPI_MCA_ess_base_jobid", "1")
    for r in range(4):  # every rank finished, none committed (all died right then)
        prepare_save(first[r], tmp_path, step=STEP, strategy=layout.strategy_files, rank=r).write(commit=False)
    monkeypatch.setenv("OMPI_MCA_ess_base_jobid", "2")
    job = prepare_save(restarted[0], tmp_path, step=STEP, strategy=layout.strategy_files, rank=0)
    others: list[Any] = []

    def pieces() -> Any:
        for i, piece in enumerate(job.pieces()):
            if i == 0:  # rank 0 has claimed the step and is writing: the other ranks save meanwhile
                others.extend(_save(layout, tmp_path, restarted, r) for r in (1, 2, 3))
            yield piece

    mine = job.write(pieces())
    assert [s.committed for s in others] == [False, False, False] and mine.committed
    report = ckptstore.verify(tmp_path)
    assert report.ok, report.problems
    assert not (tmp_path / f"step_{STEP}" / ".ckptstore-work").exists()
    assert_store_holds(tmp_path, _expected(layout, changed=True))


@pytest.mark.parametrize("attempt", ["run-1", None], ids=["same-attempt", "another-attempt"])
def test_a_rank_saving_a_committed_step_gets_a_typed_error_and_changes_nothing(tmp_path, attempt):
    w = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    for rank in (0, 1):
        local = np.ascontiguousarray(w[:, rank * 3:(rank + 1) * 3])
        ckptstore.save_rank({"w": local}, tmp_path, step=1, strategy=_two_column_ranks(), rank=rank, attempt="run-1")
    before = _tree(tmp_path)
    late = np.full((8, 3), -1, np.float32)
    with pytest.raises(StoreExistsError, match="step 1 is already committed in .*; a committed step is never written "
                                               r"again \(nothing was changed\)"):
        ckptstore.save_rank({"w": late}, tmp_path, step=1, strategy=_two_column_ranks(), rank=1, attempt=attempt)
    assert _tree(tmp_path) == before


# ---- 24.9: parts finishing at once into a bucket -----------------------------------------------


@pytest.mark.slow
def test_a_part_finishing_while_the_other_looks_leaves_the_commit_to_it(saved_layout, bucket, monkeypatch):
    """Part 1 finishes and finds part 0 running; part 0 says it finished right then: part 1 must
    not take part 0 for unfinished a moment later and fail, but leave the commit to part 0."""
    from ckptstore.io.sink import open_sink
    from ckptstore.write import commit as commit_module
    from ckptstore.write import convert as convert_module
    from ckptstore.write.output_folder import complete_manifest
    from ckptstore.write.parts import Part

    layout = saved_layout("dp2_mp2")
    url = bucket.url("parts.zarr")
    part0_may_finish, calls = threading.Event(), []
    real_mark_done = convert_module.mark_done

    def mark_done(sink: Any, part: Part, fingerprint: str, *record: Any) -> None:
        if part.index == 0:
            part0_may_finish.wait(60)
        real_mark_done(sink, part, fingerprint, *record)

    def looking(sink: Any) -> Any:  # part 1 asks whether the store is complete; on its 2nd look part 0 finishes
        if threading.current_thread().name == "part-1":
            calls.append(1)
            if len(calls) == 2:
                real_mark_done(open_sink(url), Part(0, 2), sink.read(".ckptstore-work/fingerprint").decode(), {}, {})
        return complete_manifest(sink)

    monkeypatch.setattr(convert_module, "mark_done", mark_done)
    for module in (convert_module, commit_module):
        monkeypatch.setattr(module, "complete_manifest", looking, raising=False)
    results: dict[int, Any] = {}

    def run(i: int) -> None:
        try:
            results[i] = ckptstore.convert(layout.root, url, strategy=layout.strategy_files, part=f"{i}/2")
        except Exception as e:  # the test reports it
            results[i] = e
        finally:
            if i == 1:
                part0_may_finish.set()

    threads = [threading.Thread(target=run, args=(i,), name=f"part-{i}") for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not isinstance(results[1], Exception), results[1]
    assert (results[1].committed, results[0].committed) == (False, True)
    with ckptstore.open(url) as store:
        assert sorted(store.names()) == sorted(expected_values(layout))


# ---- 24.11: a zero-size parameter is a Zarr array too -----------------------------------------


def test_a_zero_size_parameter_of_a_saved_step_is_an_array_zarr_python_opens(tmp_path):
    zarr = pytest.importorskip("zarr")
    ckptstore.save_rank({"e2d": np.zeros((0, 4), np.float32), "w": np.ones(3, np.float32)}, tmp_path, step=1)
    group = zarr.open_group(str(tmp_path / "step_1"), mode="r")
    assert group["e2d"].shape == (0, 4) and group["e2d"].dtype == np.float32
    assert ckptstore.open(tmp_path).read("e2d").shape == (0, 4)


# ---- 24.15, 25.2, 25.8b: what a half-written store says --------------------------------------


def test_commit_while_a_part_runs_is_refused_naming_it(saved_layout, tmp_path):
    from ckptstore.io.sink import open_sink

    layout = saved_layout("dp2_mp2")
    out = tmp_path / "s.zarr"
    assert not ckptstore.convert(layout.root, out, strategy=layout.strategy_files, part="0/2").committed
    running = open_sink(out).lock("lock.part-1", wait=False)  # part 1 is converting (holds its lock)
    try:
        with pytest.raises(ConversionInProgressError, match=r"part\(s\) 1 of 2 still running \(their lock is held\); "
                                                            "wait for it: the last part to finish commits"):
            ckptstore.commit(out)
    finally:
        running.release()


def test_a_step_killed_mid_save_says_which_ranks_are_missing_and_what_to_run(saved_layout, tmp_path):
    from ckptstore.write.save import prepare_save

    layout = saved_layout("dp2_mp2")
    values = _slices(layout)
    _save(layout, tmp_path, values, 1, attempt="run-3")
    job = prepare_save(values[0], tmp_path, step=STEP, strategy=layout.strategy_files, rank=0, attempt="run-3")

    def killed() -> Any:
        yield from []
        raise KeyboardInterrupt  # rank 0 dies mid-save

    with pytest.raises(KeyboardInterrupt):
        job.write(killed())
    step = tmp_path / f"step_{STEP}"
    said = (rf"step {STEP} at .* is not committed: rank\(s\) 0, 2, 3 of 4 have not finished saving it. "
            "Rerun the job's save")
    info = run_cli("info", step)
    assert info.returncode == 2 and "convert" not in info.stderr, info.stderr
    assert len(info.stderr.splitlines()) == 1 and re.search(said, info.stderr), info.stderr
    commit = run_cli("commit", step)
    assert commit.returncode == 2 and "convert" not in commit.stderr
    assert re.search(said, commit.stderr), commit.stderr


def test_a_store_whose_parts_all_finished_says_to_run_commit(saved_layout, tmp_path, monkeypatch):
    from ckptstore.write import convert as convert_module

    layout = saved_layout("dp2_mp2")
    out = tmp_path / "s.zarr"
    real_mark_done = convert_module.mark_done

    def last_dies(sink: Any, part: Any, fingerprint: str, *record: Any) -> None:  # the last part dies after its marker
        real_mark_done(sink, part, fingerprint, *record)
        raise KeyboardInterrupt

    assert not ckptstore.convert(layout.root, out, strategy=layout.strategy_files, part="0/2").committed
    monkeypatch.setattr(convert_module, "mark_done", last_dies)
    with pytest.raises(KeyboardInterrupt):
        ckptstore.convert(layout.root, out, strategy=layout.strategy_files, part="1/2")
    monkeypatch.undo()
    info = run_cli("info", out)
    assert info.returncode == 2
    assert f"every part of the store at {out} has finished but it was not committed" in info.stderr, info.stderr
    assert f"run 'ckptstore commit {out}'" in info.stderr
    assert run_cli("commit", out).returncode == 0
    assert ckptstore.open(out).names()


# ---- 25.7: the last part's summary counts its share and the store -----------------------------


def test_the_last_parts_summary_says_its_share_and_the_stores_parameters(saved_layout, tmp_path):
    from convert_fixtures import strategy_args

    layout = saved_layout("dp2_mp2")
    out = tmp_path / "s.zarr"
    args = ["convert", str(layout.root), *strategy_args(layout), "--out", str(out)]
    assert run_cli(*args, "--part", "0/2").returncode == 0
    last = run_cli(*args, "--part", "1/2")
    assert last.returncode == 0, last.stderr
    said = re.match(rf"part 1/2, the last to finish: wrote {re.escape(str(out))}: (\d+) of the store's (\d+) "
                    r"parameters \(this part's share\) in \d+ chunks", last.stdout)
    assert said is not None, last.stdout
    mine, total = map(int, said.groups())
    assert total == len(ckptstore.open(out).names()) and 0 < mine < total


def test_msrun_workers_of_a_job_on_several_hosts_or_its_scheduler_have_no_msrun_attempt():
    """A job on several hosts (its scheduler not on loopback) has one msrun per host, so it gives
    none; the workers of one launch share their running msrun's (tests/write/test_attempt_orphans.py)."""
    from ckptstore.write.attempt import msrun_attempt

    worker = {"MS_ROLE": "MS_WORKER", "MS_SCHED_HOST": "127.0.0.1"}
    assert msrun_attempt({**worker, "MS_SCHED_HOST": "10.1.2.3"}) is None
    assert msrun_attempt({"MS_ROLE": "MS_SCHED", "MS_SCHED_HOST": "127.0.0.1"}) is None


def test_a_step_whose_attempt_record_claims_more_ranks_than_a_job_has_is_refused_at_once(tmp_path):
    from ckptstore.limits import MAX_WORLD

    ckptstore.save_rank({"w": np.ones((8, 3), np.float32)}, tmp_path, step=1, strategy=_two_column_ranks(), rank=0)
    step = tmp_path / "step_1"
    (step / ".ckptstore-work" / "attempt.json").write_text(
        json.dumps({"attempt": "x", "parts": MAX_WORLD + 1, "writer": "save_rank"}))  # 10**11 ran out of memory
    with pytest.raises(IncompleteStoreError) as caught:
        ckptstore.open(step)
    assert str(caught.value) == (
        f"the step at {step} is not committed and its attempt record (.ckptstore-work/attempt.json) is unreadable: "
        "rerun the job's save of the step (a new job starts it over); open the folder above it for the newest "
        "committed step")
