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

pytestmark = [pytest.mark.slow, pytest.mark.mindspore]

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = ("load", "convert", "node")


def test_quick_suite_writes_a_well_formed_report(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "run", "--quick", "--out", str(tmp_path)], cwd=REPO,
                          env={**os.environ, "GLOG_v": "3"}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]

    for scenario in SCENARIOS:
        record = _last_run(tmp_path / f"{scenario}.json")
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
    for heading in ("## Targets from DESIGN.md", "### Load one target rank", "### Convert", "### One node",
                    "### Which target ranks each MindSpore route reaches"):
        assert heading in report, heading
    assert "× ckptstore" in report and "× bound" in report  # ratios against ckptstore and the lower bound
    verdicts = _table_rows(report, "target")
    assert len(verdicts) >= 6
    assert all(v[-1] in ("**met**", "**not met**", "not judged") for v in verdicts), verdicts


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
