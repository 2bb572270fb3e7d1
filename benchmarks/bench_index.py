"""Benchmark: ``ckptstore.index`` of a 130B-shaped checkpoint on 128 ranks, from its headers alone.

``python -m benchmarks.bench_index --model 130B --world 128 --reps 3`` (``--quick``: a small model
on 16 ranks; ``--profile``: add where the time goes)

The checkpoint is **sparse**: a PanGu-Alpha-shaped model (``ckptstore.testing.sample.pangu_specs``:
hidden 12288, 72 layers, vocab 50000, fp32 weights and both Adam moments) saved on 128 ranks as
dp16 × mp8 with optimizer sharding. Its strategy file is written by
``ckptstore.testing.sample_checkpoint.write_strategy`` (as the parallel compiler writes it). Every rank
file is a valid MindSpore ``.ckpt``: one ``Checkpoint.value`` record per parameter, in spec order
(as ``save_distributed`` saves them), each with the parameter's name, the full local dims, the
tensor type (``Float32``, ``Int32``) and a ``tensor_content`` of the *local slice's* byte length;
a slice over 512 MiB is cut into several consecutive records exactly as MindSpore's
``_write_parameter_bytes_data`` does. The local shape of each rank is the box the strategy file
gives it. Only the record headers are written: each payload is skipped with a seek and the
file is finished with ``os.truncate`` to its full size, so the payload is a hole (zeros) and the
~2.5 TB of rank files take a few MB each on disk. The writer (``benchmarks.fixtures``:
``rank_records``, ``write_sparse_file``) is checked byte for byte, before the files are written,
against ``mindspore.save_checkpoint`` and ckptstore's own ``.ckpt`` writer on a small model
(zero-filled tensors; ``check_wire_format``). Cached under ``benchmarks/cache/`` keyed by every parameter.

Measured, each in a fresh process (``benchmarks.harness``): ``ckptstore.index`` of the whole set
(no checksum) into a fresh folder (wall, CPU, peak RSS above start, bytes read, read calls); and
for scale ``ckptstore.open`` of that index (manifest read, parsed, validated, every rank file
stat-ed) and planning one target rank (``ckptstore.plan_rank(store, target, 0)`` for rank 0 of
dp8 × mp8 on 64 cards, ``sample.relayout``: the target strategy file read and every parameter's
reads planned; the store opened in the untimed setup). The plan row's bytes are set against the
rank files' (what ``mindspore.load_distributed_checkpoint`` reads in every process: it loads every
rank file whole). One unmeasured index run first warms the page cache with the headers (and
leaves the index the open and plan rows use). Sizes: the manifest (``ckptstore.json``: the whole
index) against the rank files' apparent size. Targets: index < 30 s, metadata < 0.1% of the rank files.

The index samples a few KiB of each slice to check the strategy describes the files
(its layout check); here those bytes are zeros, which it treats as uninformative and
skips, as it would a fresh optimizer moment. When the index takes longer than the target (or with
``--profile``) the run also records where the time goes: wall time per phase (one more index
run, ckptstore's functions wrapped with timers) and, with ``--profile``, a cProfile (one more; the
main thread and the worker threads' ``write_param`` calls, merged): ``benchmarks.index_profile``,
the one place that names ckptstore's internal functions.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from math import prod
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    RESULTS_DIR,
    WRITE_SIDE,
    BenchmarkError,
    Contender,
    command_line,
    run_and_publish,
    run_benchmark,
    run_contender,
)
from benchmarks.index_profile import PROFILE_TOP
from benchmarks.report import Column, format_bytes, format_seconds, markdown_table
from benchmarks.synth import CACHE_DIR, Mesh, cache_lock, parse_mesh

NAME = "index"
INDEX = "ckptstore.index (no checksum)"
OPEN = "ckptstore.open (the index)"
PLAN = "plan one target rank: ckptstore.plan_rank(store, target, rank)"
MODULE = "benchmarks.contenders"
#: Bump when the files' layout changes, so stale cached checkpoints are not reused.
GENERATOR_VERSION = 1
PREFIX, STEP_SUFFIX = "pangu", "-1_1"
PROFILE = "benchmarks.index_profile"  # the profiler: it wraps ckptstore's internals


@dataclass(frozen=True)
class Model:
    """PanGu-Alpha dimensions (``seq`` sizes the position embedding)."""

    label: str
    hidden: int
    layers: int
    vocab: int
    seq: int = 1024


MODELS = {
    "130B": Model("PanGu-Alpha-shaped 130B", 12288, 72, 50000),
    # --quick: 2 layers, but a word embedding of 586 MiB per rank, so it too is cut into 2 records
    "quick": Model("quick: PanGu-Alpha-shaped, 2 layers", 512, 2, 300000, 64),
}
#: What the targets are about: the 130B model on 128 ranks (dp16 × mp8).
JUDGED = ("130B", Mesh(16, 8))


def specs_for(model: Model, mesh: Mesh) -> list[Any]:
    """``pangu_specs`` on ``mesh`` (optimizer sharding on, Adam moments, counters), normalized as
    ``save_distributed`` normalizes them before saving."""
    from ckptstore.testing.sample import pangu_specs
    from ckptstore.testing.sample_checkpoint import normalize_spec

    return [normalize_spec(s) for s in pangu_specs(hidden=model.hidden, layers=model.layers, vocab=model.vocab,
                                                   seq=model.seq, dp=mesh.dp, mp=mesh.mp, opt_shard=True)]


# ---------------------------------------------------------------------------------------------
# the cached sparse checkpoint


@dataclass(frozen=True)
class Sparse:
    """One cached sparse checkpoint: ``ckpt/rank_<i>/pangu-1_1.ckpt`` and ``ckpt/strategy.ckpt``."""

    root: Path
    key: str
    model: Model
    mesh: Mesh

    @property
    def ckpt_dir(self) -> Path:
        return self.root / "ckpt"

    @property
    def strategy(self) -> Path:
        return self.ckpt_dir / "strategy.ckpt"

    @property
    def rank_files(self) -> list[Path]:
        return [self.ckpt_dir / f"rank_{r}" / f"{PREFIX}{STEP_SUFFIX}.ckpt" for r in range(self.mesh.world)]

    @property
    def index_store(self) -> Path:
        """The index the open and plan rows use (left by the warm-up run)."""
        return self.root / "index.ckptstore"

    def info(self) -> dict[str, Any]:
        """What the generator wrote (``ckpt/sparse.json``) plus the files as they are now."""
        info = json.loads((self.ckpt_dir / "sparse.json").read_text(encoding="utf-8"))
        stats = [p.stat() for p in self.rank_files]
        info.update(rank_file_bytes=sum(s.st_size for s in stats), largest_rank_file=max(s.st_size for s in stats),
                    allocated_bytes=sum(s.st_blocks * 512 for s in stats), rank_files=len(stats),
                    strategy_file_bytes=self.strategy.stat().st_size)
        return info

    def target_strategy(self, mesh: Mesh) -> Path:
        """The same parameters on ``mesh`` (``sample.relayout``, no optimizer sharding), cached."""
        from ckptstore.testing.sample import relayout
        from ckptstore.testing.sample_checkpoint import write_strategy

        path = self.root / "targets" / f"strategy_{mesh.tag}.ckpt"
        with cache_lock(self.root):
            if not path.exists():
                tmp = path.with_name(path.name + ".partial")
                write_strategy(tmp, relayout(specs_for(self.model, self.mesh), dp=mesh.dp, mp=mesh.mp))
                os.replace(tmp, path)
        return path


def sparse_checkpoint(model_key: str, mesh: Mesh, *, cache_dir: Path = CACHE_DIR,
                      log: Callable[[str], None] | None = None) -> Sparse:
    """The cached sparse checkpoint of ``MODELS[model_key]`` on ``mesh``, written on first use."""
    model = MODELS[model_key]
    key = (f"sparse-pangu-v{GENERATOR_VERSION}-h{model.hidden}-l{model.layers}-v{model.vocab}-s{model.seq}-"
           f"{mesh.tag}")
    sp = Sparse(Path(cache_dir) / key, key, model, mesh)
    with cache_lock(sp.root):
        if not (sp.ckpt_dir / "DONE").exists():
            _write_sparse(sp, log or (lambda msg: print(msg, file=sys.stderr, flush=True)))
    return sp


def _disk_needed(n_records: int) -> int:
    """An upper bound on the blocks the headers take: two 4 KiB blocks per record (a header may
    straddle a block boundary), plus the strategy and the partial index later."""
    return n_records * 8192 + (256 << 20)


def _write_sparse(sp: Sparse, log: Callable[[str], None]) -> None:
    from benchmarks.fixtures import (
        MINDSPORE_SLICE_BYTES,
        check_wire_format,
        load_layouts,
        rank_records,
        write_sparse_file,
    )
    from ckptstore.testing.sample import model_bytes
    from ckptstore.testing.sample_checkpoint import write_strategy

    t0 = time.perf_counter()
    sp.root.mkdir(parents=True, exist_ok=True)
    tmp = sp.root / "ckpt.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(sp.ckpt_dir, ignore_errors=True)
    try:
        check_wire_format(tmp / "wire_check", specs_for(Model("wire check", 64, 1, 64, 8), Mesh(2, 2)))
    except AssertionError as e:
        raise BenchmarkError(str(e)) from e
    shutil.rmtree(tmp / "wire_check")
    specs = specs_for(sp.model, sp.mesh)
    strategy = load_layouts(write_strategy(tmp / "strategy.ckpt", specs))
    boxes: dict[tuple[Any, ...], tuple[int, ...]] = {}
    first = rank_records(specs, strategy, 0, MINDSPORE_SLICE_BYTES, boxes)
    need, free = _disk_needed(len(first) * sp.mesh.world), shutil.disk_usage(sp.root).free
    log(f"  sparse checkpoint: {len(specs)} parameters, {len(first)} records per rank file, "
        f"{sp.mesh.world} files; disk free {format_bytes(free)}, needed at most {format_bytes(need)} "
        f"(headers only; apparent size ~{format_bytes(sp.mesh.world * sum(len(h) + n for h, n in first))})")
    if free < need + (2 << 30):
        raise BenchmarkError(f"not enough free disk for the sparse checkpoint's headers under {sp.root}: "
                             f"{format_bytes(free)} free, up to {format_bytes(need)} needed (+2 GiB kept free)")
    records = 0
    for r in range(sp.mesh.world):
        recs = first if r == 0 else rank_records(specs, strategy, r, MINDSPORE_SLICE_BYTES, boxes)
        path = tmp / f"rank_{r}" / f"{PREFIX}{STEP_SUFFIX}.ckpt"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_sparse_file(path, recs)
        records += len(recs)
    weights = sum(prod(s.shape) for s in specs if not s.name.startswith(("adam_", "global_step", "learning_rate")))
    info = {"model": asdict(sp.model), "mesh": {"dp": sp.mesh.dp, "mp": sp.mesh.mp}, "world": sp.mesh.world,
            "params": len(specs), "weights": weights, "model_bytes": model_bytes(specs), "records": records,
            "slice_bytes": MINDSPORE_SLICE_BYTES, "version": GENERATOR_VERSION,
            "generation_s": round(time.perf_counter() - t0, 3)}
    (tmp / "sparse.json").write_text(json.dumps(info), encoding="utf-8")
    os.sync()
    (tmp / "DONE").write_text("", encoding="utf-8")
    os.replace(tmp, sp.ckpt_dir)
    log(f"  wrote {records} records in {sp.mesh.world} sparse files in {info['generation_s']:.1f} s")


# ---------------------------------------------------------------------------------------------
# the scenario


@dataclass(frozen=True)
class IndexSetup:
    sparse: Sparse
    dst: Mesh
    rank: int
    dst_strategy: str
    out: Path  # the measured runs' output folder (removed before each run)


def make_setup(model_key: str, src: Mesh, dst: Mesh, rank: int, *,
               log: Callable[[str], None] | None = None) -> IndexSetup:
    sp = sparse_checkpoint(model_key, src, log=log)
    return IndexSetup(sp, dst, rank, str(sp.target_strategy(dst)), sp.root / f"index_out_{os.getpid()}")


def contenders(st: IndexSetup) -> list[Contender]:
    sp = st.sparse
    index_args = {"src_dir": str(sp.ckpt_dir), "strategy": str(sp.strategy), "out": str(st.out)}
    store_args = {"store": str(sp.index_store), "strategy": st.dst_strategy, "rank": st.rank}
    return [Contender(INDEX, MODULE, "ckptstore_index", index_args, preimport=WRITE_SIDE),
            Contender(OPEN, MODULE, "ckptstore_open", {"store": str(sp.index_store)}, preimport=("ckptstore",)),
            Contender(PLAN, MODULE, "ckptstore_plan_rank", store_args, setup="setup_open_store",
                      preimport=("ckptstore",))]


def _clear(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def run(st: IndexSetup, *, reps: int, command: str, results_dir: Path | None, quick: bool = False,
        profile: bool | None = None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Warm-up index run (leaves the index the open/plan rows read), then the measured runs.

    ``profile=True``: then time the index's phases and cProfile it (two more index runs);
    ``None``: time the phases only, and only when the index misses its target; ``False``: neither."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    sp = st.sparse
    cs = contenders(st)
    _clear(sp.index_store)
    warm = run_contender(Contender("warm-up", MODULE, "ckptstore_index",
                                   {**cs[0].args, "out": str(sp.index_store)}, preimport=WRITE_SIDE),
                         timeout=3600)
    log(f"  warm-up index run (not counted): {format_seconds(warm['wall_s'])}")
    try:
        record = run_benchmark(NAME, cs, reps=reps, warm_paths=[], params={}, command=command, results_dir=None,
                               keep_going=True, sync_before=True, before_each=lambda c: _clear(st.out), timeout=3600,
                               log=log)
    finally:
        _clear(st.out)
    info = sp.info()
    manifest = (sp.index_store / "ckptstore.json").stat().st_size
    record["params"] = {
        **info, "model_key": next(k for k, m in MODELS.items() if m == sp.model), "cache_key": sp.key,
        "root": str(sp.root), "dst": {"dp": st.dst.dp, "mp": st.dst.mp}, "dst_world": st.dst.world,
        "rank": st.rank, "quick": quick, "manifest_bytes": manifest, "index_store_bytes": _tree_bytes(sp.index_store),
        "warmup_wall_s": warm["wall_s"], "warmup_returned": warm.get("returned"),
        "judged": (next(k for k, m in MODELS.items() if m == sp.model), sp.mesh) == JUDGED,
    }
    median = record["summary"].get(INDEX, {}).get("wall_s", {}).get("median")
    from benchmarks.targets import INDEX_SPARSE_S

    if profile or (profile is None and median is not None and median > INDEX_SPARSE_S):
        log("  profiling the index (phases" + (", then cProfile)" if profile else ")"))
        record["profile"] = _profile(st, cs[0], ("phases", "cprofile") if profile else ("phases",))
    if results_dir is not None:
        from benchmarks.harness import append_result

        append_result(NAME, record, results_dir)
    return record


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def _profile(st: IndexSetup, index: Contender, kinds: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for what in kinds:
        _clear(st.out)
        try:
            m = run_contender(Contender(f"profile {what}", PROFILE, f"profile_{what}",
                                        dict(index.args), preimport=WRITE_SIDE), timeout=7200)
            out[what] = m["returned"]
            out[f"{what}_wall_s"] = m["wall_s"]
        except BenchmarkError as e:
            out[what] = {"error": str(e)[-2000:]}
        finally:
            _clear(st.out)
    return out


# ---------------------------------------------------------------------------------------------
# report

COLUMNS = (Column("wall_s", "wall", "s"), Column("cpu_s", "CPU time", "s", ratio=False),
           Column("setup_s", "setup (not timed)", "s", ratio=False),
           Column("peak_above_start", "peak RSS above start", "B", ratio=False),
           Column("rchar", "bytes read (rchar)", "B", ratio=False), Column("syscr", "read calls", "n", ratio=False))


def _returned_cell(record: Mapping[str, Any]) -> Any:
    got: dict[str, dict[str, Any]] = {}
    for s in record["samples"]:
        if isinstance(s.get("returned"), dict):
            got[s["contender"]] = s["returned"]
    files = record["params"]["rank_file_bytes"]

    def cell(name: str) -> str:
        r = got.get(name)
        if not r:
            return "–"
        if "output_bytes" in r:
            return (f"index {format_bytes(r['output_bytes'])} = {r['output_bytes'] / files:.5%} of the rank files; "
                    f"{r.get('chunks', 0):,} chunks")
        if "rank_bytes" in r:
            reads = (f"in {r['requests']:,} reads from {r['files']:,} rank files" if "requests" in r
                     else f"{r.get('chunk_reads', 0):,} chunk reads")  # a record from before plan_rank
            return (f"rank {record['params']['rank']} of {record['params']['dst_world']}: {r['params']:,} tensors, "
                    f"{format_bytes(r['rank_bytes'])} {reads} (load_distributed_checkpoint reads all "
                    f"{format_bytes(files)}: {files / max(r['rank_bytes'], 1):,.0f}×)")
        return "–"

    return cell


def dataset_lines(p: Mapping[str, Any]) -> list[str]:
    m = p["model"]
    return [
        f"Checkpoint (sparse, cached as `{p['cache_key']}`): {p.get('model_key')} = PanGu-Alpha-shaped, hidden "
        f"{m['hidden']}, {m['layers']} layers, vocab {m['vocab']}, seq {m['seq']}: {p['weights'] / 1e9:.1f} B weights, "
        f"fp32 weights + Adam moments = {format_bytes(p['model_bytes'])} of global tensors ({p['params']:,} "
        "parameters), "
        f"saved on {p['world']} ranks (dp{p['mesh']['dp']}×mp{p['mesh']['mp']}, optimizer sharding; the word and "
        f"position embeddings and their moments are replicated on every rank). Rank files: {p['rank_files']} × "
        f"`.ckpt`, {p['records']:,} records, **{format_bytes(p['rank_file_bytes'])} apparent** (largest "
        f"{format_bytes(p['largest_rank_file'])}), {format_bytes(p['allocated_bytes'])} allocated on disk (headers "
        f"only: the payload is a hole); strategy file {format_bytes(p['strategy_file_bytes'])}. Written once in "
        f"{format_seconds(p['generation_s'])}.",
        "",
        f"Index: `ckptstore.json` {p['manifest_bytes']:,} B = {format_bytes(p['manifest_bytes'])} = "
        f"**{p['manifest_bytes'] / p['rank_file_bytes']:.5%}** of the rank files' bytes. Warm-up index run (not "
        f"counted; it warms the page cache with the headers): {format_seconds(p['warmup_wall_s'])}. Target of the "
        f"plan row: dp{p['dst']['dp']}×mp{p['dst']['mp']} ({p['dst_world']} cards, `sample.relayout`), rank "
        f"{p['rank']}.",
    ]


def render(record: Mapping[str, Any], *, standalone: bool = True) -> str:
    from benchmarks import targets
    from benchmarks.bench_load import not_run_notes, run_lines

    p = record["params"]
    lines = [f"## Index a sparse checkpoint from its headers: {p.get('model_key')} on {p['world']} rank files "
             f"({format_bytes(p['rank_file_bytes'])})", "", *run_lines(record, standalone), *dataset_lines(p), "",
             markdown_table(record, columns=COLUMNS, extra={"result": _returned_cell(record)}), "",
             "Cells: median (min–max) over runs, each in a fresh process after its imports. "
             f"`{INDEX}`: `ckptstore.index(src, out, strategy=[...])` into an empty folder, ending with `os.sync()` "
             "(what `ckptstore index SRC -s STRATEGY --out STORE` runs): scan every header, resolve the slices, "
             "sample a few KiB of each slice (zeros here: skipped as uninformative), write the manifest. "
             f"`{OPEN}`: `ckptstore.open(index)` (read, parse, validate; every rank file stat-ed). `{PLAN}`: the "
             "store opened in the setup (not timed); the span reads the target strategy file and plans every "
             "parameter's reads.", "",
             "Targets (this run):", "",
             targets.markdown(targets.sparse_index_verdicts(record, INDEX), quick=bool(p.get("quick"))), ""]
    lines += profile_lines(record.get("profile"))
    lines += not_run_notes(record)
    return "\n".join(lines).rstrip() + "\n"


def profile_lines(prof: Mapping[str, Any] | None) -> list[str]:
    if not prof:
        return []
    lines = ["### Where the index's time goes", ""]
    phases = prof.get("phases", {})
    if "phases" in phases:
        lines += [f"Wall time per phase (one more index run, ckptstore's functions wrapped with timers; total "
                  f"{format_seconds(phases['total_s'])}):", "", "| phase | wall | calls | share |", "|---|---|---|---|"]
        for phase, secs, calls in json.loads(phases["phases"]):
            lines.append(f"| {phase.strip() if not phase.startswith(' ') else '… ' + phase.strip()} | "
                         f"{format_seconds(secs)} | {calls:,} | {secs / phases['total_s']:.0%} |")
        lines.append("")
    elif phases.get("error"):
        lines += [f"Phase timing failed: {phases['error'].strip().splitlines()[-1]}", ""]
    cp = prof.get("cprofile", {})
    for key, title in (("tottime", "by own time"), ("cumulative", "by cumulative time")):
        if cp.get(key):
            lines += [f"cProfile ({title}, top {PROFILE_TOP}; the main thread and the "
                      f"{cp.get('worker_calls', 0):,} `write_param` calls of the worker threads, merged; run took "
                      f"{format_seconds(prof.get('cprofile_wall_s', 0))} under the profiler):", "", "```", cp[key],
                      "```", ""]
    return lines


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_index", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="130B", choices=sorted(MODELS), help="model shape (default 130B)")
    ap.add_argument("--world", default="128", help="source ranks (128 = dp16×mp8) or DPxMP")
    ap.add_argument("--dst-world", default="8x8", help="target of the plan row (default 8x8 = 64 cards)")
    ap.add_argument("--rank", type=int, default=0, help="target rank of the plan row")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the small model on 16 ranks (dp2×mp8), one repetition")
    ap.add_argument("--profile", action="store_true", default=None,
                    help="also time the index's phases and cProfile it (the phases are timed anyway when it "
                         "misses its target)")
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    return ap.parse_args(argv)


QUICK = ("quick", Mesh(2, 8), Mesh(1, 8))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        model, src, dst, reps = QUICK[0], QUICK[1], QUICK[2], 1
    else:
        model, src, dst, reps = args.model, parse_mesh(args.world, source=True), \
            parse_mesh(args.dst_world, source=False), args.reps
    if not 0 <= args.rank < dst.world:
        print(f"error: --rank {args.rank} is outside the {dst.world} target ranks", file=sys.stderr)
        return 2

    def make() -> dict[str, Any]:
        st = make_setup(model, src, dst, args.rank)
        return run(st, reps=reps, command=command_line("benchmarks.bench_index", argv), results_dir=args.results_dir,
                   quick=args.quick, profile=args.profile)

    args.results_dir.mkdir(parents=True, exist_ok=True)
    return run_and_publish(make, render, args.results_dir, NAME)


if __name__ == "__main__":
    sys.exit(main())
