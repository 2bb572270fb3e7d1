"""``python -m benchmarks run``: every scenario, results and REPORT.md in one go.

    python -m benchmarks run [--size 1GB] [--src-world 8] [--dst-world 4] [--reps 3] [--quick]
                             [--cold-load] [--scaling] [--out benchmarks/results]

Default: a 1 GB PanGu-shaped checkpoint on 8 ranks (dp2×mp4) loaded as rank 0 of 4 (dp1×mp4),
3 repetitions; conversion (and indexing) of the same files; 8 concurrent loaders of a 0.5 GB
checkpoint 8 → 8; ``ckptstore.index`` of a sparse 130B-shaped checkpoint on 128 ranks (headers
only: 2.3 TiB apparent, 1.7 GiB on disk); under 25 minutes on a 2-core machine once the synthetic
checkpoints are cached.
``--quick`` is a smoke test (tiny sizes, one repetition, about 1.5 minutes). ``--cold-load`` also
runs the load scenario with the page cache dropped before every measured run. ``--scaling`` adds
the load and convert scenarios over model sizes and source world sizes, with PNG plots (they need
matplotlib, from the ``bench`` extra: ``pip install -e '.[bench]'``; without it the tables are written
and the report says why there are no plots).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.harness import RESULTS_DIR, command_line


def _sizes(text: str) -> list[int]:
    from benchmarks.data import parse_size

    return [parse_size(t) for t in text.split(",") if t.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the suite and write REPORT.md")
    r.add_argument("--size", default="1GB", help="model size (global tensors incl. Adam), e.g. 1GB, 3GB, 512MiB")
    r.add_argument("--src-world", default="8", help="source ranks: 4, 8 (dp2×mp4), 16, 32 or DPxMP")
    r.add_argument("--dst-world", default="4", help="target ranks of the load scenario, or DPxMP")
    r.add_argument("--rank", type=int, default=0, help="target rank the load scenario loads")
    r.add_argument("--reps", type=int, default=3, help="repetitions per contender (alternating order)")
    r.add_argument("--baseline-reps", type=int, default=None, help="cap the MindSpore load routes' repetitions")
    r.add_argument("--quick", action="store_true", help="smoke test: tiny sizes, one repetition (about 1.5 minutes)")
    r.add_argument("--cold-load", action="store_true",
                   help="also run the load scenario with the page cache dropped before every measured run "
                        "(all of it as root, else every file read, with posix_fadvise): load-cold.json, a "
                        "section of REPORT.md")
    r.add_argument("--scaling", action="store_true",
                   help="also sweep model sizes and source world sizes (tables; PNG plots need the bench extra: "
                        "pip install -e '.[bench]')")
    r.add_argument("--scaling-sizes", default="0.25GB,0.5GB,1GB", help="model sizes of the size sweep")
    r.add_argument("--scaling-worlds", default="4,8,16,32", help="source world sizes of the world sweep")
    r.add_argument("--scaling-world-size", default="0.5GB", help="model size of the world sweep")
    r.add_argument("--scaling-reps", type=int, default=1)
    r.add_argument("--node-size", default="0.5GB", help="model size of the node scenario")
    r.add_argument("--node-src-world", default="8")
    r.add_argument("--node-dst-world", default="8", help="loaders started at once (one per target rank)")
    r.add_argument("--node-reps", type=int, default=2)
    r.add_argument("--index-model", default="130B", help="model of the index scenario's sparse checkpoint")
    r.add_argument("--index-world", default="128", help="its source ranks (128 = dp16×mp8) or DPxMP")
    r.add_argument("--index-dst-world", default="8x8", help="target of its plan row (DPxMP)")
    r.add_argument("--index-reps", type=int, default=3)
    r.add_argument("--scenarios", default="load,reach,convert,node,index", help="comma-separated subset to run")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", type=Path, default=RESULTS_DIR, help="results folder (JSON, Markdown, plots)")
    rp = sub.add_parser("report", help="write REPORT.md again from the latest results in --out (runs nothing)")
    rp.add_argument("--out", type=Path, default=RESULTS_DIR)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "report":
        from benchmarks.suite import rebuild_report

        print(f"wrote {rebuild_report(args.out)}")
        return 0
    from benchmarks.data import parse_size
    from benchmarks.suite import SCENARIOS, SuiteConfig, quick_config, run_suite
    from benchmarks.synth import parse_mesh

    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        print(f"error: unknown scenario(s) {', '.join(sorted(unknown))}; known: {', '.join(SCENARIOS)}",
              file=sys.stderr)
        return 2
    cfg = SuiteConfig(
        size=parse_size(args.size), src=parse_mesh(args.src_world, source=True),
        dst=parse_mesh(args.dst_world, source=False), rank=args.rank, reps=args.reps,
        baseline_reps=args.baseline_reps, node_size=parse_size(args.node_size),
        node_src=parse_mesh(args.node_src_world, source=True), node_dst=parse_mesh(args.node_dst_world, source=False),
        node_reps=args.node_reps, scaling=args.scaling, scaling_sizes=_sizes(args.scaling_sizes),
        scaling_worlds=[int(w) for w in args.scaling_worlds.split(",") if w.strip()],
        scaling_world_size=parse_size(args.scaling_world_size), scaling_reps=args.scaling_reps,
        scenarios=scenarios, quick=args.quick, seed=args.seed, out=args.out, cold_load=args.cold_load,
        index_model=args.index_model, index_src=parse_mesh(args.index_world, source=True),
        index_dst=parse_mesh(args.index_dst_world, source=False), index_reps=args.index_reps)
    if not 0 <= cfg.rank < cfg.dst.world:
        print(f"error: --rank {cfg.rank} is outside the {cfg.dst.world} target ranks", file=sys.stderr)
        return 2
    if cfg.cold_load:
        from benchmarks.bench_load import cold_unavailable

        if cold_unavailable():
            print(f"error: {cold_unavailable()}", file=sys.stderr)
            return 2
    from benchmarks.bench_index import MODELS

    if cfg.index_model not in MODELS:
        print(f"error: unknown --index-model {cfg.index_model!r}; known: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    if cfg.quick:
        cfg = quick_config(cfg)
    if cfg.scaling:
        from benchmarks.plots import unavailable

        if unavailable():  # said before the run, not only in REPORT.md after it
            print(f"note: --scaling writes its tables, but {unavailable()}", file=sys.stderr)
    records = run_suite(cfg, command_line("benchmarks", argv))
    print(f"wrote {Path(cfg.out) / 'REPORT.md'}")
    if records["errors"]:
        print(f"error: scenario(s) failed: {', '.join(records['errors'])} (tracebacks in REPORT.md)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
