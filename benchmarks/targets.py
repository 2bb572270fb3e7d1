"""The targets of benchmarks/README.md ("Targets"), judged on one run's records.

Each target is checked against the numbers of this run only: time on medians, memory and bytes
on the worst repetition (a claim must hold every time). A target relative to a contender that
did not run (PyTorch DCP when torch is missing, a cold run that was not made) is "not judged":
no figure from elsewhere stands in for a measurement.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.report import format_bytes, format_seconds

CONVERT_PEAK_LIMIT = 500_000_000  # "< 0.5 GB"
NODE_TOLERANCE = 1.05  # "total memory ≈ the sum of their slices": within 5%
LOAD_VS_DCP = 0.8  # load_rank (Parameters built) ≤ 0.8× DCP's dcp.load
LOAD_VS_BOUND = 1.1  # ... and ≤ 1.1× the single-thread numpy pread bound
INTO_NET_VS_DCP = 0.7  # load_into_net ≤ 0.7× DCP's dcp.load
PEAK_VS_RANK = 1.02
READ_VS_RANK = 1.01
INDEX_VS_STORE = 1.1  # load_rank from an index ≤ 1.1× from the converted store (same run)
INDEX_3GB_S = 1.0  # index the 3 GB checkpoint in < 1 s (warm)
INDEX_3GB_SIZE = 3_000_000_000  # the checkpoint that target is about (`--size 3GB`)
INDEX_SPARSE_S = 30.0  # index the 128-file sparse 130B checkpoint in < 30 s
INDEX_METADATA_SHARE = 0.001  # an index's metadata < 0.1% of the rank files' bytes
INDEX_METADATA_MIN_SIZE = 1_000_000_000  # judged from the 1 GB checkpoint up (--quick's 8 MB: not judged)


@dataclass(frozen=True)
class Verdict:
    target: str
    measured: str
    met: bool | None  # None: could not be judged on this run

    @property
    def mark(self) -> str:
        return {True: "**met**", False: "**not met**", None: "not judged"}[self.met]


def _find(summary: Mapping[str, Any], *needles: str) -> str | None:
    return next((n for n in summary if any(k in n.lower() for k in needles)), None)


def fastest_dcp(summary: Mapping[str, Any]) -> str | None:
    """The DCP row with the lowest median wall (``dcp.load`` default and 1-thread variants): the
    stricter comparison; ``None`` if no DCP row ran."""
    rows = [n for n in summary if "dcp.load" in n.lower()]
    return min(rows, key=lambda n: summary[n]["wall_s"]["median"]) if rows else None


def _med(summary: Mapping[str, Any], name: str) -> float:
    return summary[name]["wall_s"]["median"]


def _vs(title: str, summary: Mapping[str, Any], mine: str, other: str | None, factor: float,
        why_missing: str) -> Verdict:
    """``mine``'s median wall ≤ ``factor`` × ``other``'s, with both numbers and the ratio."""
    if mine not in summary:
        return Verdict(title, f"`{mine}` did not run", None)
    if other is None or other not in summary:
        return Verdict(title, f"{format_seconds(_med(summary, mine))} (median); {why_missing}", None)
    a, b = _med(summary, mine), _med(summary, other)
    return Verdict(title, f"{format_seconds(a)} vs `{other}` {format_seconds(b)} (medians) = {a / b:.3f}× "
                          f"(limit {factor}× = {format_seconds(factor * b)})", a <= factor * b)


def load_verdicts(rec: Mapping[str, Any] | None, ours: str, bound: str, *, into_net: str | None = None,
                  cold: Mapping[str, Any] | None = None) -> list[Verdict]:
    """The load targets: (a) ``ours`` (load_rank, Parameters built, default workers) ≤ 0.8× DCP's
    ``dcp.load`` and ≤ 1.1× the single-thread pread bound; (b) ``into_net`` ≤ 0.7× DCP's;
    (c) ``ours``' peak RSS above start ≤ 1.02× and bytes read ≤ 1.01× the rank's bytes (worst run);
    (d) in the ``cold`` record, ``ours`` no slower than DCP."""
    if rec is None or ours not in rec["summary"]:
        why = "the load scenario did not run" if rec is None else f"`{ours}` did not run"
        return [Verdict("Load one target rank (warm)", why, None), cold_verdict(cold, ours)]
    s, n = rec["summary"], rec["params"]["rank_nbytes"]
    me = s[ours]
    dcp = fastest_dcp(s)
    no_dcp = "PyTorch DCP did not run: not judged"
    out = [
        _vs(f"Load (a): `load_rank` (Parameters built, default workers) ≤ {LOAD_VS_DCP}× PyTorch DCP's `dcp.load` "
            "(fastest DCP row)", s, ours, dcp, LOAD_VS_DCP, no_dcp),
        _vs(f"Load (a): `load_rank` (Parameters built, default workers) ≤ {LOAD_VS_BOUND}× the single-thread 4 KiB "
            "numpy pread bound", s, ours, bound if bound in s else None, LOAD_VS_BOUND,
            f"`{bound}` did not run: not judged"),
    ]
    if into_net is not None:
        out.append(_vs(f"Load (b): `load_into_net` ≤ {INTO_NET_VS_DCP}× PyTorch DCP's `dcp.load` (fastest DCP row)",
                       s, into_net, dcp, INTO_NET_VS_DCP, no_dcp))
    peak = me["peak_above_start"]["max"]
    out.append(Verdict(f"Load (c): `load_rank` peak RSS above start ≤ {PEAK_VS_RANK}× the rank's bytes",
                       f"worst {format_bytes(peak)} = {peak / n:.3f}× the rank's {format_bytes(n)}",
                       peak <= PEAK_VS_RANK * n))
    read = max(me["rchar"]["max"], (rec.get("checks", {}).get(ours) or {}).get("bytes_fetched") or 0)
    out.append(Verdict(f"Load (c): `load_rank` bytes read ≤ {READ_VS_RANK}× the rank's bytes",
                       f"worst {format_bytes(read)} = {read / n:.3f}× (the larger of rchar "
                       f"{format_bytes(me['rchar']['max'])} and what ckptstore.io_counts() says it fetched)",
                       read <= READ_VS_RANK * n))
    return out + [cold_verdict(cold, ours)]


def cold_verdict(cold: Mapping[str, Any] | None, ours: str) -> Verdict:
    """(d): on the cold run's record, ``ours`` no slower than the fastest DCP row."""
    title = "Load (d): cold page cache: `load_rank` no slower than PyTorch DCP's `dcp.load`"
    if cold is None:
        return Verdict(title, "no cold run in this report (`run --cold-load` or `bench_load --cold`): not judged",
                       None)
    cs = cold["summary"]
    return _vs(title, cs, ours, fastest_dcp(cs), 1.0, "PyTorch DCP did not run cold: not judged")


def convert_verdicts(rec: Mapping[str, Any] | None, ours: str, ms_route: str) -> list[Verdict]:
    if rec is None or ours not in rec["summary"]:
        return [Verdict("Convert", "the convert scenario did not run" if rec is None else f"`{ours}` did not run",
                        None)]
    s = rec["summary"]
    out = []
    wall = s[ours]["wall_s"]["median"]
    if ms_route in s:
        ms = s[ms_route]["wall_s"]["median"]
        out.append(Verdict("Convert: time ≤ 0.3× MindSpore's ckpt_to_safetensors + unified_safetensors",
                           f"{format_seconds(wall)} vs {format_seconds(ms)} = {wall / ms:.3f}×", wall <= 0.3 * ms))
    else:
        out.append(Verdict("Convert: time ≤ 0.3× MindSpore's ckpt_to_safetensors + unified_safetensors",
                           f"`{ms_route}` did not run", None))
    peak_stat = s[ours].get("tree_peak_above_start") or s[ours]["peak_above_start"]
    peak = peak_stat["max"]
    out.append(Verdict("Convert: peak RSS < 0.5 GB whatever the checkpoint size",
                       f"worst {format_bytes(peak)} ({peak / 1e9:.3f} GB) for "
                       f"{format_bytes(rec['params']['rank_file_bytes'])} of rank files", peak < CONVERT_PEAK_LIMIT))
    return out


def index_load_verdicts(rec: Mapping[str, Any] | None, index: str, store: str) -> list[Verdict]:
    """Loading from an index: the same values as from the converted store, in ≤ 1.1× its time (same run)."""
    same_title = "Loading from an index: identical values to the converted store"
    time_title = f"Loading from an index: time within {INDEX_VS_STORE}× of the converted store (same run)"
    if rec is None:
        return [Verdict(same_title, "the load scenario did not run", None),
                Verdict(time_title, "the load scenario did not run", None)]
    checks = rec.get("checks", {})
    mine, ref = checks.get(index, {}).get("digest"), checks.get(store, {}).get("digest")
    if mine is None or ref is None:
        same = Verdict(same_title, f"`{index if mine is None else store}` did not run (or was not checked)", None)
    else:
        c = checks[index]
        same = Verdict(same_title, f"digest {mine} vs {ref} over {c.get('tensors', '?')} tensors, "
                                   f"{format_bytes(c.get('bytes', 0))}",
                       mine == ref and not c.get("missing_or_misshapen"))
    return [same, _vs(time_title, rec["summary"], index, store, INDEX_VS_STORE, f"`{store}` did not run: not judged")]


def index_convert_verdicts(rec: Mapping[str, Any] | None, index: str) -> list[Verdict]:
    """The index targets judged in the convert scenario: the 3 GB checkpoint indexed in < 1 s warm
    (judged only when this run's checkpoint is the 3 GB one), metadata < 0.1% of the rank files
    (judged from 1 GB up: a manifest's size follows the number of chunks, so a tiny checkpoint's
    share says nothing about the target)."""
    t_title = f"Index the 3 GB checkpoint in < {INDEX_3GB_S:g} s (warm page cache)"
    m_title = f"Index: metadata < {INDEX_METADATA_SHARE:.1%} of the rank files"
    if rec is None or index not in rec["summary"]:
        why = "the convert scenario did not run" if rec is None else f"`{index}` did not run"
        return [Verdict(t_title, why, None), Verdict(m_title, why, None)]
    s, p = rec["summary"], rec["params"]
    wall = s[index]["wall_s"]["median"]
    size = p.get("size_requested")
    if size == INDEX_3GB_SIZE and rec.get("cache", "warm") == "warm":
        timed = Verdict(t_title, f"{format_seconds(wall)} (median of {s[index]['wall_s']['n']}) for "
                                 f"{format_bytes(p['rank_file_bytes'])} of rank files", wall < INDEX_3GB_S)
    else:
        timed = Verdict(t_title, f"not judged: this run's checkpoint is {size / 1e9:g} GB (the target is about "
                                 f"`--size 3GB`); here {format_seconds(wall)} (median) for "
                                 f"{format_bytes(p['rank_file_bytes'])} of rank files", None)
    meta = [x["returned"]["metadata_bytes"] for x in rec["samples"]
            if x["contender"] == index and isinstance(x.get("returned"), dict) and "metadata_bytes" in x["returned"]]
    if not meta:
        return [timed, Verdict(m_title, "the index's size was not recorded", None)]
    worst, files = max(meta), p["rank_file_bytes"]
    measured = (f"{format_bytes(worst)} of `ckptstore.json` = {worst / files:.4%} of the {format_bytes(files)} "
                "of rank files")
    if not size or size < INDEX_METADATA_MIN_SIZE:  # the manifest grows with the chunks, not the bytes
        return [timed, Verdict(m_title, f"not judged below 1 GB (the targets are about the 1 GB and 3 GB "
                                        f"checkpoints): {measured}", None)]
    return [timed, Verdict(m_title, measured, worst < INDEX_METADATA_SHARE * files)]


def sparse_index_verdicts(rec: Mapping[str, Any] | None, index: str) -> list[Verdict]:
    """The sparse 130B checkpoint (128 rank files): indexed in < 30 s, metadata < 0.1% of the rank files.
    Judged only on that checkpoint (``params["judged"]``); a quick run says "not judged"."""
    t_title = f"Index the sparse 130B checkpoint (128 rank files) in < {INDEX_SPARSE_S:g} s"
    m_title = f"Index of the sparse 130B checkpoint: metadata < {INDEX_METADATA_SHARE:.1%} of the rank files"
    if rec is None or index not in rec["summary"]:
        why = "the index scenario did not run" if rec is None else f"`{index}` did not run"
        return [Verdict(t_title, why, None), Verdict(m_title, why, None)]
    p, st = rec["params"], rec["summary"][index]
    wall = st["wall_s"]["median"]
    files = p["rank_file_bytes"]
    meta = p.get("manifest_bytes")
    judged = bool(p.get("judged"))
    note = "" if judged else f"not judged: this run's checkpoint is `{p.get('model_key')}` on {p.get('world')} ranks; "
    out = [Verdict(t_title, f"{note}{format_seconds(wall)} (median of {st['wall_s']['n']}) for {p['rank_files']} "
                            f"files, {format_bytes(files)}", (wall < INDEX_SPARSE_S) if judged else None)]
    if meta is None:
        out.append(Verdict(m_title, "the manifest's size was not recorded", None))
    else:
        out.append(Verdict(m_title, f"{note}{format_bytes(meta)} = {meta / files:.5%} of {format_bytes(files)}",
                           (meta < INDEX_METADATA_SHARE * files) if judged else None))
    return out


def node_verdicts(rec: Mapping[str, Any] | None, ours: str) -> list[Verdict]:
    title = "Node: 8 concurrent loaders hold ≈ the sum of their slices (judged: ≤ 1.05×)"
    if rec is None or ours not in rec["summary"]:
        return [Verdict(title, "the node scenario did not run" if rec is None else f"`{ours}` did not run", None)]
    p = rec["params"]
    total = p["sum_rank_nbytes"]
    worst = rec["summary"][ours]["sum_peak_above_start"]["max"]
    model = p["model_bytes"]
    return [Verdict(title.replace("8", str(p["ranks"]), 1),
                    f"worst Σ peak RSS above start {format_bytes(worst)} = {worst / total:.3f}× the "
                    f"{format_bytes(total)} the ranks hold ({p['ranks']} × the model would be "
                    f"{format_bytes(p['ranks'] * model)})", worst <= NODE_TOLERANCE * total)]


#: What a quick run says instead of verdicts: its tiny sizes and one repetition judge nothing.
SMOKE_TEST = ("Not judged: `--quick` is a smoke test (tiny sizes, one repetition) that checks the benchmarks "
              "run, not the targets; run without `--quick` to judge them.")


def markdown(verdicts: Sequence[Verdict], *, quick: bool = False) -> str:
    """The verdicts as a table; with ``quick`` (a smoke test) the :data:`SMOKE_TEST` sentence instead."""
    if quick:
        return SMOKE_TEST
    lines = ["| target | this run | verdict |", "|---|---|---|"]
    lines += [f"| {v.target} | {v.measured} | {v.mark} |" for v in verdicts]
    return "\n".join(lines)
