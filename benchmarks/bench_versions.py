"""Old vs new: two revisions of ckptstore raced on the same checkpoint, side by side in one run.

``python -m benchmarks.bench_versions --base cee2ecf [--head REV_OR_WORKTREE] --size 1GB --reps 5``

Each revision's ``ckptstore/`` folder is extracted into a folder of its own (``git archive REV
ckptstore | tar -x``; a worktree's folder is copied, uncommitted edits included), and every
measurement runs in a fresh worker whose ``PYTHONPATH`` is that folder followed by a folder
holding only a link to this ``benchmarks`` package, with ``PYTHONSAFEPATH=1`` so that the
worker's working directory (a checkout with a ``ckptstore/`` of its own) is not put on
``sys.path``. The measuring code (``benchmarks.worker``, ``benchmarks.contenders``) is this
checkout's for both revisions, so only ckptstore differs; each worker records which
``ckptstore/__init__.py`` it imported, and the run stops if that is not its revision's.

Routes, per revision, on the cached PanGu-shaped checkpoint of :mod:`benchmarks.synth`
(8 ranks dp2×mp4 → 4 ranks, target rank 0, as ``bench_load``):

* ``load_rank``: ``ckptstore.load_rank(store, strategy, rank).materialize()`` (every Parameter
  built; the revision's default workers) from a store converted by *that* revision;
* ``load_into_net``: ``ckptstore.load_into_net(net, store, strategy=..., rank=...)`` into a
  prebuilt zero-filled Cell with the rank's Parameters (built in the untimed setup);
* ``convert``: ``ckptstore.convert(src, out, strategy=[...], workers=4)`` of the rank files
  into an empty folder (Zarr), then ``os.sync()``, as ``bench_convert``;
* ``index``: ``ckptstore.index(src, out, strategy=[...], workers=4)`` (no checksum), then ``os.sync()``;
* ``index_checksum``: the same with ``checksum=True`` (every payload byte read and CRC-32C'd);
* ``save``: one training step saved by the 8 ranks of the source job at once, each its own
  process running ``benchmarks.bench_save``'s ``ckptstore async`` rank (``StoreSaver`` with a
  256 MB budget, as ``StoreCheckpoint`` saves; for a revision before 7a5c952, which has no
  ``StoreSaver``, the same background save of ``AsyncSaver`` + ``prepare_save`` from
  :mod:`benchmarks.compat`) with the revision's ckptstore: the processes start,
  load their Parameters and save once (a warm-up step) in the untimed setup, then wait at a
  barrier; the measured call releases them and ends when every rank process has exited. The
  check records, on the ranks' own clocks from the release, the **stall** (the slowest rank's
  save call) and **committed** (the last rank's save done, durable: ckptstore fsyncs); the
  verdict is on those two (both within), not on the wall time, which also holds 8 MindSpore exits.

plus the single-thread numpy ``preadv`` bound of the rank's bytes (no ckptstore), as the
benchmarks' fairness rule asks. Contenders alternate (forward, then reversed order each round),
so old and new of a route run next to each other and share the machine's drift; round 0 is a
warm-up (it also compiles each tree's ``.pyc`` files) and is left out of the medians. Both
revisions write a route's output into one folder (cleared before each run), and every per-round
ratio comes with a 95% interval of its median (:func:`median_ci`): identical code raced against
itself here moved a write route by up to ±10% in one run. Output:
``results/raw/versions.json`` (the latest run of each base, head and routes) and ``results/versions.md`` (this run).
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    RESULTS_DIR,
    BenchmarkError,
    Contender,
    append_result,
    command_line,
    run_benchmark,
    summarize,
)

NAME = "versions"
MODULE = "benchmarks.bench_versions"
#: A route is "within" when new/old of the median wall time is at most this (issue 16: "within 5%").
LIMIT = 1.05
ROUTES = ("load_rank", "load_into_net", "convert", "index", "index_checksum", "save")
#: The save route's memory budget per rank (MB), as bench_save's default.
SAVE_BUDGET_MB = 256
ROUTE_TITLES = {
    "load_rank": "`load_rank(store, strategy, 0).materialize()` (Parameters built)",
    "load_into_net": "`load_into_net(net, store, strategy=..., rank=0)` (prebuilt Cell)",
    "convert": "`convert(src, out, strategy=[...])` (Zarr) + `os.sync()`",
    "index": "`index(src, out, strategy=[...])` + `os.sync()`",
    "index_checksum": "`index(src, out, strategy=[...], checksum=True)` + `os.sync()`",
    "save": "8 ranks `StoreSaver.save(1, params)` at once (wall: until the 8 processes exit; stall, committed below)",
}
#: The contender of REPORT.md's load / convert tables that each route repeats.
REPORT_CONTENDERS = {
    "load_rank": ("load", "ckptstore.load_rank (Parameters built)"),
    "load_into_net": ("load", "ckptstore.load_into_net (into a prebuilt Cell)"),
    "convert": ("convert", "ckptstore convert"),
    "index": ("convert", "ckptstore index"),
    "index_checksum": ("convert", "ckptstore index --checksum"),
}
BOUND = "lower bound: numpy preadv"
#: Preimported, untimed, through the public names in every revision (the worker's ``"module:name"``):
#: the MindSpore adapter (``ckptstore.load_rank``) and the write side (``ckptstore.convert``), which
#: a revision may import on first use or with ``ckptstore``; whichever module holds them.
LOAD_PREIMPORT = ("mindspore", "ckptstore:load_rank")
WRITE_PREIMPORT = ("ckptstore:convert",)


# ---------------------------------------------------------------------------------------------
# contender functions (run inside the workers; import ckptstore lazily so that the revision on
# PYTHONPATH is the one imported, after the worker's preimports)


def _which() -> str:
    import ckptstore

    return str(Path(ckptstore.__file__).resolve())


def which_ckptstore() -> dict[str, str]:
    """The ``ckptstore/__init__.py`` this process imports (what every check records)."""
    return {"ckptstore": _which()}


def load_rank(store: str, strategy: str, rank: int, names_file: str) -> Any:
    """``ckptstore.load_rank(store, strategy, rank).materialize()`` with the revision's default workers."""
    from benchmarks.contenders import ckptstore_load_rank

    return ckptstore_load_rank(store, strategy, rank, names_file)


def check_load(out: Mapping[str, Any], **args: Any) -> dict[str, Any]:
    """Digest of the loaded Parameters and the ``ckptstore/__init__.py`` this worker imported."""
    from benchmarks.contenders import check_params

    return {**check_params(out, **args), "ckptstore": _which()}


def setup_net(store: str, strategy: str, rank: int, names_file: str) -> dict[str, Any]:
    """Unmeasured: the zero-filled Cell with the rank's Parameters (``contenders.setup_target_net``)."""
    from benchmarks.contenders import setup_target_net

    return setup_target_net(store, strategy, rank, names_file)


def load_into_net(state: Mapping[str, Any]) -> dict[str, Any]:
    """``ckptstore.load_into_net(net, store, strategy=..., rank=...)`` into the prebuilt Cell."""
    from benchmarks.contenders import ckptstore_load_into_net

    return ckptstore_load_into_net(state)


def check_into_net(out: Mapping[str, Any], **args: Any) -> dict[str, Any]:
    """Digest of the filled Cell, how many names were not loaded (both must be 0), and the tree."""
    from benchmarks.contenders import check_net

    return {**check_net(out["net"], **args), "param_not_load": len(out["param_not_load"]),
            "ckpt_not_load": len(out["ckpt_not_load"]), "ckptstore": _which()}


def convert(src_dir: str, strategy: str, out: str) -> dict[str, Any]:
    """``ckptstore.convert(src, out, strategy=[strategy], workers=4)``, then ``os.sync()``."""
    from benchmarks.contenders import ckptstore_convert

    return ckptstore_convert(src_dir, strategy, out)


def index(src_dir: str, strategy: str, out: str) -> dict[str, Any]:
    """``ckptstore.index(src, out, strategy=[strategy], workers=4)`` (no checksum), then ``os.sync()``."""
    from benchmarks.contenders import ckptstore_index

    return ckptstore_index(src_dir, strategy, out)


def index_checksum(src_dir: str, strategy: str, out: str) -> dict[str, Any]:
    """``ckptstore.index(src, out, strategy=[strategy], checksum=True, workers=4)``, then ``os.sync()``."""
    from benchmarks.contenders import ckptstore_index

    return ckptstore_index(src_dir, strategy, out, checksum=True)


def check_written(result: Mapping[str, Any], **args: Any) -> dict[str, Any]:
    """The size of what was written (the same for both revisions when the format did not change)."""
    return {"output_bytes": result["output_bytes"], "metadata_bytes": result["metadata_bytes"], "ckptstore": _which()}


def setup_save(rank_files: Sequence[str], strategy: str, out: str, budget_mb: int = SAVE_BUDGET_MB) -> dict[str, Any]:
    """Unmeasured: one process per rank (``benchmarks.bench_save rank``, this worker's environment,
    so the revision's ckptstore), each holding its Parameters after a warm-up save, waiting at the
    barrier (a ``go`` file)."""
    import tempfile
    import time

    for folder in (out, out + "-warm-up"):
        shutil.rmtree(folder, ignore_errors=True)
    Path(out).mkdir(parents=True)
    sync = tempfile.mkdtemp(prefix="bench_versions_save_")
    env = {**os.environ, "GLOG_v": "3"}
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.bench_save", "rank", "--contender", "ckptstore async",
                               "--rank", str(r), "--rank-file", f, "--strategy", strategy, "--out", out,
                               "--sync", sync, "--budget-mb", str(budget_mb), "--world", str(len(rank_files))],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r, f in enumerate(rank_files)]
    while len(list(Path(sync).glob("ready-*"))) < len(procs):
        failed = [p for p in procs if p.poll() not in (None, 0)]
        if failed:
            raise BenchmarkError(f"a save rank failed in its setup:\n{failed[0].communicate()[1][-2000:]}")
        time.sleep(0.01)
    os.sync()  # the warm-up step's files are not the measured save's to flush
    return {"procs": procs, "sync": sync}


def save(state: Mapping[str, Any]) -> dict[str, Any]:
    """Release the ranks together; return when every rank's save has committed, with the stall
    (the slowest rank's save call, from the release) and how many ranks committed (one)."""
    import json
    import time

    sync = Path(state["sync"])
    go = time.time()
    (sync / "go.tmp").write_text(repr(go))
    (sync / "go.tmp").rename(sync / "go")
    ranks = []
    for p in state["procs"]:
        stdout, stderr = p.communicate()
        if p.returncode != 0:
            raise BenchmarkError(f"a save rank failed:\n{stderr[-2000:]}")
        ranks.append(json.loads(stdout))
    shutil.rmtree(sync, ignore_errors=True)
    return {"stall_s": max(r["stall_end"] for r in ranks) - go, "committed_s": max(r["done"] for r in ranks) - go,
            "ranks_cpu_s": sum(r["cpu_s"] for r in ranks),
            "committed": sum(bool(r["committed"]) for r in ranks), "written": sum(r.get("written", 0) for r in ranks)}


def check_save(result: Mapping[str, Any], **args: Any) -> dict[str, Any]:
    """The stall, the ranks that committed (must be 1), the bytes written, and the tree."""
    return {**result, "ckptstore": _which()}


# ---------------------------------------------------------------------------------------------
# the revisions' source trees


@dataclass(frozen=True)
class Tree:
    """One revision's ``ckptstore/`` extracted into ``path`` (``path/ckptstore/__init__.py``)."""

    label: str  # "old" or "new"
    spec: str  # as given on the command line
    rev: str  # commit (full hash), "+dirty" when a worktree had uncommitted edits
    path: Path
    store: Path  # a store of the benchmark's checkpoint converted by this revision

    @property
    def init_file(self) -> str:
        return str((self.path / "ckptstore" / "__init__.py").resolve())

    @property
    def short(self) -> str:
        return self.rev[:7] + ("+dirty" if self.rev.endswith("+dirty") else "")

    def env(self, harness_dir: Path) -> dict[str, str]:
        """The worker environment that imports this tree's ckptstore and this checkout's benchmarks."""
        return {"PYTHONPATH": f"{self.path}{os.pathsep}{harness_dir}", "PYTHONSAFEPATH": "1"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def extract(spec: str, repo: Path, dest: Path) -> str:
    """Put revision ``spec``'s ``ckptstore/`` under ``dest``; return its commit.

    ``spec`` is a commit-ish of ``repo`` (``git archive`` of its ``ckptstore/`` folder: the
    committed files, nothing else) or the path of a checkout (its ``ckptstore/`` copied as it
    is on disk, ``__pycache__`` left out; the commit gets ``+dirty`` if it has uncommitted edits).
    """
    dest.mkdir(parents=True)
    checkout = Path(spec)
    if (checkout / "ckptstore" / "__init__.py").is_file():
        shutil.copytree(checkout / "ckptstore", dest / "ckptstore", ignore=shutil.ignore_patterns("__pycache__"))
        rev = _git(checkout, "rev-parse", "HEAD")
        return rev + ("+dirty" if _git(checkout, "status", "--porcelain", "--", "ckptstore") else "")
    try:
        rev = _git(repo, "rev-parse", "--verify", f"{spec}^{{commit}}")
    except subprocess.CalledProcessError as e:
        raise BenchmarkError(f"{spec!r} is neither a revision of {repo} nor a checkout with a ckptstore/ "
                             f"folder: {e.stderr.strip()}") from e
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", rev, "ckptstore"],
                               stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    assert archive.stdout is not None
    archive.stdout.close()
    if archive.wait() != 0:
        raise BenchmarkError(f"git archive {rev} ckptstore failed (exit {archive.returncode})")
    return rev


_CONVERT_ONCE = """
import sys, ckptstore
src, strategy, out, expected = sys.argv[1:]
assert ckptstore.__file__ == expected, (ckptstore.__file__, expected)
ckptstore.convert(src, out, strategy=[strategy], overwrite=True)
"""


def make_store(tree_path: Path, harness_dir: Path, ckpt_dir: Path, strategy: Path, out: Path) -> None:
    """Convert the checkpoint with the tree's ckptstore (in a subprocess, untimed) into ``out``."""
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": f"{tree_path}{os.pathsep}{harness_dir}",
           "PYTHONSAFEPATH": "1"}
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", _CONVERT_ONCE, str(ckpt_dir), str(strategy), str(out),
                           str(tree_path / "ckptstore" / "__init__.py")], env=env, cwd=str(tree_path),
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise BenchmarkError(f"converting with {tree_path} failed:\n{done.stderr[-3000:]}")


def prepare_tree(label: str, spec: str, repo: Path, work: Path, cache_root: Path, harness_dir: Path,
                 ckpt_dir: Path, strategy: Path) -> Tree:
    """Extract ``spec`` and make its store (cached under ``cache_root`` per git tree of
    ``ckptstore/``; a dirty checkout's store is made again in ``work``)."""
    path = work / label
    rev = extract(spec, repo, path)
    if rev.endswith("+dirty"):
        store = work / f"{label}-store.zarr"
        make_store(path, harness_dir, ckpt_dir, strategy, store)
    else:
        # keyed by the ckptstore/ folder's git tree: commits that did not touch it share one store
        folder = cache_root / _git(repo, "rev-parse", f"{rev}:ckptstore")
        store = folder / "store.zarr"
        if not (folder / "DONE").exists():
            folder.mkdir(parents=True, exist_ok=True)
            make_store(path, harness_dir, ckpt_dir, strategy, store)
            (folder / "DONE").write_text("", encoding="utf-8")
    return Tree(label, spec, rev, path, store)


# ---------------------------------------------------------------------------------------------
# the run


def contender_name(route: str, tree: Tree) -> str:
    return f"{route} [{tree.label} {tree.short}]"


def contenders_for(trees: Sequence[Tree], harness_dir: Path, *, routes: Sequence[str], dst_strategy: str, rank: int,
                   names_file: str, ckpt_dir: str, src_strategy: str, out_root: Path, flat_file: str,
                   rank_nbytes: int, rank_files: Sequence[str] = ()) -> list[Contender]:
    """The bound, then for each route its old and new contender next to each other."""
    out = [Contender(BOUND, "benchmarks.contenders", "pread_flat",
                     {"path": flat_file, "nbytes": rank_nbytes, "names_file": names_file},
                     preimport=("numpy",), check="check_flat")]
    for route in routes:
        for t in trees:
            env = t.env(harness_dir)
            load_pre = LOAD_PREIMPORT
            load_args = {"store": str(t.store), "strategy": dst_strategy, "rank": rank, "names_file": names_file}
            # one output folder per route, not per revision (each run clears it first): a folder of
            # its own put one revision's files in other places of the disk, and identical code raced
            # against itself came out 1.23x on convert that way
            write_args = {"src_dir": ckpt_dir, "strategy": src_strategy, "out": str(out_root / route)}
            name = contender_name(route, t)
            if route == "load_rank":
                c = Contender(name, MODULE, "load_rank", load_args, preimport=load_pre, env=env, check="check_load")
            elif route == "load_into_net":
                c = Contender(name, MODULE, "load_into_net", load_args, preimport=load_pre, env=env,
                              setup="setup_net", check="check_into_net")
            elif route == "save":
                c = Contender(name, MODULE, "save", {"rank_files": rank_files, "strategy": src_strategy,
                                                     "out": write_args["out"]},
                              preimport=("ckptstore",), env=env, setup="setup_save", check="check_save")
            else:
                c = Contender(name, MODULE, route, write_args, preimport=WRITE_PREIMPORT, env=env,
                              check="check_written", track_children=True)
            out.append(c)
    return out


def _clear_output(c: Contender) -> None:
    out = c.args.get("out")
    if out:
        shutil.rmtree(out, ignore_errors=True)


def _files(root: Path) -> list[str]:
    return [str(p) for p in sorted(root.rglob("*")) if p.is_file()]


def run(*, base: str, head: str, size: int, src_world: str, dst_world: str, rank: int, reps: int, seed: int,
        repo: Path, command: str, results_dir: Path | None, routes: Sequence[str] = ROUTES,
        log: Any = None) -> dict[str, Any]:
    """Prepare both trees and stores, race them (``reps`` measured rounds after one warm-up round),
    and return the run record (appended to ``results_dir/versions.json`` unless None)."""
    from benchmarks.bench_load import target_files
    from benchmarks.synth import parse_mesh, synth

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    s = synth(size, parse_mesh(src_world, source=True), seed)
    dst = parse_mesh(dst_world, source=False)
    dst_strategy, _, names_file = target_files(s, dst, rank)
    flat = s.flat_file(dst, rank, names_file)
    work = s.root / f"versions_run_{os.getpid()}"  # per run: two runs may share the cache
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        harness_dir = work / "harness"
        harness_dir.mkdir()
        (harness_dir / "benchmarks").symlink_to(Path(__file__).resolve().parent, target_is_directory=True)
        trees = []
        for label, spec in (("old", base), ("new", head)):
            log(f"preparing {label} = {spec}: extract ckptstore/, convert the checkpoint with it (untimed)")
            trees.append(prepare_tree(label, spec, repo, work, s.root / "versions", harness_dir, s.ckpt_dir,
                                      s.strategy))
        out_root = work / "out"
        out_root.mkdir()
        contenders = contenders_for(trees, harness_dir, routes=routes, dst_strategy=dst_strategy, rank=rank,
                                    names_file=str(names_file), ckpt_dir=str(s.ckpt_dir),
                                    src_strategy=str(s.strategy), out_root=out_root, flat_file=str(flat),
                                    rank_nbytes=flat.stat().st_size, rank_files=[*map(str, s.rank_files)])
        warm = [*map(str, s.rank_files), str(flat), *[f for t in trees for f in _files(t.store)]]
        params = {**s.describe(), "dst": {"dp": dst.dp, "mp": dst.mp}, "dst_world": dst.world, "rank": rank,
                  "rank_nbytes": flat.stat().st_size, "dst_strategy": dst_strategy, "warmup_rounds": 1,
                  "routes": list(routes),
                  "trees": [{"label": t.label, "spec": t.spec, "rev": t.rev, "short": t.short, "store": str(t.store)}
                            for t in trees]}
        record = run_benchmark(NAME, contenders, reps=reps + 1, warm_paths=warm, params=params, command=command,
                               results_dir=None, log=log, sync_before=True, before_each=_clear_output,
                               timeout=1800)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    measured = [x for x in record["samples"] if x["round"] >= 1]
    record["summary"] = summarize(measured)  # round 0 was the warm-up
    record["reps"] = reps
    for x in record["samples"]:
        x["warmup"] = x["round"] == 0
    check_trees(record, trees)
    record["verdicts"] = verdicts(record, trees, routes)
    if results_dir is not None:
        append_result(NAME, record, results_dir)
    return record


def check_trees(record: Mapping[str, Any], trees: Sequence[Tree]) -> None:
    """Stop if any worker imported another ckptstore than its revision's (a wrong ``sys.path``)."""
    expected = {contender_name(r, t): t.init_file for r in record["params"]["routes"] for t in trees}
    for x in record["samples"]:
        want = expected.get(x["contender"])
        got = x.get("check", {}).get("ckptstore")
        if want is not None and got != want:
            raise BenchmarkError(f"{x['contender']} imported {got}, not {want}")


def verdicts(record: Mapping[str, Any], trees: Sequence[Tree], routes: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per route: the verdict on the ratio new/old of the median wall times, and beside it the
    ratio of the fastest runs, the median of the per-round ratios (old and new of one round ran
    next to each other) and the new/old ratios of peak memory and bytes read."""
    old, new = trees
    summary = record["summary"]
    out: dict[str, dict[str, Any]] = {}
    for route in routes:
        a_name, b_name = contender_name(route, old), contender_name(route, new)
        a, b = summary.get(a_name), summary.get(b_name)
        if a is None or b is None:
            out[route] = {"verdict": "not judged (a contender failed)"}
            continue
        ratio = b["wall_s"]["median"] / a["wall_s"]["median"]
        walls = {(x["contender"], x["round"]): x["wall_s"] for x in record["samples"] if x["round"] >= 1}
        paired = _per_round_ratios(walls, a_name, b_name, record["reps"])
        entry: dict[str, Any] = {"old_wall_s": a["wall_s"]["median"], "new_wall_s": b["wall_s"]["median"],
                                 "wall_ratio": ratio, "within": ratio <= LIMIT,
                                 "min_ratio": b["wall_s"]["min"] / a["wall_s"]["min"],
                                 "paired_ratios": paired,
                                 "paired_median": statistics.median(paired) if paired else None}
        for metric in ("cpu_s", "peak_above_start", "tree_peak_above_start", "rchar"):
            if metric in a and metric in b and a[metric]["median"]:
                entry[f"{metric}_ratio"] = b[metric]["median"] / a[metric]["median"]
        entry["paired_ci"] = median_ci(paired)
        if route == "save":  # judged on the ranks' own clocks: the wall time also holds 8 MindSpore exits
            for metric in ("stall_s", "committed_s", "ranks_cpu_s"):
                per_round = {(x["contender"], x["round"]): x["check"][metric] for x in record["samples"]
                             if x["round"] >= 1 and metric in x.get("check", {})}
                got = {n: [v for (c, _), v in per_round.items() if c == n] for n in (a_name, b_name)}
                if not got[a_name] or not got[b_name]:
                    continue  # a revision of the harness that did not record it
                key = metric[:-2]
                pairs = _per_round_ratios(per_round, a_name, b_name, record["reps"])
                old_m, new_m = statistics.median(got[a_name]), statistics.median(got[b_name])
                entry.update({f"old_{metric}": old_m, f"new_{metric}": new_m, f"{key}_ratio": new_m / old_m,
                              f"{key}_paired_ci": median_ci(pairs)})
            entry["within"] = entry["stall_ratio"] <= LIMIT and entry["committed_ratio"] <= LIMIT
        out[route] = entry
    return out


def _per_round_ratios(values: Mapping[tuple[str, int], float], old: str, new: str, reps: int) -> list[float]:
    """new / old of each measured round in which both ran (``values`` by contender and round)."""
    return [values[new, r] / values[old, r] for r in range(1, reps + 1) if (old, r) in values and (new, r) in values]


def median_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval of the median of ``values`` (the order statistics
    that the binomial distribution puts around it), or None when there are too few values for
    one (fewer than 6 at 95%). Applied to the per-round new/old ratios it says how far this
    machine's noise lets one run tell a ratio from 1.05."""
    n = len(values)
    ordered = sorted(values)
    below, k = 0.0, 0  # P(Binomial(n, 1/2) <= k - 1): the chance that the median is below ordered[k]
    while True:
        p_next = below + math.comb(n, k) / 2**n
        if p_next > (1 - level) / 2:
            break
        below, k = p_next, k + 1
    if k == 0:
        return None
    return ordered[k - 1], ordered[n - k]


# ---------------------------------------------------------------------------------------------
# the report


def report_figure(route: str, params: Mapping[str, Any], results_dir: Path = RESULTS_DIR) -> tuple[float, str] | None:
    """REPORT.md's median wall time of this route and the revision it was measured at: the last
    warm record of ``results/raw/load.json`` / ``convert.json`` on the same checkpoint (and, for a
    load, the same target), or None."""
    from benchmarks.harness import load_results, raw_path

    if route not in REPORT_CONTENDERS:  # bench_save's records are of another shape
        return None
    scenario, contender = REPORT_CONTENDERS[route]
    same = ("size_requested", "src_world", "seed") + (("dst_world", "rank") if scenario == "load" else ())
    for rec in reversed(load_results(raw_path(results_dir, f"{scenario}.json"))):
        if rec.get("cache") == "warm" and all(rec["params"].get(k) == params.get(k) for k in same) \
                and contender in rec["summary"]:
            return rec["summary"][contender]["wall_s"]["median"], str(rec["environment"].get("git"))
    return None


def _stat(stats: Mapping[str, Any], metric: str, fmt: Any) -> str:
    s = stats.get(metric)
    if s is None:
        return "–"
    return f"{fmt(s['median'])} ({fmt(s['min'])}–{fmt(s['max'])})"


def render(record: Mapping[str, Any]) -> str:
    """The Markdown report: the machine and its load, one table of old vs new per route, the verdicts."""
    from benchmarks.report import format_bytes, format_seconds, machine_line, not_run_reason

    p = record["params"]
    old, new = p["trees"]
    summary = record["summary"]
    load = record["loadavg"]
    lines = [
        "# Old vs new: ckptstore revisions side by side", "",
        f"Command: `{record['command']}`", "",
        f"Machine: {machine_line(record)}", "",
        f"Revisions: **old** = `{old['spec']}` ({old['rev'][:12]}), **new** = `{new['spec']}` ({new['rev'][:12]}); "
        "each worker imports the revision's `ckptstore/` extracted by `git archive` (checked: every worker "
        "recorded the `ckptstore/__init__.py` it imported), the measuring code is the same for both.", "",
        f"Checkpoint: PanGu-Alpha-shaped, {format_bytes(p['model_bytes'])} of global tensors ({p['params']} "
        f"parameters), saved by MindSpore on {p['src_world']} ranks (dp{p['src']['dp']}×mp{p['src']['mp']}): rank "
        f"files {format_bytes(p['rank_file_bytes'])}. Target dp{p['dst']['dp']}×mp{p['dst']['mp']}, rank {p['rank']} "
        f"holds {format_bytes(p['rank_nbytes'])}. Loads read a store converted by the same revision.", "",
        f"Load on the machine: load average {', '.join(f'{x:.2f}' for x in load['before'])} before, "
        f"{', '.join(f'{x:.2f}' for x in load['after'])} after; other processes kept "
        f"{record['foreign_cpu_cores']:.2f} of the {record['environment'].get('nproc', '?')} cores busy on average "
        f"({'above ~0.3: timings disturbed' if record['foreign_cpu_cores'] > 0.3 else 'a quiet machine'}). "
        "Old and new of a route run next to each other, in alternating order, so they share any disturbance; "
        "the ratios are the result, absolute times depend on the machine's state. CPU time (user + "
        "system, the worker's threads) is far less sensitive to other processes than wall time.", "",
        f"{record['reps']} measured rounds after 1 warm-up round (left out); cells are median (min–max).", "",
        "| route | old wall | new wall | **new / old** (medians) | verdict (≤ 1.05×) | new / old of the fastest runs | "
        "new / old per round: median (min–max; 95% interval of the median) | old CPU time | new CPU time | "
        "new / old CPU | "
        "old peak RSS above start | new peak RSS above start | "
        "old bytes read (rchar) | new bytes read (rchar) | REPORT.md (rev) | new / REPORT.md |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    mem = "tree_peak_above_start"
    for route in p["routes"]:
        a_name, b_name = (f"{route} [{t['label']} {t['short']}]" for t in (old, new))
        if a_name not in summary or b_name not in summary:
            why = "; ".join(f"{n}: {not_run_reason(record, n)}" for n in (a_name, b_name) if n not in summary)
            lines.append(f"| {ROUTE_TITLES[route]} | {why} | | | not judged |" + " |" * 11)
            continue
        a, b = summary[a_name], summary[b_name]
        v = record["verdicts"][route]
        m = mem if mem in a else "peak_above_start"
        ref = report_figure(route, p)
        ref_cell = f"{format_seconds(ref[0])} ({ref[1]})" if ref else "–"
        ref_ratio = f"{b['wall_s']['median'] / ref[0]:.3f}×" if ref else "–"
        lines.append(
            f"| {ROUTE_TITLES[route]} | {_stat(a, 'wall_s', format_seconds)} | {_stat(b, 'wall_s', format_seconds)} | "
            f"**{v['wall_ratio']:.3f}×** | {'within' if v['within'] else '**over**'} | {v['min_ratio']:.3f}× | "
            f"{_paired(v['paired_ratios'])} | {_stat(a, 'cpu_s', format_seconds)} | "
            f"{_stat(b, 'cpu_s', format_seconds)} | "
            f"{v['cpu_s_ratio']:.3f}× | "
            f"{_stat(a, m, format_bytes)} | {_stat(b, m, format_bytes)} | {_stat(a, 'rchar', format_bytes)} | "
            f"{_stat(b, 'rchar', format_bytes)} | {ref_cell} | {ref_ratio} |")
    save_v = record["verdicts"].get("save", {})
    if "stall_ratio" in save_v:
        lines += ["", "Save route, timed by the ranks from their release (the wall time above also holds the 8 rank "
                      "processes' exits): **stall** (slowest rank's save call) old "
                      f"{format_seconds(save_v['old_stall_s'])}, new {format_seconds(save_v['new_stall_s'])}, "
                      f"**new / old {save_v['stall_ratio']:.3f}×**; **committed** (the last rank's save done, "
                      f"durable) old {format_seconds(save_v['old_committed_s'])}, new "
                      f"{format_seconds(save_v['new_committed_s'])}, **new / old {save_v['committed_ratio']:.3f}×** "
                      f"(medians; the verdict, {'within' if save_v['within'] else '**over**'}, needs both ≤ {LIMIT}×)."]
        cis = [f"{label} {_ci(save_v.get(key))}" for label, key in (("stall", "stall_paired_ci"),
                                                                     ("committed", "committed_paired_ci"))]
        if "ranks_cpu_ratio" in save_v:
            lines += ["", "The 8 ranks' own CPU time (user + system, every thread, release to the save's end, summed): "
                          f"old {format_seconds(save_v['old_ranks_cpu_s'])}, new "
                          f"{format_seconds(save_v['new_ranks_cpu_s'])}, **new / old "
                          f"{save_v['ranks_cpu_ratio']:.3f}×**, 95% interval of the per-round median "
                          f"{_ci(save_v.get('ranks_cpu_paired_ci'))}."]
        lines += ["", f"95% intervals of the median per-round new / old: {'; '.join(cis)}."]
    if BOUND in summary:
        lines += ["", f"`{BOUND}` (one `os.preadv` of a file of exactly the rank's bytes, one thread, same run): "
                      f"{_stat(summary[BOUND], 'wall_s', format_seconds)}."]
    lines += ["", "Same values: " + same_values_line(record, old, new), "",
              "Peak RSS of convert / index includes the processes they start (`tree_peak_above_start`). "
              "Every convert / index ends with `os.sync()` (as in bench_convert), so both revisions pay for "
              "durability. The REPORT.md column is the latest warm record of `results/raw/load.json` / "
              "`results/raw/convert.json` on the same checkpoint (another run, another revision, another state of the "
              "machine): context, not the verdict.", ""]
    return "\n".join(lines)


def _paired(ratios: Sequence[float]) -> str:
    if not ratios:
        return "–"
    ci = median_ci(ratios)
    return f"{statistics.median(ratios):.3f}× ({min(ratios):.2f}–{max(ratios):.2f}; 95% interval {_ci(ci)})"


def _ci(ci: Sequence[float] | None) -> str:
    return "– (too few rounds)" if ci is None else f"{ci[0]:.3f}–{ci[1]:.3f}×"


def same_values_line(record: Mapping[str, Any], old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """Whether old and new loaded the same tensors (digests), and the sizes of what they wrote."""
    checks = record["checks"]
    parts = []
    for route in record["params"]["routes"]:
        got = {t["label"]: checks.get(f"{route} [{t['label']} {t['short']}]", {}) for t in (old, new)}
        key = "digest" if route.startswith("load") else "written" if route == "save" else "output_bytes"
        va, vb = got["old"].get(key), got["new"].get(key)
        if va is None or vb is None:
            parts.append(f"{route}: not compared")
        elif route.startswith("load"):
            parts.append(f"{route}: {'identical tensors' if va == vb else 'DIFFERENT tensors'}")
        else:
            parts.append(f"{route}: output {va:,} B (old) vs {vb:,} B (new)")
    return "; ".join(parts) + "."


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_versions", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="old revision (commit-ish of this repository, or a checkout)")
    ap.add_argument("--head", default="HEAD", help="new revision or checkout path (default: HEAD of this repository)")
    ap.add_argument("--size", default="1GB")
    ap.add_argument("--src-world", default="8")
    ap.add_argument("--dst-world", default="4")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--reps", type=int, default=5, help="measured rounds (one warm-up round is added)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--routes", default=",".join(ROUTES),
                    help=f"comma-separated subset of {','.join(ROUTES)} (default: all)")
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = ap.parse_args(argv)
    args.routes = [r.strip() for r in args.routes.split(",") if r.strip()]
    unknown = [r for r in args.routes if r not in ROUTES]
    if unknown or not args.routes:
        ap.error(f"--routes: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(ROUTES)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.data import parse_size
    from benchmarks.harness import REPO_ROOT, run_and_publish

    args = parse_args(argv)
    return run_and_publish(
        lambda: run(base=args.base, head=args.head, size=parse_size(args.size), src_world=args.src_world,
                    dst_world=args.dst_world, rank=args.rank, reps=args.reps, seed=args.seed, repo=REPO_ROOT,
                    routes=args.routes,
                    command=command_line("benchmarks.bench_versions", argv), results_dir=args.results_dir),
        render, args.results_dir, NAME)


if __name__ == "__main__":
    sys.exit(main())
