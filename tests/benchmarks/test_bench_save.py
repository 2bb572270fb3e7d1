"""``benchmarks.bench_save``'s judgement of the issue's targets against PyTorch DCP.

The benchmark itself (8 rank processes per contender) takes minutes; these tests feed its report
a record of runs and check the verdicts it writes. No timing is measured here.
"""
from __future__ import annotations

from typing import Any

from benchmarks.bench_save import report, targets


def _run(stall: float, *, done: float = 5.0, written: int = 1000, staged: int = 0) -> dict[str, Any]:
    return {"stall_max": stall, "stall_median": stall, "done": done, "bytes_written": written,
            "extra_memory": 10, "committed": 1, "staged_peak": staged}


def _record(ckptstore_async: float, dcp_async: float | None) -> dict[str, Any]:
    runs = {"ModelCheckpoint sync": [_run(5.0)] * 3, "ckptstore async": [_run(ckptstore_async, staged=100)] * 3}
    if dcp_async is not None:
        runs["PyTorch DCP async_save"] = [_run(dcp_async, written=1100, staged=500)] * 3
    return {"runs": runs, "model_bytes": 1000, "budget_mb": 1, "index_s": [0.5], "mesh": "8 (dp2×mp4)",
            "size": "1GB", "command": "python -m benchmarks.bench_save", "time": "now", "load_avg": [3.0, 5.0, 4.0],
            "foreign_cpu_cores": 0.7}


def test_async_stall_at_most_dcp_async_save_is_met() -> None:
    assert ("- async stall no more than PyTorch DCP async_save's (2.5 s): 1.25 s = 0.50× — met"
            in targets(_record(1.25, 2.5)))


def test_async_stall_above_dcp_async_save_is_missed() -> None:
    assert "- async stall no more than PyTorch DCP async_save's (1.25 s): 2.5 s = 2.00× — MISSED" in \
        targets(_record(2.5, 1.25))


def test_without_dcp_runs_the_comparison_is_not_measured() -> None:
    assert ("- async stall no more than PyTorch DCP async_save's: not measured in this run"
            in targets(_record(1.0, None)))


def test_report_shows_dcp_host_copies_and_the_machine_load() -> None:
    text = report(_record(1.0, 2.0))
    row = next(line for line in text.splitlines() if line.startswith("| PyTorch DCP async_save |"))
    assert row.endswith("| 1.100 | 10 B | 500 B |")
    assert "1-minute load average before each run median 4.0 (min 3.0, max 5.0;" in text
    assert "kept 0.70 of the 2 cores busy" in text


def _bucket_record(bucket_done: float, raw_done: float | None) -> dict[str, Any]:
    record = _record(1.0, None)
    record["runs"]["ckptstore async"] = [_run(1.0, done=4.0, staged=100)] * 3
    record["runs"]["ckptstore async (SeaweedFS)"] = [_run(1.0, done=bucket_done)] * 3
    if raw_done is not None:
        record["runs"]["raw PUTs (SeaweedFS)"] = [_run(raw_done, done=raw_done)] * 3
    return record


def test_a_bucket_save_within_one_and_a_half_local_saves_is_met() -> None:
    assert ("- committed into the bucket ≤ 1.5× the local save (4 s): 6 s = 1.50× — met"
            in targets(_bucket_record(6.0, None)))


def test_a_slower_bucket_save_is_missed_and_set_against_the_raw_put_bound() -> None:
    assert ("- committed into the bucket ≤ 1.5× the local save (4 s): 10 s = 2.50× — MISSED; the same objects PUT "
            "alone (raw PUTs (SeaweedFS)) took 8 s = 2.00× the local save, so ckptstore's bucket save is 1.25× the "
            "server's bound") in targets(_bucket_record(10.0, 8.0))
