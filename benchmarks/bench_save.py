"""Benchmark: one training step saved by the 8 ranks of a dp2 x mp4 job at once.

``python -m benchmarks.bench_save --size 1GB --reps 3 [--budget-mb 256] [--base DIR] [--out DIR]``

The synthetic PanGu-Alpha checkpoint of :mod:`benchmarks.synth` (weights and Adam moments,
about ``--size`` bytes of global tensors) gives each rank its local slices: every rank is its
own process that loads its rank file into ``mindspore.Parameter`` values (``mindspore.load_checkpoint``,
its memory pre-check given MemAvailable as in ``benchmarks.contenders.patched_mindspore``; unmeasured
setup: what a training job holds), waits at a barrier, and then saves them,
all eight at once, as each contender does (each rank saves once before, unmeasured: a job saves
many times, and the measured save is a later one; the ``ckptstore async`` rows save that first
step as step 0 of the same folder with the same saver and are measured saving step 1, the other
rows save it into another folder):

* ``ModelCheckpoint sync``: ``mindspore.save_checkpoint`` of the rank's Parameters into its own
  file (what ``ModelCheckpoint`` calls);
* ``ModelCheckpoint async_save``: the same with ``async_save=True``; done when MindSpore's save
  thread has finished (``_wait_async_thread_save_ckpt``, what ``ModelCheckpoint`` waits on);
* ``ModelCheckpoint remove_redundancy``: sync, each replicated slice saved by one rank, chosen by
  MindSpore's own ``get_parameter_redundancy`` + ``remove_param_redundancy`` (the selection
  ``remove_redundancy=True`` makes; that flag itself needs a compiled parallel network);
* ``ckptstore save_rank``: ``ckptstore.save_rank`` (sync), committed by the last rank;
* ``ckptstore async``: ``ckptstore.StoreSaver(out, keep=None, memory_budget_mb=--budget-mb)``, one per
  rank process, ``saver.save(1, params)``: the step returns once the rank's slices are copied to
  host memory (in pieces of at most 64 MiB, within the budget); done when the writer has
  committed (``saver.wait()``);
* ``ckptstore async (SeaweedFS)``: the same into a bucket of a SeaweedFS server on loopback
  (``ckptstore.testing.s3_server``), bytes written counted from the bucket's listing;
* ``raw PUTs (SeaweedFS)``: the bound of the row above, no ckptstore in the timed span: in the
  untimed setup the rank saves its slices once with ``ckptstore.save_rank`` into a folder of its
  own and reads back the files it wrote (the objects a save of this rank makes, same sizes), then
  the timed span PUTs each of them into the bucket with ``obstore.put`` from 8 threads (multipart
  in 16 MiB parts above 16 MiB, as ckptstore's sink sends): what the server costs for the same
  objects, without staging, planning or the commit;
* ``PyTorch DCP save``: the same local slices as torch tensors in the rank's memory, wrapped as
  DTensors of the source layout (:func:`benchmarks.peers.dcp.rank_state`), on a ``gloo`` process
  group of the 8 ranks (set up before the barrier, unmeasured); one collective
  ``dcp.save(state, storage_writer=FileSystemWriter(out))``: DCP's default planner writes each
  replicated shard once (balanced across its replicas), one file per rank, fsynced; done when
  the coordinator has written ``.metadata`` and every rank has returned;
* ``PyTorch DCP async_save``: ``dcp.async_save`` of that state dict with a ``DefaultStager``
  kept for the job (it caches its host copies between saves, as ckptstore's saver reuses its
  buffers; pinned memory and async staging need CUDA, so staging is a blocking copy on this
  CPU build), the default thread executor, and the collectives of the background save on a
  ``gloo`` group of their own (not the one a training loop would use); done when the returned
  future completes.

Old vs new in one run: ``--base DIR``, a folder holding another revision's ``ckptstore/``
(``git archive REV ckptstore | tar -x -C DIR``), adds ``<name> @base`` after every ``ckptstore``
contender: the same rank processes with ``PYTHONPATH=DIR:<this checkout>`` and ``PYTHONSAFEPATH=1``
(so the checkout's own ``ckptstore/`` is not found first), checked by the ``ckptstore/__init__.py``
each rank imported.

Per save: **stall** = how long the rank's training loop is blocked (the call's return, slowest
rank; the median rank too), **done** = from the barrier to the end of the last rank's save, plus
an ``os.sync()`` by the driver afterwards, so every contender pays for durable files, **bytes written** = the
output folder's size, **extra memory** = the largest per-rank peak RSS above its level before
the call (``clear_refs``), **host copies kept** = the staging buffers an async saver allocated in
the unmeasured first save and reuses (``StoreSaver.peak_staged``) (so extra memory does not show
them: ckptstore's peak use of
its piece buffers, DCP's cached copy of the whole rank). ``ModelCheckpoint sync + ckptstore index`` adds the time of
``ckptstore.index`` of the sync save's rank files (the way to a store without saving into one).
Contenders alternate order between repetitions; medians are reported, with the machine's
1-minute load average before each run and the cores other processes kept busy (it is shared).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS_DIR, command_line, raw_path
from benchmarks.procfs import ForeignLoad
from benchmarks.report import format_bytes, format_seconds
from benchmarks.synth import Mesh, synth

CONTENDERS = ("ModelCheckpoint sync", "ModelCheckpoint async_save", "ModelCheckpoint remove_redundancy",
              "ckptstore save_rank", "ckptstore async", "ckptstore async (SeaweedFS)", "raw PUTs (SeaweedFS)",
              "PyTorch DCP save", "PyTorch DCP async_save")
SEAWEED = "ckptstore async (SeaweedFS)"
#: The object-storage bound: the objects ckptstore's save of the rank writes, PUT with obstore alone.
RAW_PUTS = "raw PUTs (SeaweedFS)"
#: Contenders that write into the SeaweedFS bucket.
IN_BUCKET = (SEAWEED, RAW_PUTS)
#: Contenders whose warm-up save is step 0 of the measured folder (one StoreSaver per rank for both
#: steps, as a training loop holds one): only the measured step's folder is counted.
SAME_ROOT = ("ckptstore async", SEAWEED)
DCP_ASYNC = "PyTorch DCP async_save"
NAME = "save"
#: Suffix of a contender run with the ckptstore of ``--base`` (old vs new in one run).
AT_BASE = " @base"


def parse_size(text: str) -> int:
    units = {"GB": 10**9, "MB": 10**6, "KB": 10**3, "GiB": 1 << 30, "MiB": 1 << 20}
    for u, m in units.items():
        if text.endswith(u):
            return int(float(text[:-len(u)]) * m)
    return int(text)


# ---- one rank (its own process) ----------------------------------------------------------------


def rank_main(a: argparse.Namespace) -> None:
    from benchmarks.procfs import read_status, reset_peak_rss

    state: dict[str, Any] = {}
    params = _dcp_setup(a, state) if a.contender.startswith("PyTorch DCP") else _parameters(a.rank_file)
    if a.contender == RAW_PUTS:
        params = _objects_of_a_save(a, params)
    if a.contender.startswith("ckptstore"):  # a job imports its libraries before it trains
        import zarr  # noqa: F401  (imported on a store's first save)

        import ckptstore

        for name in ("load_rank", "save_rank"):  # public names imported on first use: the adapter, the writer
            getattr(ckptstore, name)
    _save(a, params, state, warm_up=True)  # a job saves many times: measure a save after the first
    ready = Path(a.sync) / f"ready-{a.rank}"
    ready.write_text("")
    go = Path(a.sync) / "go"
    while not go.exists():
        time.sleep(0.001)
    reset_peak_rss()
    before = read_status()["VmRSS"]
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.time()
    committed = _save(a, params, state)
    t_stall = committed.pop("stall")
    t_done = time.time()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    peak = read_status()["VmHWM"] - before
    # the rank's own CPU (every thread, user + system) from the release to its save's end: the
    # part of a save's cost another process on the machine or the disk's mood barely moves
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    imported = sys.modules["ckptstore"].__file__ if "ckptstore" in sys.modules else None
    json.dump({"rank": a.rank, "go": float(go.read_text()), "start": t0, "stall_end": t_stall, "done": t_done,
               "peak_above": peak, "cpu_s": cpu, "ckptstore": imported, **committed}, sys.stdout)
    if "stager" in state:  # a stager passed to async_save is the caller's to close
        state["stager"].close()
    if a.contender.startswith("PyTorch DCP"):
        import torch.distributed as dist

        dist.destroy_process_group()


def _dcp_setup(a: argparse.Namespace, state: dict[str, Any]) -> dict[str, Any]:
    """Unmeasured: the rank's ``gloo`` process group (and, for async_save, a second group and
    the job's stager) and its state dict of DTensors, every tensor in the rank's own memory."""
    import torch.distributed as dist

    from benchmarks.peers.dcp import rank_state

    dist.init_process_group("gloo", init_method=f"file://{Path(a.sync) / 'torch-rendezvous'}", rank=a.rank,
                            world_size=a.world)
    if a.contender == DCP_ASYNC:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        state["pg"] = dist.new_group(backend="gloo")
        state["stager"] = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                                       use_async_staging=False, use_non_blocking_copy=False))
    return rank_state(a.rank, a.rank_file, a.strategy, in_memory=True)


def _parameters(rank_file: str) -> dict[str, Any]:
    """The rank's ``mindspore.Parameter``\\s, as a training job holds them: ``mindspore.load_checkpoint``
    of its rank file (which refuses a file larger than MemFree, which a full page cache makes small
    here: the benchmarks' patched check uses MemAvailable, ``contenders.MEMORY_CHECK_NOTE``)."""
    from benchmarks.contenders import patched_mindspore

    return dict(patched_mindspore().load_checkpoint(rank_file))


def _objects_of_a_save(a: argparse.Namespace, params: Any) -> dict[str, bytes]:
    """Unmeasured: the files ``ckptstore.save_rank`` writes for this rank alone (its own folder,
    so nothing of another rank is among them), as ``{relative path: bytes}``."""
    import ckptstore

    with tempfile.TemporaryDirectory(prefix=f"bench_save_raw{a.rank}_") as root:
        ckptstore.save_rank(params, root, step=0, strategy=a.strategy, rank=a.rank)
        return {str(f.relative_to(root)): f.read_bytes() for f in sorted(Path(root).rglob("*")) if f.is_file()}


def _raw_puts(url: str, objects: dict[str, bytes]) -> None:
    """PUT every object under ``url`` from 8 threads, as ckptstore's sink sends one (16 MiB parts)."""
    from concurrent.futures import ThreadPoolExecutor

    import obstore
    from obstore.store import S3Store

    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    store, part = S3Store(bucket), 16 << 20

    def put(key: str) -> Any:
        return obstore.put(store, f"{prefix}/{key}", objects[key], use_multipart=len(objects[key]) > part,
                           chunk_size=part, max_concurrency=8)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, objects))


def _save(a: argparse.Namespace, params: Any, state: dict[str, Any], warm_up: bool = False) -> dict[str, Any]:
    import mindspore as ms

    if a.contender == RAW_PUTS:  # params: the objects of this rank's save
        where = f"{a.out}/{'warm-up' if warm_up else 'measured'}/rank_{a.rank}"
        _raw_puts(where, params)
        return {"stall": time.time(), "committed": a.rank == 0, "store": f"{a.out}/measured"}

    # the warm-up's files are not counted: another folder, or (ckptstore async, one saver) step 0 of the same
    where = a.out + "-warm-up" if warm_up and a.contender not in SAME_ROOT else a.out
    name, out = a.contender, where if where.startswith("s3://") else Path(where)
    rank_file = Path(where) / f"rank_{a.rank}" / "net-1_1.ckpt"
    step = 0 if warm_up else 1
    if name.startswith("ModelCheckpoint"):
        rank_file.parent.mkdir(parents=True, exist_ok=True)
        items = [{"name": n, "data": p} for n, p in params.items()]
    if name == "ModelCheckpoint sync":
        ms.save_checkpoint(items, str(rank_file))
        return {"stall": time.time()}
    if name == "ModelCheckpoint async_save":
        from mindspore.train.serialization import _wait_async_thread_save_ckpt

        ms.save_checkpoint(items, str(rank_file), async_save=True)
        stall = time.time()
        _wait_async_thread_save_ckpt()
        return {"stall": stall}
    if name == "ModelCheckpoint remove_redundancy":
        from mindspore.train._utils import get_parameter_redundancy, remove_param_redundancy

        redundancy = get_parameter_redundancy(a.strategy)
        mine = remove_param_redundancy(redundancy).get(a.rank, set())
        ms.save_checkpoint(items, str(rank_file), choice_func=lambda n: n in mine or n not in redundancy)
        return {"stall": time.time()}
    if name.startswith("PyTorch DCP"):
        import torch.distributed.checkpoint as dcp

        local = sum(t.to_local().nbytes if hasattr(t, "to_local") else t.nbytes for t in params.values())
        writer = dcp.FileSystemWriter(str(out))
        if name == DCP_ASYNC:
            future = dcp.async_save(params, storage_writer=writer, process_group=state["pg"],
                                    async_stager=state["stager"])
            stall = time.time()
            future.result()
            return {"stall": stall, "committed": a.rank == 0, "staged_peak": local}
        dcp.save(params, storage_writer=writer)
        return {"stall": time.time(), "committed": a.rank == 0}
    import ckptstore

    if name == "ckptstore save_rank":
        s = ckptstore.save_rank(params, out, step=step, strategy=a.strategy, rank=a.rank)
        return {"stall": time.time(), "committed": s.committed, "written": s.bytes_written}
    from benchmarks.compat import store_saver

    if "saver" not in state:  # one per rank process, kept for the warm-up and the measured step
        state["saver"] = store_saver(a.out, memory_budget_mb=a.budget_mb or None, strategy=a.strategy, rank=a.rank)
    saver = state["saver"]
    saver.save(step, params)
    stall = time.time()
    last = saver.wait()
    return {"stall": stall, "committed": last.committed, "written": last.bytes_written,
            "staged_peak": saver.peak_staged, "store": str(last.store)}


# ---- the driver ---------------------------------------------------------------------------------


def run_once(s: Any, contender: str, out: Path, budget_mb: int | None, bucket: Any = None,
             base: str | None = None) -> dict[str, Any]:
    """Start every rank, release them together, wait, sync; the measurement of one save.
    ``bucket`` is ``(url, environment)`` of a fresh bucket prefix for the object-storage contender;
    a contender named ``<name> @base`` is ``<name>`` with the ckptstore of the folder ``base``."""
    label, contender = contender, contender.removesuffix(AT_BASE)
    for folder in (out, out.with_name(out.name + "-warm-up")):
        shutil.rmtree(folder, ignore_errors=True)
    out.mkdir(parents=True)
    os.sync()
    world = s.src.world
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    if label != contender:  # the base's ckptstore first, and not this checkout's from the working directory
        env.update(PYTHONPATH=f"{Path(base or '').resolve()}{os.pathsep}{env['PYTHONPATH']}", PYTHONSAFEPATH="1")
    target = str(out)
    if contender in IN_BUCKET:
        target, extra = bucket
        env.update(extra)
    with tempfile.TemporaryDirectory(prefix="bench_save_") as sync_dir:
        procs = []
        for r in range(world):
            cmd = [sys.executable, "-m", "benchmarks.bench_save", "rank", "--contender", contender, "--rank", str(r),
                   "--rank-file", str(s.rank_file(r)), "--strategy", str(s.strategy), "--out", target,
                   "--sync", sync_dir, "--budget-mb", str(budget_mb or 0), "--world", str(world)]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        while len(list(Path(sync_dir).glob("ready-*"))) < world:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.01)
        t_go = time.time()
        tmp = Path(sync_dir) / "go.tmp"
        tmp.write_text(repr(t_go))
        tmp.rename(Path(sync_dir) / "go")
        ranks = []
        for p in procs:
            stdout, stderr = p.communicate()
            if p.returncode != 0:
                raise RuntimeError(f"{contender}: a rank failed:\n{stderr[-2000:]}")
            ranks.append(json.loads(stdout))
    if label != contender:
        wrong = {r["ckptstore"] for r in ranks if not str(r["ckptstore"]).startswith(str(Path(base or "").resolve()))}
        if wrong:
            raise RuntimeError(f"{label}: ranks imported ckptstore from {sorted(map(str, wrong))}, not {base}")
    t_sync = time.time()
    os.sync()  # every contender's files durable (ckptstore fsyncs its own; MindSpore's are not)
    sync_s = time.time() - t_sync
    stalls = sorted(r["stall_end"] - t_go for r in ranks)
    stores = {r["store"] for r in ranks if r.get("store")} if contender in (*SAME_ROOT, RAW_PUTS) else set()
    if contender in IN_BUCKET:
        written = sum(_bucket_bytes(where, bucket[1]) for where in stores)
    else:
        written = sum(p.stat().st_size for folder in ([Path(w) for w in stores] or [out])
                      for p in folder.rglob("*") if p.is_file())
    return {"stall_max": stalls[-1], "stall_median": statistics.median(stalls),
            "done": max(r["done"] for r in ranks) - t_go + sync_s,
            "bytes_written": written, "extra_memory": max(r["peak_above"] for r in ranks),
            "committed": sum(bool(r.get("committed")) for r in ranks),
            "staged_peak": max((r.get("staged_peak", 0) for r in ranks), default=0)}


def _bucket_bytes(url: str, env: dict[str, str]) -> int:
    """Bytes of the objects under ``url`` (the bucket's listing, with obstore)."""
    os.environ.update(env)
    import obstore
    from obstore.store import S3Store

    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return sum(int(m["size"]) for batch in obstore.list(S3Store(bucket), prefix.rstrip("/") + "/") for m in batch)


def index_time(s: Any, out: Path) -> float:
    import ckptstore

    t0 = time.perf_counter()
    ckptstore.index(out, out / "store.index", strategy=[s.strategy])
    os.sync()
    return time.perf_counter() - t0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_save", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1GB")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget-mb", type=int, default=256, help="ckptstore async's memory budget per rank (MB)")
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--out", default=str(RESULTS_DIR))
    ap.add_argument("--work", default=None, help="where the saves go (default: a temporary folder)")
    ap.add_argument("--base", default=None, help="a folder holding another revision's ckptstore/: every ckptstore "
                    "contender also runs with it, as '<name> @base' (old vs new in one run)")
    a = ap.parse_args(argv)
    s = synth(parse_size(a.size), Mesh(2, 4))
    for r in range(s.src.world):  # warm: every rank file in the page cache
        s.rank_file(r).read_bytes()
    names = [c for c in a.contenders.split(",") if c]
    if a.base:
        names = [n for c in names for n in ((c, c + AT_BASE) if c.startswith("ckptstore") else (c,))]
    work = Path(a.work or tempfile.mkdtemp(prefix="bench_save_"))
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    index_runs: list[float] = []
    load_avg: list[float] = []  # the machine is shared: its 1-minute load average before each run
    foreign = ForeignLoad()
    server = None
    if set(IN_BUCKET) & set(names):
        from ckptstore.testing.s3_server import SeaweedServer, env_for

        server = SeaweedServer()
        server.create_bucket("bench")
    for rep in range(a.reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            bucket = (f"s3://bench/run{rep}-{len(load_avg)}", env_for(server.url)) \
                if name.removesuffix(AT_BASE) in IN_BUCKET else None
            load_avg.append(round(os.getloadavg()[0], 2))
            result = run_once(s, name, work / "out", a.budget_mb, bucket, a.base)
            runs[name].append(result)
            print(f"rep {rep} {name}: stall {result['stall_max']:.2f} s, done {result['done']:.2f} s, "
                  f"{format_bytes(result['bytes_written'])}", flush=True)
            if name == "ModelCheckpoint sync":
                index_runs.append(index_time(s, work / "out"))
    shutil.rmtree(work, ignore_errors=True)
    if server is not None:
        server.stop()
    record = {"name": NAME, "command": command_line("benchmarks.bench_save", argv), "size": a.size,
              "model_bytes": s.model_bytes,
              "world": s.src.world, "mesh": str(s.src), "budget_mb": a.budget_mb, "runs": runs, "index_s": index_runs,
              **({"base": a.base} if a.base else {}),
              "load_avg": load_avg, "foreign_cpu_cores": round(foreign.cores(), 2),
              "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = raw_path(out, f"{NAME}.json")  # the record beside the summary, in the folder git ignores
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps(record, indent=1))
    text = report(record)
    (out / f"{NAME}.md").write_text(text)
    print(text)
    return 0


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def report(record: dict[str, Any]) -> str:
    """The Markdown table of one run, with the issue's targets judged."""
    runs, distinct = record["runs"], record["model_bytes"]
    lines = [f"# Saving a step: {record['mesh']} ranks at once, {record['size']} model", "",
             f"`{record['command']}` ({record['time']}; medians of {len(next(iter(runs.values())))} runs; ckptstore "
             f"async budget {str(record['budget_mb']) + ' MB' if record['budget_mb'] else 'none (the whole share)'} "
             "per rank)", "",
             "| contender | stall (slowest rank) | stall (median rank) | done, durable | bytes written | × distinct "
             "| extra memory (largest rank) | host copies kept between saves (largest rank) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, rs in runs.items():
        if not rs:
            continue
        lines.append(f"| {name} | {format_seconds(_median(rs, 'stall_max'))} | "
                     f"{format_seconds(_median(rs, 'stall_median'))} | {format_seconds(_median(rs, 'done'))} | "
                     f"{format_bytes(_median(rs, 'bytes_written'))} | {_median(rs, 'bytes_written') / distinct:.3f} | "
                     f"{format_bytes(_median(rs, 'extra_memory'))} | {_kept(name, rs)} |")
    if record["index_s"] and runs.get("ModelCheckpoint sync"):
        total = _median(runs["ModelCheckpoint sync"], "done") + statistics.median(record["index_s"])
        lines.append(f"| ModelCheckpoint sync + ckptstore index | | | {format_seconds(total)} | | | | |")
    if record.get("load_avg"):
        la = record["load_avg"]
        foreign = (f"; other processes kept {record['foreign_cpu_cores']:.2f} of the 2 cores busy on average"
                   if "foreign_cpu_cores" in record else "")
        when = record.get("load_avg_sampled", "before each run")
        lines += ["", f"Machine load (shared 2-core machine): 1-minute load average {when} median "
                      f"{statistics.median(la):.1f} (min {min(la):.1f}, max {max(la):.1f}; it counts this benchmark's "
                      f"own rank processes){foreign}."]
    lines += ["", *targets(record)]
    for note in record.get("notes", []):  # added afterwards, e.g. a follow-up run with another budget
        lines += ["", note]
    return "\n".join(lines) + "\n"


def _kept(name: str, runs: list[dict[str, Any]]) -> str:
    """The staging buffers a saver holds from one save to the next (allocated in the unmeasured
    first save, so the measured save's extra RSS does not show them): ckptstore's reused piece
    buffers (their peak use), DCP's cached copy of the rank's whole state dict."""
    staged = _median(runs, "staged_peak")
    return format_bytes(staged) if staged else ""


def targets(record: dict[str, Any]) -> list[str]:
    runs, distinct, out = record["runs"], record["model_bytes"], []
    out_of: set[str] = set()  # contenders compared with their --base run
    if runs.get("ckptstore async") and runs.get("ModelCheckpoint sync"):
        a, sync = runs["ckptstore async"], runs["ModelCheckpoint sync"]
        ratio = _median(a, "stall_max") / _median(sync, "stall_max")
        out.append(f"- async stall ≤ 0.2× ModelCheckpoint sync's: {ratio:.2f}× — {'met' if ratio <= 0.2 else 'MISSED'}")
        budget = record["budget_mb"] * 10**6 * 1.048576
        peak = _median(a, "staged_peak")
        rss = f"extra RSS, which also counts the writer's buffers and MindSpore's host copies: " \
              f"{format_bytes(_median(a, 'extra_memory'))}"
        if budget:
            out.append(f"- staged copies within the budget: {format_bytes(peak)} of {format_bytes(budget)} — "
                       f"{'met' if peak <= budget else 'MISSED'} ({rss})")
        else:  # --budget-mb 0: no budget, the rank's whole share copied at once (StoreCheckpoint's default)
            out.append(f"- staged copies, no budget (the rank's whole share, StoreCheckpoint's default): "
                       f"{format_bytes(peak)} ({rss})")
    for name in ("ckptstore save_rank", "ckptstore async"):
        if runs.get(name):
            ratio = _median(runs[name], "bytes_written") / distinct
            out.append(f"- {name}: bytes written {ratio:.4f}× the distinct bytes (target ≤ 1.01×; metadata included) "
                       f"— {'met' if ratio <= 1.01 else 'MISSED'}")
    if runs.get("ckptstore async") and runs.get("ModelCheckpoint sync") and record["index_s"]:
        bound = _median(runs["ModelCheckpoint sync"], "done") + statistics.median(record["index_s"])
        done = _median(runs["ckptstore async"], "done")
        out.append(f"- committed no later than ModelCheckpoint sync + ckptstore index ({format_seconds(bound)}): "
                   f"{format_seconds(done)} — {'met' if done <= bound else 'MISSED'}")
    if runs.get(SEAWEED) and runs.get("ckptstore async"):
        bucket, local = _median(runs[SEAWEED], "done"), _median(runs["ckptstore async"], "done")
        line = (f"- committed into the bucket ≤ 1.5× the local save ({format_seconds(local)}): "
                f"{format_seconds(bucket)} = "
                f"{bucket / local:.2f}× — {'met' if bucket <= 1.5 * local else 'MISSED'}")
        if runs.get(RAW_PUTS):
            raw = _median(runs[RAW_PUTS], "done")
            line += (f"; the same objects PUT alone ({RAW_PUTS}) took {format_seconds(raw)} = {raw / local:.2f}× the "
                     f"local save, so ckptstore's bucket save is {bucket / raw:.2f}× the server's bound")
        out.append(line)
    sync = runs.get("ModelCheckpoint sync")
    for name in (*CONTENDERS, *(n.removesuffix(AT_BASE) for n in runs)):
        old, new = runs.get(name + AT_BASE), runs.get(name)
        if not (old and new) or name in out_of:
            continue
        out_of.add(name)
        o_stall, n_stall = _median(old, "stall_max"), _median(new, "stall_max")
        o_done, n_done = _median(old, "done"), _median(new, "done")
        versus = (f"; stall × ModelCheckpoint sync: {o_stall / _median(sync, 'stall_max'):.2f}× old, "
                  f"{n_stall / _median(sync, 'stall_max'):.2f}× new" if sync else "")
        out.append(f"- {name}, new vs old ({record.get('base', 'base')}) in this run: stall "
                   f"{format_seconds(n_stall)} vs {format_seconds(o_stall)} ({n_stall / o_stall:.2f}×), done "
                   f"{format_seconds(n_done)} vs {format_seconds(o_done)} ({n_done / o_done:.2f}×){versus}")
    for name in ("PyTorch DCP save", DCP_ASYNC):
        if runs.get(name):
            ratio = _median(runs[name], "bytes_written") / distinct
            out.append(f"- {name}: bytes written {ratio:.4f}× the distinct bytes (for comparison)")
    if runs.get("ckptstore async") and runs.get(DCP_ASYNC):
        mine, theirs = _median(runs["ckptstore async"], "stall_max"), _median(runs[DCP_ASYNC], "stall_max")
        out.append(f"- async stall no more than PyTorch DCP async_save's ({format_seconds(theirs)}): "
                   f"{format_seconds(mine)} = {mine / theirs:.2f}× — {'met' if mine <= theirs else 'MISSED'}")
    else:
        out.append("- async stall no more than PyTorch DCP async_save's: not measured in this run")
    return out


def _rank_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    for opt in ("--contender", "--rank-file", "--strategy", "--out", "--sync"):
        ap.add_argument(opt, required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--budget-mb", type=int, default=0)
    return ap.parse_args(argv)


# --- incremental steps: ``python -m benchmarks.bench_save incremental --size 1GB --steps 5`` -------------
INCREMENTAL = "save-incremental"


def incremental_model(size: int, trainable: float, frozen: float) -> dict[str, Any]:
    """A transformer-like model of about ``size`` bytes, float32, in one process: square
    ``2048 x 2048`` matrices (16 MiB each), a LoRA pair per matrix holding ``trainable`` of the
    bytes, and which names a "training step" changes: with ``trainable`` > 0 only the LoRA pairs
    (a frozen base); else every matrix but the first ``frozen`` share (frozen embeddings/layers)."""
    import numpy as np

    h = 2048
    n = max(1, round(size / (h * h * 4)))
    rng = np.random.default_rng(0)
    model: dict[str, Any] = {f"layer{i}.w": rng.standard_normal((h, h), dtype=np.float32) for i in range(n)}
    rank = max(1, round(trainable * h / 2)) if trainable else 0
    for i in range(n if rank else 0):
        model[f"layer{i}.lora_a"] = rng.standard_normal((rank, h), dtype=np.float32)
        model[f"layer{i}.lora_b"] = np.zeros((h, rank), dtype=np.float32)
    changing = [k for k in model if ".lora_" in k] if rank else list(model)[round(frozen * n):]
    return {"values": model, "changing": changing}


def _train(model: dict[str, Any], step: int) -> None:
    """One "training step": every changing array moves (in place, as an optimizer updates)."""
    for name in model["changing"]:
        model["values"][name] += 1e-3 * step


def _incremental_run(model: dict[str, Any], root: Path, steps: int, *, incremental: bool,
                     budget_mb: int) -> list[dict[str, Any]]:
    """``steps`` saves of ``model`` by one StoreSaver (async, as a training loop), one per step."""
    import ckptstore

    out = []
    saver = ckptstore.StoreSaver(root, keep=2, async_save=True, memory_budget_mb=budget_mb,
                                 incremental=incremental, attempt="bench")
    for step in range(1, steps + 1):
        _train(model, step)
        t0 = time.perf_counter()
        saver.save(step, model["values"])
        stall = time.perf_counter() - t0
        saver.wait()
        done = time.perf_counter() - t0
        summary = saver.summaries[-1]
        out.append({"step": step, "stall": round(stall, 4), "committed": round(done, 4),
                    "bytes_written": summary.bytes_written, "chunks_written": summary.chunks_written})
    return out


def _modelcheckpoint_run(model: dict[str, Any], root: Path, steps: int) -> list[dict[str, Any]]:
    """``mindspore.save_checkpoint`` of the same values (what ``ModelCheckpoint`` calls), sync."""
    import mindspore as ms

    root.mkdir(parents=True, exist_ok=True)
    out = []
    for step in range(1, steps + 1):
        _train(model, step)
        t0 = time.perf_counter()
        ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in model["values"].items()],
                           str(root / f"step_{step}.ckpt"))
        done = time.perf_counter() - t0
        out.append({"step": step, "stall": round(done, 4), "committed": round(done, 4),
                    "bytes_written": (root / f"step_{step}.ckpt").stat().st_size})
    return out


def incremental_main(argv: Sequence[str]) -> int:
    """Frozen-base (LoRA-style) and full-training runs, saved incrementally and in full."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_save incremental")
    ap.add_argument("--size", default="1GB")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--trainable", type=float, default=0.01, help="LoRA run: share of the bytes trained")
    ap.add_argument("--frozen", type=float, default=0.1, help="full run: share of the matrices frozen")
    ap.add_argument("--budget-mb", type=int, default=256)
    ap.add_argument("--modelcheckpoint", action="store_true", help="also mindspore.save_checkpoint (sync)")
    ap.add_argument("--out", default=str(RESULTS_DIR))
    ap.add_argument("--work", default=None)
    a = ap.parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="bench_inc_"))
    runs: dict[str, list[dict[str, Any]]] = {}
    for run, trainable in (("LoRA", a.trainable), ("full training", 0.0)):
        for mode in ("full saves", "incremental", *(("ModelCheckpoint sync",) if a.modelcheckpoint else ())):
            model = incremental_model(parse_size(a.size), trainable, a.frozen)
            changed = sum(model["values"][k].nbytes for k in model["changing"])
            root = work / f"{run}-{mode}".replace(" ", "_")
            if mode == "ModelCheckpoint sync":
                rows = _modelcheckpoint_run(model, root, a.steps)
            else:
                rows = _incremental_run(model, root, a.steps, incremental=mode == "incremental",
                                        budget_mb=a.budget_mb)
            for r in rows:
                r["changed_bytes"] = changed
            runs[f"{run} / {mode}"] = rows
            shutil.rmtree(root, ignore_errors=True)
            print(f"{run} / {mode}: " + ", ".join(f"{format_bytes(r['bytes_written'])} {r['stall']:.2f}s/"
                                                  f"{r['committed']:.2f}s" for r in rows), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    record = {"name": INCREMENTAL, "command": command_line("benchmarks.bench_save", ["incremental", *argv]),
              "size": a.size, "runs": runs, "load_avg": round(os.getloadavg()[0], 2),
              "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    out = Path(a.out)
    raw = raw_path(out, f"{INCREMENTAL}.json")
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps(record, indent=1))
    text = incremental_report(record)
    (out / f"{INCREMENTAL}.md").write_text(text)
    print(text)
    return 0


def incremental_report(record: dict[str, Any]) -> str:
    """A table per run: bytes written, stall and committed time of each step (step 1 apart: it
    writes everything), medians over the later steps, and bytes written / bytes changed."""
    lines = [f"# Incremental steps ({record['size']} model, one process)", "", f"`{record['command']}` "
             f"({record['time']}, load average {record['load_avg']})", "",
             "| run / saves | step 1 written | later steps: written (median) | written / changed | stall | "
             "committed |", "|---|---|---|---|---|---|"]
    for name, rows in record["runs"].items():
        later = rows[1:] or rows
        written = statistics.median(r["bytes_written"] for r in later)
        changed = later[0]["changed_bytes"]
        lines.append(f"| {name} | {format_bytes(rows[0]['bytes_written'])} | {format_bytes(written)} | "
                     f"{written / changed:.3f}× | {format_seconds(statistics.median(r['stall'] for r in later))} | "
                     f"{format_seconds(statistics.median(r['committed'] for r in later))} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        rank_main(_rank_args(sys.argv[2:]))
    elif len(sys.argv) > 1 and sys.argv[1] == "incremental":
        sys.exit(incremental_main(sys.argv[2:]))
    else:
        sys.exit(main())
