"""The whole suite: every scenario, one report (``python -m benchmarks run``).

Scenarios, in order: ``load`` (one target rank, every route; with ``--cold-load`` again with
the page cache dropped before every measured run, as the record ``load-cold``), ``reach``
(which target ranks the MindSpore routes load correctly, on a small model), ``convert``,
``node`` (8 loaders at once), ``index`` (``ckptstore.index`` of a sparse 130B-shaped checkpoint
on 128 ranks, from its headers: :mod:`benchmarks.bench_index`) and, with ``--scaling``, the load
and convert scenarios again over model sizes and source world sizes. Each writes
``<out>/<name>.json`` (the latest run of each scenario) and ``<out>/<name>.md``; the suite
writes ``<out>/REPORT.md`` with every table, the targets of benchmarks/README.md judged on this run, and
the plots.
"""
from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import bench_convert, bench_index, bench_load, bench_node, targets
from benchmarks.harness import RAW, append_result, environment, raw_path
from benchmarks.report import format_bytes, format_seconds, machine_line
from benchmarks.synth import Mesh, source_mesh, synth

SCENARIOS = ("load", "reach", "convert", "node", "index")
REACH_SIZE = 8_000_000
QUICK_SIZE = 8_000_000


@dataclass
class SuiteConfig:
    """What ``python -m benchmarks run`` was asked to do (see ``--help``)."""

    size: int = 1_000_000_000
    src: Mesh = Mesh(2, 4)
    dst: Mesh = Mesh(1, 4)
    rank: int = 0
    reps: int = 3
    baseline_reps: int | None = None
    node_size: int = 500_000_000
    node_src: Mesh = Mesh(2, 4)
    node_dst: Mesh = Mesh(1, 8)
    node_reps: int = 2
    scaling: bool = False
    scaling_sizes: Sequence[int] = (250_000_000, 500_000_000, 1_000_000_000)
    scaling_worlds: Sequence[int] = (4, 8, 16, 32)
    scaling_world_size: int = 500_000_000
    scaling_reps: int = 1
    scenarios: Sequence[str] = SCENARIOS
    quick: bool = False
    seed: int = 0
    out: Path = Path("benchmarks/results")
    reach_ranks: Sequence[int] | None = None
    cold_load: bool = False  # also run the load scenario with the page cache dropped before every run
    index_model: str = "130B"  # the index scenario's sparse checkpoint (bench_index.MODELS)
    index_src: Mesh = Mesh(16, 8)
    index_dst: Mesh = Mesh(8, 8)  # target of its plan row
    index_reps: int = 3
    extra: dict[str, Any] = field(default_factory=dict)


def quick_config(cfg: SuiteConfig) -> SuiteConfig:
    """``--quick``: tiny sizes, one repetition, two node loaders, one rank checked for reach."""
    cfg.size = cfg.node_size = cfg.scaling_world_size = QUICK_SIZE
    cfg.reps = cfg.node_reps = cfg.scaling_reps = 1
    cfg.node_dst = Mesh(1, 2)
    cfg.scaling_sizes = (4_000_000, QUICK_SIZE)
    cfg.scaling_worlds = (4, 8)
    cfg.reach_ranks = [cfg.dst.world - 1]
    cfg.index_model, cfg.index_src, cfg.index_dst = bench_index.QUICK
    cfg.index_reps = 1
    return cfg


def run_suite(cfg: SuiteConfig, command: str, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the chosen scenarios, write their results and REPORT.md; return the records.

    A scenario that raises is recorded under ``records["errors"]`` (with its traceback, also in
    REPORT.md) and the others still run.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    records: dict[str, Any] = {"errors": {}}
    steps = [(name, step) for name, step in (("load", _load), ("reach", _reach), ("convert", _convert),
                                             ("node", _node), ("index", _index)) if name in cfg.scenarios]
    if cfg.cold_load:
        steps.insert(1 if "load" in cfg.scenarios else 0, (bench_load.COLD_NAME, _load_cold))
    if cfg.scaling:
        steps.append(("scaling", lambda c, cmd, lg: run_scaling(c, cmd, lg)))
    for name, step in steps:
        log(f"scenario {name}")
        try:
            records[name] = step(cfg, command, log)
        except Exception:
            records["errors"][name] = traceback.format_exc()
            log(f"scenario {name} FAILED:\n{records['errors'][name]}")
    records["seconds"] = time.monotonic() - started
    append_result("suite", {"name": "suite", "date": _now(), "command": command, "seconds": records["seconds"],
                            "scenarios": [n for n, _ in steps], "errors": records["errors"]}, out)
    _write(out / "REPORT.md", report(records, cfg, command))
    return records


def _main_synth(cfg: SuiteConfig) -> Any:
    return synth(cfg.size, cfg.src, cfg.seed)


def _load(cfg: SuiteConfig, command: str, log: Callable[[str], None]) -> dict[str, Any]:
    st = bench_load.make_setup(_main_synth(cfg), cfg.dst, cfg.rank)
    rec = bench_load.run(st, reps=cfg.reps, baseline_reps=cfg.baseline_reps, command=command, results_dir=cfg.out,
                         quick=cfg.quick)
    _write(Path(cfg.out) / "load.md", bench_load.render(rec))
    return rec


def _load_cold(cfg: SuiteConfig, command: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The load scenario again, the page cache dropped before every measured run (``load-cold``)."""
    st = bench_load.make_setup(_main_synth(cfg), cfg.dst, cfg.rank)
    rec = bench_load.run(st, reps=cfg.reps, baseline_reps=cfg.baseline_reps, command=command, results_dir=cfg.out,
                         quick=cfg.quick, cold=True)
    _write(Path(cfg.out) / f"{bench_load.COLD_NAME}.md", bench_load.render(rec))
    return rec


def _reach(cfg: SuiteConfig, command: str, log: Callable[[str], None]) -> dict[str, Any]:
    small = synth(REACH_SIZE, cfg.src, cfg.seed)
    routes = bench_load.REACH_ROUTES[:1] if cfg.quick else bench_load.REACH_ROUTES
    rec = bench_load.reach(small, cfg.dst, cfg.reach_ranks, routes=routes, log=log)
    rec.update(name="reach", command=command, date=_now(), environment=environment())
    append_result("reach", rec, Path(cfg.out))
    _write(Path(cfg.out) / "reach.md", "## Which target ranks each MindSpore route reaches\n\n"
           + bench_load.render_reach(rec))
    return rec


def _convert(cfg: SuiteConfig, command: str, log: Callable[[str], None]) -> dict[str, Any]:
    rec = bench_convert.run(bench_convert.make_setup(_main_synth(cfg), cfg.dst), reps=cfg.reps, command=command,
                            results_dir=cfg.out, quick=cfg.quick)
    _write(Path(cfg.out) / "convert.md", bench_convert.render(rec))
    return rec


def _node(cfg: SuiteConfig, command: str, log: Callable[[str], None]) -> dict[str, Any]:
    log(f"  {format_bytes(cfg.node_size)} on {cfg.node_src} → {cfg.node_dst}")
    ns = synth(cfg.node_size, cfg.node_src, cfg.seed)
    rec = bench_node.run(bench_node.make_setup(ns, cfg.node_dst), reps=cfg.node_reps, command=command,
                         results_dir=cfg.out, quick=cfg.quick, log=log)
    _write(Path(cfg.out) / "node.md", bench_node.render(rec))
    return rec


def _index(cfg: SuiteConfig, command: str, log: Callable[[str], None]) -> dict[str, Any]:
    st = bench_index.make_setup(cfg.index_model, cfg.index_src, cfg.index_dst, 0, log=log)
    rec = bench_index.run(st, reps=cfg.index_reps, command=command, results_dir=cfg.out, quick=cfg.quick, log=log)
    _write(Path(cfg.out) / f"{bench_index.NAME}.md", bench_index.render(rec))
    return rec


def run_scaling(cfg: SuiteConfig, command: str, log: Callable[[str], None]) -> dict[str, Any]:
    """Load and convert over model sizes (source = ``cfg.src``) and source world sizes."""
    points = [("size", size, cfg.src, size) for size in cfg.scaling_sizes]
    points += [("world", world, source_mesh(world), cfg.scaling_world_size) for world in cfg.scaling_worlds]
    results = []
    for axis, x, src, size in points:
        log(f"  scaling {axis}={x}: {format_bytes(size)} on {src} → {cfg.dst}")
        s = synth(size, src, cfg.seed)
        point: dict[str, Any] = {"axis": axis, "x": x, "size": size, "src_world": src.world,
                                 "model_bytes": s.model_bytes, "rank_file_bytes": s.rank_file_bytes}
        load = bench_load.run(bench_load.make_setup(s, cfg.dst, cfg.rank), reps=cfg.scaling_reps, baseline_reps=None,
                              command=command, results_dir=None, quick=cfg.quick)
        conv = bench_convert.run(bench_convert.make_setup(s, cfg.dst), reps=cfg.scaling_reps, command=command,
                                 results_dir=None, quick=cfg.quick)
        point.update(load=load["summary"], convert=conv["summary"], rank_nbytes=load["params"]["rank_nbytes"],
                     not_run={**load["unavailable"], **load["failed"], **conv["unavailable"], **conv["failed"]})
        results.append(point)
    from benchmarks.plots import plot_scaling

    files, why = plot_scaling(results, raw_path(cfg.out, ""))
    rec = {"name": "scaling", "date": _now(), "command": command, "environment": environment(),
           "dst": {"dp": cfg.dst.dp, "mp": cfg.dst.mp}, "rank": cfg.rank, "reps": cfg.scaling_reps, "points": results,
           "plots": [f.name for f in files], "plots_missing": why}
    append_result("scaling", rec, Path(cfg.out))
    return rec


# ---------------------------------------------------------------------------------------------
# REPORT.md


def report(records: Mapping[str, Any], cfg: SuiteConfig, command: str) -> str:
    first = next((r for k, r in records.items() if isinstance(r, dict) and "environment" in r and "summary" in r), None)
    lines = ["# ckptstore benchmarks", "", f"Command: `{command}`", ""]
    if first:
        lines += [f"Machine: {machine_line(first)}", ""]
    took = f"The suite took {format_seconds(records['seconds'])}." if "seconds" in records else ""
    quick = " **Quick mode: tiny sizes and one repetition — a smoke test, not numbers to quote.**" if cfg.quick else ""
    lines += [_load_line(records), "", (took + quick).strip(), ""]
    verdicts = (targets.load_verdicts(records.get("load"), bench_load.CKPTSTORE, bench_load.BOUND,
                                      into_net=bench_load.INTO_NET, cold=records.get(bench_load.COLD_NAME))
                + targets.index_load_verdicts(records.get("load"), bench_load.INDEX, bench_load.CKPTSTORE)
                + targets.convert_verdicts(records.get("convert"), bench_convert.CKPTSTORE,
                                           bench_convert.MS_SAFETENSORS)
                + targets.index_convert_verdicts(records.get("convert"), bench_convert.INDEX)
                + targets.sparse_index_verdicts(records.get("index"), bench_index.INDEX)
                + targets.node_verdicts(records.get("node"), bench_node.CKPTSTORE))
    lines += ["## Targets (benchmarks/README.md)", "", targets.markdown(verdicts, quick=cfg.quick), ""]
    lines += _design_context(records.get("load"))
    lines += ["### How the MindSpore routes were run", "", *bench_load.mindspore_notes(),
              "- The node scenario sets the parallel context a real job has "
              "(`set_auto_parallel_context(parallel_mode='semi_auto_parallel', device_num=<target ranks>, "
              "global_rank=r)`) "
              "for `load_distributed_checkpoint`: with `RANK_ID` alone some ranks get rank 0's slices (see "
              "\"Which target ranks each MindSpore route reaches\").", ""]
    if "load" in records:
        lines += [_demote(bench_load.render(records["load"], standalone=False)), ""]
    if bench_load.COLD_NAME in records:
        cold = records[bench_load.COLD_NAME]
        section = _demote(bench_load.render(cold, standalone=False))
        if cold.get("command") != command:  # a separate `bench_load --cold` run written to the same folder
            head, _, rest = section.partition("\n")
            section = f"{head}\n\nFrom a separate run: `{cold.get('command')}` ({cold.get('date')}).\n{rest}"
        lines += [section, ""]
    if "reach" in records:
        lines += ["### Which target ranks each MindSpore route reaches", "", bench_load.render_reach(records["reach"]),
                  _reach_note(records["reach"]), ""]
    if "convert" in records:
        lines += [_demote(bench_convert.render(records["convert"], standalone=False)), ""]
    if "node" in records:
        lines += [_demote(bench_node.render(records["node"], standalone=False)), ""]
    if "index" in records:
        lines += [_demote(bench_index.render(records["index"], standalone=False)), ""]
    if "scaling" in records:
        lines += _scaling_section(records["scaling"])
    elif raw_path(Path(cfg.out) / "scaling", "scaling.json").exists():
        lines += _linked_scaling(Path(cfg.out) / "scaling")
    for name, tb in records.get("errors", {}).items():
        lines += [f"## Scenario `{name}` failed", "", "```", tb.rstrip(), "```", ""]
    lines += _separate_runs(Path(cfg.out))
    return "\n".join(lines).rstrip() + "\n"


#: Benchmarks run on their own (each section gives its command), included in REPORT.md when present.
SEPARATE = ("s3", "parts", "save")


def _separate_runs(out: Path) -> list[str]:
    """The sections of :data:`SEPARATE` benchmarks found in ``out``, headings marked "run separately"."""
    lines = []
    for name in SEPARATE:
        path = out / f"{name}.md"
        if path.exists():
            text = path.read_text(encoding="utf-8")
            if text.startswith("# "):  # a standalone report opens with a level-1 heading
                text = _demote(text)
            head, _, rest = _demote(text).partition("\n")
            lines += [f"{head} (run separately)\n{rest}", ""]
    return lines


def _load_line(records: Mapping[str, Any]) -> str:
    parts = []
    for name in ("load", bench_load.COLD_NAME, "convert", "node", "index"):
        r = records.get(name)
        if r and "foreign_cpu_cores" in r:
            parts.append(f"{name} {r['foreign_cpu_cores']:.2f}")
    if not parts:
        return ""
    return ("Load from other processes on this 2-core machine during each scenario (average cores kept busy by "
            "processes not started by the benchmark): " + ", ".join(parts) + ". Above ~0.3 the timings are "
            "disturbed; memory and bytes read are not.")


def _design_context(load: Mapping[str, Any] | None) -> list[str]:
    if not load:
        return []
    s, bound = load["summary"], bench_load.BOUND
    ldc = "mindspore.load_distributed_checkpoint"
    if bound not in s or ldc not in s:
        return []
    n = load["params"]["rank_nbytes"]
    t = s[ldc]["wall_s"]["median"] / s[bound]["wall_s"]["median"]
    m = s[ldc]["peak_above_start"]["median"] / n
    b = s[ldc]["rchar"]["median"] / n
    return [f"For comparison with the figures for `{ldc}` in benchmarks/README.md (~25× the pread time, 5.6× "
            f"memory, 4.1× bytes read, on a 3 GB model 8 → 4): here {t:.1f}× the time, {m:.1f}× the rank's bytes in "
            f"peak memory, {b:.1f}× the bytes read.", ""]


def _reach_note(rec: Mapping[str, Any]) -> str:
    ldc = rec["routes"].get("mindspore.load_distributed_checkpoint", {})
    if ldc.get("different"):
        return ("`load_distributed_checkpoint` without `init()` takes the rank from `RANK_ID` for cutting "
                "(`get_rank()`), but picks source slices with `_get_global_rank()`, which is 0 in stand-alone "
                "mode: where source and target layouts are 'similar' (same split of an axis, as dp2×mp4 → mp4) "
                "ranks other than 0 silently receive rank 0's slices. Setting the parallel context a real job "
                "has (`set_auto_parallel_context(parallel_mode='semi_auto_parallel', global_rank=r)`) fixes it; "
                "the node scenario does that.")
    return ""


def _demote(text: str) -> str:
    """Lower every heading of a scenario's Markdown by one level (it becomes a section of REPORT.md)."""
    return "\n".join("#" + line if line.startswith("#") else line for line in text.splitlines())


def _scaling_section(rec: Mapping[str, Any]) -> list[str]:
    lines = ["## Scaling", "", f"Target dp{rec['dst']['dp']}×mp{rec['dst']['mp']}, rank {rec['rank']}; "
             f"{rec['reps']} repetition(s) per point.", ""]
    for axis, label in (("size", "model size"), ("world", "source world size")):
        pts = sorted((p for p in rec["points"] if p["axis"] == axis), key=lambda p: p["x"])
        if not pts:
            continue
        head = [f"{format_bytes(p['model_bytes'])}" if axis == "size" else f"{p['src_world']} ranks" for p in pts]
        for scenario, metric, title, fmt in (("load", "wall_s", "load wall", format_seconds),
                                             ("load", "peak_above_start", "load peak RSS above start", format_bytes),
                                             ("convert", "wall_s", "convert wall", format_seconds)):
            names: list[str] = []
            for p in pts:
                names += [n for n in p[scenario] if n not in names]
            lines += [f"{title} by {label} (median):", "", "| contender | " + " | ".join(head) + " |",
                      "|---|" + "---|" * len(pts)]
            for n in names:
                cells = [fmt(p[scenario][n][metric]["median"]) if n in p[scenario] and metric in p[scenario][n]
                         else "–" for p in pts]
                lines.append(f"| `{n}` | " + " | ".join(cells) + " |")
            lines.append("")
        lines += ["Rank's bytes / all rank files per point: "
                  + "; ".join(f"{h}: {format_bytes(p['rank_nbytes'])} / {format_bytes(p['rank_file_bytes'])}"
                              for h, p in zip(head, pts, strict=False)), ""]
    for f in rec.get("plots", []):
        lines += [f"![{f}]({RAW}/{f})", ""]
    if rec.get("plots_missing"):
        lines += [f"No plots: {rec['plots_missing']}.", ""]
    not_run = {k: v for p in rec["points"] for k, v in p.get("not_run", {}).items()}
    for k, v in not_run.items():
        lines += [f"- `{k}` did not run at some points: {' '.join(str(v).split())[:300]}"]
    return lines


def rebuild_report(out: Path) -> Path:
    """Write ``out/REPORT.md`` again from the latest record of each scenario in ``out`` (no run)."""
    from benchmarks.harness import load_results

    records: dict[str, Any] = {}
    for name in (*SCENARIOS, bench_load.COLD_NAME, "scaling"):
        runs = load_results(raw_path(out, f"{name}.json"))
        if runs:
            records[name] = runs[-1]
    if not records:
        raise FileNotFoundError(f"no results in {out}; run `python -m benchmarks run --out {out}` first")
    main = next(iter(records.values()))
    quick = bool(main.get("params", {}).get("quick"))
    command = main.get("command", "")
    suite_runs = load_results(raw_path(out, "suite.json"))
    if suite_runs and suite_runs[-1]["command"] == command:
        records["seconds"] = suite_runs[-1]["seconds"]
    cfg = SuiteConfig(out=Path(out), quick=quick, scaling="scaling" in records)
    path = Path(out) / "REPORT.md"
    _write(path, report(records, cfg, command))
    return path


def _linked_scaling(folder: Path) -> list[str]:
    """The scaling section of an earlier ``--scaling`` run written to ``folder`` (plots linked)."""
    from benchmarks.harness import load_results

    runs = load_results(raw_path(folder, "scaling.json"))
    if not runs:
        return []
    rec = runs[-1]
    lines = _scaling_section({**rec, "plots": []})
    lines[0] = "## Scaling"
    lines[1:1] = ["", f"From an earlier run: `{rec['command']}` ({rec['date']}), results in `{folder.name}/`."]
    lines += [f"![{f}]({folder.name}/{RAW}/{f})" for f in rec.get("plots", [])] + [""]
    return lines


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
