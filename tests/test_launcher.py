"""One place says this process's rank and the job's size (issue 24.13, issue 25 "where you touch it").

Loads (``rank=None``), ``convert --part auto`` and saves all ask :func:`ckptstore.launcher.job`:
MindSpore's communication when initialised, else the launcher's variables, and variables of two
launchers that disagree are refused, naming both (an msrun job under mpirun, a stale export).
"""
from __future__ import annotations

import numpy as np
import pytest

import ckptstore
from ckptstore.errors import InvalidOptionError
from ckptstore.launcher import Job, job
from ckptstore.write.parts import Part, parse_part

LAUNCHER_VARIABLES = ("RANK_ID", "RANK_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "MS_ROLE")
DISAGREE = {"RANK_ID": "0", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
SAYS_BOTH = r"disagree about this process's rank: RANK_ID=0 \(msrun\) but OMPI_COMM_WORLD_RANK=1 \(mpirun\)"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in LAUNCHER_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.mark.parametrize("variables,want", [
    ({}, Job(None, None, "")),
    ({"RANK_ID": "3", "RANK_SIZE": "4"}, Job(3, 4, "RANK_ID/RANK_SIZE")),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
     Job(1, 2, "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE")),
    ({"RANK_ID": "1", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},  # RANK_ID exported from mpirun's
     Job(1, 2, "RANK_ID/OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE")),
], ids=["nothing", "msrun", "mpirun", "agreeing"])
def test_the_job_is_what_the_launchers_variables_say_together(variables, want):
    assert job(variables) == want


@pytest.mark.parametrize("variables,message", [
    (DISAGREE, SAYS_BOTH),
    ({"RANK_ID": "1", "RANK_SIZE": "2", "OMPI_COMM_WORLD_SIZE": "4"},
     r"disagree about this process's job size: RANK_SIZE=2 \(msrun\) but OMPI_COMM_WORLD_SIZE=4 \(mpirun\)"),
    ({"RANK_ID": "2", "RANK_SIZE": "2"}, r"RANK_ID=2 is no rank of a job of RANK_SIZE=2 ranks"),
    ({"RANK_SIZE": "0"}, r"RANK_SIZE='0' in the environment is not a job size"),
], ids=["ranks", "sizes", "rank-outside", "size-0"])
def test_launcher_variables_that_cannot_all_be_true_are_refused(variables, message):
    with pytest.raises(InvalidOptionError, match=message):
        job(variables)


def test_part_auto_refuses_launchers_that_disagree_naming_both():
    with pytest.raises(InvalidOptionError, match=SAYS_BOTH):
        parse_part("auto", DISAGREE)
    assert parse_part("auto", {"RANK_ID": "1", "OMPI_COMM_WORLD_SIZE": "2"}) == Part(1, 2)


def test_a_save_refuses_launchers_that_disagree_naming_both(env, tmp_path):
    for var, value in DISAGREE.items():
        env.setenv(var, value)
    with pytest.raises(InvalidOptionError, match=SAYS_BOTH):
        ckptstore.save_rank({"w": np.ones(2, np.float32)}, tmp_path, step=1)
    assert not (tmp_path / "step_1").exists()


def test_a_save_takes_the_job_size_from_the_launcher_that_names_the_rank(env, tmp_path):
    env.setenv("OMPI_COMM_WORLD_RANK", "1")
    env.setenv("OMPI_COMM_WORLD_SIZE", "2")
    summary = ckptstore.save_rank({"w": np.ones(2, np.float32)}, tmp_path, step=1)
    assert (summary.rank, summary.world, summary.committed) == (1, 2, False)


def test_a_load_refuses_launchers_that_disagree_naming_both(env, load_env):
    t = load_env.target("dp2_mp4->dp2_mp2")
    for var, value in DISAGREE.items():
        env.setenv(var, value)
    with pytest.raises(InvalidOptionError, match=SAYS_BOTH):
        ckptstore.read_rank(t.store_path, t.strategy)


def test_a_save_in_msruns_scheduler_saves_nothing_and_says_so_in_one_log_line(env, tmp_path, caplog):
    env.setenv("MS_ROLE", "MS_SCHED")
    env.setenv("RANK_ID", "0")
    env.setenv("RANK_SIZE", "2")
    with caplog.at_level("INFO", logger="ckptstore"):
        summary = ckptstore.save_rank({"w": np.ones(2, np.float32)}, tmp_path, step=3, rank=0)
    assert (summary.rank, summary.committed, summary.bytes_written) == (-1, False, 0)
    assert [r.getMessage() for r in caplog.records] == [
        f"ckptstore: not saving {tmp_path / 'step_3'} in msrun's scheduler process (MS_ROLE=MS_SCHED), which is no "
        "rank of the job; the worker processes save it"]
    assert list(tmp_path.iterdir()) == []
