"""Benchmark: ``ckptstore convert`` as 1, 2 or 4 processes (``--part I/N``) on one machine.

``python -m benchmarks.bench_parts --size 1GB --src-world 8 --parts 1,2,4 --reps 3``

The synthetic PanGu-Alpha checkpoint of :mod:`benchmarks.synth` (the one ``bench_convert``
converts) is converted into an empty folder by real ``ckptstore`` processes:

* ``1 part``: one ``ckptstore convert SRC -s STRATEGY --out OUT -q``;
* ``N parts``: N such processes started at once, process ``I`` with ``--part I/N``; the last to
  finish commits the store.

The measured call (in a fresh worker) starts the processes, waits for every one of them and
ends with ``os.sync()`` (ckptstore fsyncs its files; the sync makes every contender pay for the
same durability). Before each measurement the output folder is removed and dirty pages are
written back, and the rank files are in the page cache (read once first), so every contender
starts from the same state and does the same work: the same store, written once.

Memory is the sum over the processes: each process's own peak (``ru_maxrss`` from ``wait4``,
summed; an upper bound on their simultaneous peak) and the harness's sampled largest
simultaneous growth of the worker's children. Bytes read and written are the worker's
``/proc/self/io`` counters, which include its children once they are reaped. After the
measurement the worker compares every file of the store with a store converted by one
process before the runs (byte for byte) and records the processes' exit codes.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
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
from benchmarks.report import Column, format_bytes, format_seconds, markdown_table, one_line

NAME = "parts"
MODULE = "benchmarks.bench_parts"
TARGET_2 = 0.65  # 2 parts' wall time / 1 part's, on this 2-core machine
QUICK_SIZE = "8MB"


def part_name(n: int) -> str:
    return "1 part" if n == 1 else f"{n} parts"


def cli() -> list[str]:
    """The installed ``ckptstore`` console script beside this interpreter (``python -m ckptstore`` without it)."""
    script = Path(sys.executable).with_name("ckptstore")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ckptstore"]


# ---------------------------------------------------------------------------------------------
# run inside the worker


def _io() -> dict[str, int]:
    with open("/proc/self/io", encoding="ascii") as f:
        fields = dict(line.split(": ") for line in f.read().splitlines())
    return {k: int(fields[k]) for k in ("rchar", "wchar", "read_bytes", "write_bytes")}


def convert_parts(src_dir: str, strategy: str, out: str, parts: int, reference: str) -> dict[str, Any]:
    """The measured call: ``parts`` convert processes started together, all waited for, then ``os.sync()``.

    Returns the exit codes, the sum of the processes' peak RSS (``ru_maxrss``) and the I/O of
    the worker and its reaped children (``/proc/self/io`` deltas). The processes' stderr goes
    to temporary files, its tail is returned when a process fails.
    """
    io0 = _io()
    base = [*cli(), "convert", src_dir, "-s", strategy, "--out", out, "-q"]
    with tempfile.TemporaryDirectory(prefix="ckptstore_parts_") as tmp:
        procs = []
        for i in range(parts):
            with open(os.path.join(tmp, f"{i}.err"), "wb") as err:
                extra = ["--part", f"{i}/{parts}"] if parts > 1 else []
                procs.append(subprocess.Popen([*base, *extra], stdout=subprocess.DEVNULL, stderr=err))
        codes, maxrss = [], 0
        for p in procs:
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
            codes.append(p.returncode)
            maxrss += usage.ru_maxrss * 1024
        errors = {i: Path(tmp, f"{i}.err").read_text(errors="replace")[-1500:] for i, c in enumerate(codes) if c}
    os.sync()
    io1 = _io()
    return {"exit_codes": ",".join(map(str, codes)), "processes_peak_rss_sum": maxrss,
            **{k: io1[k] - io0[k] for k in io0}, "errors": repr(errors) if errors else ""}


def check(result: Mapping[str, Any], **args: Any) -> dict[str, Any]:
    """After the measurement: did every process exit 0, and is the store the 1-process store, byte for byte?"""
    same, files, differing = compare_trees(args["out"], args["reference"])
    codes = [int(c) for c in result["exit_codes"].split(",")]
    return {"all_exited_0": all(c == 0 for c in codes), "exit_codes": result["exit_codes"], "identical": same,
            "files": files, "differing": ", ".join(differing[:5]), "output_bytes": _tree_bytes(args["out"])}


def compare_trees(a: str, b: str) -> tuple[bool, int, list[str]]:
    """``(identical, files compared, relative paths that differ or exist on one side only)``."""
    fa, fb = _files(a), _files(b)
    differing = sorted(set(fa) ^ set(fb))
    for rel in sorted(set(fa) & set(fb)):
        if not _same_bytes(fa[rel], fb[rel]):
            differing.append(rel)
    return not differing, len(set(fa) | set(fb)), differing


def _files(root: str) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in sorted(Path(root).rglob("*")) if p.is_file()}


def _same_bytes(x: Path, y: Path, block: int = 8 << 20) -> bool:
    if x.stat().st_size != y.stat().st_size:
        return False
    with open(x, "rb") as f, open(y, "rb") as g:
        while True:
            a, b = f.read(block), g.read(block)
            if a != b:
                return False
            if not a:
                return True


def _tree_bytes(path: str | os.PathLike[str]) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------
# set-up and run, in the parent


@dataclass(frozen=True)
class PartsSetup:
    """A source checkpoint, the part counts to measure, a scratch root for the outputs."""

    synth: Any  # benchmarks.synth.Synth
    parts: tuple[int, ...]
    out_root: Path

    @property
    def reference(self) -> str:
        return str(self.out_root / "reference")

    def out(self, n: int) -> str:
        return str(self.out_root / f"out_{n}")

    def params(self) -> dict[str, Any]:
        return {**self.synth.describe(), "parts": list(self.parts), "cli": " ".join(cli()),
                "cpu_count": os.cpu_count()}


def make_setup(s: Any, parts: Sequence[int]) -> PartsSetup:
    out = s.root / f"parts_out_{os.getpid()}"  # per run: two runs may share the cache
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    return PartsSetup(s, tuple(parts), out)


def contenders(st: PartsSetup) -> list[Contender]:
    """One contender per part count; same source, strategy, command and reference."""
    args = {"src_dir": str(st.synth.ckpt_dir), "strategy": str(st.synth.strategy), "reference": st.reference}
    return [Contender(part_name(n), MODULE, "convert_parts", {**args, "out": st.out(n), "parts": n},
                      track_children=True, check="check") for n in st.parts]


def write_reference(st: PartsSetup) -> float:
    """The 1-process store every run is compared with (untimed); returns its wall time for the log."""
    import time

    t0 = time.perf_counter()
    r = subprocess.run([*cli(), "convert", str(st.synth.ckpt_dir), "-s", str(st.synth.strategy), "--out",
                        st.reference, "-q"], check=False, capture_output=True, text=True)
    if r.returncode != 0:
        raise BenchmarkError(f"the reference conversion failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return time.perf_counter() - t0


def _clear_output(c: Contender) -> None:
    shutil.rmtree(c.args["out"], ignore_errors=True)


def run(st: PartsSetup, *, reps: int, command: str, results_dir: Path | None, quick: bool = False,
        log: Any = None) -> dict[str, Any]:
    """Convert once for the reference, then measure every part count; returns the record (appended
    to ``results_dir/parts.json``) with ``mb_per_s`` (rank-file MB per second) in the summary."""
    from benchmarks.bench_convert import add_throughput
    from benchmarks.harness import append_result

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        ref_s = write_reference(st)
        log(f"  reference store (1 process, untimed): {ref_s:.1f} s")
        record = run_benchmark(NAME, contenders(st), reps=reps, warm_paths=st.synth.rank_files,
                               params={**st.params(), "quick": quick, "reference_s": ref_s}, command=command,
                               results_dir=None, keep_going=True, sync_before=True, before_each=_clear_output,
                               timeout=3600, log=log)
    finally:
        shutil.rmtree(st.out_root, ignore_errors=True)
    add_throughput(record, record["params"]["rank_file_bytes"])
    if results_dir is not None:
        append_result(NAME, record, results_dir)
    return record


# ---------------------------------------------------------------------------------------------
# report


def _returned_median(record: Mapping[str, Any], name: str, key: str) -> float | None:
    values = sorted(s["returned"][key] for s in record["samples"]
                    if s["contender"] == name and isinstance(s.get("returned"), dict) and key in s["returned"])
    return values[len(values) // 2] if values else None


def returned_cell(record: Mapping[str, Any], key: str) -> Any:
    """Column function: the median of a byte count the measured call returned."""
    def cell(name: str) -> str:
        v = _returned_median(record, name, key)
        return "–" if v is None else format_bytes(v)

    return cell


def check_cell(record: Mapping[str, Any]) -> Any:
    """Column function: exit codes and whether the store equals the 1-process reference."""
    def cell(name: str) -> str:
        c = record.get("checks", {}).get(name)
        if not c:
            return "–"
        exits = "all exited 0" if c["all_exited_0"] else f"**exit codes {c['exit_codes']}**"
        same = (f"identical ({c['files']} files)" if c["identical"]
                else f"**differs**: {c['differing'] or '?'}")
        return f"{exits}; {same}" + ("" if c.get("consistent", True) else " (runs differ)")

    return cell


def verdict_lines(record: Mapping[str, Any]) -> list[str]:
    """Each part count's time against one process, and the 2-part target."""
    s = record["summary"]
    one = s.get(part_name(1), {}).get("wall_s", {}).get("median")
    if not one:
        return []
    lines = []
    for n in record["params"]["parts"]:
        w = s.get(part_name(n), {}).get("wall_s", {}).get("median")
        if w is None or n == 1:
            continue
        line = f"- {part_name(n)}: {format_seconds(w)} / {format_seconds(one)} = **{w / one:.2f}×** one process"
        if n == 2:
            line += f" (target ≤ {TARGET_2}×: {'met' if w / one <= TARGET_2 else '**not met**'})"
        lines.append(line)
    return lines


COLUMNS = (Column("wall_s", "wall", "s"), Column("mb_per_s", "MB/s of rank files", "n", ratio=False),
           Column("children_cpu_s", "CPU time (processes)", "s", ratio=False),
           Column("tree_peak_above_start", "sampled peak (simultaneous growth)", "B", ratio=False))


def render(record: Mapping[str, Any]) -> str:
    """``parts.md``: what was run, on what, the table and the target."""
    from benchmarks.bench_load import not_run_notes, run_lines

    p = record["params"]
    base = part_name(1)
    table = markdown_table(record, columns=COLUMNS, baselines=[base] if base in record["summary"] else [],
                           labels={base: "1 part"},
                           extra={"peak RSS (sum of each process's peak)": returned_cell(record,
                                                                                      "processes_peak_rss_sum"),
                                  "bytes read (rchar)": returned_cell(record, "rchar"),
                                  "bytes written (wchar)": returned_cell(record, "wchar"),
                                  "exit codes; store vs 1-process store": check_cell(record)})
    lines = [
        f"## Convert in parts: {p['src_world']} rank files → one store, {' vs '.join(map(str, p['parts']))} "
        "processes",
        "",
        *run_lines(record, True),
        f"Checkpoint: PanGu-Alpha-shaped, {format_bytes(p['model_bytes'])} of global tensors ({p['params']} "
        f"parameters) saved on {p['src_world']} ranks (dp{p['src']['dp']}×mp{p['src']['mp']}): rank files "
        f"{format_bytes(p['rank_file_bytes'])}. Command per process: `{p['cli']} convert SRC -s STRATEGY --out OUT "
        "-q [--part I/N]` (default `--workers`); the machine has "
        f"{p['cpu_count']} cores.",
        "",
        table,
        "",
        "Each row times starting all its processes at once until the last one exits (it commits the store), then "
        "`os.sync()`; the output folder is removed and dirty pages written back before each run, the rank files "
        "are in the page cache. Peak RSS: each process's own peak (`ru_maxrss`) summed, an upper bound on their "
        "simultaneous total; the sampled column is the largest simultaneous growth of the processes' RSS (every "
        "50 ms, each since it was first seen). Bytes read and written: the processes' `rchar`/`wchar` (page-cache "
        "hits included). Cells: median (min–max) over runs; ratios compare medians.",
        "",
        *verdict_lines(record),
    ]
    if p.get("quick"):
        lines += ["", "**Quick mode: a tiny checkpoint and one repetition — a smoke test, not numbers to quote.**"]
    for s in record["samples"]:
        if isinstance(s.get("returned"), dict) and s["returned"].get("errors"):
            lines += ["", f"- `{s['contender']}` round {s['round']}: a process failed: "
                          f"{one_line(s['returned']['errors'], 1500)}"]
    lines += not_run_notes(record)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from benchmarks.bench_load import add_model_args

    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_parts", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--parts", default="1,2,4", help="process counts to compare (1 is always included)")
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    ap.add_argument("--quick", action="store_true", help=f"smoke test: --size {QUICK_SIZE}, one repetition")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.data import parse_size
    from benchmarks.synth import parse_mesh, synth

    args = parse_args(argv)
    try:
        parts = sorted({1, *(int(x) for x in args.parts.split(",") if x.strip())})
    except ValueError:
        print(f"error: --parts must be comma-separated whole numbers, not {args.parts!r}", file=sys.stderr)
        return 2
    if parts[0] < 1:
        print("error: --parts must be at least 1", file=sys.stderr)
        return 2
    size, reps = (QUICK_SIZE, 1) if args.quick else (args.size, args.reps)
    s = synth(parse_size(size), parse_mesh(args.src_world, source=True), args.seed)
    st = make_setup(s, parts)
    return run_and_publish(lambda: run(st, reps=reps, command=command_line("benchmarks.bench_parts", argv),
                                       results_dir=args.results_dir, quick=args.quick), render, args.results_dir, NAME)


if __name__ == "__main__":
    sys.exit(main())
