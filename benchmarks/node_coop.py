"""Cooperative load under msrun (issue 33, Build item 4): each slice held by 4 ranks, read once from storage.

``python -m benchmarks.bench_node --cooperative replicas --size 0.5GB --coop-workers 4 --latency-ms 20``

The synthetic PanGu checkpoint of :mod:`benchmarks.synth` is converted into a bucket of SeaweedFS
(``ckptstore.testing.s3_server``), reached through ``ckptstore.testing.latency_proxy`` at
``--latency-ms`` per request. The target is dp``N`` × mp1 on ``N = --coop-workers`` ranks: every
rank holds every weight whole, so each slice is held ``N`` times. The same worker script (a file, as
msrun needs) runs under ``msrun --worker_num=N --join=True`` twice: each rank alone
(``load_rank(url, target, rank).materialize()``) and cooperatively (``cooperative=GROUP``). Each
worker records its wall time, ``ckptstore.io_counts()`` (what it fetched from storage, not what it
received from the others) and a SHA-256 of its values (solo and cooperative must agree, bit for
bit). After the cooperative load, each worker also times broadcasts of 32 MiB from every rank of
the group over the same collectives (``MindSporeExchange``): the rate at which this machine's
collectives move bytes, which the model below needs.

Reported per mode: Σ bytes and requests from storage against the distinct bytes (one rank's slice:
the target ≤ 1.01×), against what ``ckptstore.plan_cooperative`` announced, and the slowest rank's
wall time. MindSpore's CPU collectives (mccl) move tens of MiB/s, so the cooperative wall time here
is the exchange's; the model prices each rank's cooperative load as its share of the solo storage
time (``fetched ÷ needed × solo wall``) plus what it receives at a collective rate, at the measured
rate and at the rate that breaks even with reading alone.
"""
from __future__ import annotations

import json
import os
import statistics
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
import hashlib, json, sys, time
import numpy as np
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
digest, held = hashlib.sha256(), 0
for name in sorted(params):
    p = params[name]
    if not isinstance(p, str):
        a = p.asnumpy()
        held += a.nbytes
        digest.update(name.encode() + b"\\0" + np.ascontiguousarray(a).tobytes())
record = {"rank": rank, "wall_s": wall, "held": held, "requests": io.requests, "gets": io.gets,
          "bytes_fetched": io.bytes_fetched, "sha256": digest.hexdigest()}
if mode != "solo":  # the collectives' rate on this machine: a broadcast of 32 MiB from every rank
    from ckptstore.mindspore.exchange import MindSporeExchange
    from mindspore.communication import get_group_size

    ex = MindSporeExchange(range(get_group_size()))
    buf = np.zeros(32 << 20, dtype=np.uint8)
    ex.broadcast(buf, ex.ranks[0], ex.ranks)  # warm-up: the group and its buffers
    t0 = time.perf_counter()
    for root in ex.ranks:
        ex.broadcast(buf, root, ex.ranks)
    record["bcast_s"] = time.perf_counter() - t0
    record["bcast_received"] = (len(ex.ranks) - 1) * buf.nbytes
    ex.close()
with open(f"{out}/rank{rank}.json", "w", encoding="utf-8") as f:
    json.dump(record, f)
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
            planned = ckptstore.plan_cooperative(url, strategy, 0, cooperative=group).to_json() \
                if group != "solo" else None
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
                if code != 0:  # the workers' last words, before the temporary folder goes
                    for f in sorted((out / "logs").glob("*.log")):
                        tail = f.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-6:]
                        log(f"  {mode} {f.name}: " + " | ".join(tail)[-1500:])
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
              "modes": modes, "planned": planned}
    if results_dir is not None:
        append_result(NAME, record, results_dir)
    if any(m["exit"] != 0 or len(m["ranks"]) != workers for m in modes.values()):
        raise BenchmarkError(f"a mode failed under msrun: { {k: m['exit'] for k, m in modes.items()} }")
    digests = {m: sorted({r["sha256"] for r in v["ranks"]}) for m, v in modes.items()}
    if len({d for ds in digests.values() for d in ds}) != 1:
        raise BenchmarkError(f"the ranks' values differ between modes or ranks: {digests}")
    return record


def model(record: Mapping[str, Any]) -> dict[str, Any]:
    """Each rank's cooperative wall time modelled from the measured solo one: its share of the solo
    storage time (``bytes_fetched ÷ held``; requests shrink in the same ratio) plus the bytes it
    received (``held - bytes_fetched``: every rank holds the whole model) at a collective rate. Returns
    the measured rate, the modelled slowest rank at that rate, and the rate that breaks even."""
    solo = {r["rank"]: r for r in record["modes"]["solo"]["ranks"]}
    coop = next(m for k, m in record["modes"].items() if k != "solo")["ranks"]
    rate = statistics.median(r["bcast_received"] / r["bcast_s"] for r in coop)
    rows, even = [], []
    for r in coop:
        t_solo, share = solo[r["rank"]]["wall_s"], r["bytes_fetched"] / r["held"]
        received = r["held"] - r["bytes_fetched"]
        rows.append(t_solo * share + received / rate)
        saved = t_solo * (1 - share)
        even.append(received / saved if saved > 0 else float("inf"))
    return {"rate": rate, "modelled_s": max(rows), "breakeven_rate": max(even),
            "solo_s": max(r["wall_s"] for r in solo.values())}


def render(record: Mapping[str, Any]) -> str:
    """The Markdown summary: bytes and requests from storage per mode, against the distinct bytes and the plan."""
    p = record["params"]
    title = f"## Cooperative load: {p['workers']} msrun workers, dp{p['workers']}, SeaweedFS at {p['latency_ms']:g} ms"
    lines = [title, "", f"Command: `{record['command']}` ({record['date']})", "",
             f"Checkpoint: {format_bytes(p['distinct_bytes'])} of weights and moments per rank (every rank holds the "
             f"whole model: dp{p['workers']}×mp1), converted into SeaweedFS; group `{p['group']}`.", "",
             "| mode | from storage | ÷ distinct bytes (target ≤ 1.01×) | requests (GET) | slowest rank, measured "
             "| values (SHA-256, all ranks) |",
             "|---|---|---|---|---|---|"]
    for mode, m in record["modes"].items():
        ratio = m["bytes_fetched"] / p["distinct_bytes"] if p["distinct_bytes"] else float("nan")
        wall = f"{m['wall_s']:.2f} s" if m["wall_s"] is not None else "–"
        same = {r["sha256"][:12] for r in m["ranks"]}
        lines.append(f"| {mode} | {format_bytes(m['bytes_fetched'])} | {ratio:.3f}× | {m['requests']:,} "
                     f"({sum(r['gets'] for r in m['ranks']):,}) | {wall} | {', '.join(sorted(same))} |")
    planned = record.get("planned")
    if planned:
        per = "; ".join(f"rank {r['rank']}: {format_bytes(r['fetched_bytes'])} in {r['requests']:,} requests, "
                        f"receives {format_bytes(r['received_bytes'])}" for r in planned["per_rank"])
        alone = format_bytes(planned["independent_bytes"])
        lines += ["", f"Planned (`plan_cooperative`, metadata only): {format_bytes(planned['fetched_bytes'])}"
                  f" from storage in {planned['requests']:,} requests against {alone} in "
                  f"{planned['independent_requests']:,} alone; {per}."]
        measured = next(m for k, m in record["modes"].items() if k != "solo")
        for r in measured["ranks"]:
            want = next(x for x in planned["per_rank"] if x["rank"] == r["rank"])
            if (r["bytes_fetched"], r["requests"]) != (want["fetched_bytes"], want["requests"]):
                lines.append(f"- rank {r['rank']} fetched {r['bytes_fetched']:,} bytes in {r['requests']:,} requests, "
                             f"planned {want['fetched_bytes']:,} in {want['requests']:,}")
    if "bcast_s" in next((r for m in record["modes"].values() for r in m["ranks"] if "bcast_s" in r), {}):
        md = model(record)
        lines += ["", "Wall time by the model (each rank: its share of the solo storage time + what it receives "
                  "at a collective rate; `node_coop.model`):", "",
                  "| collective rate | slowest rank, cooperative | solo, measured |", "|---|---|---|",
                  f"| measured here (mccl on CPU, 32 MiB broadcasts): {format_bytes(md['rate'])}/s "
                  f"| {md['modelled_s']:.2f} s | {md['solo_s']:.2f} s |",
                  f"| break-even: {format_bytes(md['breakeven_rate'])}/s | {md['solo_s']:.2f} s "
                  f"| {md['solo_s']:.2f} s |"]
    return "\n".join(lines) + "\n"
