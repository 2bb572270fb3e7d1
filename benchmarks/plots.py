"""PNG curves of the scaling runs (matplotlib, from the optional ``bench`` extra).

One figure per (scenario, axis): a panel per measure, a line per contender, log-log, medians
with the min–max spread as error bars. Without matplotlib, :func:`plot_scaling` returns why no
figure was drawn instead of failing the suite.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PANELS = {
    "load": (("wall_s", "wall (s)", 1.0), ("peak_above_start", "peak RSS above start (MiB)", 2**20),
             ("rchar", "bytes read, rchar (MiB)", 2**20)),
    "convert": (("wall_s", "wall (s)", 1.0), ("mb_per_s", "MB/s of rank files", 1.0),
                ("tree_peak_above_start", "peak RSS above start, with children (MiB)", 2**20)),
}
AXES = {"size": ("model size: global tensors incl. Adam (GB)", 1e9), "world": ("source world size (ranks)", 1)}


#: Why no figure is drawn where matplotlib is missing, naming the extra that brings it.
MISSING = "the plots need matplotlib, which is not installed (pip install -e '.[bench]': the bench extra)"


def unavailable() -> str | None:
    """:data:`MISSING` where matplotlib cannot be imported, else ``None`` (asked before a long run)."""
    import importlib.util

    return MISSING if importlib.util.find_spec("matplotlib") is None else None


def plot_scaling(points: Sequence[Mapping[str, Any]], out_dir: Path) -> tuple[list[Path], str | None]:
    """Draw every (scenario, axis) figure the points allow; ``(files, reason none were drawn)``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], MISSING
    files = []
    for scenario, panels in PANELS.items():
        for axis, (xlabel, xscale) in AXES.items():
            pts = sorted((p for p in points if p["axis"] == axis and p.get(scenario)), key=lambda p: p["x"])
            if len(pts) < 2:
                continue
            fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
            for ax, (metric, ylabel, yscale) in zip(axes[0], panels, strict=False):
                _panel(ax, pts, scenario, metric, xscale, yscale)
                ax.set_xlabel(xlabel)
                ax.set_ylabel(ylabel)
            handles, labels = axes[0][0].get_legend_handles_labels()
            fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
            title = {"size": f"{scenario}: scaling with model size", "world": f"{scenario}: scaling with source ranks"}
            fig.suptitle(title[axis])
            fig.tight_layout(rect=(0, 0.06 + 0.035 * ((len(labels) + 1) // 2), 1, 1))
            path = Path(out_dir) / f"scaling_{scenario}_{axis}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=110)
            plt.close(fig)
            files.append(path)
    return files, None


MARKERS = "osD^v<>pXh*"


def _panel(ax: Any, pts: Sequence[Mapping[str, Any]], scenario: str, metric: str, xscale: float,
           yscale: float) -> None:
    import matplotlib
    import matplotlib.ticker

    names: list[str] = []
    for p in pts:
        names += [n for n in p[scenario] if n not in names]
    colors = matplotlib.colormaps["tab20"].colors
    for i, name in enumerate(names):
        xs, ys, lo, hi = [], [], [], []
        for p in pts:
            st = p[scenario].get(name, {}).get(metric)
            if not st:
                continue
            xs.append(p["x"] / xscale)
            ys.append(st["median"] / yscale)
            lo.append((st["median"] - st["min"]) / yscale)
            hi.append((st["max"] - st["median"]) / yscale)
        if xs:
            ours = name.startswith("ckptstore") or name.startswith("lower bound")
            ax.errorbar(xs, ys, yerr=[lo, hi], marker=MARKERS[i % len(MARKERS)], markersize=4 if ours else 3,
                        capsize=2, label=name, color=colors[(2 * i) % 20 + (i // 10) % 2],
                        linewidth=2.4 if ours else 1.1, linestyle="-" if ours else "--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = sorted({p["x"] / xscale for p in pts})
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.grid(True, which="both", alpha=0.3)
