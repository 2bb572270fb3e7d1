"""The benchmark harness's measuring worker, without MindSpore (``make test-pure``): a contender's
setup runs before the measured window opens. The whole suite's smoke test is
test_benchmarks_quick.py (slow)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

# The benchmark worker imports this module by its dotted name, where tests/ is not on sys.path.
REPO = Path(__file__).resolve().parents[2]


def setup_sleep(delay: float) -> dict:
    """Test contender (run by the worker): an untimed setup that takes ``delay`` seconds."""
    time.sleep(delay)
    return {"done_ns": time.monotonic_ns()}  # CLOCK_MONOTONIC, the clock of the worker's start_ns


def measured_after_setup(state: dict) -> dict:
    return {"state_keys": len(state), "setup_done_ns": state["done_ns"]}


def check_after_setup(out: dict, **args: object) -> dict:
    return {"got": out["state_keys"], "delay": args["delay"]}


def test_worker_setup_is_outside_the_measurement() -> None:
    from benchmarks.harness import Contender, run_contender

    c = Contender("setup test", "tests.benchmarks.test_benchmark_harness", "measured_after_setup", {"delay": 0.3},
                  setup="setup_sleep", check="check_after_setup")
    m = run_contender(c, timeout=120)
    # the measured window opens after the setup has finished (clock order, not a time limit:
    # the machine is shared, so no duration is asserted except the sleeps' lower bounds)
    assert m["start_ns"] >= m["returned"]["setup_done_ns"], m
    assert m["setup_s"] >= 0.3, m
    assert m["check"] == {"got": 1, "delay": 0.3} and m["returned"]["state_keys"] == 1
    plain = run_contender(Contender("no setup", "tests.benchmarks.test_benchmark_harness", "setup_sleep",
                                    {"delay": 0.2}),
                          timeout=120)
    assert plain["wall_s"] >= 0.2 and "setup_s" not in plain



def test_a_result_replaces_the_earlier_one_of_its_scenario_and_keeps_the_others(tmp_path):
    from benchmarks.harness import append_result, load_results

    one_gb, three_gb = {"name": "load", "params": {"size": "1GB"}}, {"name": "load", "params": {"size": "3GB"}}
    append_result("load", {**one_gb, "run": 1}, tmp_path)
    append_result("load", {**three_gb, "run": 2}, tmp_path)
    append_result("load", {**one_gb, "run": 3}, tmp_path)
    assert [r["run"] for r in load_results(tmp_path / "raw" / "load.json")] == [2, 3]


def test_records_go_to_the_raw_folder_beside_the_summaries(tmp_path):
    from benchmarks.harness import append_result, raw_path

    append_result("node", {"name": "node", "params": {}}, tmp_path)
    assert raw_path(tmp_path, "node.json") == tmp_path / "raw" / "node.json"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["raw", "raw/node.json"]


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)


def test_git_ignores_raw_records_and_plots_and_holds_none():
    if _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout")
    ignored = _git("check-ignore", "--no-index", "benchmarks/results/raw/load.json",
                   "benchmarks/results/scaling/raw/scaling_load_size.png", "benchmarks/results/load.json").stdout
    assert ignored.split() == ["benchmarks/results/raw/load.json",
                               "benchmarks/results/scaling/raw/scaling_load_size.png",
                               "benchmarks/results/load.json"]
    assert _git("check-ignore", "--no-index", "benchmarks/results/load.md").returncode == 1  # the summaries stay
    tracked = _git("ls-files", "benchmarks/results").stdout.split()
    assert tracked and [f for f in tracked if f.endswith((".json", ".png"))] == []


def test_memory_guard_kills_the_workers_when_memory_runs_low():
    from benchmarks.harness import MemoryGuard

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    guard = MemoryGuard([proc.pid], floor=1 << 62)  # more than any machine has: fires at once
    guard.start()
    assert proc.wait(timeout=10) == -9
    guard.stop()
    assert guard.tripped > 0
