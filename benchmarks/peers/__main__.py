"""ckptstore vs PyTorch DCP vs Orbax vs the lower bound, loading one target rank.

``python -m benchmarks.peers --size 1GB --src-world 8 --dst-world 4 --rank 0 --reps 3``

The synthetic MindSpore checkpoint of :mod:`benchmarks.synth` (converted to a ckptstore store)
is also saved once in each peer's own format, from the same rank files, on the same source
layout. Then target rank ``r`` is loaded by each route, every run in a fresh process, rounds in
alternating order. Before any timing, one run of every route is checked against the expected
values (global tensors from the seeded generator, cut by MindSpore's own slicing code): a route
that loads other values stops the benchmark. Writes ``results/raw/peers.json`` (appended) and
``results/peers.md``.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_load import BOUND, CKPTSTORE, add_load_args, dataset_line, make_setup
from benchmarks.harness import (
    RESULTS_DIR,
    BenchmarkError,
    Contender,
    command_line,
    run_and_publish,
    run_benchmark,
    run_contender,
)
from benchmarks.peers import DCP, DCP_1T, ORBAX, ORBAX_ALL, dcp_contender, orbax_contenders
from benchmarks.report import Column, format_bytes, machine_line, markdown_table, one_line

NAME = "peers"
COLUMNS = (Column("wall_s", "wall", "s"), Column("peak_above_start", "peak RSS above start", "B"),
           Column("rchar", "bytes read (rchar)", "B"))
LABELS = {DCP: "DCP", DCP_1T: "DCP 1 thread", BOUND: "bound", CKPTSTORE: "ckptstore"}


def build(st: Any, *, orbax_all: bool, log: Any, dtype: str = "float32") -> list[Contender]:
    """ckptstore, the lower bound and the peers for one ``bench_load.LoadSetup``."""
    base = {"rank": st.rank, "names_file": st.names_file}
    # bench_load's contender for fp32; a wrapper whose check reads bfloat16 Parameters otherwise
    ours = (("benchmarks.contenders", "ckptstore_load_rank", "check_params") if dtype == "float32" else
            ("benchmarks.peers.variants", "ckptstore_load_rank", "check_load_rank"))
    return [
        Contender(CKPTSTORE, ours[0], ours[1], {"store": st.store, "strategy": st.dst_strategy, **base},
                  preimport=("mindspore", "ckptstore", ours[0]), check=ours[2]),
        Contender(BOUND, "benchmarks.contenders", "pread_flat",
                  {"path": st.flat_file, "nbytes": st.rank_nbytes, "names_file": st.names_file},
                  # ml_dtypes registers the name "bfloat16" with numpy, which check_flat's np.dtype(...) needs
                  preimport=("numpy",) if dtype == "float32" else ("numpy", "ml_dtypes"), check="check_flat"),
        dcp_contender(st, log=log),
        dcp_contender(st, one_thread=True, log=log),
        *orbax_contenders(st, all_ranks=orbax_all, log=log),
    ]


def verify(st: Any, contenders: Sequence[Contender], *, log: Any) -> dict[str, Any]:
    """Run each contender once and compare its values' digest with the expected one; raise on a mismatch."""
    from benchmarks.peers.expected import expected_digest

    want = expected_digest(st.synth, st.dst, st.rank, st.names_file)
    log(f"expected values of rank {st.rank}: {want['tensors']} tensors, {format_bytes(want['bytes'])}, "
        f"digest {want['digest']}")
    got: dict[str, Any] = {}
    for c in contenders:
        if c.unavailable:
            continue
        check = run_contender(c, timeout=1800).get("check", {})
        same = check.get("digest") == want["digest"] and not check.get("missing_or_misshapen")
        got[c.name] = {**check, "equal_to_expected": same}
        log(f"  {c.name:<52} digest {check.get('digest')}  {'equal' if same else 'DIFFERENT'}")
    bad = [n for n, g in got.items() if not g["equal_to_expected"]]
    if bad:
        raise BenchmarkError(f"these routes load other values than expected for rank {st.rank}: {bad}; "
                             f"expected {want}, got {[got[n] for n in bad]}")
    return {"expected": want, "routes": got}


def store_files(st: Any, contenders: Sequence[Contender]) -> list[str]:
    """Every file a contender reads (warmed once before the runs, so no one pays a cold cache)."""
    roots = [st.store, *(c.args["ckpt"] for c in contenders if "ckpt" in c.args)]
    files = [str(p) for r in roots for p in Path(r).rglob("*") if p.is_file()]
    return sorted(set(files)) + [st.flat_file]


def render(record: Mapping[str, Any]) -> str:
    p = record["params"]
    nbytes = p["rank_nbytes"]
    summary = record["summary"]
    bases = [b for b in (DCP, DCP_1T, BOUND) if b in summary]

    def per_rank_bytes(metric: str) -> Any:
        return lambda name: (f"{summary[name][metric]['median'] / nbytes:.3g}×" if name in summary else "–")

    ver = p.get("verification", {}).get("routes", {})
    want = p.get("verification", {}).get("expected", {}).get("digest", "?")
    rechecked = ", ".join(f"`{n}` {'same' if c.get('digest') == want and c.get('consistent') else 'DIFFERENT'}"
                          for n, c in record.get("checks", {}).items())
    table = markdown_table(record, columns=COLUMNS, baselines=bases, labels=LABELS, extra={
        "peak / rank bytes": per_rank_bytes("peak_above_start"),
        "read / rank bytes": per_rank_bytes("rchar"),
        "values = expected": lambda n: ("yes" if ver.get(n, {}).get("equal_to_expected") else
                                        "**no**" if n in ver else "–"),
    })
    load = record.get("loadavg", {})
    lines = [
        f"## One target rank, ckptstore vs peers: {p['src_world']} → {p['dst_world']} cards, rank {p['rank']}",
        "",
        f"Command: `{record['command']}`",
        "",
        f"Machine: {machine_line(record)}; torch {p['versions'].get('torch')}, jax {p['versions'].get('jax')}, "
        f"orbax-checkpoint {p['versions'].get('orbax-checkpoint')}, tensorstore {p['versions'].get('tensorstore')}. "
        f"Load average before/after: {_loadavg(load.get('before'))} / {_loadavg(load.get('after'))}; other "
        f"processes kept {record.get('foreign_cpu_cores', 0):.2f} cores busy on average during the run. "
        f"`uptime` before: {p.get('uptime_before', '?')}",
        "",
        dataset_line(p) if p.get("dtype", "float32") == "float32" else
        dataset_line(p).replace("fp32 weights", f"**{p['dtype']}** weights"),
        "",
        table,
        "",
        "Cells: median (min–max) over runs; ratios compare medians. `values = expected`: a run of the route, "
        "before timing, gave tensors bit-identical to the expected ones (seeded global tensors cut by "
        "MindSpore's own slicing code), compared by CRC-32C digest of every in-strategy tensor "
        f"(expected digest `{want}`). Every timed run was digested again after its measurement: {rechecked}.",
        "",
        "What each row measures (one call in a fresh process, imports and the untimed setup done before it; "
        "every row is timed from \"a model / state dict with the target shapes exists\" to \"its tensors are "
        "filled\"):",
        f"- `{CKPTSTORE}`: `ckptstore.load_rank(store, target strategy, rank).materialize()`: every Parameter "
        "built (MindSpore Parameters sharing the arrays ckptstore read into, ckptstore's default workers); no setup.",
        f"- `{BOUND}`: one `os.preadv` of a file holding exactly the rank's bytes into one numpy array.",
        f"- `{DCP}`: `dcp.load(state, FileSystemReader(dir), no_dist=True)` alone; the setup (untimed) initialised "
        "`init_process_group('fake', rank=r, world_size=dst)` and built the meshes and the target DTensors "
        "(`torch.zeros` local shards). The DCP checkpoint was saved from the same MindSpore rank files by 8 gloo "
        "processes (DTensors on the equivalent mesh, replicas written once).",
        f"- `{DCP_1T}`: the same with `OMP_NUM_THREADS=1` (torch's intra-op threads 2 → 1). On this shared 2-core "
        "machine torch's parallel `copy_` waits for its second thread whenever another process holds the other "
        "core, which makes the default configuration 2–4× slower and erratic (CPU time grows with the wall time).",
        f"- `{ORBAX}`: `StandardCheckpointer(active_processes={{r}}).restore(dir, abstract tree)` (checkpointer "
        "made inside the timed call; the abstract tree with target `NamedSharding`s built in the setup), in the "
        "process of rank r of a `jax.distributed` job of dst CPU processes (joined before "
        "the call; the other processes idle), so only rank r's shards are read and built into `jax.Array`s. "
        "Orbax's defaults (OCDBT, Zarr with its default zstd compression) — hence fewer bytes read than the "
        "rank holds.",
        f"- `{ORBAX_ALL}`: the same restore in one process with dst virtual CPU devices: it reads and builds "
        "*every* target rank's shards (for reference; not a per-rank cost).",
    ]
    for name, why in {**record.get("unavailable", {}), **record.get("failed", {})}.items():
        lines += ["", f"- `{name}` did not run: {one_line(why, 1500)}"]
    return "\n".join(lines) + "\n"


def _loadavg(values: Any) -> str:
    return ", ".join(f"{x:.2f}" for x in values) if values else "?"


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in ("torch", "jax", "jaxlib", "orbax-checkpoint", "tensorstore"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _uptime() -> str:
    try:
        return os.popen("uptime").read().strip()
    except OSError:
        return "?"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_args(ap)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="dtype of every floating-point tensor (bfloat16: a separate cached checkpoint)")
    ap.add_argument("--no-orbax-all", action="store_true", help="skip the single-process all-ranks Orbax row")
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.data import parse_size
    from benchmarks.peers.variants import dtype_synth
    from benchmarks.synth import parse_mesh

    args = parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    uptime = _uptime()
    name = NAME if args.dtype == "float32" else f"{NAME}-{args.dtype}"  # results/<name>.json and .md
    s = dtype_synth(parse_size(args.size), parse_mesh(args.src_world, source=True), args.seed, dtype=args.dtype)
    st = make_setup(s, parse_mesh(args.dst_world, source=False), args.rank)
    contenders = build(st, orbax_all=not args.no_orbax_all, log=log, dtype=args.dtype)
    def measure() -> dict[str, Any]:
        verification = verify(st, contenders, log=log)
        return run_benchmark(name, contenders, reps=args.reps, warm_paths=store_files(st, contenders),
                             params={**st.params(), "dtype": args.dtype, "verification": verification,
                                     "versions": _versions(), "uptime_before": uptime},
                             command=command_line("benchmarks.peers", argv), results_dir=args.results_dir,
                             keep_going=True, timeout=1800)

    return run_and_publish(measure, render, args.results_dir, name)


if __name__ == "__main__":
    sys.exit(main())
