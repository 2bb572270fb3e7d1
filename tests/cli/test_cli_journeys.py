"""The command line as a new user meets it (issue 19 items 2, 9 and 10): every error one line and
exit 2, Ctrl-C one line and exit 130, msrun's scheduler taking no part in ``--part auto``, and an
index that says what it does and does not hold. Real ``ckptstore`` processes on checkpoints
saved by MindSpore."""
from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import ckptstore
from ckptstore.store.kinds import WORK_DIR
from convert_fixtures import REPO, cli_command, run_cli, store_files, strategy_args

VENV_BIN = Path(sys.executable).parent


# ---------------------------------------------------------------------------------------------
# 1. usage errors: one line, exit 2 (need no checkpoint: test_cli_usage.py)


# ---------------------------------------------------------------------------------------------
# 2. Ctrl-C: one line saying that a rerun resumes, exit 130


def test_ctrl_c_is_one_line_saying_a_rerun_resumes(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    out = tmp_path / "s.zarr"
    (out / WORK_DIR).mkdir(parents=True)
    holder = os.open(out / WORK_DIR / "lock", os.O_CREAT | os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another conversion holds the folder: the command waits, deterministically
    env = {**os.environ, "GLOG_v": "3"}
    proc = subprocess.Popen([*cli_command(), "convert", str(layout.root), *strategy_args(layout), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        waiting = proc.stderr.readline()
        assert "is being written by another process" in waiting, waiting
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        os.close(holder)
    assert proc.returncode == 130
    assert (stdout, stderr) == ("", "ckptstore: interrupted; run the same command again to resume where it "
                                    "stopped\n")
    r = run_cli("convert", layout.root, *strategy_args(layout), "--out", out, "-q")
    assert r.returncode == 0 and r.stdout.startswith(f"wrote {out}: 15 parameters"), r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------
# 3. msrun's scheduler process takes no part in --part auto


def test_the_scheduler_process_takes_no_part(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    out = tmp_path / "s.zarr"
    r = run_cli("convert", layout.root, *strategy_args(layout), "--out", out, "--part", "auto",
                env={"MS_ROLE": "MS_SCHED", "RANK_ID": "0", "RANK_SIZE": "2"})
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == ("ckptstore: this is msrun's scheduler process (MS_ROLE=MS_SCHED), which is no rank of the "
                        "job: it takes no part; the worker processes convert\n")
    assert not out.exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # msrun starts a scheduler and two workers: 7-9 s here
@pytest.mark.mindspore  # msrun is MindSpore's launcher
def test_part_auto_under_msrun_converts_once_and_the_job_succeeds(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    out, logs = tmp_path / "s.zarr", tmp_path / "logs"
    env = {**os.environ, "GLOG_v": "3", "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    for var in ("RANK_ID", "RANK_SIZE", "MS_ROLE"):
        env.pop(var, None)
    # msrun starts `python SCRIPT ARGS` in a scheduler and in each worker process
    script = str(VENV_BIN / "ckptstore") if (VENV_BIN / "ckptstore").exists() else str(REPO / "ckptstore" / "cli.py")
    r = subprocess.run([str(VENV_BIN / "msrun"), "--worker_num=2", "--local_worker_num=2",
                        f"--master_port={_free_port()}", f"--log_dir={logs}", "--join=True", script, "convert",
                        str(layout.root), *strategy_args(layout), "--out", str(out), "--part", "auto", "-q"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    scheduler = (logs / "scheduler.log").read_text()
    assert "it takes no part; the worker processes convert" in scheduler, scheduler
    workers = [(logs / f"worker_{i}.log").read_text() for i in range(2)]
    assert sum("the last to finish: wrote" in w for w in workers) == 1, workers
    ckptstore.convert(layout.root, tmp_path / "one", strategy=layout.strategy_files)
    assert store_files(out) == store_files(tmp_path / "one")


# ---------------------------------------------------------------------------------------------
# 4. an index says what it holds and what there is to check


@pytest.fixture
def index(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    ckptstore.index(layout.root, tmp_path / "idx", strategy=layout.strategy_files)
    return layout, tmp_path / "idx"


def test_info_of_an_index_does_not_claim_to_store_bytes(index):
    layout, idx = index
    r = run_cli("info", idx)
    assert r.returncode == 0, r.stderr
    last = r.stdout.splitlines()[-1]
    assert last.startswith("  tensors: ") and ", none of it stored here: the index refers to " in last, last
    assert "stored:" not in r.stdout and "stored once" not in r.stdout, r.stdout
    r = run_cli("info", idx, "--json")
    import json

    totals = json.loads(r.stdout)["totals"]
    assert totals["stored_bytes"] == 0 and totals["referenced_bytes"] == totals["nbytes"] > 0


def test_verify_of_an_index_without_checksums_says_there_is_nothing_to_check(index):
    _, idx = index
    r = run_cli("verify", idx)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.startswith(f"nothing to check: {idx} is an index made without --checksum, so it holds no "
                               "checksums of its "), r.stdout
    assert "checked" not in r.stdout


def test_verify_of_an_index_against_its_source_gives_no_advice_to_do_so(index):
    layout, idx = index
    r = run_cli("verify", idx, "--against", layout.root, *strategy_args(layout))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK: 15 parameters, ") and "chunks compared with the source; 0 problem(s)" in r.stdout
    assert "--against" not in r.stdout and " checked" not in r.stdout, r.stdout
