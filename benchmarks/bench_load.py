"""Benchmark: "give me target rank r's tensors" (default: 8 → 4 cards, rank 0).

``python -m benchmarks.bench_load --size 1GB --src-world 8 --dst-world 4 --rank 0 --reps 3 [--cold]``

A synthetic PanGu-Alpha checkpoint (:mod:`benchmarks.synth`) saved by MindSpore on the source
layout is loaded as rank ``r`` of the target layout, by every route, each in a fresh process.
Every route is timed over the same span of work: from "a model (or state dict) with the target
shapes exists" to "its tensors are filled". Imports, process-group set-up and building the
model are done before the measurement (a contender's ``setup``, reported as ``setup`` but not
timed). What each row times (:data:`TIMED_SPANS` has the one-line version the report prints):

* ``ckptstore.load_rank (Parameters built)``: ``load_rank(store, strategy, rank, workers=W)``
  then ``.materialize()`` (every read with ``W`` threads, then every Parameter built);
  ``W`` = ckptstore's default, and again with ``W`` = 1, 2, 4 (the workers curve);
* ``ckptstore.load_rank, step by step``: the same work call by call, each step timed: where the
  time goes (the report's table, and the reads alone against the N-thread bound);
* ``ckptstore.load_rank from an index (Parameters built)``: the same call on an *index* of the
  rank files (``ckptstore.index``: a manifest of byte ranges, no payload copied), which reads
  the slices straight from the rank files; its values must equal the converted store's;
* ``ckptstore.load_into_net (into a prebuilt Cell)``: ``load_into_net(net, store, strategy=...,
  rank=...)`` into a Cell built in the setup with the rank's Parameters, zero-filled;
* ``ckptstore.read_rank (numpy)``: ``read_rank(store, strategy, rank)``, the same slices as numpy arrays;
* ``lower bound: numpy preadv``: one ``os.preadv`` of a file holding exactly the rank's bytes
  into one preallocated array, one thread, 4 KiB pages (``numpy preadv, N threads``: the same
  split over N threads, N = the cores the loader may use (:func:`bound_threads`); the report
  judges ``load_rank`` against this N-thread bound, because copying out of the page cache is
  CPU-bound and a loader with N threads on N cores is not limited by one thread's copy rate);
* ``mindspore.load_distributed_checkpoint``: the call alone, the Cell declaring the target
  shapes and the target layout (``predict_strategy``) built in the setup;
* ``mindspore.transform_checkpoint_by_rank + load_checkpoint``: the rank's file written from
  the source files ``rank_list_for_transform`` names, then loaded (no model);
* ``mindspore.load_checkpoint (needed source files)``: only reading those source files;
* ``mindspore.load_distributed_checkpoint (safetensors)``: from the global tensors made by
  ``ckpt_to_safetensors`` + ``unified_safetensors`` (made once, outside the measurement);
* plug-in peers (:mod:`benchmarks.peers`): PyTorch DCP's ``dcp.load`` into prebuilt DTensors,
  Orbax's restore.

Warm by default (every file any contender reads is read once first); ``--cold`` drops the page
cache before every measured run (all of it where ``/proc/sys/vm/drop_caches`` is writable, else
every file a contender reads, with ``posix_fadvise(DONTNEED)``) and writes
``load-cold.json``/``load-cold.md`` instead. Every route's values are digested after its
measurement and compared with ckptstore's. ``--base REV`` runs the ckptstore rows again with revision
``REV``'s ckptstore (old and new in one run); ``--only A,B`` keeps the rows whose name holds A or B.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    RESULTS_DIR,
    BenchmarkError,
    Contender,
    command_line,
    run_and_publish,
    run_benchmark,
)
from benchmarks.registry import contenders_for, register
from benchmarks.report import Column, format_bytes, format_seconds, machine_line, markdown_table, one_line
from benchmarks.synth import Mesh, Synth

NAME = "load"
COLD_NAME = "load-cold"  # results of --cold runs: a record of their own
CKPTSTORE = "ckptstore.load_rank (Parameters built)"
INDEX = "ckptstore.load_rank from an index (Parameters built)"
INTO_NET = "ckptstore.load_into_net (into a prebuilt Cell)"
READ_RANK = "ckptstore.read_rank (numpy)"
STEPS = "ckptstore.load_rank, step by step"
BOUND = "lower bound: numpy preadv"
BOUND_2T = "numpy preadv, 2 threads"  # bound_name(2): the N-thread bound's row where N = 2
#: The target of issue 36: warm ``load_rank`` (default workers) at most this many times the N-thread bound.
LOAD_VS_BOUND_NT = 1.3
MS_LDC = "mindspore.load_distributed_checkpoint"
MS_BY_RANK = "mindspore.transform_checkpoint_by_rank + load_checkpoint"
MS_NEEDED = "mindspore.load_checkpoint (needed source files)"
MS_SAFETENSORS = "mindspore.load_distributed_checkpoint (safetensors)"
LABELS = {CKPTSTORE: "ckptstore", BOUND: "bound"}
MODULE = "benchmarks.contenders"
MS = ("mindspore",)
#: What ckptstore's contenders import before the measurement (its MindSpore adapter included:
#: ``ckptstore.load_rank`` imports it on first use).
CKPTSTORE_PREIMPORT = ("mindspore", "ckptstore:load_rank")
#: ``workers`` of the load_rank rows: the workers curve (the default's row is the main one).
WORKERS_CURVE = (1, 2, 4)

#: One line per contender: the span its wall time covers (setup = done before, not timed).
TIMED_SPANS = {
    CKPTSTORE: "`ckptstore.load_rank(store, strategy, rank, workers=W)` + `.materialize()` (the reads, with W "
               "threads, and building every `mindspore.Parameter`); W = ckptstore's default here, other W: the "
               "rows `(Parameters built, workers=W)`; no setup",
    INDEX: "the same call as the `load_rank` row, default workers, on an index of the rank files "
           "(`ckptstore.index(src, out, strategy=[...])`, no checksums; made once, cached beside the converted "
           "store): its chunks are byte ranges in the rank files, read from there; no setup",
    INTO_NET: "`ckptstore.load_into_net(net, store, strategy=..., rank=...)` (default workers); setup: a Cell with "
              "the rank's Parameters (names, local shapes, dtypes), zero-filled (memory touched)",
    READ_RANK: "`ckptstore.read_rank(store, strategy, rank)` (numpy arrays, default workers); no setup",
    STEPS: "the `load_rank` row's work done call by call, each step timed (see \"Where the time goes\"), then "
           "planning once more on its own; its Parameters are dropped inside the span; no setup",
    BOUND: "one `os.preadv` of a file holding exactly the rank's bytes into one `np.empty` array (1 thread, 4 KiB "
           "pages: `NUMPY_MADVISE_HUGEPAGE=0`); no setup",
    BOUND_2T: "the same with the file split over 2 threads",
    MS_LDC: "`mindspore.load_distributed_checkpoint(net, rank files, predict_layout, train_strategy_filename=...)`; "
            "setup: the Cell of the target shapes (under `no_init_parameters`: unallocated) and the predict layout",
    MS_BY_RANK: "`rank_list_for_transform` + `transform_checkpoint_by_rank` (writes the rank's `.ckpt`) + "
                "`load_checkpoint` of it; no setup (builds no model)",
    MS_NEEDED: "`load_checkpoint` of every source file the rank needs (reading only, no slice cut); no setup",
    MS_SAFETENSORS: "`load_distributed_checkpoint(net, predict_strategy=..., format='safetensors', "
                    "unified_safetensors_dir=...)`; setup: the Cell (unallocated)",
}


@dataclass(frozen=True)
class LoadSetup:
    """Everything the contenders of one (checkpoint, target layout, rank) need."""

    synth: Synth
    dst: Mesh
    rank: int
    dst_strategy: str
    store: str
    names_file: str
    flat_file: str
    rank_nbytes: int
    out_dir: str
    #: set a real job's parallel context (``global_rank``) for load_distributed_checkpoint
    parallel_context: bool = False

    @property
    def rank_files(self) -> list[str]:
        return [str(p) for p in self.synth.rank_files]

    def params(self) -> dict[str, Any]:
        return {**self.synth.describe(), "dst": {"dp": self.dst.dp, "mp": self.dst.mp}, "dst_world": self.dst.world,
                "rank": self.rank, "rank_nbytes": self.rank_nbytes, "store": self.store,
                "dst_strategy": self.dst_strategy}


def target_files(s: Synth, dst: Mesh, rank: int) -> tuple[str, str, Path]:
    """The target strategy file, the converted store and the names file of ``rank`` (the
    tensors it holds), made once and cached beside the checkpoint."""
    from benchmarks.contenders import write_names_file
    from benchmarks.synth import cache_lock

    strategy = str(s.target_strategy(dst))
    store = str(s.store())
    names = s.root / "flat" / f"{dst.tag}_rank{rank}.names.json"
    with cache_lock(s.root):
        if not names.exists():
            write_names_file(names, store, strategy, rank)
    return strategy, store, names


def make_setup(s: Synth, dst: Mesh, rank: int) -> LoadSetup:
    """Prepare (and cache) the target strategy, store, names file and flat file for ``rank``."""
    strategy, store, names = target_files(s, dst, rank)
    flat = s.flat_file(dst, rank, names)
    out_dir = s.root / f"out_{os.getpid()}"  # per run: two runs may share the cache
    out_dir.mkdir(exist_ok=True)
    return LoadSetup(s, dst, rank, strategy, store, str(names), str(flat), flat.stat().st_size, str(out_dir))


def default_workers(st: LoadSetup) -> int:
    """ckptstore's default ``workers`` for this setup's store on this machine (``RankPlan.workers``
    of ``ckptstore.plan_rank``: the store is local, so every local store's default)."""
    import ckptstore

    return int(ckptstore.plan_rank(st.store, st.dst_strategy, st.rank).workers)


def bound_threads(st: LoadSetup) -> int:
    """N of the N-thread bound: the cores the loader may use, i.e. the CPUs this process may run on
    (``os.sched_getaffinity``) capped by the threads ``load_rank`` reads with by default
    (:func:`default_workers`). More
    threads than that copy no faster for ckptstore, so a bound using them would not be one it can reach."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, default_workers(st)))


def bound_name(threads: int) -> str:
    """The row of the ``threads``-thread preadv bound (``numpy preadv, 2 threads``)."""
    return f"numpy preadv, {threads} threads"


def nthread_bound(record: Mapping[str, Any]) -> str:
    """The contender the record judges ``load_rank`` against: the N-thread bound's row when it ran
    (N from the record's ``bound_threads``; records before it have the 2-thread row), else the
    single-thread bound (N = 1)."""
    n = record.get("params", {}).get("bound_threads", 2)
    name = bound_name(n) if n > 1 else BOUND
    return name if name in record.get("summary", {}) else BOUND


def workers_name(workers: int) -> str:
    """The row of ``load_rank`` with ``workers`` threads (other than the default's)."""
    return f"{CKPTSTORE[:-1]}, workers={workers})"


# ---------------------------------------------------------------------------------------------
# the contenders of this scenario (more can be registered by plug-ins, see registry.py)


def _ckptstore_args(st: LoadSetup, **more: Any) -> dict[str, Any]:
    return {"store": st.store, "strategy": st.dst_strategy, "rank": st.rank, "names_file": st.names_file, **more}


@register("load")
def _ckptstore_load_rank(st: LoadSetup) -> Contender:
    return Contender(CKPTSTORE, MODULE, "ckptstore_load_rank", _ckptstore_args(st, workers=default_workers(st)),
                     preimport=CKPTSTORE_PREIMPORT, check="check_ckptstore")


@register("load")
def _ckptstore_load_rank_index(st: LoadSetup) -> Contender:
    """``load_rank`` as the main row, on an index of the same rank files instead of the converted store."""
    try:
        index = str(st.synth.index_store())
    except Exception as e:  # ckptstore refused to index the files: say so in the table
        return Contender(INDEX, MODULE, "ckptstore_load_rank", unavailable=(
            f"ckptstore.index of the rank files failed: {type(e).__name__}: {e}"))
    return Contender(INDEX, MODULE, "ckptstore_load_rank",
                     {**_ckptstore_args(st, workers=default_workers(st)), "store": index},
                     preimport=CKPTSTORE_PREIMPORT, check="check_ckptstore")


@register("load")
def _ckptstore_load_rank_workers(st: LoadSetup) -> list[Contender]:
    """The workers curve: ``load_rank`` with 1, 2 and 4 threads (the default's row is the main one)."""
    return [Contender(workers_name(w), MODULE, "ckptstore_load_rank", _ckptstore_args(st, workers=w),
                      preimport=CKPTSTORE_PREIMPORT, check="check_ckptstore")
            for w in WORKERS_CURVE if w != default_workers(st)]


@register("load")
def _ckptstore_load_into_net(st: LoadSetup) -> Contender:
    return Contender(INTO_NET, MODULE, "ckptstore_load_into_net", _ckptstore_args(st), setup="setup_target_net",
                     preimport=CKPTSTORE_PREIMPORT, check="check_into_net")


@register("load")
def _ckptstore_read_rank(st: LoadSetup) -> Contender:
    return Contender(READ_RANK, MODULE, "ckptstore_read_rank", _ckptstore_args(st, workers=default_workers(st)),
                     preimport=("ckptstore",), check="check_ckptstore")


@register("load")
def _ckptstore_load_rank_steps(st: LoadSetup) -> Contender:
    """The ``load_rank`` row's work call by call, each step timed: where its time goes."""
    return Contender(STEPS, "benchmarks.load_profile", "ckptstore_load_rank_steps",
                     _ckptstore_args(st, workers=default_workers(st)), preimport=CKPTSTORE_PREIMPORT)


@register("load")
def _bound(st: LoadSetup) -> list[Contender]:
    """The single-thread bound and the N-thread one (N = :func:`bound_threads`; none when N = 1)."""
    args = {"path": st.flat_file, "nbytes": st.rank_nbytes, "names_file": st.names_file}
    out = [Contender(BOUND, MODULE, "pread_flat", args, preimport=("numpy",), check="check_flat")]
    n = bound_threads(st)
    if n > 1:
        out.append(Contender(bound_name(n), MODULE, "pread_flat", {**args, "threads": n}, preimport=("numpy",),
                             check="check_flat"))
    return out


@register("load")
def _ms_load_distributed(st: LoadSetup) -> Contender:
    return Contender(MS_LDC, MODULE, "ms_load_distributed",
                     {"rank_files": st.rank_files, "src_strategy": str(st.synth.strategy),
                      "dst_strategy": st.dst_strategy, "names_file": st.names_file,
                      "parallel_context": [st.dst.world, st.rank] if st.parallel_context else None},
                     setup="setup_ms_load_distributed", preimport=MS, check="check_net",
                     env={"RANK_ID": str(st.rank)})


@register("load")
def _ms_transform_by_rank(st: LoadSetup) -> Contender:
    return Contender(MS_BY_RANK, MODULE, "ms_transform_by_rank",
                     {"rank": st.rank, "rank_files": st.rank_files, "src_strategy": str(st.synth.strategy),
                      "dst_strategy": st.dst_strategy, "out_dir": st.out_dir, "names_file": st.names_file},
                     preimport=MS, check="check_transformed")


@register("load")
def _ms_load_needed_files(st: LoadSetup) -> Contender:
    return Contender(MS_NEEDED, MODULE, "ms_load_needed_files",
                     {"rank": st.rank, "rank_files": st.rank_files, "src_strategy": str(st.synth.strategy),
                      "dst_strategy": st.dst_strategy, "names_file": st.names_file},
                     preimport=MS, check="check_files")


@register("load")
def _ms_load_distributed_safetensors(st: LoadSetup) -> Contender:
    name = MS_SAFETENSORS
    try:
        unified = str(st.synth.unified_dir())
    except Exception as e:  # MindSpore's converter refused the files: say so in the table
        return Contender(name, MODULE, "ms_load_distributed_safetensors", unavailable=(
            f"ckpt_to_safetensors + unified_safetensors failed while preparing its input: {type(e).__name__}: {e}"))
    return Contender(name, MODULE, "ms_load_distributed_safetensors",
                     {"unified_dir": unified, "dst_strategy": st.dst_strategy, "names_file": st.names_file},
                     setup="setup_ms_load_distributed_safetensors", preimport=MS, check="check_net",
                     env={"RANK_ID": str(st.rank)})


# ---------------------------------------------------------------------------------------------


def quick_skipped() -> tuple[str, ...]:
    """Contenders ``--quick`` leaves out (variants of rows it keeps), so the smoke test stays short."""
    try:
        from benchmarks.peers import DCP_1T
    except ImportError:
        DCP_1T = "torch DCP dcp.load, 1 torch thread (OMP_NUM_THREADS=1)"
    return (DCP_1T, MS_NEEDED)


def read_paths(st: LoadSetup, contenders: Sequence[Contender]) -> list[str]:
    """Every file a contender reads: warmed once before a warm run, so no one pays a cold read.

    That is the rank files, the flat file, every store a contender names (the converted store,
    the index) and the peers' checkpoints; for an index, also every rank file it points into
    (the synthetic checkpoint's own rank files, unless the index was made elsewhere)."""
    roots = [st.store, *(c.args[k] for c in contenders for k in ("store", "ckpt", "unified_dir") if k in c.args)]
    roots = list(dict.fromkeys(roots))
    files = [str(p) for r in roots for p in sorted(Path(r).rglob("*")) if p.is_file()]
    pointed = [f for r in roots for f in index_source_files(r)]
    return list(dict.fromkeys([*st.rank_files, st.flat_file, *files, *pointed]))


def index_source_files(store: str | os.PathLike[str]) -> list[str]:
    """The rank files an index store reads from (its ``source_root`` + ``source_files``); ``[]``
    for any other store."""
    import json

    manifest = Path(store) / "ckptstore.json"
    try:
        doc = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if doc.get("kind") != "index" or "://" in str(doc.get("source_root", "://")):
        return []  # not an index, or rank files in a bucket (nothing to warm here)
    root = Path(doc["source_root"])
    root = root if root.is_absolute() else Path(store).resolve() / root
    return [os.path.normpath(root / key) for key in doc.get("source_files", {})]


def only(contenders: Sequence[Contender], wanted: Sequence[str] | None) -> list[Contender]:
    """The contenders whose name holds one of ``wanted`` (every one when ``None``)."""
    return [c for c in contenders if wanted is None or any(w in c.name for w in wanted)]


#: The rows ``--base`` repeats with the other revision's ckptstore.
BASE_ROWS = (CKPTSTORE, READ_RANK, STEPS)


def base_rows(contenders: Sequence[Contender], tree: Path, rev: str) -> list[Contender]:
    """``[base REV]`` copies of :data:`BASE_ROWS`: the same calls on the same store, importing the
    ckptstore of ``tree`` (a revision's ``ckptstore/`` folder, :func:`benchmarks.bench_versions.extract`)."""
    harness_dir = Path(__file__).resolve().parent.parent
    env = {"PYTHONPATH": f"{tree}{os.pathsep}{harness_dir}", "PYTHONSAFEPATH": "1"}
    return [dataclasses.replace(c, name=f"{c.name} [base {rev[:7]}]", env={**c.env, **env})
            for c in contenders if c.name in BASE_ROWS]


def run(st: LoadSetup, *, reps: int, baseline_reps: int | None, command: str, results_dir: Path | None,
        quick: bool = False, cold: bool = False, base: str | None = None,
        wanted: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the scenario and return its record (appended to ``results_dir/load.json``, or
    ``load-cold.json`` when ``cold``: the page cache dropped before every measured run).

    ``base`` (a revision of this repository) adds the :data:`BASE_ROWS` again with that
    revision's ckptstore, old and new measured in one run; ``wanted`` keeps only the rows whose
    name holds one of its strings."""
    contenders = only(contenders_for("load", st), wanted)
    skipped = [c.name for c in contenders if quick and c.name in quick_skipped()]
    contenders = [c for c in contenders if c.name not in skipped]
    if baseline_reps is not None:
        contenders = [dataclasses.replace(c, reps=baseline_reps) if c.name.startswith("mindspore") else c
                      for c in contenders]
    try:
        if base is not None:
            from benchmarks.bench_versions import extract

            tree = Path(st.out_dir) / "base"
            contenders += base_rows(contenders, tree, extract(base, Path(__file__).resolve().parent.parent, tree))
        return run_benchmark(COLD_NAME if cold else NAME, contenders, reps=reps, cold=cold,
                             warm_paths=[] if cold else read_paths(st, contenders),
                             evict_paths=read_paths(st, contenders) if cold else (),
                             params={**st.params(), "quick": quick, "quick_skipped": skipped, "base": base,
                                     "default_workers": default_workers(st), "bound_threads": bound_threads(st)},
                             command=command, results_dir=results_dir, keep_going=True, timeout=1800)
    finally:
        shutil.rmtree(st.out_dir, ignore_errors=True)


COLUMNS = (Column("wall_s", "wall", "s"), Column("setup_s", "setup (not timed)", "s", ratio=False),
           Column("peak_above_start", "peak RSS above start", "B"),
           Column("rchar", "bytes read (rchar)", "B"), Column("read_bytes", "read_bytes", "B", ratio=False))


def same_values(record: Mapping[str, Any], reference: str = CKPTSTORE) -> Any:
    """Column function: does a contender's digest equal the reference's?"""
    checks = record.get("checks", {})
    ref = checks.get(reference, {}).get("digest")

    def cell(name: str) -> str:
        c = checks.get(name)
        if not c:
            return "–"
        if "digest" not in c:
            return f"n/a ({c.get('files', '?')} source files)"
        if c.get("missing_or_misshapen"):
            return f"**no**: {c['missing_or_misshapen']} tensors missing or misshapen"
        if c.get("param_not_load") or c.get("ckpt_not_load"):
            return (f"**no**: {c.get('param_not_load', 0)} network / {c.get('ckpt_not_load', 0)} store parameters "
                    f"not loaded ({c.get('not_loaded_names', '')})")
        return "yes" if c["digest"] == ref else "**no** (different values)"

    return cell


def fetched_cell(record: Mapping[str, Any]) -> Any:
    """Column function: what a ckptstore route says it fetched (``ckptstore.io_counts()`` after the
    call: read calls and bytes, memory-mapped copies included, which ``rchar`` does not count)."""
    checks = record.get("checks", {})

    def cell(name: str) -> str:
        c = checks.get(name, {})
        if c.get("bytes_fetched") is None:
            return "–"
        return f"{format_bytes(c['bytes_fetched'])} in {c['requests']:,} reads"

    return cell


def table(record: Mapping[str, Any]) -> str:
    """The scenario's Markdown table (ratios against ckptstore, the lower bound and the N-thread one)."""
    bases = list(dict.fromkeys(b for b in (CKPTSTORE, BOUND, nthread_bound(record)) if b in record["summary"]))
    labels = {**LABELS, nthread_bound(record): f"{record['params'].get('bound_threads', 2)}-thread bound"}
    return markdown_table(record, columns=COLUMNS, baselines=bases, labels=labels,
                          extra={"fetched (ckptstore.io_counts)": fetched_cell(record),
                                 "same values as ckptstore": same_values(record)})


def cache_phrase(record: Mapping[str, Any]) -> str:
    """``warm page cache`` or ``cold page cache``, as the heading of a load section says it."""
    if record.get("cache") == "cold":
        how = record.get("cold_method") or "drop_caches"
        return f"cold page cache (dropped before every measured run: {how})"
    return "warm page cache (every file read once before the runs)"


def render(record: Mapping[str, Any], *, standalone: bool = True) -> str:
    """``load.md``: what was run, on what, and the table (``standalone=False``: a REPORT.md section)."""
    p = record["params"]
    lines = [
        f"## Load one target rank: {p['src_world']} → {p['dst_world']} cards, rank {p['rank']}, "
        f"{cache_phrase(record)}",
        "",
        *run_lines(record, standalone),
        dataset_line(p),
        "",
        table(record),
        "",
        "Cells: median (min–max) over runs; ratios compare medians. `× ckptstore` is against "
        f"`{CKPTSTORE}`, `× bound` against `{BOUND}`, `× {p.get('bound_threads', 2)}-thread bound` against "
        f"`{nthread_bound(record)}`. `wall` is the timed span only; `setup (not timed)` "
        "is what the worker did before it, unmeasured (building the model or state dict the load fills, "
        "the target layout, a process group): every route is timed from \"a model with the target shapes "
        "exists\" to \"its tensors are filled\". Peak RSS is measured from after the imports and the "
        "setup (a prebuilt model's memory is not in it). `rchar` counts `read`/`pread` calls only: bytes "
        "copied out of memory-mapped files are not in it (the `fetched` column is what ckptstore's routes "
        "say they read, `ckptstore.io_counts()` after the call; the safetensors route maps every file it "
        "reads, so its `rchar` is only headers).",
        "",
        *bound_lines(record),
        *dcp_lines(record),
        *steps_lines(record),
        *index_lines(record),
        *workers_curve(record),
        *timed_span_lines(record),
    ]
    if p.get("quick_skipped"):
        lines += ["", "Quick mode left out: " + ", ".join(f"`{n}`" for n in p["quick_skipped"]) + "."]
    if standalone and any(c["name"].startswith("mindspore") for c in record.get("contenders", [])):
        lines += ["", *mindspore_notes()]
    lines += not_run_notes(record)
    return "\n".join(lines) + "\n"


def bound_verdict(record: Mapping[str, Any]) -> tuple[float, float, bool] | None:
    """``(load_rank's median wall, the N-thread bound's, met?)``: is warm ``load_rank`` (default
    workers) within :data:`LOAD_VS_BOUND_NT` of the N-thread bound? ``None`` if either did not run."""
    s, nt = record["summary"], nthread_bound(record)
    if CKPTSTORE not in s or nt not in s:
        return None
    a, b = s[CKPTSTORE]["wall_s"]["median"], s[nt]["wall_s"]["median"]
    return a, b, a <= LOAD_VS_BOUND_NT * b


def bound_lines(record: Mapping[str, Any]) -> list[str]:
    """The bound of this machine and the verdict: ``load_rank`` against the N-thread ``preadv`` bound
    (N = the cores the loader may use), beside the single-thread one."""
    v = bound_verdict(record)
    if v is None:
        return []
    a, b, met = v
    s, n, nt = record["summary"], record["params"].get("bound_threads", 2), nthread_bound(record)
    one = s.get(BOUND, {}).get("wall_s", {}).get("median")
    # the target is for a warm cache: cold, the bound's threads wait on the disk, not on copying
    judged = f" (target ≤ {LOAD_VS_BOUND_NT}×: {'met' if met else '**MISSED**'})" if record.get("cache") != "cold" \
        else " (the target is for a warm page cache: not judged cold)"
    text = (f"The bound here: `{nt}` (N = {n}: the cores the loader may use, its default workers capped by the "
            f"CPUs this process may run on) {format_seconds(b)}"
            + (f", `{BOUND}` {format_seconds(one)} ({one / b:.2f}× the N-thread one)" if one else "") + ". "
            f"`{CKPTSTORE}` {format_seconds(a)} = **{a / b:.2f}× the N-thread bound**{judged}"
            + (f", {a / one:.2f}× the single-thread one" if one else "") + " (medians of one run).")
    busy = record.get("foreign_cpu_cores", 0)
    if busy > 0.2:  # the N threads of the bound compete with them too
        text += f" Other processes kept {busy:.2f} cores busy: an N-thread bound on a loaded machine is slowed too."
    return [text, ""]


#: Issue 36: with a cold page cache, ``load_rank`` at most this many times the fastest DCP row.
COLD_VS_DCP = 0.8


def dcp_lines(record: Mapping[str, Any]) -> list[str]:
    """``load_rank`` against the fastest PyTorch DCP row, judged (≤ :data:`COLD_VS_DCP`) when cold."""
    from benchmarks.targets import fastest_dcp

    s = record["summary"]
    dcp = fastest_dcp(s)
    if dcp is None or CKPTSTORE not in s:
        return []
    a, b = s[CKPTSTORE]["wall_s"]["median"], s[dcp]["wall_s"]["median"]
    cold = record.get("cache") == "cold"
    judged = f" (target ≤ {COLD_VS_DCP}× cold: {'met' if a <= COLD_VS_DCP * b else '**MISSED**'})" if cold else ""
    return [f"Against PyTorch DCP: `{CKPTSTORE}` {format_seconds(a)} vs `{dcp}` {format_seconds(b)} (the faster DCP "
            f"row; medians of one run) = **{a / b:.2f}×**{judged}.", ""]


def step_medians(record: Mapping[str, Any], name: str = STEPS) -> dict[str, float]:
    """Median over the runs of each figure the step-by-step row ``name`` returned (``{step}_s``,
    ``{step}_cpu_s``, :func:`benchmarks.load_profile.ckptstore_load_rank_steps`); ``{}`` if it did not run."""
    runs = [s["returned"] for s in record.get("samples", [])
            if s.get("contender") == name and isinstance(s.get("returned"), Mapping)]
    keys = list(dict.fromkeys(k for r in runs for k in r))
    return {k: statistics.median(r[k] for r in runs if k in r) for k in keys}


def steps_lines(record: Mapping[str, Any]) -> list[str]:
    """Where ``load_rank``'s time goes: each step's wall and CPU time (for every step-by-step row:
    this revision's and ``--base``'s), the reads alone against the N-thread bound, and what the
    single-thread steps leave of the target (the measured cause)."""
    from benchmarks.load_profile import LOAD_STEPS

    rows = {c["name"]: step_medians(record, c["name"]) for c in record.get("contenders", [])
            if c["name"].startswith(STEPS)}
    rows = {n: m for n, m in rows.items() if all(f"{k}_s" in m for k in LOAD_STEPS)}
    if STEPS not in rows:
        return []
    heads = " | ".join(f"`{n}` wall / CPU" for n in rows)
    lines = [f"Where the time goes (`{STEPS}`: the `{CKPTSTORE}` row's calls one by one; medians over the runs):", "",
             f"| step | {heads} | what it is |", "|---|" + "---|" * len(rows) + "---|"]

    def cells(key: str) -> str:
        return " | ".join(f"{format_seconds(m[f'{key}_s'])} / {format_seconds(m[f'{key}_cpu_s'])}"
                          if f"{key}_s" in m else "–" for m in rows.values())

    for k, what in LOAD_STEPS.items():
        lines.append(f"| {k} | {cells(k)} | {what} |")
        if k == "read":
            lines.append(f"| … of it planning | {cells('plan')} | `RankParameters.plan` timed again afterwards: "
                         "the plans the read step made before reading |")
    sums = " | ".join(f"{format_seconds(sum(m[f'{k}_s'] for k in LOAD_STEPS))} / "
                      f"{format_seconds(sum(m[f'{k}_cpu_s'] for k in LOAD_STEPS))}" for m in rows.values())
    lines += [f"| **sum** | {sums} | |", ""]
    n = record["params"].get("bound_threads", 2)
    nt = record["summary"].get(nthread_bound(record), {}).get("wall_s", {}).get("median")
    if nt and record.get("cache") != "cold":  # cold, the reads wait on the disk: no copy bound to share
        m = rows[STEPS]
        total = sum(m[f"{k}_s"] for k in LOAD_STEPS)
        reads = m["read_s"] - m.get("plan_s", 0.0)
        single = total - reads  # open, layout, planning, Parameters: one thread running Python
        lines += [f"The pool's reads alone (read − planning) take {format_seconds(reads)} = **{reads / nt:.2f}× "
                  f"the N-thread bound** ({format_seconds(nt)}); the steps one thread runs in Python (open, layout, "
                  f"planning, Parameters) take {format_seconds(single)}. The N-thread bound keeps all {n} cores "
                  f"copying, so even with that work hidden behind the copy a load takes at least the bound plus "
                  f"1/{n} of it, {format_seconds(nt + single / n)} = {(nt + single / n) / nt:.2f}× the bound; "
                  f"after the reads, as it runs (it needs the interpreter the readers need between their `preadv` "
                  f"calls), {format_seconds(nt + single)} = {(nt + single) / nt:.2f}×. {LOAD_VS_BOUND_NT}× leaves "
                  f"{format_seconds((LOAD_VS_BOUND_NT - 1) * nt)} for everything but the copy.", ""]
    return lines


def index_ratio(record: Mapping[str, Any]) -> tuple[float, float] | None:
    """Median walls of ``load_rank`` from the index and from the converted store, if both ran."""
    s = record["summary"]
    if INDEX not in s or CKPTSTORE not in s:
        return None
    return s[INDEX]["wall_s"]["median"], s[CKPTSTORE]["wall_s"]["median"]


def index_lines(record: Mapping[str, Any]) -> list[str]:
    """One line: ``load_rank`` from an index vs from the converted store (time ratio, same values?)."""
    walls = index_ratio(record)
    if walls is None:
        return []
    a, b = walls
    checks = record.get("checks", {})
    same = checks.get(INDEX, {}).get("digest") is not None and \
        checks.get(INDEX, {}).get("digest") == checks.get(CKPTSTORE, {}).get("digest")
    return [f"Index vs converted store: `{INDEX}` {format_seconds(a)} vs `{CKPTSTORE}` {format_seconds(b)} "
            f"(medians) = **{a / b:.3f}×**; values {'identical' if same else '**different**'} "
            f"(digest of every tensor of the rank).", ""]


def curve_points(record: Mapping[str, Any]) -> list[tuple[int, str]]:
    """``(workers, contender)`` of every ``load_rank`` row that ran, by workers."""
    points = {}
    for c in record.get("contenders", []):
        if c["name"].startswith(CKPTSTORE[:-1]) and c.get("func") == "ckptstore_load_rank" \
                and c["name"] in record["summary"] and c.get("args", {}).get("workers"):
            points.setdefault(int(c["args"]["workers"]), c["name"])
    return sorted(points.items())


def workers_curve(record: Mapping[str, Any]) -> list[str]:
    """A small table: ``load_rank`` (Parameters built) workers → median wall (and CPU time)."""
    points = curve_points(record)
    if not points:
        return []
    s = record["summary"]
    default = record["params"].get("default_workers")
    one = next((s[n]["wall_s"]["median"] for w, n in points if w == 1), None)
    lines = [f"`{CKPTSTORE}` over `workers` (threads reading; median of the runs):", "",
             "| workers | wall | CPU time | × workers=1 | × bound | × N-thread bound |", "|---|---|---|---|---|---|"]
    bound = s.get(BOUND, {}).get("wall_s", {}).get("median")
    nbound = s.get(nthread_bound(record), {}).get("wall_s", {}).get("median")
    for w, name in points:
        wall, cpu = s[name]["wall_s"]["median"], s[name]["cpu_s"]["median"]
        lines.append(f"| {w}{' (default)' if w == default else ''} | {format_seconds(wall)} | {format_seconds(cpu)} | "
                     f"{f'{wall / one:.2f}×' if one else '–'} | {f'{wall / bound:.2f}×' if bound else '–'} | "
                     f"{f'{wall / nbound:.2f}×' if nbound else '–'} |")
    return lines + [""]


def timed_span_lines(record: Mapping[str, Any]) -> list[str]:
    """One bullet per contender of the record: what its wall time covers."""
    spans = {**TIMED_SPANS, **_peer_spans()}
    lines = ["What each row times (one call in a fresh process, after its imports and its setup):"]
    for c in record.get("contenders", []):
        name = c["name"]
        base = name.rsplit(" [base ", 1)
        if name in spans:
            lines.append(f"- `{name}`: {spans[name]}")
        elif len(base) == 2 and base[0] in spans:
            lines.append(f"- `{name}`: as `{base[0]}`, with revision {base[1][:-1]}'s ckptstore (`--base`), "
                         "on the same store")
        elif name.startswith(CKPTSTORE[:-1]):
            lines.append(f"- `{name}`: as `{CKPTSTORE}`, with that many workers")
        elif name.startswith("numpy preadv, "):
            lines.append(f"- `{name}`: as `{BOUND}`, with the file split over that many threads")
    return lines


def _peer_spans() -> dict[str, str]:
    try:
        from benchmarks.peers import TIMED_SPANS as peer_spans
    except ImportError:
        return {}
    return dict(peer_spans)


def run_lines(record: Mapping[str, Any], standalone: bool) -> list[str]:
    """Command and machine (standalone), and how busy other processes kept the machine."""
    load = (f"other processes kept {record.get('foreign_cpu_cores', 0):.2f} cores busy on average during the run"
            + (f" (load average before: {', '.join(f'{x:.2f}' for x in record['loadavg']['before'])})"
               if record.get("loadavg") else ""))
    if not standalone:
        return [load[0].upper() + load[1:] + ".", ""]
    return [f"Command: `{record['command']}`", "", f"Machine: {machine_line(record)}; {load}.", ""]


def dataset_line(p: Mapping[str, Any]) -> str:
    return (f"Checkpoint: PanGu-Alpha-shaped, hidden {p['hidden']}, {p['layers']} layers, vocab {p['vocab']}, "
            f"fp32 weights + Adam moments = {format_bytes(p['model_bytes'])} of global tensors "
            f"({p['params']} parameters), saved by MindSpore on {p['src_world']} ranks "
            f"(dp{p['src']['dp']}×mp{p['src']['mp']}, optimizer sharding): rank files "
            f"{format_bytes(p['rank_file_bytes'])}. Target: dp{p['dst']['dp']}×mp{p['dst']['mp']}, rank {p['rank']} "
            f"holds {format_bytes(p['rank_nbytes'])} (the bytes every ratio to the bound is about).")


def mindspore_notes() -> list[str]:
    """How the MindSpore routes were called (one bullet each)."""
    from benchmarks.contenders import MEMORY_CHECK_NOTE

    return [
        "- `load_distributed_checkpoint` gets a Cell declaring the target rank's Parameters (target shapes, "
        "built in the untimed setup under `no_init_parameters`, so the Cell itself costs no memory and the "
        "memory measured is the load's), every source rank file, the "
        "source strategy as `train_strategy_filename`, and the target layout as `predict_strategy` in the form "
        "`model.infer_predict_layout` returns (built from the target strategy file with "
        "`mindspore.parallel.build_searched_strategy`, also in the setup). Without `init()`, `get_rank()` "
        "returns `RANK_ID`, "
        "which the harness sets. The safetensors route is `load_distributed_checkpoint(net, "
        "predict_strategy=<target strategy file>, format='safetensors', unified_safetensors_dir=...)` on the "
        "output of `ckpt_to_safetensors` + `unified_safetensors` (made once, not timed here; timed in the "
        "convert scenario).",
        "- " + MEMORY_CHECK_NOTE,
    ]


def not_run_notes(record: Mapping[str, Any]) -> list[str]:
    """Full reasons for contenders that did not run or failed (the table shows one line)."""
    from benchmarks.report import last_error_line

    out = []
    for name, why in record.get("unavailable", {}).items():
        out += ["", f"- `{name}` did not run: {one_line(why, 1500)}"]
    for name, why in record.get("failed", {}).items():
        out += ["", f"- `{name}` failed: {one_line(last_error_line(why), 1500)} (traceback in the JSON record)"]
    return out


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The options every scenario on a synthetic checkpoint takes: its size and source layout,
    the seed, repetitions."""
    ap.add_argument("--size", default="1GB", help="global tensor bytes of the model (1GB = 10^9 B)")
    ap.add_argument("--src-world", default="8", help="source ranks (8 = dp2×mp4) or DPxMP")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)


def add_load_args(ap: argparse.ArgumentParser) -> None:
    """The options of a load scenario: :func:`add_model_args`, the target layout and rank."""
    add_model_args(ap)
    ap.add_argument("--dst-world", default="4", help="target ranks (4 = dp1×mp4) or DPxMP")
    ap.add_argument("--rank", type=int, default=0, help="target rank to load")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_load", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_args(ap)
    ap.add_argument("--baseline-reps", type=int, default=None, help="cap the MindSpore routes' repetitions")
    ap.add_argument("--cold", action="store_true",
                    help="drop the page cache before every measured run (every file read, with posix_fadvise, "
                         "where /proc/sys/vm/drop_caches is not writable); "
                         "writes load-cold.json / load-cold.md")
    ap.add_argument("--base", metavar="REV",
                    help="also run the load_rank, read_rank and step-by-step rows with revision REV's ckptstore "
                         "(git archive of its ckptstore/ folder), old and new in one run")
    ap.add_argument("--only", metavar="A,B", type=lambda v: [w for w in v.split(",") if w],
                    help="run only the rows whose name holds one of these strings (e.g. 'ckptstore,preadv,DCP')")
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    return ap.parse_args(argv)


def cold_unavailable() -> str | None:
    """Why ``--cold`` cannot run here, or ``None``: it drops the whole page cache where
    ``/proc/sys/vm/drop_caches`` is writable, else evicts the files the contenders read with
    ``posix_fadvise(DONTNEED)``, which any user may do on files they can open."""
    if not os.access("/proc/sys/vm/drop_caches", os.W_OK) and not hasattr(os, "posix_fadvise"):
        return "--cold needs a writable /proc/sys/vm/drop_caches or posix_fadvise; run warm instead"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.data import parse_size
    from benchmarks.synth import parse_mesh, synth

    args = parse_args(argv)
    if args.cold and cold_unavailable():
        print(f"error: {cold_unavailable()}", file=sys.stderr)
        return 2
    s = synth(parse_size(args.size), parse_mesh(args.src_world, source=True), args.seed)
    st = make_setup(s, parse_mesh(args.dst_world, source=False), args.rank)
    return run_and_publish(lambda: run(st, reps=args.reps, baseline_reps=args.baseline_reps,
                                       command=command_line("benchmarks.bench_load", argv),
                                       results_dir=args.results_dir, cold=args.cold, base=args.base,
                                       wanted=args.only), render, args.results_dir,
                           COLD_NAME if args.cold else NAME)


if __name__ == "__main__":
    sys.exit(main())


# ---------------------------------------------------------------------------------------------
# which target ranks each MindSpore route reaches (values compared, not timed)

REACH_ROUTES = (_ms_load_distributed, _ms_load_distributed_safetensors, _ms_transform_by_rank)

_LDC_WHY = ("without init() load_distributed_checkpoint cuts for RANK_ID but picks source slices for global rank 0 "
            "(stand-alone mode), so ranks other than 0 get rank 0's slices where the layouts split an axis alike; "
            "a job's parallel context (set_auto_parallel_context(global_rank=r)) fixes it")
#: Why a route loads other values than ckptstore for a rank, in one line (REPORT.md says it at length).
REACH_WHY = {MS_LDC: _LDC_WHY}


def reach_line(rank: int, route: str, same: bool) -> str:
    """The console line of one reach check; a route with other values than ckptstore's says why."""
    if same:
        return f"  reach rank {rank} {route:<40} same values"
    why = REACH_WHY.get(route, 'not explained yet: compare its values by hand (REPORT.md, "Which target ranks '
                               'each MindSpore route reaches")')
    return f"  reach rank {rank} {route:<40} DIFFERENT values: {why}"


def reach(s: Synth, dst: Mesh, ranks: Sequence[int] | None = None, *,
          routes: Sequence[Any] = REACH_ROUTES, log: Any = None) -> dict[str, Any]:
    """For each target rank, does each MindSpore route load the same values as ckptstore?

    Runs every route once per rank (fresh process, ``RANK_ID`` set) and compares the digest of
    what it loaded with ckptstore's for that rank (computed here, numpy only). Returns
    ``{"ranks": [...], "routes": {name: {"same": [...], "different": [...], "failed": {rank: error}}}}``.
    """
    import ckptstore
    from benchmarks.contenders import check_params
    from benchmarks.harness import run_contender
    from benchmarks.report import last_error_line

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    chosen = list(range(dst.world)) if ranks is None else list(ranks)
    results: dict[str, dict[str, Any]] = {}
    for r in chosen:
        st = make_setup(s, dst, r)
        ref = check_params(ckptstore.read_rank(st.store, st.dst_strategy, r), names_file=st.names_file)["digest"]
        for factory in routes:
            c = factory(st)
            entry = results.setdefault(c.name, {"same": [], "different": [], "failed": {}})
            if c.unavailable:
                entry["failed"][r] = c.unavailable
                continue
            try:
                got = run_contender(c, timeout=1800)["check"]["digest"]
            except BenchmarkError as e:
                entry["failed"][r] = last_error_line(str(e))
                continue
            entry["same" if got == ref else "different"].append(r)
            log(reach_line(r, c.name, got == ref))
        shutil.rmtree(st.out_dir, ignore_errors=True)
    return {"ranks": chosen, "routes": results, "params": {**s.describe(), "dst": {"dp": dst.dp, "mp": dst.mp}}}


def render_reach(rec: Mapping[str, Any]) -> str:
    """A table: route, ranks with ckptstore's values, ranks with other values, failures."""
    p = rec["params"]
    lines = [f"Checked on a {format_bytes(p['model_bytes'])} model with the same layouts ({p['src_world']} → "
             f"dp{p['dst']['dp']}×mp{p['dst']['mp']}), target ranks {', '.join(map(str, rec['ranks']))}; "
             "`RANK_ID` set for each, no `init()`:", "",
             "| route | ranks with ckptstore's values | ranks with different values | failed |",
             "|---|---|---|---|"]
    for name, e in rec["routes"].items():
        failed = "; ".join(f"rank {r}: {one_line(str(w), 200)}" for r, w in e["failed"].items()) or "–"
        lines.append(f"| `{name}` | {', '.join(map(str, e['same'])) or 'none'} | "
                     f"{', '.join(map(str, e['different'])) or 'none'} | {failed} |")
    return "\n".join(lines) + "\n"
