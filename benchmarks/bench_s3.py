"""Benchmark: load one target rank from an S3 server vs from the same store on local disk.

``python -m benchmarks.bench_s3 --size 1GB --src-world 8 --dst-world 4 --rank 0 --reps 3``

The synthetic PanGu-Alpha checkpoint of :mod:`benchmarks.synth` is converted once to a local
Zarr store (cached, the one ``bench_load`` reads), a real S3 server (``moto`` in server mode,
:mod:`ckptstore.testing.s3_server`) is started on loopback and the store is copied to
``s3://<bucket>/store``. Two contenders, each in a fresh worker process, do the same work:
``ckptstore.load_rank(store, strategy, rank).materialize()`` (every Parameter of the rank built;
:func:`benchmarks.contenders.ckptstore_load_rank`), each with ckptstore's default ``workers``
for its kind of store:

* ``local store``: the store's folder, page cache warm (every file read once first);
* ``s3://``: the bucket copy, the client pointed straight at the server (``AWS_ENDPOINT_URL``
  and the rest of the standard ``AWS_*`` variables, no proxy in between).

Both workers get the same environment and import the same modules (MindSpore, ckptstore, its
S3 client) before the measurement, so each is timed from "nothing opened" to "every
Parameter built"; opening the store (its manifest: two GETs on S3) is inside the timed call for
both. After the measurement the worker digests the values (both routes must give the same
tensors) and reads the process's own S3 request counters
(:data:`ckptstore.io.s3.REQUEST_STATS`), so requests and bytes are that run's alone.

Reported against the read plan (worked out here from the local store, no I/O): time S3/local,
peak RSS over the slice size, bytes transferred / bytes wanted (target <= 1.02) and requests vs
2 + the coalesced ranges of the plan (target <=; also against the count expected once
ckptstore's S3 reader cuts runs longer than ``ckptstore.io.s3.GET_PIECE`` into pieces fetched by
different threads). The server shares this machine's cores: its
CPU time per load is reported too (moto reads and copies a whole object for every ranged GET,
so the S3 time here is the test server's as much as ckptstore's).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from benchmarks.harness import RESULTS_DIR, Contender, command_line, run_benchmark, run_and_publish
from benchmarks.report import Column, format_bytes, format_seconds, markdown_table

NAME = "s3"
LOCAL = "ckptstore.load_rank, local store"
S3 = "ckptstore.load_rank, s3:// (moto on loopback)"
LABELS = {LOCAL: "local"}
BUCKET = "ckptstore-bench"
PREFIX = "store"
#: Imported by both workers before the measurement (MindSpore, ckptstore and its S3 client).
PREIMPORT = ("mindspore", "ckptstore", "ckptstore.mindspore", "ckptstore.io.s3", "obstore",
             "obstore.store")
BYTES_TARGET = 1.02  # bytes transferred / bytes wanted
PEAK_TARGET = 1.05  # peak RSS above start / bytes wanted, loading from S3
QUICK_SIZE = "8MB"
MODULE = "benchmarks.bench_s3"


# ---------------------------------------------------------------------------------------------
# run inside the worker


def load_rank(store: str, strategy: str, rank: int, names_file: str) -> dict[str, Any]:
    """The measured call: :func:`benchmarks.contenders.ckptstore_load_rank` (default workers)."""
    from benchmarks.contenders import ckptstore_load_rank

    return ckptstore_load_rank(store, strategy, rank, names_file)


def check(result: Mapping[str, Any], **args: Any) -> dict[str, Any]:
    """After the measurement: the values' digest and this process's S3 request counters."""
    from benchmarks.contenders import check_params
    from ckptstore.io.s3 import REQUEST_STATS as rs

    out = check_params(result, **args)
    out.update(gets=rs.gets, heads=rs.heads, lists=rs.lists, bytes_in=rs.bytes_in)
    return out


# ---------------------------------------------------------------------------------------------
# set-up, in the parent


@dataclass(frozen=True)
class S3Setup:
    """The local store, the target, and what the rank's read plan says must be fetched."""

    synth: Any  # benchmarks.synth.Synth
    dst: Any  # benchmarks.synth.Mesh
    rank: int
    dst_strategy: str
    store: str
    names_file: str
    wanted: int  # bytes of the rank's read plan
    runs: int  # maximal runs of touching byte ranges per file: one ranged GET each at best
    unit_gets: int  # the same runs cut into the reader's units (a long run is fetched by several threads)
    manifest_bytes: int  # the root zarr.json, read whole when the store is opened

    def params(self) -> dict[str, Any]:
        return {**self.synth.describe(), "dst": {"dp": self.dst.dp, "mp": self.dst.mp}, "dst_world": self.dst.world,
                "rank": self.rank, "rank_nbytes": self.wanted, "coalesced_ranges": self.runs,
                "unit_gets": self.unit_gets, "unit_bytes": unit_bytes(),
                "manifest_bytes": self.manifest_bytes, "store": self.store, "dst_strategy": self.dst_strategy,
                "store_bytes": _tree_bytes(self.store)}


def coalesced_runs(ranges: Iterable[tuple[str, str, int, int, Any]]) -> list[int]:
    """Lengths of the maximal runs of touching (or overlapping) byte ranges per file in ``plan.ranges()``."""
    by_file: dict[str, list[tuple[int, int]]] = {}
    for _, key, off, n, _ in ranges:
        by_file.setdefault(key, []).append((off, off + n))
    runs: list[int] = []
    for spans in by_file.values():
        lo = hi = None
        for a, b in sorted(spans):
            if hi is None or a > hi:
                if hi is not None:
                    runs.append(hi - lo)
                lo, hi = a, b
            else:
                hi = max(hi, b)
        if hi is not None:
            runs.append(hi - lo)
    return runs


def unit_bytes() -> int:
    """The largest piece ckptstore's S3 reader fetches with one GET (``ckptstore.io.s3.GET_PIECE``)."""
    from ckptstore.io import s3

    return int(s3.GET_PIECE)


def make_setup(s: Any, dst: Any, rank: int) -> S3Setup:
    """The cached store, target strategy and names file (shared with bench_load) and the plan's numbers."""
    import ckptstore
    from benchmarks.bench_load import target_files

    strategy, store, names = target_files(s, dst, rank)
    plan = ckptstore.load_rank(store, strategy, rank).plan
    runs, unit = coalesced_runs(plan.ranges()), unit_bytes()
    manifest = Path(store) / "zarr.json"
    return S3Setup(s, dst, rank, strategy, store, str(names), int(plan.nbytes), len(runs),
                   sum(-(-r // unit) for r in runs), manifest.stat().st_size if manifest.exists() else 0)


@contextlib.contextmanager
def environ(env: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` updated with ``env`` for the block (the upload's client reads it), then restored."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (and its reaped children), from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class ServerCpu:
    """CPU time the server spent between consecutive measurements, charged to the contender run then."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.per_contender: dict[str, list[float]] = {}
        self._last: tuple[str, float] | None = None

    def mark(self, contender: str | None) -> None:
        now = cpu_seconds(self.pid)
        if self._last is not None:
            self.per_contender.setdefault(self._last[0], []).append(now - self._last[1])
        self._last = (contender, now) if contender else None


# ---------------------------------------------------------------------------------------------


def contenders(st: S3Setup, url: str, env: Mapping[str, str]) -> list[Contender]:
    """The two loads: same call, same target, same environment and imports; only the store differs."""
    args = {"strategy": st.dst_strategy, "rank": st.rank, "names_file": st.names_file}
    return [Contender(LOCAL, MODULE, "load_rank", {"store": st.store, **args}, preimport=PREIMPORT, env=dict(env),
                      check="check"),
            Contender(S3, MODULE, "load_rank", {"store": url, **args}, preimport=PREIMPORT, env=dict(env),
                      check="check")]


def run(st: S3Setup, *, reps: int, command: str, results_dir: Path | None, quick: bool = False,
        log: Any = None) -> dict[str, Any]:
    """Start the server, upload the store, measure both loads; returns the record (appended to
    ``results_dir/s3.json``) with the server's CPU time per run in ``params["server_cpu_s"]``."""
    import time

    from benchmarks.harness import append_result
    from ckptstore.testing.s3_server import MotoServer, env_for, upload

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    server = MotoServer()
    try:
        env = env_for(server.url)
        server.create_bucket(BUCKET)
        url = f"s3://{BUCKET}/{PREFIX}"
        t0 = time.perf_counter()
        with environ(env):
            upload(Path(st.store), url)
        upload_s = time.perf_counter() - t0
        log(f"  uploaded {format_bytes(_tree_bytes(st.store))} to {url} in {upload_s:.1f} s")
        cpu = ServerCpu(server.proc.pid)
        cs = contenders(st, url, env)
        warm = [str(p) for p in sorted(Path(st.store).rglob("*")) if p.is_file()]
        params = {**st.params(), "quick": quick, "upload_s": upload_s, "default_workers": _default_workers()}
        record = run_benchmark(NAME, cs, reps=reps, warm_paths=warm, params=params, command=command,
                               results_dir=None, keep_going=True, timeout=1800, before_each=lambda c: cpu.mark(c.name),
                               log=log)
        cpu.mark(None)
    finally:
        server.stop()
    record["params"]["server_cpu_s"] = cpu.per_contender
    if results_dir is not None:
        append_result(NAME, record, results_dir)
    return record


def _default_workers() -> dict[str, int]:
    from ckptstore.read.loader import DEFAULT_WORKERS
    from ckptstore.io.s3 import READ_CONCURRENCY

    return {"local": int(DEFAULT_WORKERS), "s3": int(READ_CONCURRENCY)}


def _tree_bytes(path: str | os.PathLike[str]) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------
# report


def _median(record: Mapping[str, Any], name: str, metric: str) -> float | None:
    return record["summary"].get(name, {}).get(metric, {}).get("median")


def requests_cell(record: Mapping[str, Any]) -> Any:
    """Column function: requests the worker sent (GET + HEAD + LIST) and bytes it received."""
    def cell(name: str) -> str:
        c = record.get("checks", {}).get(name)
        if not c or "gets" not in c:
            return "–"
        return (f"{c['gets']} GET, {c['heads']} HEAD, {c['lists']} LIST; {format_bytes(c['bytes_in'])} in"
                + ("" if c.get("consistent", True) else " (runs differ)"))

    return cell


def same_cell(record: Mapping[str, Any]) -> Any:
    checks = record.get("checks", {})
    ref = checks.get(LOCAL, {}).get("digest")

    def cell(name: str) -> str:
        c = checks.get(name)
        if not c:
            return "–"
        if c.get("missing_or_misshapen"):
            return f"**no**: {c['missing_or_misshapen']} tensors missing or misshapen"
        return "yes" if c.get("digest") == ref else "**no** (different values)"

    return cell


def verdict_lines(record: Mapping[str, Any]) -> list[str]:
    """Time ratio, memory over the slice, bytes and requests against their targets."""
    p = record["params"]
    wanted, runs = p["rank_nbytes"], p["coalesced_ranges"]
    lines = []
    local, s3 = _median(record, LOCAL, "wall_s"), _median(record, S3, "wall_s")
    if local and s3:
        lines.append(f"- time, S3 / local: {format_seconds(s3)} / {format_seconds(local)} = **{s3 / local:.2f}×** "
                     "(medians)")
    for name in (LOCAL, S3):
        peak = _median(record, name, "peak_above_start")
        if peak is not None:
            judged = "" if name != S3 else (f" (target ≤ {PEAK_TARGET}: "
                                              f"{'met' if peak <= PEAK_TARGET * wanted else '**not met**'})")
            lines.append(f"- peak RSS above start / slice size, `{name}`: {format_bytes(peak)} / "
                         f"{format_bytes(wanted)} = **{peak / wanted:.4f}×**{judged}")
    c = record.get("checks", {}).get(S3)
    if c and "gets" in c:
        got, data = c["bytes_in"], c["bytes_in"] - p["manifest_bytes"]
        ok = got <= BYTES_TARGET * wanted
        lines.append(f"- bytes transferred / wanted: {format_bytes(got)} / {format_bytes(wanted)} = "
                     f"**{got / wanted:.4f}** (target ≤ {BYTES_TARGET}: {'met' if ok else '**not met**'}); "
                     f"without the manifest (root `zarr.json`, {format_bytes(p['manifest_bytes'])}, read whole on "
                     f"open): {data / wanted:.4f}")
        n = c["gets"] + c["heads"] + c["lists"]
        lines.append(f"- requests: {n} ({c['gets']} GET, {c['heads']} HEAD, {c['lists']} LIST) vs 2 + {runs} "
                     f"coalesced ranges = {2 + runs} (target ≤: {'met' if n <= 2 + runs else '**not met**'})")
        if "unit_gets" in p and p["unit_gets"] != runs:
            lines.append(f"  - ckptstore's reader cuts a run longer than {format_bytes(p['unit_bytes'])} "
                         "(`ckptstore.io.s3.GET_PIECE`) into pieces read by different threads, one GET each: "
                         f"2 + {p['unit_gets']} = {2 + p['unit_gets']} requests expected with that cut "
                         f"({'met' if n <= 2 + p['unit_gets'] else '**exceeded**'})")
    cpu = p.get("server_cpu_s", {})
    if cpu.get(S3):
        lines.append(f"- server (moto) CPU time per S3 load: {format_seconds(statistics.median(cpu[S3]))} (median; "
                     f"{format_seconds(statistics.median(cpu.get(LOCAL) or [0]))} during a local load). moto reads "
                     "and copies the whole object for every ranged GET, on the same 2 cores as the client")
    return lines


COLUMNS = (Column("wall_s", "wall", "s"), Column("cpu_s", "CPU time (client)", "s", ratio=False),
           Column("peak_above_start", "peak RSS above start", "B"),
           Column("rchar", "bytes read (rchar)", "B", ratio=False))


def render(record: Mapping[str, Any]) -> str:
    """``s3.md``: what was run, on what, the table and the targets."""
    from benchmarks.bench_load import dataset_line, not_run_notes, run_lines

    p = record["params"]
    w = p.get("default_workers", {})
    table = markdown_table(record, columns=COLUMNS, baselines=[LOCAL] if LOCAL in record["summary"] else [],
                           labels=LABELS, extra={"S3 requests (client counters)": requests_cell(record),
                                                 "same values as local": same_cell(record)})
    lines = [
        f"## Load one target rank from S3 vs local disk: {p['src_world']} → {p['dst_world']} cards, rank {p['rank']}",
        "",
        *run_lines(record, True),
        dataset_line(p).replace(" (the bytes every ratio to the bound is about)", ""),
        "",
        f"Store: {format_bytes(p['store_bytes'])} (Zarr, uploaded to a moto S3 server on loopback in "
        f"{p['upload_s']:.1f} s, untimed). The rank's read plan: {format_bytes(p['rank_nbytes'])} in "
        f"{p['coalesced_ranges']} coalesced ranges.",
        "",
        table,
        "",
        "Each row times `ckptstore.load_rank(store, strategy, rank).materialize()` in a fresh process after the "
        f"same imports, with ckptstore's default workers ({w.get('local', '?')} threads for a local store, "
        f"{w.get('s3', '?')} for object storage); opening the store is inside the timed call. The S3 client talks "
        "to the server directly (no proxy); request counts are ckptstore's own counters in the measured process. "
        "Cells: median (min–max) over runs; ratios compare medians. `rchar` counts file reads only (the strategy "
        "file, a local store's chunks), not what arrives on a socket: the S3 row's payload is in its request counters.",
        "",
        *verdict_lines(record),
    ]
    if p.get("quick"):
        lines += ["", "**Quick mode: a tiny checkpoint and one repetition — a smoke test, not numbers to quote.**"]
    lines += not_run_notes(record)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from benchmarks.bench_load import add_load_args

    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_s3", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_args(ap)
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    ap.add_argument("--quick", action="store_true", help=f"smoke test: --size {QUICK_SIZE}, one repetition")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.data import parse_size
    from benchmarks.synth import parse_mesh, synth

    args = parse_args(argv)
    size, reps = (QUICK_SIZE, 1) if args.quick else (args.size, args.reps)
    s = synth(parse_size(size), parse_mesh(args.src_world, source=True), args.seed)
    st = make_setup(s, parse_mesh(args.dst_world, source=False), args.rank)
    return run_and_publish(lambda: run(st, reps=reps, command=command_line("benchmarks.bench_s3", argv),
                                       results_dir=args.results_dir, quick=args.quick), render, args.results_dir, NAME)


if __name__ == "__main__":
    sys.exit(main())
