"""Cooperative load under msrun (issue 33, Build item 4): each slice held by 4 ranks, read once from storage.

``python -m benchmarks.bench_node --cooperative replicas --size 0.5GB --coop-workers 4 --latency-ms 20``

UNTESTED: ``ckptstore.load_rank(..., cooperative=GROUP)`` is being built on another branch; this
route is prepared so that it runs as soon as that lands, and it fails with the library's
``TypeError`` until then.

The synthetic PanGu checkpoint of :mod:`benchmarks.synth` is converted into a bucket of SeaweedFS
(``ckptstore.testing.s3_server``), reached through ``ckptstore.testing.latency_proxy`` at
``--latency-ms`` per request. The target is dp``N`` × mp1 on ``N = --coop-workers`` ranks: every
rank holds every weight whole, so each slice is held ``N`` times. The same worker script (a file, as
msrun needs) runs under ``msrun --worker_num=N --join=True`` twice: each rank alone
(``load_rank(url, target, rank).materialize()``) and cooperatively (``cooperative=GROUP``). Each
worker records its wall time and ``ckptstore.io_counts()`` (what it fetched from storage, not
what it received from the others). Reported per mode: Σ bytes and requests from storage against
the distinct bytes (one rank's slice: the target ≤ 1.01×), and the slowest rank's wall time.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO_ROOT, BenchmarkError, append_result, environment
from benchmarks.report import format_bytes

NAME = "node-coop"
BUCKET = "coop"

WORKER = '''
import json, sys, time
from mindspore.communication import get_rank, init

init()
import ckptstore

store, strategy, mode, out = sys.argv[1:5]
rank = get_rank()
options = {} if mode == "solo" else {"cooperative": mode}
before = ckptstore.io_counts()
t0 = time.perf_counter()
params = ckptstore.load_rank(store, strategy, rank, **options).materialize()
wall = time.perf_counter() - t0
io = ckptstore.io_counts() - before
held = sum(p.asnumpy().nbytes for p in params.values() if not isinstance(p, str))
with open(f"{out}/rank{rank}.json", "w", encoding="utf-8") as f:
    json.dump({"rank": rank, "wall_s": wall, "held": held, "requests": io.requests, "gets": io.gets,
               "bytes_fetched": io.bytes_fetched}, f)
'''


def msrun(script: Path, args: list[str], workers: int, logs: Path, env: Mapping[str, str]) -> int:
    """``msrun --worker_num=N --local_worker_num=N --join=True script args`` (venv first on PATH, a free port)."""
    from ckptstore.testing.s3_server import free_port

    bin_dir = Path(sys.executable).parent
    full = {**os.environ, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO_ROOT),
            "GLOG_v": "3"}
    for var in ("RANK_ID", "RANK_SIZE", "MS_ROLE"):
        full.pop(var, None)
    cmd = [str(bin_dir / "msrun"), f"--worker_num={workers}", f"--local_worker_num={workers}",
           f"--master_port={free_port()}", f"--log_dir={logs}", "--join=True", str(script), *args]
    return subprocess.run(cmd, env=full, cwd=script.parent, timeout=3600, check=False,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode


def run(size: int, group: str, *, workers: int, latency_ms: float, command: str, results_dir: Path | None,
        log: Callable[[str], None]) -> dict[str, Any]:
    """Convert into SeaweedFS, then the solo and the cooperative rounds under msrun; returns the record."""
    import ckptstore
    from benchmarks.bench_load import target_files
    from benchmarks.bench_s3 import environ
    from benchmarks.synth import Mesh, source_mesh, synth
    from ckptstore.testing.latency_proxy import LatencyProxy
    from ckptstore.testing.s3_server import SeaweedServer, env_for

    s = synth(size, source_mesh(8), 0)
    dst = Mesh(workers, 1)
    strategy, _, _ = target_files(s, dst, 0)
    server = SeaweedServer()
    modes: dict[str, Any] = {}
    try:
        server.create_bucket(BUCKET)
        url = f"s3://{BUCKET}/store"
        with environ(env_for(server.url)):
            ckptstore.convert(s.ckpt_dir, url, strategy=[s.strategy])
            distinct = ckptstore.plan_rank(url, strategy, 0).nbytes
        with LatencyProxy(server.port, delay_ms=latency_ms) as proxy, tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "coop_worker.py"
            script.write_text(WORKER, encoding="utf-8")
            for mode in ("solo",) if group == "solo" else ("solo", group):
                out = Path(tmp) / mode
                out.mkdir()
                t0 = time.perf_counter()
                code = msrun(script, [url, str(strategy), mode, str(out)], workers, out / "logs",
                             env_for(proxy.url))
                ranks = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(out.glob("rank*.json"))]
                modes[mode] = {"exit": code, "launch_s": time.perf_counter() - t0, "ranks": ranks,
                               "bytes_fetched": sum(r["bytes_fetched"] for r in ranks),
                               "requests": sum(r["requests"] for r in ranks),
                               "wall_s": max((r["wall_s"] for r in ranks), default=None)}
                log(f"  {mode}: exit {code}, {len(ranks)} ranks reported, "
                    f"{format_bytes(modes[mode]['bytes_fetched'])} from storage")
    finally:
        server.stop()
    record = {"name": NAME, "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "command": command,
              "environment": environment(), "params": {**s.describe(), "group": group, "workers": workers,
                                                       "latency_ms": latency_ms, "distinct_bytes": distinct},
              "modes": modes, "untested": True}
    if results_dir is not None:
        append_result(NAME, record, results_dir)
    if any(m["exit"] != 0 for m in modes.values()):
        raise BenchmarkError(f"a mode failed under msrun: { {k: m['exit'] for k, m in modes.items()} }")
    return record


def render(record: Mapping[str, Any]) -> str:
    """The Markdown summary: bytes and requests from storage per mode, against the distinct bytes."""
    p = record["params"]
    title = f"## Cooperative load: {p['workers']} msrun workers, dp{p['workers']}, SeaweedFS at {p['latency_ms']:g} ms"
    lines = [title, "", f"Command: `{record['command']}` ({record['date']})", "",
             "| mode | from storage | ÷ distinct bytes (target ≤ 1.01×) | requests | slowest rank |",
             "|---|---|---|---|---|"]
    for mode, m in record["modes"].items():
        ratio = m["bytes_fetched"] / p["distinct_bytes"] if p["distinct_bytes"] else float("nan")
        wall = f"{m['wall_s']:.2f} s" if m["wall_s"] is not None else "–"
        lines.append(f"| {mode} | {format_bytes(m['bytes_fetched'])} | {ratio:.3f}× | {m['requests']:,} | {wall} |")
    return "\n".join(lines) + "\n"
