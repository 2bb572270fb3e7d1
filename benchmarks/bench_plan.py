"""At-scale planning, no payload: PanGu-Alpha 13B and a ~200B model saved on 128 cards, loaded on 64.

``python -m benchmarks.bench_plan`` (about a minute here; ``--profile`` adds cProfile hot spots)

Shapes only. For each model the source layout is ``ckptstore.testing.sample.pangu_specs`` on mp 8 × dp 16
with optimizer sharding (Adam moments included); its strategy file is written by
``ckptstore.testing.sample_checkpoint.write_strategy`` (as the parallel compiler writes it) and read back by
``ckptstore.checkpoint.strategy.load_strategy``. The store manifest is built the way ``ckptstore.convert`` builds it
(distinct boxes from ``Strategy.replica_groups``, which works them out with the conversion's own
``checkpoint.strategy.stage_slices``; chunk shapes from ``manifest.chunk_shape_for`` with the
default 256 MiB bound, chunks in C order over the grid,
offsets back to back in one shard file per parameter, the supplying rank = first replica; CRCs
are fake), written as the store's root ``zarr.json`` by the Zarr backend, and opened with
``ckptstore.open`` (read + JSON parse + validation). Then every rank of the 64-card target
(mp 8 × dp 8, ``sample.relayout``) is planned with ``ckptstore.read.loader.rank_view(...).plan`` — the code
``load_rank`` runs before it reads a byte.

Bytes read and memory are *computed*, not measured:

* ckptstore: a rank reads exactly its slices (``plan.nbytes``) into arrays of that size, so its
  peak is the largest rank's slice bytes (plus the open manifest's Python objects, measured).
* ``mindspore.load_distributed_checkpoint`` (MindSpore 2.10, ``parallel/checkpoint_transform.py``,
  ``format='ckpt'``): it first runs ``ms.load_checkpoint(file)`` on *every* rank file and keeps
  all of them in ``param_total_dict`` for the whole call; then for each network parameter it
  concatenates the optimizer-shard pieces, ``merge_sliced_parameter`` rebuilds the *global*
  tensor (``np.concatenate`` + ``Tensor(...)``, a reshape by the device matrix), and
  ``_load_tensor`` cuts this rank's slice, which is kept in ``param_dict`` until
  ``load_param_into_net`` at the end. So each process reads every byte of all 128 rank files
  (every parameter of every file: ``load_checkpoint`` parses whole files), and its peak is at
  least ``sum(rank files) + its own slices + 2 × the largest global tensor`` (the merge
  transient; the reshape can add more).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from benchmarks.harness import RESULTS_DIR, append_result, command_line, environment
from benchmarks.report import format_bytes, format_seconds, publish
from benchmarks.synth import Mesh

NAME = "plan"
DEFAULT_CHUNK_BYTES = 256 << 20  # ckptstore.convert's default bound for raw chunks
NODE = 8  # processes per node
SLOW_OPEN_S = 1.0  # open slower than this, or planning all ranks slower than the next: profile it
SLOW_PLAN_ALL_S = 60.0


@dataclass(frozen=True)
class Model:
    """PanGu-Alpha dimensions (``seq`` sizes the position embedding)."""

    name: str
    hidden: int
    layers: int
    vocab: int
    seq: int = 1024


MODELS = {
    "13B": Model("PanGu-Alpha 13B", 5120, 40, 40000),
    "200B": Model("PanGu-Alpha-shaped ~200B", 16384, 64, 40000),
}


def specs_for(model: Model, mesh: Mesh) -> list[Any]:
    from ckptstore.testing.sample import pangu_specs

    return pangu_specs(hidden=model.hidden, layers=model.layers, vocab=model.vocab, seq=model.seq, dp=mesh.dp,
                       mp=mesh.mp, opt_shard=True)


def weight_count(specs: Sequence[Any]) -> int:
    """Trainable parameters (elements of the weights, not the Adam moments or counters)."""
    return sum(prod(s.shape) for s in specs if not s.name.startswith(("adam_", "global_step", "learning_rate")))


# ---------------------------------------------------------------------------------------------
# the manifest convert would write


def build_manifest(specs: Sequence[Any], strategy: Any, *, max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                   seed: int = 0) -> Any:
    """The ``StoreManifest`` ``ckptstore.convert`` writes for these parameters (fake CRCs)."""
    from ckptstore.store import zarr as zb
    from ckptstore.store.manifest import StoreManifest
    from ckptstore.version import __version__

    rng = np.random.default_rng(seed)
    params = {s.name: _param_manifest(s, strategy, max_chunk_bytes, rng, zb) for s in specs}
    world = strategy.world_size
    source = {"world_size": world,
              "files": {str(r): f"/data/ckpt/rank_{r}/pangu-1_1.ckpt" for r in range(world)},
              "step": None, "strategy": strategy.summary(), "created_by": f"ckptstore {__version__}"}
    return StoreManifest(params, source)


def _param_manifest(spec: Any, strategy: Any, max_chunk_bytes: int, rng: np.random.Generator, zb: Any) -> Any:
    from ckptstore.boxes import Box
    from ckptstore.store.manifest import ChunkTable, ParamManifest, chunk_shape_for, dtype_label

    shape, item = tuple(spec.shape), spec.np_dtype.itemsize
    if spec.name in strategy.layouts:
        groups = strategy.replica_groups(spec.name, shape)
    else:  # saved whole on every rank (global_step, learning_rate)
        groups = {Box.full(shape): list(range(strategy.world_size))}
    slice_shape = next(iter(groups)).shape
    if any(b.shape != slice_shape for b in groups):
        raise ValueError(f"{spec.name}: uneven slices")
    chunk = chunk_shape_for(slice_shape, item, max_chunk_bytes)
    grid = tuple(n // c for n, c in zip(shape, chunk))
    by_start = {b.start: ranks for b, ranks in groups.items()}
    chunk_bytes = prod(chunk) * item
    ranks, replicas = [], []
    for coords in (np.ndindex(*grid) if grid else [()]):
        start = tuple(int(c) * k for c, k in zip(coords, chunk))
        group = by_start[tuple(s - s % k for s, k in zip(start, slice_shape))]
        ranks.append(group[0])
        replicas.append(len(group))
    n = len(ranks)
    path = zb.array_path(spec.name)
    table = ChunkTable((zb.chunk_key(path, len(shape)),) * n, tuple(i * chunk_bytes for i in range(n)),
                       (chunk_bytes,) * n, tuple(int(x) for x in rng.integers(0, 2**32, n)), tuple(ranks),
                       tuple(replicas))
    return ParamManifest(spec.name, path, dtype_label(spec.np_dtype), shape, chunk, table, None)


def source_rank_bytes(specs: Sequence[Any], strategy: Any) -> list[int]:
    """Tensor bytes in each source rank file (protobuf framing, < 1 KiB per parameter, left out)."""
    out = [0] * strategy.world_size
    for s in specs:
        item = s.np_dtype.itemsize
        for r in range(strategy.world_size):
            box = strategy.box(s.name, r, s.shape) if s.name in strategy.layouts else None
            out[r] += (box.size if box is not None else prod(s.shape)) * item
    return out


# ---------------------------------------------------------------------------------------------
# measurements


def _timed(fn: Callable[[], Any], reps: int) -> tuple[list[float], Any]:
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def _stats(times: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "n": len(times)}


def _profile(fn: Callable[[], Any], top: int = 12) -> str:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return _trim_profile(buf.getvalue())


def _trim_profile(text: str) -> str:
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if "ncalls" in ln), 0)
    head = [ln.strip() for ln in lines[:start] if "function calls" in ln]
    return "\n".join(head + [ln.replace(str(Path(sys.prefix)), "<venv>").replace(str(REPO), "<repo>")
                             for ln in lines[start:] if ln.strip()])


REPO = Path(__file__).resolve().parent.parent


def measure_model(key: str, src: Mesh, dst: Mesh, *, reps: int, profile: bool,
                  log: Callable[[str], None]) -> dict[str, Any]:
    """Everything the report says about one model."""
    import ckptstore
    from ckptstore.store import zarr as zb
    from ckptstore.testing.sample import model_bytes, relayout
    from ckptstore.testing.sample_checkpoint import write_strategy

    model = MODELS[key]
    specs = specs_for(model, src)
    out: dict[str, Any] = {"model": model.__dict__, "src": src.__dict__, "dst": dst.__dict__,
                           "params": len(specs), "weights": weight_count(specs), "global_bytes": model_bytes(specs)}
    with tempfile.TemporaryDirectory(prefix="ckptstore_plan_") as tmp:
        root = Path(tmp)
        src_file = write_strategy(root / "strategy_src.ckpt", specs)
        dst_file = write_strategy(root / "strategy_dst.ckpt", relayout(specs, dp=dst.dp, mp=dst.mp))
        t, strategy = _timed(lambda: ckptstore.checkpoint.strategy.load_strategy(src_file), reps)
        out["read_src_strategy_s"] = _stats(t)
        out["strategy_file_bytes"] = src_file.stat().st_size
        t, target = _timed(lambda: ckptstore.checkpoint.strategy.load_strategy(dst_file), reps)
        out["read_dst_strategy_s"] = _stats(t)

        t0 = time.perf_counter()
        manifest = build_manifest(specs, strategy)
        out["build_manifest_s"] = time.perf_counter() - t0
        out["chunks"] = sum(len(p.chunks) for p in manifest.params.values())
        rank_bytes = source_rank_bytes(specs, strategy)
        out["src_rank_file_bytes"] = {"min": min(rank_bytes), "max": max(rank_bytes), "total": sum(rank_bytes)}
        log(f"{key}: {len(specs)} parameters, {out['chunks']} chunks, global {format_bytes(out['global_bytes'])}, "
            f"rank files {format_bytes(sum(rank_bytes))}; strategy read {format_seconds(out['read_src_strategy_s']['median'])}, "
            f"manifest built in {format_seconds(out['build_manifest_s'])}")

        t, doc = _timed(lambda: zb.group_metadata({"ckptstore": manifest.to_json()}), 1)
        out["write_manifest_s"] = t[0]
        store_dir = root / "store.zarr"
        store_dir.mkdir()
        (store_dir / zb.ROOT_METADATA).write_bytes(doc)
        out["manifest_bytes"] = len(doc)
        out["manifest_compact_bytes"] = len(manifest.dumps().encode())
        del doc
        out.update(_measure_open(store_dir, reps, profile))
        log(f"{key}: zarr.json {format_bytes(out['manifest_bytes'])}, open {format_seconds(out['open_s']['median'])}")
        store = ckptstore.open(store_dir)
        out.update(_measure_plans(store, target, dst, reps, profile, log, key))
        out.update(_mindspore_model(out, specs, rank_bytes))
    return out


def _measure_open(store_dir: Path, reps: int, profile: bool) -> dict[str, Any]:
    import ckptstore
    from ckptstore.store import zarr as zb
    from ckptstore.store.manifest import StoreManifest

    out: dict[str, Any] = {}
    t, _ = _timed(lambda: ckptstore.open(store_dir), reps)
    out["open_s"] = _stats(t)
    t, attrs = _timed(lambda: zb.read_root_attributes(store_dir), reps)
    out["open_read_json_s"] = _stats(t)
    t, _ = _timed(lambda: StoreManifest.from_json(attrs["ckptstore"], where=str(store_dir)), reps)
    out["open_from_json_s"] = _stats(t)
    params = StoreManifest.from_json(attrs["ckptstore"], where="").params
    t, _ = _timed(lambda: [p.validate() for p in params.values()], reps)
    out["open_validate_s"] = _stats(t)
    del attrs, params
    tracemalloc.start()
    store = ckptstore.open(store_dir)
    out["open_python_peak_bytes"] = tracemalloc.get_traced_memory()[1]
    out["open_python_kept_bytes"] = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del store
    if profile or out["open_s"]["median"] > SLOW_OPEN_S:
        out["open_profile"] = _profile(lambda: ckptstore.open(store_dir))
    return out


def _measure_plans(store: Any, target: Any, dst: Mesh, reps: int, profile: bool, log: Callable[[str], None],
                   key: str) -> dict[str, Any]:
    import ckptstore

    def plan(rank: int) -> Any:
        return ckptstore.read.loader.rank_view(store, target, rank).plan

    out: dict[str, Any] = {}
    t, _ = _timed(lambda: plan(0), reps)
    out["plan_one_rank_s"] = _stats(t)
    t0 = time.perf_counter()
    per_rank, chunk_reads = [], []
    for r in range(target.world_size):
        p = plan(r)
        per_rank.append(p.nbytes)
        chunk_reads.append(sum(len(x.chunks) for x in p.params.values()))
    out["plan_all_ranks_s"] = time.perf_counter() - t0
    out["rank_bytes"] = per_rank
    out["rank_chunk_reads"] = {"min": min(chunk_reads), "max": max(chunk_reads)}
    out["node_distinct_bytes"] = _node_distinct_bytes(store, target, range(NODE))
    p0 = plan(0)
    t0 = time.perf_counter()
    runs = sum(len(x.runs(c)[0]) for x in p0.params.values() for c in x.chunks)
    out["rank0_byte_runs"] = runs
    out["rank0_runs_s"] = time.perf_counter() - t0
    log(f"{key}: plan rank 0 {format_seconds(out['plan_one_rank_s']['median'])}, all {target.world_size} ranks "
        f"{format_seconds(out['plan_all_ranks_s'])}")
    if profile or out["plan_all_ranks_s"] > SLOW_PLAN_ALL_S:
        out["plan_profile"] = _profile(lambda: plan(0))
    return out


def _node_distinct_bytes(store: Any, target: Any, ranks: Sequence[int]) -> int:
    """Bytes of the union of the ranks' boxes (what the node reads from disk, the page cache
    serving the rest); boxes of these layouts are identical or disjoint."""
    import ckptstore

    boxes: dict[str, set[Any]] = {}
    for r in ranks:
        for name, box in ckptstore.read.loader.rank_view(store, target, r).boxes.items():
            boxes.setdefault(name, set()).add(box)
    total = 0
    for name, bs in boxes.items():
        info = store.info(name)
        item = info.np_dtype.itemsize
        total += sum((b.size if b is not None else prod(info.shape)) * item for b in bs)
    return total


def _mindspore_model(out: Mapping[str, Any], specs: Sequence[Any], rank_bytes: Sequence[int]) -> dict[str, Any]:
    """``load_distributed_checkpoint``'s reads and peak per process (see the module docstring)."""
    total = sum(rank_bytes)
    largest = max(prod(s.shape) * s.np_dtype.itemsize for s in specs)
    worst = max(out["rank_bytes"])
    return {"largest_global_tensor_bytes": largest,
            "ms_read_per_process": total,
            "ms_peak_per_process": total + worst + 2 * largest}


# ---------------------------------------------------------------------------------------------
# report


def render(record: Mapping[str, Any]) -> str:
    models = record["models"]
    lines = [
        "## Planning at scale (metadata only): 128 cards → 64 cards",
        "",
        f"Command: `{record['command']}`",
        "",
        f"Machine: {_machine(record)}. `uptime` before: {record.get('uptime_before', '?')}; after: "
        f"{record.get('uptime_after', '?')}.",
        "",
        "Source: `ckptstore.testing.sample.pangu_specs` on mp 8 × dp 16 (128 cards) with optimizer sharding and Adam "
        "moments, fp32; target: the same parameters on mp 8 × dp 8 (64 cards, `sample.relayout`, no optimizer "
        "sharding). Manifest as `ckptstore.convert` builds it (256 MiB chunk bound, fake CRCs), opened with "
        "`ckptstore.open`; plans by `ckptstore.read.loader.rank_view(store, target, r).plan`. Times: median (min–max) of "
        f"{record['reps']} runs.",
        "",
        "| | " + " | ".join(m["label"] for m in models) + " |",
        "|---|" + "---|" * len(models),
    ]
    rows: list[tuple[str, Callable[[Mapping[str, Any]], str]]] = [
        ("model", lambda m: f"hidden {m['model']['hidden']}, {m['model']['layers']} layers, vocab "
                            f"{m['model']['vocab']}, seq {m['model']['seq']}: {m['weights'] / 1e9:.1f} B weights"),
        ("parameters (weights + Adam + counters) / chunks", lambda m: f"{m['params']:,} / {m['chunks']:,}"),
        ("global tensors (the model once)", lambda m: format_bytes(m["global_bytes"])),
        ("source rank files (128): total / largest", lambda m: f"{format_bytes(m['src_rank_file_bytes']['total'])} "
                                                             f"/ {format_bytes(m['src_rank_file_bytes']['max'])}"),
        ("source strategy file: size / `load_strategy`",
         lambda m: f"{format_bytes(m['strategy_file_bytes'])} / {_cell(m['read_src_strategy_s'])}"),
        ("manifest: store `zarr.json` bytes (compact `dumps()`)",
         lambda m: f"{m['manifest_bytes']:,} B = {format_bytes(m['manifest_bytes'])} "
                   f"({format_bytes(m['manifest_compact_bytes'])})"),
        ("write manifest (`to_json` + Zarr group metadata)", lambda m: format_seconds(m["write_manifest_s"])),
        ("**open + validate** (`ckptstore.open`)", lambda m: "**" + _cell(m["open_s"]) + "**"),
        ("… read + JSON parse / `from_json` / of which `validate`",
         lambda m: f"{_cell(m['open_read_json_s'])} / {_cell(m['open_from_json_s'])} / {_cell(m['open_validate_s'])}"),
        ("open manifest in Python memory (kept / peak while opening)",
         lambda m: f"{format_bytes(m['open_python_kept_bytes'])} / {format_bytes(m['open_python_peak_bytes'])}"),
        ("**plan one rank** (rank 0)", lambda m: "**" + _cell(m["plan_one_rank_s"]) + "**"),
        ("**plan all 64 ranks** (one after another)", lambda m: "**" + format_seconds(m["plan_all_ranks_s"]) + "**"),
        ("chunk reads per rank (min–max); rank 0's byte runs (`paired_runs`, computed in)",
         lambda m: f"{m['rank_chunk_reads']['min']:,}–{m['rank_chunk_reads']['max']:,}; "
                   f"{m['rank0_byte_runs']:,} ({format_seconds(m['rank0_runs_s'])})"),
    ]
    for title, fn in rows:
        lines.append(f"| {title} | " + " | ".join(fn(m) for m in models) + " |")
    lines += ["", "### Bytes read and peak memory (computed)", "",
              "| | " + " | ".join(m["label"] for m in models) + " |", "|---|" + "---|" * len(models)]
    mem_rows: list[tuple[str, Callable[[Mapping[str, Any]], str]]] = [
        ("ckptstore, one process: bytes read (min–max over the 64 ranks)",
         lambda m: f"{format_bytes(min(m['rank_bytes']))}–{format_bytes(max(m['rank_bytes']))}"),
        ("ckptstore, one process: peak memory ≈ the rank's slices (max over ranks) + open manifest",
         lambda m: f"{format_bytes(max(m['rank_bytes']))} + {format_bytes(m['open_python_kept_bytes'])}"),
        ("MindSpore `load_distributed_checkpoint`, one process: bytes read (all 128 rank files)",
         lambda m: f"{format_bytes(m['ms_read_per_process'])} "
                   f"({m['ms_read_per_process'] / max(m['rank_bytes']):,.0f}× the rank's bytes; without the "
                   f"replicas still ≥ the model, {m['global_bytes'] / max(m['rank_bytes']):.1f}×)"),
        ("MindSpore, one process: peak ≥ rank files + own slices + 2 × largest global tensor",
         lambda m: f"{format_bytes(m['ms_peak_per_process'])} "
                   f"({m['ms_peak_per_process'] / max(m['rank_bytes']):,.0f}× ckptstore's)"),
        (f"node of {NODE} processes (target ranks 0–{NODE - 1}), ckptstore: bytes read (distinct from disk) / memory",
         lambda m: f"{format_bytes(sum(m['rank_bytes'][:NODE]))} ({format_bytes(m['node_distinct_bytes'])}) / "
                   f"{format_bytes(sum(m['rank_bytes'][:NODE]) + NODE * m['open_python_kept_bytes'])}"),
        (f"node of {NODE} processes, MindSpore: bytes read / memory",
         lambda m: f"{format_bytes(NODE * m['ms_read_per_process'])} / "
                   f"≥ {format_bytes(NODE * m['ms_peak_per_process'])}"),
    ]
    for title, fn in mem_rows:
        lines.append(f"| {title} | " + " | ".join(fn(m) for m in models) + " |")
    lines += ["", _MS_NOTE]
    for m in models:
        for what in ("open_profile", "plan_profile"):
            if m.get(what):
                lines += ["", f"cProfile of {what.split('_')[0]} ({m['label']}), by own time:", "", "```",
                          m[what], "```"]
    return "\n".join(lines) + "\n"


_MS_NOTE = (
    "MindSpore's model, from `mindspore/parallel/checkpoint_transform.py` (`load_distributed_checkpoint`, the "
    "function `mindspore.train.serialization.load_distributed_checkpoint` forwards to, MindSpore 2.10): "
    "`for file_name in checkpoint_filenames: ckpt_dict = ms.load_checkpoint(file_name)` fills "
    "`param_total_dict[param_name][file_index]` with every parameter of every rank file, kept until the end of "
    "the call; then per network parameter the optimizer-shard pieces are concatenated "
    "(`np.concatenate(param_stride)`), `_merge_and_split` → `merge_sliced_parameter` builds the global tensor "
    "(`np.concatenate` of the slices, `Tensor(...)`, `_reshape_param_data`) and `_load_tensor` cuts this rank's "
    "slice, kept in `param_dict` until `load_param_into_net`. Reads = every rank file, whole; resident = all "
    "rank files' tensors + this rank's slices + the merge transient. The pangu_specs layout replicates the word "
    "embedding (and its moments) on all 128 ranks without optimizer sharding, which is most of the rank files' "
    "bytes; ckptstore stores it once.")


def _cell(s: Mapping[str, float]) -> str:
    if s["n"] < 2:
        return format_seconds(s["median"])
    return f"{format_seconds(s['median'])} ({format_seconds(s['min'])}–{format_seconds(s['max'])})"


def _machine(record: Mapping[str, Any]) -> str:
    e = record["environment"]
    return (f"{e['cpu_model']}, {e['nproc']} cores, {e['mem_total'] / 2**30:.1f} GiB RAM; Python {e['python']}, "
            f"numpy {e['numpy']}, zarr {e['zarr']}; ckptstore {e.get('git') or '?'}; {record['date']}")


def _uptime() -> str:
    return os.popen("uptime").read().strip()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_plan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="13B,200B", help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--src", default="16x8", help="source DPxMP (default 16x8 = 128 cards)")
    ap.add_argument("--dst", default="8x8", help="target DPxMP (default 8x8 = 64 cards)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--profile", action="store_true",
                    help="add cProfile hot spots of open and of planning one rank (always done when open takes "
                         f"> {SLOW_OPEN_S:g} s or planning all ranks > {SLOW_PLAN_ALL_S:g} s)")
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    import datetime as dt

    from benchmarks.synth import parse_mesh

    args = parse_args(argv)
    src, dst = parse_mesh(args.src, source=True), parse_mesh(args.dst, source=False)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    before = _uptime()
    models = []
    for key in args.models.split(","):
        m = measure_model(key.strip(), src, dst, reps=args.reps, profile=args.profile, log=log)
        m["label"] = MODELS[key.strip()].name
        models.append(m)
    record = {"name": NAME, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": command_line("benchmarks.bench_plan", argv), "reps": args.reps, "environment": environment(),
              "uptime_before": before, "uptime_after": _uptime(), "models": models}
    append_result(NAME, record, args.results_dir)
    return publish(render(record), args.results_dir, NAME)


if __name__ == "__main__":
    sys.exit(main())
