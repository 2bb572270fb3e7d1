"""One node of a 130B job: 8 loaders at once for ranks 0-7 of a 128-card target, from the sparse index.

``python -m benchmarks.bench_node --sparse 130B --dst-world 1x128 --ranks 0-7 --layers 36 --reps 2``

The checkpoint is the one ``bench_index`` builds and indexes (:func:`benchmarks.bench_index.sparse_checkpoint`:
PanGu-Alpha-shaped, hidden 12288, 72 layers, saved on 128 ranks as dp16 × mp8 with optimizer
sharding; headers only, every payload a hole of zeros), read through its ``ckptstore index``. The
target lays every weight out over the 128 cards (``sample.relayout`` to dp1 × mp128), and splits
the two embedding tables by columns as well (``relayout`` leaves them whole on every card; 50,000
vocabulary rows do not divide by 128): so each card holds 1/128 of every weight, the least a
128-card layout can give it. Each loader is ``ckptstore.read_rank(index, target, r,
include=weights, dtype="float16")`` in its own process (numpy arrays, no MindSpore import), all
started together behind a barrier (:func:`benchmarks.harness.run_concurrent`).

Memory: fp16 weights at 1/128 are 1.9 GiB per card, 15.4 GiB for 8; this machine has 24 GiB shared
with other work. ``--layers N`` loads the embeddings, the final layer norm and the first ``N`` of the
72 blocks (the weights of every block are alike), so that Σ slices fits; the run is refused unless
``MemAvailable`` holds Σ slices × 1.1 + 8 × 256 MiB + ``--keep-free-gib``, every worker is the
kernel's first OOM victim, and all are killed if ``MemAvailable`` falls below half of
``--keep-free-gib`` during the run.

Measured: the plan of each rank alone (``ckptstore.plan_rank``, store opened untimed, one process,
ranks in turn); then per round the makespan, Σ of each loader's peak RSS above its start against Σ
of the slices the plans announce (and the loaders hold), the peak of the simultaneous sum (sampled
every 20 ms), Σ peak RSS with imports, and what the loaders fetched (``ckptstore.io_counts``).
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import procfs
from benchmarks.harness import BenchmarkError, Contender, append_result, environment, run_concurrent, run_contender
from benchmarks.report import format_bytes
from benchmarks.synth import Mesh, cache_lock

NAME = "node-sparse"
MODULE = "benchmarks.contenders"
ROUTE = "ckptstore.read_rank, local index"
DTYPE = "float16"
#: Resident memory a loader process may add besides its slice (numpy, the manifest, the plan).
PER_PROCESS = 256 << 20
#: Layers of the model; ``--layers`` takes the first N of them.
EMBEDDINGS = ("backbone.word_embedding.*", "backbone.position_embedding.*", "backbone.layernorm.*")


def weight_globs(layers: int, total: int) -> list[str]:
    """The weights of the first ``layers`` blocks, the embeddings and the final layer norm (no Adam moments)."""
    if layers >= total:
        return ["backbone.*"]
    return [*EMBEDDINGS, *(f"backbone.blocks.{i}.*" for i in range(layers))]


def node_target(sp: Any, mesh: Mesh) -> Path:
    """The target strategy: ``sample.relayout`` onto ``mesh`` with the embedding tables split by
    columns too (so every weight is divided among all the cards), cached beside the checkpoint."""
    from benchmarks.bench_index import specs_for
    from ckptstore.testing.sample import relayout
    from ckptstore.testing.sample_checkpoint import write_strategy

    path = sp.root / "targets" / f"strategy_node_{mesh.tag}_embcols.ckpt"
    with cache_lock(sp.root):
        if not path.exists():
            specs = relayout(specs_for(sp.model, sp.mesh), dp=mesh.dp, mp=mesh.mp)
            # the tables (and their Adam moments) by columns: hidden 12288 divides by 128, vocab 50000 does not
            specs = [dataclasses.replace(s, tensor_map=(-1, 0)) if s.name.endswith("_embedding.embedding_table")
                     else s for s in specs]
            tmp = path.with_name(path.name + ".partial")
            path.parent.mkdir(parents=True, exist_ok=True)
            write_strategy(tmp, specs)
            tmp.replace(path)
    return path


@dataclass(frozen=True)
class SparseNode:
    """The indexed sparse checkpoint, the target and the ranks of one node."""

    sparse: Any  # benchmarks.bench_index.Sparse
    dst: Mesh
    strategy: str
    ranks: tuple[int, ...]
    layers: int

    @property
    def include(self) -> list[str]:
        return weight_globs(self.layers, self.sparse.model.layers)

    def contenders(self) -> list[Contender]:
        return [Contender(ROUTE, MODULE, "ckptstore_read_rank_slice",
                          {"store": str(self.sparse.index_store), "strategy": self.strategy, "rank": r,
                           "include": self.include, "dtype": DTYPE}, preimport=("ckptstore", "numpy"),
                          check="check_slice") for r in self.ranks]

    def memory(self, layers: int, dtype: str) -> Contender:
        """One loader alone (the first ``layers`` blocks, read as ``dtype``), its memory split into the
        manifest, the rest of ckptstore, and the slice."""
        return Contender("where one loader's memory goes", MODULE, "ckptstore_rank_memory",
                         {"store": str(self.sparse.index_store), "strategy": self.strategy, "rank": self.ranks[0],
                          "include": weight_globs(layers, self.sparse.model.layers), "dtype": dtype},
                         preimport=("ckptstore", "numpy"))

    def planner(self) -> Contender:
        return Contender("ckptstore.plan_rank, each rank alone", MODULE, "ckptstore_plan_ranks",
                         {"store": str(self.sparse.index_store), "strategy": self.strategy, "ranks": list(self.ranks),
                          "include": self.include, "dtype": DTYPE}, setup="setup_open_store_ranks",
                         preimport=("ckptstore",))


def make_node(model_key: str, src: Mesh, dst: Mesh, ranks: Sequence[int], layers: int, *,
              log: Callable[[str], None]) -> SparseNode:
    """The cached sparse checkpoint of ``model_key`` on ``src`` (130B: dp16 × mp8), indexed once, and the target."""
    import ckptstore
    from benchmarks.bench_index import MODELS, sparse_checkpoint

    if model_key not in MODELS:
        raise BenchmarkError(f"unknown sparse model {model_key!r}; known: {', '.join(MODELS)}")
    if not ranks or min(ranks) < 0 or max(ranks) >= dst.world:
        raise BenchmarkError(f"ranks {ranks} are not all among the {dst.world} target ranks")
    sp = sparse_checkpoint(model_key, src, log=log)
    with cache_lock(sp.root):
        if not (sp.index_store / "ckptstore.json").exists():
            t0 = time.perf_counter()
            ckptstore.index(str(sp.ckpt_dir), str(sp.index_store), strategy=[str(sp.strategy)])
            log(f"  indexed the sparse checkpoint in {time.perf_counter() - t0:.1f} s")
    return SparseNode(sp, dst, str(node_target(sp, dst)), tuple(ranks), min(layers, sp.model.layers))


def ldc_unavailable(info: Mapping[str, Any], ranks: int) -> str:
    """Why ``mindspore.load_distributed_checkpoint`` cannot run here, from what it does."""
    total = info["rank_file_bytes"]
    return (f"`load_distributed_checkpoint(net, checkpoint_filenames, predict_strategy)` calls `load_checkpoint` on "
            f"every one of the {info['rank_files']} rank files and keeps every tensor of all of them "
            "(`param_total_dict`, mindspore/parallel/checkpoint_transform.py, MindSpore 2.10) before it cuts "
            f"one slice: one rank needs at least the rank files' {format_bytes(total)}, the node {ranks} × that = "
            f"{format_bytes(ranks * total)}, against {format_bytes(procfs.mem_available())} available here. "
            "At small scale it was measured: 1.4 GiB above start for one rank of 1.2 GiB of "
            "rank files (results/node.md).")


def run(node: SparseNode, *, reps: int, command: str, results_dir: Path | None, keep_free: int,
        log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Plan each rank alone, check the node's slices fit, then ``reps`` rounds of the 8 loaders."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    plans = run_contender(node.planner(), timeout=1800)["returned"]
    slices = [plans[f"result_bytes_{r}"] for r in node.ranks]
    need = int(sum(slices) * 1.1) + len(node.ranks) * PER_PROCESS
    avail = procfs.mem_available()
    log(f"  plans: {statistics.median(plans[f'plan_s_{r}'] for r in node.ranks):.2f} s per rank (median); "
        f"Σ slices {format_bytes(sum(slices))}, need ≈ {format_bytes(need)}, available {format_bytes(avail)}")
    samples: list[dict[str, Any]] = []
    foreign = procfs.ForeignLoad()
    refused = failed = None
    if avail < need + keep_free:
        refused = (f"not run: the {len(slices)} slices need about {format_bytes(need)} and "
                   f"{format_bytes(keep_free)} must stay free, but only {format_bytes(avail)} is available")
        log("  " + refused)
    for rnd in range(reps if refused is None else 0):
        try:
            res = run_concurrent(node.contenders(), timeout=3600, min_available=keep_free // 2)
        except BenchmarkError as e:
            failed = str(e)
            log(f"  round {rnd} FAILED: {failed.strip().splitlines()[-1][:300]}")
            break
        samples.append(_sample(rnd, res))
        s = samples[-1]
        log(f"  round {rnd} makespan {s['makespan_s']:.2f} s  Σpeak+ {format_bytes(s['sum_peak_above_start'])}"
            f"  = {s['sum_peak_above_start'] / sum(slices):.4f}× Σ slices")
    memory: dict[str, Any] = {}
    # one process alone, so all the weights fit even when the node's 8 slices would not; and the
    # node's blocks without the fp16 conversion (float32: the bytes land in place, no scratch)
    alone = [(node.layers, DTYPE), (node.sparse.model.layers, DTYPE), (node.layers, "float32")]
    for layers, dtype in dict.fromkeys(alone) if samples else ():
        if procfs.mem_available() < 4 * max(slices) * node.sparse.model.layers / node.layers + keep_free:
            continue
        m = run_contender(node.memory(layers, dtype), timeout=1800)["returned"]
        memory[f"{layers} {dtype}"] = m
        log(f"  one loader alone, {layers} blocks as {dtype}: open +{format_bytes(m['open_rss'])}, peak above "
            f"start {format_bytes(m['peak_above_start'])} = {m['peak_above_start'] / m['held']:.4f}× its slice of "
            f"{format_bytes(m['held'])}")
    info = node.sparse.info()
    record = {
        "name": NAME, "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "command": command,
        "cache": "warm", "reps": reps, "environment": environment(),
        "params": {"model_key": next(k for k, v in _models().items() if v == node.sparse.model),
                   "cache_key": node.sparse.key, "src": {"dp": node.sparse.mesh.dp, "mp": node.sparse.mesh.mp},
                   "dst": {"dp": node.dst.dp, "mp": node.dst.mp}, "dst_world": node.dst.world,
                   "ranks": list(node.ranks), "layers": node.layers, "model_layers": node.sparse.model.layers,
                   "include": node.include, "dtype": DTYPE, "keep_free": keep_free},
        "sparse": info, "plans": plans, "slices": slices, "need": need, "available_before": avail,
        "refused": refused, "failed": failed, "samples": samples, "memory": memory,
        "foreign_cpu_cores": foreign.cores(),
        "unavailable": {"mindspore.load_distributed_checkpoint": ldc_unavailable(info, len(node.ranks)),
                        "from SeaweedFS (0 and 20 ms)": s3_unavailable(info, plans, node.ranks, node.sparse.root)},
    }
    if results_dir is not None:
        append_result(NAME, record, results_dir)
    return record


def _models() -> dict[str, Any]:
    from benchmarks.bench_index import MODELS

    return MODELS


def s3_unavailable(info: Mapping[str, Any], plans: Mapping[str, Any], ranks: Sequence[int], root: Path) -> str:
    """Why the node cannot load this checkpoint from SeaweedFS here: an object has all its bytes."""
    import shutil

    files = max(plans[f"files_{r}"] for r in ranks)
    return (f"each loader reads from {files} of the {info['rank_files']} rank files, which must be objects of their "
            f"full size (S3 has no sparse objects; the index records each one's size and ETag): "
            f"{format_bytes(info['rank_file_bytes'])} for all of them, up to {files} × "
            f"{format_bytes(info['largest_rank_file'])} for those read here, against "
            f"{format_bytes(shutil.disk_usage(root).free)} of free disk on this machine. The node from SeaweedFS "
            "at 0 and 20 ms is measured on the synthetic checkpoint's real bytes instead (`bench_node "
            "--s3-latency-ms 0,20`: results/node-s3/node.md).")


def _sample(rnd: int, res: Mapping[str, Any]) -> dict[str, Any]:
    ws = res["samples"]
    return {
        "round": rnd, "makespan_s": res["makespan_s"], "peak_sum_above_start": res["peak_sum_above_start"],
        "sum_peak_above_start": sum(w["peak_above_start"] for w in ws), "sum_peak_rss": sum(w["peak_rss"] for w in ws),
        "sum_held": sum(w["check"]["bytes"] for w in ws), "sum_rchar": sum(w["rchar"] for w in ws),
        "sum_fetched": sum(w["check"]["bytes_fetched"] for w in ws),
        "sum_requests": sum(w["check"]["requests"] for w in ws),
        "workers": [{k: w[k] for k in ("wall_s", "cpu_s", "peak_above_start", "peak_rss", "rss_before", "rchar",
                                       "hwm_reset")} | {"check": w["check"]} for w in ws],
    }


def render(record: Mapping[str, Any]) -> str:
    """The Markdown summary (benchmarks/results/node-sparse.md)."""
    p, info, plans = record["params"], record["sparse"], record["plans"]
    ranks, slices = p["ranks"], record["slices"]
    total = sum(slices)
    plan_s = [plans[f"plan_s_{r}"] for r in ranks]
    lines = [
        (f"## One node of a 130B job: {len(ranks)} loaders at once (ranks {ranks[0]}–{ranks[-1]} of "
         f"{p['dst_world']} cards)"),
        "",
        f"Command: `{record['command']}`",
        "",
        _machine(record),
        "",
        f"Checkpoint: the sparse index of `bench_index` (`{p['cache_key']}`): {info['params']:,} parameters, "
        f"{info['weights'] / 1e9:.1f} B weights, saved on {info['world']} ranks "
        f"(dp{p['src']['dp']}×mp{p['src']['mp']}, optimizer sharding), {info['rank_files']} rank files of "
        f"{format_bytes(info['rank_file_bytes'])} (payloads are "
        "holes: zeros). Target: dp{dp}×mp{mp} (`sample.relayout`, embedding tables split by columns too), "
        "ranks {a}–{b}; weights only ({what}), read as {dt}: **Σ slices {tot}** ({per} per rank).".format(
            dp=p["dst"]["dp"], mp=p["dst"]["mp"], a=ranks[0], b=ranks[-1], dt=p["dtype"], tot=format_bytes(total),
            per=format_bytes(statistics.median(slices)),
            what="all of them" if p["layers"] >= p["model_layers"] else
            f"the embeddings, the final layer norm and blocks 0–{p['layers'] - 1} of {p['model_layers']}: "
            f"{p['layers'] / p['model_layers']:.0%} of the blocks"),
        "",
        (f"Plan of one rank (`ckptstore.plan_rank`, the index opened before, ranks in turn in one process): "
         f"median {statistics.median(plan_s):.2f} s (min {min(plan_s):.2f}, max {max(plan_s):.2f}); "
         f"{plans[f'requests_{ranks[0]}']:,} read calls from {plans[f'files_{ranks[0]}']} rank files for rank "
         f"{ranks[0]}."),
        "",
    ]
    if record.get("refused") or not record["samples"]:
        lines.append(f"**{record.get('refused') or record.get('failed')}**")
    else:
        lines += _table(record, total)
    if record.get("memory"):
        lines += ["", (f"Where one loader's memory goes (rank {ranks[0]} alone, in its own process: `ckptstore.open` "
                       "of the index, then `read_rank` on it):"), "",
                  ("| blocks, read as | slice | opened index (manifest of all parameters) | planning and reading, "
                   "more at the peak | planned read calls | conversion scratch (`plan_rank`) | peak ÷ slice |"),
                  "|---|---|---|---|---|---|---|"]
        for key, m in record["memory"].items():
            rest = m["peak_above_start"] - m["held"] - m["open_rss"]
            layers, dtype = key.split()
            lines.append(f"| {layers} of {p['model_layers']}, {dtype} | {format_bytes(m['held'])} | "
                         f"{format_bytes(m['open_rss'])} | {format_bytes(rest)} | {m['requests']:,} | "
                         f"{format_bytes(m['scratch_bytes'])} | {m['peak_above_start'] / m['held']:.4f}× |")
    lines += ["", "Not run:", ""]
    lines += [f"- {name}: {why}" for name, why in record["unavailable"].items()]
    return "\n".join(lines) + "\n"


def _machine(record: Mapping[str, Any]) -> str:
    env = record["environment"]
    return (f"Machine: {env.get('cpu_model')}, {env.get('nproc')} cores, {format_bytes(env.get('mem_total', 0))} RAM; "
            f"Python {env.get('python')}, numpy {env.get('numpy')}; ckptstore {env.get('git')}; {record['date']}; "
            f"{format_bytes(record['available_before'])} available before the rounds; other processes kept "
            f"{record.get('foreign_cpu_cores', 0):.2f} cores busy on average.")


def _table(record: Mapping[str, Any], total: int) -> list[str]:
    ss = record["samples"]

    def cell(key: str, fmt: Callable[[float], str]) -> str:
        vals = [s[key] for s in ss]
        return f"{fmt(statistics.median(vals))} ({fmt(min(vals))}–{fmt(max(vals))})"

    def ratio(key: str) -> str:
        return cell(key, lambda v: f"{v / total:.4f}×")

    worst = max(w["peak_above_start"] / w["check"]["bytes"] for s in ss for w in s["workers"])
    rows = [
        ("makespan (first start → last end)", cell("makespan_s", lambda v: f"{v:.1f} s")),
        ("Σ peak RSS above start", cell("sum_peak_above_start", format_bytes)),
        ("… ÷ Σ slices (target ≤ 1.05×)", ratio("sum_peak_above_start")),
        ("peak of Σ RSS above start (sampled every 20 ms)", cell("peak_sum_above_start", format_bytes)),
        ("Σ peak RSS incl. imports", cell("sum_peak_rss", format_bytes)),
        ("Σ bytes the loaders hold", cell("sum_held", format_bytes)),
        ("Σ bytes fetched (ckptstore.io_counts; fp32 source)", cell("sum_fetched", format_bytes)),
        ("Σ read calls", cell("sum_requests", lambda v: f"{v:,.0f}")),
        ("slowest / fastest loader's own wall (median round)",
         (f"{statistics.median(max(w['wall_s'] for w in s['workers']) for s in ss):.1f} s / "
          f"{statistics.median(min(w['wall_s'] for w in s['workers']) for s in ss):.1f} s")),
    ]
    return [f"| {ROUTE}, {len(ss)} rounds | median (min–max) |", "|---|---|",
            *(f"| {a} | {b} |" for a, b in rows),
            "", (f"Largest single loader: peak RSS above start {worst:.4f}× its slice. Each loader: "
                 "`ckptstore.read_rank(index, target, r, include=weights, dtype=\"float16\")` in its own process "
                 "(imports done before a shared barrier; `oom_score_adj` 1000).")]
