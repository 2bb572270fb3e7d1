"""The benchmark suite's smoke test: ``python -m benchmarks run --quick`` produces a well-formed report.

No timing is asserted (this machine is shared and small); only that every scenario wrote its
JSON, that REPORT.md has its tables, and that every contender has a row with numbers or says
why it has none.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repo_paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.mindspore]

SCENARIOS = ("load", "convert", "node", "index")


def test_quick_suite_writes_a_well_formed_report(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "run", "--quick", "--out", str(tmp_path)], cwd=REPO,
                          env={**os.environ, "GLOG_v": "3"}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]

    for scenario in SCENARIOS:
        record = _last_run(tmp_path / "raw" / f"{scenario}.json")
        assert record["params"]["quick"] is True
        declared = [c["name"] for c in record["contenders"]]
        assert declared, f"{scenario}: no contenders"
        section = (tmp_path / f"{scenario}.md").read_text(encoding="utf-8")
        rows = {row[0].strip("`"): row for row in _table_rows(section, "contender")}
        for name in declared:
            assert name in rows, f"{scenario}: contender {name!r} has no row in {scenario}.md"
            if name in record["summary"]:
                assert record["summary"][name]["wall_s"]["n"] >= 1 and rows[name][1] != "0"
            else:  # did not run: the record and the row must say why
                assert record["unavailable"].get(name) or record["failed"].get(name), name
                assert rows[name][2].startswith(("unavailable:", "failed:")), rows[name]

    report = (tmp_path / "REPORT.md").read_text(encoding="utf-8")
    assert report.startswith("# ckptstore benchmarks")
    assert "Command: `python -m benchmarks run --quick" in report
    for heading in ("## Targets (benchmarks/README.md)", "### Load one target rank", "### Convert", "### One node",
                    "### Which target ranks each MindSpore route reaches", "### Index a sparse checkpoint"):
        assert heading in report, heading
    assert "× ckptstore" in report and "× bound" in report  # ratios against ckptstore and the lower bound
    # a smoke test judges no target (issue 25.9): the sentence that says so, no verdict table
    from benchmarks.targets import SMOKE_TEST

    assert f"## Targets (benchmarks/README.md)\n\n{SMOKE_TEST}\n" in report
    assert not _table_rows(report, "target") and "**met**" not in report and "**not met**" not in report
    _check_load_scenario(tmp_path, report)
    _check_index_rows(tmp_path, report)


def _check_load_scenario(out: Path, report: str) -> None:
    """The load scenario: its ckptstore rows, the workers curve, setup times, warm/cold stated."""
    from benchmarks import bench_load

    record = _last_run(out / "raw" / "load.json")
    assert record["cache"] == "warm" and "warm page cache" in report
    summary, checks = record["summary"], record["checks"]
    default = record["params"]["default_workers"]
    curve = [bench_load.workers_name(w) for w in bench_load.WORKERS_CURVE if w != default]
    for name in (bench_load.CKPTSTORE, bench_load.INDEX, bench_load.INTO_NET, bench_load.READ_RANK, bench_load.BOUND,
                 *curve):
        assert name in summary, f"{name} did not run: {record['failed'].get(name)}"
        assert checks[name]["digest"] == checks[bench_load.CKPTSTORE]["digest"], name
    into_net = checks[bench_load.INTO_NET]
    assert into_net["param_not_load"] == 0 and into_net["ckpt_not_load"] == 0 and not into_net["missing_or_misshapen"]
    # the setup (the prebuilt Cell) is outside the measurement, and reported
    assert summary[bench_load.INTO_NET]["setup_s"]["median"] > 0
    assert "setup_s" not in summary[bench_load.CKPTSTORE]
    assert "setup (not timed)" in report
    for name in (n for n in summary if "dcp.load" in n):
        assert summary[name]["setup_s"]["median"] > 0, name
    # the workers curve: load_rank over workers = 1, 2, 4
    curve_rows = _table_rows(report, "workers")
    assert [r[0].split()[0] for r in curve_rows] == [str(w) for w in sorted(bench_load.WORKERS_CURVE)], curve_rows
    assert any("(default)" in r[0] for r in curve_rows)
    assert all(r[1] != "–" for r in curve_rows)
    # where the time goes: the step-by-step row ran and its section is in the report
    assert bench_load.STEPS in summary, record["failed"].get(bench_load.STEPS)
    assert "Where the time goes" in report and "The pool's reads alone (read − planning) take" in report


def _check_index_rows(out: Path, report: str) -> None:
    """The index: loading from one (ratio stated), the convert rows with their store sizes, the sparse scenario."""
    from benchmarks import bench_convert, bench_index, bench_load

    assert "Index vs converted store:" in report and "values identical" in report
    convert = _last_run(out / "raw" / "convert.json")
    sizes = {s["contender"]: s["returned"] for s in convert["samples"] if isinstance(s.get("returned"), dict)}
    for name in (bench_convert.CKPTSTORE, bench_convert.INDEX, bench_convert.INDEX_CRC):
        assert name in convert["summary"], f"{name} did not run: {convert['failed'].get(name)}"
        assert sizes[name]["metadata_bytes"] > 0, name
    for name in (bench_convert.INDEX, bench_convert.INDEX_CRC):  # an index is nothing but its manifest
        assert sizes[name]["output_bytes"] == sizes[name]["metadata_bytes"], name
    assert sizes[bench_convert.INDEX]["output_bytes"] < convert["params"]["rank_file_bytes"] / 100
    assert "store size (output folder" in report and "Index targets (this run)" in report
    index = _last_run(out / "raw" / "index.json")
    p = index["params"]
    assert p["rank_files"] == bench_index.QUICK[1].world and p["allocated_bytes"] < p["rank_file_bytes"] / 100
    assert 0 < p["manifest_bytes"] < p["rank_file_bytes"] / 1000
    for name in (bench_index.INDEX, bench_index.OPEN, bench_index.PLAN):
        assert name in index["summary"], f"{name} did not run: {index['failed'].get(name)}"
    assert bench_load.INDEX in _last_run(out / "raw" / "load.json")["summary"]


def _last_run(path: Path) -> dict:
    runs = json.loads(path.read_text(encoding="utf-8"))["runs"]
    assert runs, f"{path} has no runs"
    return runs[-1]


def _table_rows(report: str, first_cell: str) -> list[list[str]]:
    """Rows (cells) of the Markdown tables whose header starts with ``| first_cell |``."""
    rows: list[list[str]] = []
    inside = False
    for line in report.splitlines():
        if line.startswith(f"| {first_cell} |"):
            inside = True
        elif inside and line.startswith("|---"):
            continue
        elif inside and line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        else:
            inside = False
    return rows
