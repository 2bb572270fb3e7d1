"""The save attempt of an msrun worker names its running msrun; a worker whose msrun exited
(reparented to init or a subreaper, shared by the orphans of every launch) has no attempt and
says so, instead of sharing one id with the orphans of another launch. Real processes: a
stand-in ``msrun`` script that starts workers and stays or exits."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptstore.write.attempt import msrun_attempt, parent_pid, process_start_ticks

pytestmark = pytest.mark.slow
WORKER = {"MS_ROLE": "MS_WORKER", "MS_SCHED_HOST": "127.0.0.1"}

#: A stand-in for msrun: starts the worker command given N times, prints the workers' pids, then
#: waits for them ("stay") or exits at once ("exit", orphaning them).
MSRUN = """\
import subprocess, sys
mode, n, cmd = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
workers = [subprocess.Popen(cmd) for _ in range(n)]
print(" ".join(str(w.pid) for w in workers), flush=True)
if mode == "stay":
    sys.stdin.read()
    for w in workers:
        w.kill()
"""


def _launch(tmp_path: Path, mode: str, n: int, *cmd: str) -> tuple[subprocess.Popen, list[int]]:
    script = tmp_path / "msrun"
    script.write_text(MSRUN)
    launcher = subprocess.Popen([sys.executable, str(script), mode, str(n), *cmd], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    workers = [int(p) for p in launcher.stdout.readline().split()]
    return launcher, workers


def _orphaned(pids: list[int], launcher: subprocess.Popen) -> None:
    launcher.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(parent_pid(p) == launcher.pid for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)


def _kill(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, 9)
        except ProcessLookupError:
            pass


def test_workers_of_a_running_msrun_share_an_attempt_naming_it(tmp_path):
    launcher, workers = _launch(tmp_path, "stay", 2, "sleep", "30")
    try:
        want = f"msrun:{os.uname().nodename}:{launcher.pid}:{process_start_ticks(launcher.pid)}"
        assert [msrun_attempt(WORKER, pid=w) for w in workers] == [want, want]
    finally:
        launcher.communicate("", timeout=10)


def test_orphaned_workers_of_two_launches_have_no_attempt(tmp_path):
    """Before, both became msrun:<host>:1:<init's start>, one id for two launches."""
    first, a = _launch(tmp_path, "exit", 1, "sleep", "30")
    second, b = _launch(tmp_path, "exit", 1, "sleep", "30")
    try:
        _orphaned(a, first)
        _orphaned(b, second)
        assert parent_pid(a[0]) != first.pid and parent_pid(b[0]) != second.pid
        assert [msrun_attempt(WORKER, pid=a[0]), msrun_attempt(WORKER, pid=b[0])] == [None, None]
    finally:
        _kill(a + b)


def test_a_worker_whose_parent_is_not_msrun_has_no_msrun_attempt():
    worker = subprocess.Popen(["sleep", "30"])  # its parent runs pytest, not msrun
    try:
        assert msrun_attempt(WORKER, pid=worker.pid) is None
    finally:
        worker.kill()
        worker.wait()


ORPHAN = """\
import logging, os, sys, time
from ckptstore.write.attempt import command_line, is_msrun, save_attempt, say_no_attempt
deadline = time.monotonic() + 20
while is_msrun(command_line(os.getppid())) and time.monotonic() < deadline:  # until the stand-in msrun exits
    time.sleep(0.01)
logging.basicConfig(stream=open(sys.argv[1] + ".log", "w"), format="%(message)s")
shared = save_attempt(None, 2)
if shared is None:
    say_no_attempt("ROOT", 2)
open(sys.argv[1] + ".tmp", "w").write(repr(shared))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
"""


def test_an_orphaned_worker_saves_with_no_attempt_and_logs_it(tmp_path):
    out = tmp_path / "attempt"
    env = {**os.environ, **WORKER, "PYTHONPATH": os.getcwd()}
    script = tmp_path / "msrun"
    script.write_text(MSRUN)
    subprocess.run([sys.executable, str(script), "exit", "1", sys.executable, "-c", ORPHAN, str(out)], env=env,
                   stdout=subprocess.DEVNULL, check=True, timeout=30)
    deadline = time.monotonic() + 30
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert out.read_text() == "None"
    log = (tmp_path / "attempt.log").read_text()
    assert log.startswith("ckptstore: ROOT: this job of 2 ranks has no save attempt id"), log
