"""Markdown tables of a run record: medians with their spread, and ratios against a baseline."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Column:
    """One metric in a table: the record's metric key, a header, its unit and whether to add a ratio."""

    metric: str
    title: str
    unit: str  # "s" (seconds), "B" (bytes) or "n" (a count)
    ratio: bool = True


DEFAULT_COLUMNS = (
    Column("wall_s", "wall", "s"),
    Column("peak_above_start", "peak RSS above start", "B"),
    Column("rchar", "bytes read (rchar)", "B"),
)


def format_seconds(s: float) -> str:
    """``0.0123`` -> ``'12.3 ms'``; three significant-ish digits."""
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    if s < 1000:
        return f"{s:.3g} s"
    return f"{s:.0f} s ({s / 60:.1f} min)"  # not "1.29e+03 s"


def format_bytes(n: float) -> str:
    """Binary units: ``1536`` -> ``'1.5 KiB'``."""
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return format_seconds(value)
    if unit == "B":
        return format_bytes(value)
    return f"{value:,.0f}"


def _cell(stat: Mapping[str, float], unit: str) -> str:
    median = _fmt(stat["median"], unit)
    if stat["n"] < 2:
        return median
    return f"{median} ({_fmt(stat['min'], unit)}–{_fmt(stat['max'], unit)})"


def _ratio(value: float, base: float) -> str:
    if base == 0:
        return "–"
    r = value / base
    return f"{r:.3g}×" if r >= 0.001 else f"{r:.1e}×"


def markdown_table(record: Mapping[str, Any], *, baseline: str | None = None,
                   columns: Sequence[Column] = DEFAULT_COLUMNS, baselines: Sequence[str] = (),
                   labels: Mapping[str, str] | None = None,
                   extra: Mapping[str, Callable[[str], str]] | None = None) -> str:
    """A Markdown table: one row per contender, median (min–max) per column, ratios to baselines.

    Ratios compare medians; ``baseline`` (or each of ``baselines``) must be a contender that ran.
    ``labels`` shortens a baseline's name in the ratio headers (``× bound``). ``extra`` adds
    columns: header -> function of the contender name. Contenders of the record that did not
    run get a row saying why (``unavailable`` or ``failed``).
    """
    summary = record["summary"]
    bases = list(baselines) or ([baseline] if baseline else [])
    for b in bases:
        if b not in summary:
            raise KeyError(f"baseline {b!r} is not among the contenders that ran {list(summary)}")
    labels = labels or {}
    extra = extra or {}
    header = ["contender", "runs"]
    for c in columns:
        header += [c.title] + ([f"× {labels.get(b, b)}" for b in bases] if c.ratio else [])
    header += list(extra)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    for name in contender_names(record):
        stats = summary.get(name)
        if stats is None:
            why = not_run_reason(record, name)
            row = [f"`{name}`", "0", why] + ["–"] * (len(header) - 3 - len(extra)) + [f(name) for f in extra.values()]
            lines.append("| " + " | ".join(row) + " |")
            continue
        row = [f"`{name}`", str(stats["wall_s"]["n"])]
        for c in columns:
            row.append(_cell(stats[c.metric], c.unit) if c.metric in stats else "–")
            if c.ratio:
                row += [_ratio(stats[c.metric]["median"], summary[b][c.metric]["median"])
                        if c.metric in stats and c.metric in summary[b] else "–" for b in bases]
        row += [f(name) for f in extra.values()]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def contender_names(record: Mapping[str, Any]) -> list[str]:
    """Every contender of a record, in the order they were declared (run or not)."""
    names = [c["name"] for c in record.get("contenders", [])]
    return names + [n for n in record["summary"] if n not in names]


def not_run_reason(record: Mapping[str, Any], name: str) -> str:
    """Why a contender has no measurements: its ``unavailable`` reason (its first line: a
    record may hold a traceback after it) or its failure (the exception line), on one line."""
    if name in record.get("unavailable", {}):
        return "unavailable: " + one_line(first_line(record["unavailable"][name]))
    if name in record.get("failed", {}):
        return "failed: " + one_line(last_error_line(record["failed"][name]))
    return "not run"


def first_line(text: str) -> str:
    """The first non-empty line of ``text``."""
    return next((ln.strip() for ln in text.strip().splitlines() if ln.strip()), text)


def last_error_line(text: str) -> str:
    """The exception line of a traceback (its last non-empty line)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else text


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, ``|`` escaped for Markdown, cut at ``limit`` characters."""
    flat = " ".join(text.split()).replace("|", "\\|")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def machine_line(record: Mapping[str, Any]) -> str:
    """One line naming the machine, software versions, cache state and date of a run."""
    e = record["environment"]
    mem = f"{e['mem_total'] / 2**30:.1f} GiB" if e.get("mem_total") else "? GiB"
    return (f"{e['cpu_model']}, {e['nproc']} cores, {mem} RAM, Linux {e['kernel']}; "
            f"Python {e['python']}, numpy {e['numpy']}, MindSpore {e['mindspore']}; "
            f"ckptstore {e.get('git') or '?'}; {record['cache']} page cache; {record['date']}")


def publish(text: str, results_dir: Path, name: str) -> int:
    """Write a scenario's Markdown report to ``results_dir/<name>.md``, print it, return exit 0."""
    (results_dir / f"{name}.md").write_text(text, encoding="utf-8")
    print(text)
    return 0
