"""Benchmark: convert a distributed checkpoint once (throughput in MB/s of rank-file bytes).

``python -m benchmarks.bench_convert --size 1GB --src-world 8 --dst-world 4 --reps 3``

Contenders, each in a fresh process, each writing into an empty folder:

* ``ckptstore convert``: ``ckptstore.convert`` into a Zarr store of global tensors;
* ``ckptstore index``: ``ckptstore.index`` (no checksums): a store that copies no payload, only a
  manifest (``ckptstore.json``) of byte ranges in the rank files; ``ckptstore index --checksum``:
  the same, reading every slice once to record its CRC-32C;
* ``cp -r``: a plain copy of the same rank folders (every byte read and written once);
* ``mindspore.transform_checkpoints``: every rank file of the target layout;
* ``mindspore.ckpt_to_safetensors + unified_safetensors``: MindSpore's route to global tensors
  (what its sliced safetensors loader reads).

Every call ends with ``os.sync()`` (ckptstore fsyncs its files; the others would otherwise leave
their writing to the kernel), and dirty pages are written back before each measurement.
Memory is the process tree's: MindSpore's ``ckpt_to_safetensors`` works in a pool process and
``cp`` is a child, so children are sampled too. Every contender's output folder is measured after
the call (``store size``), and for ckptstore's stores their metadata (the JSON files: Zarr's
``zarr.json`` files, an index's ``ckptstore.json``) as a share of the rank files' bytes.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS_DIR, WRITE_SIDE, Contender, command_line, run_and_publish, run_benchmark
from benchmarks.registry import contenders_for, register
from benchmarks.report import Column, markdown_table
from benchmarks.synth import Mesh, Synth

NAME = "convert"
CKPTSTORE = "ckptstore convert"
INDEX = "ckptstore index"
INDEX_CRC = "ckptstore index --checksum"
COPY = "cp -r (rank files)"
MS_SAFETENSORS = "mindspore.ckpt_to_safetensors + unified_safetensors"
LABELS = {CKPTSTORE: "ckptstore", COPY: "cp"}
MODULE = "benchmarks.contenders"


@dataclass(frozen=True)
class ConvertSetup:
    """A source checkpoint, the target strategy (for transform_checkpoints), an output root."""

    synth: Synth
    dst: Mesh
    dst_strategy: str
    out_root: Path

    def out(self, name: str) -> str:
        return str(self.out_root / "".join(ch if ch.isalnum() else "_" for ch in name))

    def params(self) -> dict[str, Any]:
        return {**self.synth.describe(), "dst": {"dp": self.dst.dp, "mp": self.dst.mp}, "dst_world": self.dst.world}


def make_setup(s: Synth, dst: Mesh) -> ConvertSetup:
    out = s.root / f"convert_out_{os.getpid()}"  # per run: two runs may share the cache
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    return ConvertSetup(s, dst, str(s.target_strategy(dst)), out)


@register("convert")
def _ckptstore(st: ConvertSetup) -> Contender:
    return Contender(CKPTSTORE, MODULE, "ckptstore_convert",
                     {"src_dir": str(st.synth.ckpt_dir), "strategy": str(st.synth.strategy), "out": st.out(CKPTSTORE)},
                     preimport=WRITE_SIDE, track_children=True)


@register("convert")
def _ckptstore_index(st: ConvertSetup) -> list[Contender]:
    args = {"src_dir": str(st.synth.ckpt_dir), "strategy": str(st.synth.strategy)}
    return [Contender(INDEX, MODULE, "ckptstore_index", {**args, "out": st.out(INDEX)},
                      preimport=WRITE_SIDE, track_children=True),
            Contender(INDEX_CRC, MODULE, "ckptstore_index", {**args, "out": st.out(INDEX_CRC), "checksum": True},
                      preimport=WRITE_SIDE, track_children=True)]


@register("convert")
def _cp(st: ConvertSetup) -> Contender:
    return Contender(COPY, MODULE, "cp_r", {"src_dir": str(st.synth.ckpt_dir), "out": st.out(COPY)},
                     track_children=True)


@register("convert")
def _ms_transform(st: ConvertSetup) -> Contender:
    name = f"mindspore.transform_checkpoints (all {st.dst.world} target ranks)"
    return Contender(name, MODULE, "ms_transform_checkpoints",
                     {"src_dir": str(st.synth.ckpt_dir), "strategy": str(st.synth.strategy),
                      "dst_strategy": st.dst_strategy, "out": st.out(name)},
                     preimport=("mindspore",), track_children=True)


@register("convert")
def _ms_safetensors(st: ConvertSetup) -> Contender:
    return Contender(MS_SAFETENSORS, MODULE, "ms_ckpt_to_unified",
                     {"src_dir": str(st.synth.ckpt_dir), "strategy": str(st.synth.strategy),
                      "out": st.out(MS_SAFETENSORS)},
                     preimport=("mindspore",), track_children=True)


def _clear_output(c: Contender) -> None:
    out = c.args.get("out")
    if out:
        for p in Path(out).rglob("*"):  # MindSpore writes its files read-only (0400)
            if p.is_file():
                p.chmod(0o600)
        shutil.rmtree(out, ignore_errors=True)


def run(st: ConvertSetup, *, reps: int, command: str, results_dir: Path | None, quick: bool = False) -> dict[str, Any]:
    """Run the scenario; adds ``mb_per_s`` (rank-file MB per second) to the summary."""
    contenders = contenders_for("convert", st)
    try:
        record = run_benchmark(NAME, contenders, reps=reps, warm_paths=st.synth.rank_files,
                               params={**st.params(), "quick": quick}, command=command, results_dir=None,
                               keep_going=True, sync_before=True, before_each=_clear_output, timeout=3600)
    finally:
        for c in contenders:
            _clear_output(c)
        shutil.rmtree(st.out_root, ignore_errors=True)
    add_throughput(record, record["params"]["rank_file_bytes"])
    if results_dir is not None:
        from benchmarks.harness import append_result

        append_result(NAME, record, results_dir)
    return record


def add_throughput(record: dict[str, Any], nbytes: int) -> None:
    """``mb_per_s`` (10^6 B/s of ``nbytes``) per contender from its wall times."""
    for stats in record["summary"].values():
        w = stats["wall_s"]
        stats["mb_per_s"] = {"median": nbytes / w["median"] / 1e6, "min": nbytes / w["max"] / 1e6,
                             "max": nbytes / w["min"] / 1e6, "n": w["n"]}


COLUMNS = (Column("wall_s", "wall", "s"), Column("mb_per_s", "MB/s of rank files", "n", ratio=False),
           Column("tree_peak_above_start", "peak RSS above start (with children)", "B"),
           Column("rchar", "bytes read (rchar)", "B", ratio=False))


def _returned(record: Mapping[str, Any], key: str) -> dict[str, int]:
    """Per contender, the largest ``returned[key]`` over its runs (sizes are the same every run)."""
    out: dict[str, int] = {}
    for s in record["samples"]:
        if isinstance(s.get("returned"), dict) and key in s["returned"]:
            out[s["contender"]] = max(out.get(s["contender"], 0), s["returned"][key])
    return out


def output_cell(record: Mapping[str, Any]) -> Any:
    """Column function: bytes of the contender's output folder (and the share of the rank files')."""
    from benchmarks.report import format_bytes

    outs, files = _returned(record, "output_bytes"), record["params"]["rank_file_bytes"]

    def cell(name: str) -> str:
        return f"{format_bytes(outs[name])} ({outs[name] / files:.3g}×)" if name in outs else "–"

    return cell


def metadata_cell(record: Mapping[str, Any]) -> Any:
    """Column function: bytes of a ckptstore store's metadata (JSON files) and their share of the rank files."""
    from benchmarks.report import format_bytes

    meta, files = _returned(record, "metadata_bytes"), record["params"]["rank_file_bytes"]

    def cell(name: str) -> str:
        return f"{format_bytes(meta[name])} = {meta[name] / files:.4%}" if name in meta else "–"

    return cell


def table(record: Mapping[str, Any]) -> str:
    bases = [b for b in (CKPTSTORE, COPY) if b in record["summary"]]
    return markdown_table(record, columns=COLUMNS, baselines=bases, labels=LABELS,
                          extra={"store size (output folder, × rank files)": output_cell(record),
                                 "metadata (JSON files, share of rank files)": metadata_cell(record)})


def verdict_lines(record: Mapping[str, Any]) -> list[str]:
    """The index targets judged on this run (3 GB in < 1 s warm: only when the run is at 3 GB)."""
    from benchmarks import targets

    quick = bool(record.get("params", {}).get("quick"))
    return ["Index targets (this run):", "",
            targets.markdown(targets.index_convert_verdicts(record, INDEX), quick=quick)]


def render(record: Mapping[str, Any], *, standalone: bool = True) -> str:
    from benchmarks.bench_load import dataset_line, not_run_notes, run_lines
    from benchmarks.report import format_seconds

    p = record["params"]
    split = [s["returned"] for s in record["samples"]
             if s["contender"] == MS_SAFETENSORS and isinstance(s.get("returned"), dict)]
    lines = [
        f"## Convert: {p['src_world']} rank files → one store / target files",
        "",
        *run_lines(record, standalone),
        dataset_line({**p, "rank": 0, "rank_nbytes": 0}).split(" Target:")[0],
        "",
        table(record),
        "",
        "MB/s = rank-file bytes (10^6) per second of wall time. Every call ends with `os.sync()`; "
        "peaks include the processes a call starts (sampled every 50 ms; each child's growth "
        "since it appeared, so pages a forked pool worker shares with its parent are not counted twice). "
        "Store size: every file of the output folder after the call; metadata: a ckptstore store's JSON "
        "files (an index is nothing else: its chunks are byte ranges in the rank files, read from there).",
        "",
        *verdict_lines(record),
    ]
    if split:
        a = sorted(x["ckpt_to_safetensors_s"] for x in split)[len(split) // 2]
        b = sorted(x["unified_safetensors_s"] for x in split)[len(split) // 2]
        lines += ["", f"Of `{MS_SAFETENSORS}`: `ckpt_to_safetensors` {format_seconds(a)}, "
                      f"`unified_safetensors` {format_seconds(b)} (medians)."]
    if standalone:
        from benchmarks.contenders import MEMORY_CHECK_NOTE

        lines += ["", "- " + MEMORY_CHECK_NOTE]
    lines += not_run_notes(record)
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_convert", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GB")
    ap.add_argument("--src-world", default="8")
    ap.add_argument("--dst-world", default="4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.data import parse_size
    from benchmarks.synth import parse_mesh, synth

    args = parse_args(argv)
    s = synth(parse_size(args.size), parse_mesh(args.src_world, source=True), args.seed)
    st = make_setup(s, parse_mesh(args.dst_world, source=False))
    return run_and_publish(lambda: run(st, reps=args.reps, command=command_line("benchmarks.bench_convert", argv),
                                       results_dir=args.results_dir), render, args.results_dir, NAME)


if __name__ == "__main__":
    sys.exit(main())
