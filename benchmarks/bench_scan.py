"""Benchmark: index a single large ``.ckpt`` without reading its payloads.

``python -m benchmarks.bench_scan --size 1GB --reps 3``

Contenders, each in a fresh process:

* ``scan``: ``ckptstore.formats.ckpt_reader.scan_checkpoint(path)`` (record headers only);
* ``scan+read_rows``: the scan, then ``read_entry(..., rows=...)`` of a slice of the matrix in
  the middle of the file (``--rows-mib`` of it);
* ``mindspore.load_checkpoint``: MindSpore's route to the same names and shapes (the baseline).

The claim checked: scanning adds < 64 MiB to peak RSS and reads < 1% of the file.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from benchmarks.harness import RESULTS_DIR, Contender, command_line, run_benchmark, run_and_publish
from benchmarks.report import Column, format_bytes, machine_line, markdown_table

NAME = "scan"
BASELINE = "mindspore.load_checkpoint"
PEAK_LIMIT = 64 * 2**20
READ_SHARE_LIMIT = 0.01

# ----------------------------------------------------------------------------------------------
# contenders: called inside the worker, after it imported what each Contender's preimport names


def scan_only(path: str) -> dict[str, int]:
    """Index the file: names, dtypes, shapes and byte pieces of every parameter."""
    from ckptstore.formats.ckpt_reader import scan_checkpoint

    index = scan_checkpoint(path)
    return {"entries": len(index.entries)}


def scan_and_read_rows(path: str, name: str, rows: Sequence[int]) -> dict[str, int]:
    """Index the file, then read rows ``[lo, hi)`` of one parameter into a new array."""
    from ckptstore.formats.ckpt_reader import read_entry, scan_checkpoint

    index = scan_checkpoint(path)
    array = read_entry(path, index[name], rows=(rows[0], rows[1]))
    return {"entries": len(index.entries), "bytes_returned": int(array.nbytes)}


def mindspore_load(path: str) -> dict[str, int]:
    """``mindspore.load_checkpoint(path)``: every parameter, as MindSpore Parameters."""
    import mindspore

    params = mindspore.load_checkpoint(path)
    return {"entries": len(params), "bytes_returned": int(sum(p.nbytes for p in params.values()))}


# ----------------------------------------------------------------------------------------------


def contenders(path: Path, name: str, rows: tuple[int, int], *, baseline_reps: int | None) -> list[Contender]:
    """The three contenders on one file; ``baseline_reps`` caps MindSpore's (slow) repetitions."""
    here = __name__ if __name__ != "__main__" else "benchmarks.bench_scan"
    reader = ("ckptstore.formats.ckpt_reader",)
    return [
        Contender("scan", here, "scan_only", {"path": str(path)}, preimport=reader),
        Contender("scan+read_rows", here, "scan_and_read_rows",
                  {"path": str(path), "name": name, "rows": list(rows)}, preimport=reader),
        Contender(BASELINE, here, "mindspore_load", {"path": str(path)}, preimport=("mindspore",),
                  reps=baseline_reps),
    ]


def claim_lines(record: Mapping[str, Any]) -> list[str]:
    """PASS/FAIL lines for the scan claim, judged on the worst repetition."""
    scan = record["summary"]["scan"]
    size = record["params"]["file_bytes"]
    peak, read = scan["peak_above_start"]["max"], scan["rchar"]["max"]
    return [
        f"- scan adds {format_bytes(peak)} to peak RSS (limit {format_bytes(PEAK_LIMIT)}): "
        f"{'PASS' if peak < PEAK_LIMIT else 'FAIL'}",
        f"- scan reads {format_bytes(read)} = {read / size:.4%} of the {format_bytes(size)} file "
        f"(limit {READ_SHARE_LIMIT:.0%}): {'PASS' if read < READ_SHARE_LIMIT * size else 'FAIL'}",
    ]


def render(record: Mapping[str, Any]) -> str:
    """``scan.md``: what was run, on what, the table and the claim."""
    p = record["params"]
    columns = [Column("wall_s", "wall", "s"), Column("peak_above_start", "peak RSS above start", "B"),
               Column("rchar", "bytes read (rchar)", "B"), Column("syscr", "read calls", "n", ratio=False)]
    if record["cache"] == "cold":  # warm runs read nothing from the device: the column would be all 0
        columns.insert(3, Column("read_bytes", "from device (read_bytes)", "B"))
    table = markdown_table(record, baseline=BASELINE, columns=columns)
    return "\n".join([
        f"# Scan a {format_bytes(p['file_bytes'])} `.ckpt` ({p['entries']} parameters)",
        "",
        f"Command: `{record['command']}`",
        "",
        f"Machine: {machine_line(record)}",
        "",
        f"File: {p['file']} ({p['file_bytes']} bytes). `scan+read_rows` reads rows "
        f"[{p['rows'][0]}, {p['rows'][1]}) of `{p['mid_tensor']}` ({format_bytes(p['rows_bytes'])}).",
        "Cells: median (min–max) over runs; ratios compare medians.",
        "",
        table,
        "",
        *claim_lines(record),
        *([] if record["hwm_reset"] else ["", "Note: the kernel refused to reset VmHWM, so peaks may "
                                          "include import-time peaks (upper bounds)."]),
        "",
    ])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_scan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GB", help="payload size of the synthetic file (1GB = 10^9 B, 1GiB = 2^30 B)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3, help="repetitions per contender (alternating order)")
    ap.add_argument("--baseline-reps", type=int, default=None,
                    help="cap MindSpore's repetitions (it is the slow one); default: --reps")
    ap.add_argument("--rows-mib", type=float, default=16.0, help="how much of the mid-file matrix to read")
    ap.add_argument("--cold", action="store_true", help="drop the page cache before every run (root only)")
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from benchmarks import data  # numpy (and MindSpore, if the file must be written) only here

    size = data.parse_size(args.size)
    layout = data.synthetic_layout(size, args.seed)
    path = data.synthetic_ckpt(size, args.seed)
    mid = data.mid_file_tensor(layout)
    row_bytes = mid.nbytes // mid.shape[0]
    n_rows = max(1, min(mid.shape[0], int(args.rows_mib * 2**20) // row_bytes))
    lo = (mid.shape[0] - n_rows) // 2
    params = {"size": args.size, "seed": args.seed, "file": str(path), "file_bytes": path.stat().st_size,
              "entries": len(layout), "mid_tensor": mid.name, "rows": [lo, lo + n_rows],
              "rows_bytes": n_rows * row_bytes}
    print(f"{path} ({params['file_bytes']} bytes, {len(layout)} parameters)", file=sys.stderr)
    return run_and_publish(
        lambda: run_benchmark(NAME, contenders(path, mid.name, (lo, lo + n_rows), baseline_reps=args.baseline_reps),
                              reps=args.reps, cold=args.cold, warm_paths=[path], params=params,
                              command=command_line("benchmarks.bench_scan", argv), results_dir=args.results_dir),
        render, args.results_dir, NAME)


if __name__ == "__main__":
    sys.exit(main())
