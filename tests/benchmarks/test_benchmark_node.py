"""``bench_node --sparse``: one node's loaders at once on a sparse index (issue 33, the node proof),
run small: the ``quick`` sparse PanGu checkpoint on 4 ranks (dp2×mp2), ranks 0-1 of a dp1×mp4 target."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from repo_paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.mindspore]  # the sparse writer is checked against MindSpore first

SMALL = ["--sparse", "quick", "--src-world", "2x2", "--dst-world", "1x4", "--ranks", "0-1", "--reps", "1"]


def _run(out: Path, *extra: str) -> tuple[dict[str, Any], str]:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_node", *SMALL, "--results-dir", str(out), *extra],
                          cwd=REPO, env={**os.environ, "GLOG_v": "3"}, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    record = json.loads((out / "raw" / "node-sparse.json").read_text(encoding="utf-8"))["runs"][-1]
    return record, (out / "node-sparse.md").read_text(encoding="utf-8")


def test_each_loader_holds_and_fetches_exactly_what_its_plan_announced(tmp_path: Path) -> None:
    record, report = _run(tmp_path)
    plans, (sample,) = record["plans"], record["samples"]
    for rank, worker in zip(record["params"]["ranks"], sample["workers"], strict=True):
        assert worker["check"]["bytes"] == plans[f"result_bytes_{rank}"]
        assert worker["check"]["tensors"] == plans[f"params_{rank}"]
        assert worker["check"]["dtypes"] == "float16"
        assert (worker["check"]["requests"], worker["check"]["bytes_fetched"]) == (plans[f"requests_{rank}"],
                                                                                   plans[f"fetched_bytes_{rank}"])
    assert sample["sum_held"] == sum(record["slices"])
    assert "| … ÷ Σ slices (target ≤ 1.05×) |" in report and "mindspore.load_distributed_checkpoint" in report


def test_a_node_whose_slices_would_not_fit_is_refused_before_any_loader_starts(tmp_path: Path) -> None:
    record, report = _run(tmp_path, "--keep-free-gib", "100000")
    assert record["samples"] == [] and record["refused"].startswith("not run: the 2 slices need about")
    assert f"**{record['refused']}**" in report


def test_the_node_loads_from_seaweedfs_the_values_it_loads_locally(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_node", "--size", "8MB", "--src-world", "4",
                           "--dst-world", "1x2", "--reps", "1", "--routes", "ckptstore", "--s3-latency-ms", "0,20",
                           "--results-dir", str(tmp_path)], cwd=REPO, env={**os.environ, "GLOG_v": "3"},
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    record = json.loads((tmp_path / "raw" / "node.json").read_text(encoding="utf-8"))["runs"][-1]
    s3 = ["ckptstore.load_rank, s3:// at 0 ms", "ckptstore.load_rank, s3:// at 20 ms"]
    assert sorted(record["summary"]) == ["ckptstore.load_rank", *s3]
    for name in s3:
        assert record["checks"][name]["same_as_ckptstore"] == record["checks"][name]["ranks"] == 2


def test_the_cooperative_route_reads_each_byte_once_and_loads_the_solo_values(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_node", "--cooperative", "replicas", "--size", "8MB",
                           "--coop-workers", "2", "--latency-ms", "0", "--results-dir", str(tmp_path)], cwd=REPO,
                          env={**os.environ, "GLOG_v": "3"}, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    record = json.loads((tmp_path / "raw" / "node-coop.json").read_text(encoding="utf-8"))["runs"][-1]
    solo, coop, distinct = record["modes"]["solo"], record["modes"]["replicas"], record["params"]["distinct_bytes"]
    assert (solo["bytes_fetched"], coop["bytes_fetched"]) == (2 * distinct, distinct)
    assert len({r["sha256"] for r in solo["ranks"] + coop["ranks"]}) == 1 and len(coop["ranks"]) == 2
    planned = {r["rank"]: (r["fetched_bytes"], r["requests"]) for r in record["planned"]["per_rank"]}
    assert {r["rank"]: (r["bytes_fetched"], r["requests"]) for r in coop["ranks"]} == planned
    assert "| replicas |" in (tmp_path / "node-coop.md").read_text(encoding="utf-8")
