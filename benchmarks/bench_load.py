"""Benchmark: "give me target rank r's tensors" (default: 8 → 4 cards, rank 0).

``python -m benchmarks.bench_load --size 1GB --src-world 8 --dst-world 4 --rank 0 --reps 3``

A synthetic PanGu-Alpha checkpoint (:mod:`benchmarks.synth`) saved by MindSpore on the source
layout is loaded as rank ``r`` of the target layout, by every route, each in a fresh process:

* ``ckptstore.load_rank``: Parameters built for every tensor, from the converted store (and
  again with ``workers=2``: large parameters' chunks read by two threads);
* ``ckptstore.loader.rank_view().read``: the same slices as numpy arrays (no MindSpore);
* ``lower bound: numpy preadv``: one ``os.preadv`` of a file holding exactly the rank's bytes
  into one preallocated array (``numpy preadv, 2 threads``: the same split over two threads);
* ``mindspore.load_distributed_checkpoint``: a Cell declaring the target shapes, every rank
  file, the target layout as ``predict_strategy``;
* ``mindspore.transform_checkpoint_by_rank + load_checkpoint``: the rank's file written from
  the source files ``rank_list_for_transform`` names, then loaded;
* ``mindspore.load_checkpoint (needed source files)``: only reading those source files;
* ``mindspore.load_distributed_checkpoint (safetensors)``: from the global tensors made by
  ``ckpt_to_safetensors`` + ``unified_safetensors`` (made once, outside the measurement).

Every route's values are digested after its measurement and compared with ckptstore's.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from benchmarks.harness import (
    RESULTS_DIR, BenchmarkError, Contender, command_line, run_benchmark, run_and_publish,
)
from benchmarks.registry import contenders_for, register
from benchmarks.report import Column, format_bytes, machine_line, markdown_table, one_line
from benchmarks.synth import Mesh, Synth

NAME = "load"
CKPTSTORE = "ckptstore.load_rank"
BOUND = "lower bound: numpy preadv"
LABELS = {CKPTSTORE: "ckptstore", BOUND: "bound"}
MODULE = "benchmarks.contenders"
MS = ("mindspore",)


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


def make_setup(s: Synth, dst: Mesh, rank: int) -> LoadSetup:
    """Prepare (and cache) the target strategy, store, names file and flat file for ``rank``."""
    from benchmarks.contenders import write_names_file
    from benchmarks.synth import cache_lock

    strategy = str(s.target_strategy(dst))
    store = str(s.store())
    names = s.root / "flat" / f"{dst.tag}_rank{rank}.names.json"
    with cache_lock(s.root):
        if not names.exists():
            write_names_file(names, store, strategy, rank)
    flat = s.flat_file(dst, rank)
    out_dir = s.root / f"out_{os.getpid()}"  # per run: two runs may share the cache
    out_dir.mkdir(exist_ok=True)
    return LoadSetup(s, dst, rank, strategy, store, str(names), str(flat), flat.stat().st_size, str(out_dir))


# ---------------------------------------------------------------------------------------------
# the contenders of this scenario (more can be registered by plug-ins, see registry.py)


@register("load")
def _ckptstore_load_rank(st: LoadSetup) -> Contender:
    return Contender(CKPTSTORE, MODULE, "ckptstore_load_rank",
                     {"store": st.store, "strategy": st.dst_strategy, "rank": st.rank, "names_file": st.names_file},
                     preimport=("mindspore", "ckptstore"), check="check_ckptstore")


@register("load")
def _ckptstore_load_rank_2workers(st: LoadSetup) -> Contender:
    # the default reads each parameter's chunks with 1 thread; this row shows what a second
    # thread for large parameters (>= 64 MiB) costs or gains
    return Contender(f"{CKPTSTORE} (workers=2)", MODULE, "ckptstore_load_rank",
                     {"store": st.store, "strategy": st.dst_strategy, "rank": st.rank, "names_file": st.names_file,
                      "workers": 2}, preimport=("mindspore", "ckptstore"), check="check_ckptstore")


@register("load")
def _ckptstore_rank_view(st: LoadSetup) -> Contender:
    return Contender("ckptstore.loader.rank_view().read (numpy)", MODULE, "ckptstore_rank_view",
                     {"store": st.store, "strategy": st.dst_strategy, "rank": st.rank, "names_file": st.names_file},
                     preimport=("ckptstore",), check="check_ckptstore")


@register("load")
def _bound(st: LoadSetup) -> list[Contender]:
    args = {"path": st.flat_file, "nbytes": st.rank_nbytes, "names_file": st.names_file}
    return [Contender(BOUND, MODULE, "pread_flat", args, preimport=("numpy",), check="check_flat"),
            Contender("numpy preadv, 2 threads", MODULE, "pread_flat", {**args, "threads": 2},
                      preimport=("numpy",), check="check_flat")]


@register("load")
def _ms_load_distributed(st: LoadSetup) -> Contender:
    return Contender("mindspore.load_distributed_checkpoint", MODULE, "ms_load_distributed",
                     {"rank_files": st.rank_files, "src_strategy": str(st.synth.strategy),
                      "dst_strategy": st.dst_strategy, "names_file": st.names_file,
                      "parallel_context": [st.dst.world, st.rank] if st.parallel_context else None},
                     preimport=MS, check="check_net", env={"RANK_ID": str(st.rank)})


@register("load")
def _ms_transform_by_rank(st: LoadSetup) -> Contender:
    return Contender("mindspore.transform_checkpoint_by_rank + load_checkpoint", MODULE, "ms_transform_by_rank",
                     {"rank": st.rank, "rank_files": st.rank_files, "src_strategy": str(st.synth.strategy),
                      "dst_strategy": st.dst_strategy, "out_dir": st.out_dir, "names_file": st.names_file},
                     preimport=MS, check="check_transformed")


@register("load")
def _ms_load_needed_files(st: LoadSetup) -> Contender:
    return Contender("mindspore.load_checkpoint (needed source files)", MODULE, "ms_load_needed_files",
                     {"rank": st.rank, "rank_files": st.rank_files, "src_strategy": str(st.synth.strategy),
                      "dst_strategy": st.dst_strategy, "names_file": st.names_file},
                     preimport=MS, check="check_files")


@register("load")
def _ms_load_distributed_safetensors(st: LoadSetup) -> Contender:
    name = "mindspore.load_distributed_checkpoint (safetensors)"
    try:
        unified = str(st.synth.unified_dir())
    except Exception as e:  # MindSpore's converter refused the files: say so in the table
        return Contender(name, MODULE, "ms_load_distributed_safetensors", unavailable=(
            f"ckpt_to_safetensors + unified_safetensors failed while preparing its input: {type(e).__name__}: {e}"))
    return Contender(name, MODULE, "ms_load_distributed_safetensors",
                     {"unified_dir": unified, "dst_strategy": st.dst_strategy, "names_file": st.names_file},
                     preimport=MS, check="check_net", env={"RANK_ID": str(st.rank)})


# ---------------------------------------------------------------------------------------------


def run(st: LoadSetup, *, reps: int, baseline_reps: int | None, command: str, results_dir: Path | None,
        quick: bool = False) -> dict[str, Any]:
    """Run the scenario and return its record (also appended to ``results_dir/load.json``)."""
    contenders = contenders_for("load", st)
    if baseline_reps is not None:
        contenders = [dataclasses.replace(c, reps=baseline_reps) if c.name.startswith("mindspore") else c
                      for c in contenders]
    try:
        return run_benchmark(NAME, contenders, reps=reps, warm_paths=[*st.rank_files, st.flat_file],
                             params={**st.params(), "quick": quick}, command=command, results_dir=results_dir,
                             keep_going=True, timeout=1800)
    finally:
        shutil.rmtree(st.out_dir, ignore_errors=True)


COLUMNS = (Column("wall_s", "wall", "s"), Column("peak_above_start", "peak RSS above start", "B"),
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
        return "yes" if c["digest"] == ref else "**no** (different values)"

    return cell


def mmap_cell(record: Mapping[str, Any]) -> Any:
    """Column function: bytes a ckptstore route copied out of memory maps (not counted in rchar)."""
    checks = record.get("checks", {})

    def cell(name: str) -> str:
        c = checks.get(name, {})
        if c.get("mmap_bytes") is None:
            return "–"
        return f"{format_bytes(c['mmap_bytes'])} (on {format_bytes(c['mmap_pages_bytes'])} of pages)"

    return cell


def table(record: Mapping[str, Any]) -> str:
    """The scenario's Markdown table (ratios against ckptstore and the lower bound)."""
    bases = [b for b in (CKPTSTORE, BOUND) if b in record["summary"]]
    return markdown_table(record, columns=COLUMNS, baselines=bases, labels=LABELS,
                          extra={"copied from mmap (not in rchar)": mmap_cell(record),
                                 "same values as ckptstore": same_values(record)})


def render(record: Mapping[str, Any], *, standalone: bool = True) -> str:
    """``load.md``: what was run, on what, and the table (``standalone=False``: a REPORT.md section)."""
    p = record["params"]
    lines = [
        f"## Load one target rank: {p['src_world']} → {p['dst_world']} cards, rank {p['rank']}",
        "",
        *run_lines(record, standalone),
        dataset_line(p),
        "",
        table(record),
        "",
        "Cells: median (min–max) over runs; ratios compare medians. `× ckptstore` is against "
        f"`{CKPTSTORE}`, `× bound` against `{BOUND}`. Peak RSS is measured from after the imports "
        "(MindSpore and ckptstore imported before the call). `rchar` counts `read`/`pread` calls only: "
        "bytes copied out of memory-mapped files are not in it (ckptstore maps a chunk when a slice is "
        "many short runs, e.g. a column slice — the next column estimates those bytes from its read "
        "plan; the safetensors route maps every file it reads, so its `rchar` is only headers).",
    ]
    if standalone:
        lines += ["", *mindspore_notes()]
    lines += not_run_notes(record)
    return "\n".join(lines) + "\n"


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
        "built under `no_init_parameters` so the Cell itself costs no memory), every source rank file, the "
        "source strategy as `train_strategy_filename`, and the target layout as `predict_strategy` in the form "
        "`model.infer_predict_layout` returns (built from the target strategy file with "
        "`mindspore.parallel.build_searched_strategy`). Without `init()`, `get_rank()` returns `RANK_ID`, "
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


def add_load_args(ap: argparse.ArgumentParser) -> None:
    """The options of a load scenario: checkpoint size and layouts, target rank, repetitions."""
    ap.add_argument("--size", default="1GB", help="global tensor bytes of the model (1GB = 10^9 B)")
    ap.add_argument("--src-world", default="8", help="source ranks (8 = dp2×mp4) or DPxMP")
    ap.add_argument("--dst-world", default="4", help="target ranks (4 = dp1×mp4) or DPxMP")
    ap.add_argument("--rank", type=int, default=0, help="target rank to load")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_load", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_args(ap)
    ap.add_argument("--baseline-reps", type=int, default=None, help="cap the MindSpore routes' repetitions")
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.data import parse_size
    from benchmarks.synth import parse_mesh, synth

    args = parse_args(argv)
    s = synth(parse_size(args.size), parse_mesh(args.src_world, source=True), args.seed)
    st = make_setup(s, parse_mesh(args.dst_world, source=False), args.rank)
    return run_and_publish(lambda: run(st, reps=args.reps, baseline_reps=args.baseline_reps,
                                       command=command_line("benchmarks.bench_load", argv),
                                       results_dir=args.results_dir), render, args.results_dir, NAME)


if __name__ == "__main__":
    sys.exit(main())


# ---------------------------------------------------------------------------------------------
# which target ranks each MindSpore route reaches (values compared, not timed)

REACH_ROUTES = (_ms_load_distributed, _ms_load_distributed_safetensors, _ms_transform_by_rank)


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
        view = ckptstore.loader.rank_view(ckptstore.open(st.store), st.dst_strategy, r)
        ref = check_params({n: view.read(n) for n in view.names()}, names_file=st.names_file)["digest"]
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
            log(f"  reach rank {r} {c.name:<40} {'same values' if got == ref else 'DIFFERENT values'}")
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
