"""The targets of DESIGN.md ("Targets"), judged on one run's records.

Each target is checked against the numbers of this run only: time on medians, memory and bytes
on the worst repetition (a claim must hold every time). A target relative to a contender that
did not run (PyTorch DCP when torch is missing, a cold run that was not made) is "not judged":
no figure from elsewhere stands in for a measurement.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from benchmarks.report import format_bytes, format_seconds

CONVERT_PEAK_LIMIT = 500_000_000  # "< 0.5 GB"
NODE_TOLERANCE = 1.05  # "total memory ≈ the sum of their slices": within 5%
LOAD_VS_DCP = 0.8  # load_rank (Parameters built) ≤ 0.8× DCP's dcp.load
LOAD_VS_BOUND = 1.1  # ... and ≤ 1.1× the single-thread numpy pread bound
INTO_NET_VS_DCP = 0.7  # load_into_net ≤ 0.7× DCP's dcp.load
PEAK_VS_RANK = 1.02
READ_VS_RANK = 1.01


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
    mapped = (rec.get("checks", {}).get(ours) or {}).get("mmap_bytes") or 0
    read = me["rchar"]["max"] + mapped
    out.append(Verdict(f"Load (c): `load_rank` bytes read ≤ {READ_VS_RANK}× the rank's bytes",
                       f"worst {format_bytes(read)} = {read / n:.3f}× (rchar {format_bytes(me['rchar']['max'])}"
                       + (f" + {format_bytes(mapped)} copied from memory-mapped chunks)" if mapped else ")"),
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


def markdown(verdicts: Sequence[Verdict]) -> str:
    lines = ["| target | this run | verdict |", "|---|---|---|"]
    lines += [f"| {v.target} | {v.measured} | {v.mark} |" for v in verdicts]
    return "\n".join(lines)
