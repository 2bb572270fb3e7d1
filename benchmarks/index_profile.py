"""Where ``ckptstore.index``'s time goes: its main phases timed, or a cProfile of it.

Run by ``benchmarks.bench_index --profile`` (or when the index misses its target) inside a
benchmark worker, as ``profile_phases(src_dir, strategy, out)`` / ``profile_cprofile(...)``.
It wraps ckptstore's internal functions by name, in the process only (never on disk): one of the
modules ``tests/benchmarks/test_benchmarks_public_api.py`` allow-lists below the public API (with
``fixtures`` and ``load_profile``), and ``tests/benchmarks/test_benchmark_index_profile.py`` keeps
:data:`PHASES` pointing at functions that exist. It serves only the benchmarks, so it is not part of
the installed package.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

#: Rows of the cProfile tables.
PROFILE_TOP = 25

#: ``(module, attribute, phase)``: functions of ckptstore.index's main thread timed per phase. A
#: missing one (ckptstore changed) is an error: the test suite says which.
PHASES = (
    ("ckptstore.write.convert", "resolve_source", "resolve_source (everything below)"),
    ("ckptstore.checkpoint.source", "load_strategy", "  read the strategy file"),
    ("ckptstore.checkpoint.source", "scan_rank_file", "  scan the rank files' headers (ckpt_reader)"),
    ("ckptstore.checkpoint.source", "_resolve", "  resolve each parameter's global shape and slices"),
    ("ckptstore.checkpoint.source", "_check_redundancy", "  redundancy check"),
    ("ckptstore.checkpoint.source", "check_against_strategy", "  layout check (sampled bytes, layout_check)"),
    ("ckptstore.write.convert", "select_params", "select parameters"),
    ("ckptstore.write.convert", "_plan", "chunk plans (write.chunk_plan)"),
    ("ckptstore.write.convert", "_fingerprint", "fingerprint (stat every rank file)"),
    ("ckptstore.write.convert", "claim", "claim the output folder"),
    ("ckptstore.write.kinds.index", "IndexWriter.write_param", "  per-parameter chunk tables (worker threads: summed)"),
    ("ckptstore.write.kinds.index", "IndexWriter.extra", "  stat the rank files for the manifest"),
    ("ckptstore.write.convert", "commit_if_last", "commit (dumps + write + make durable)"),
    ("ckptstore.store.manifest", "StoreManifest.dumps", "    manifest to JSON text (dumps)"),
    ("ckptstore.write.convert", "_summary", "summary"),
)


def _wrap_phases(timers: dict[str, list[float]]) -> None:
    import importlib
    import threading

    lock = threading.Lock()
    for module, attr, phase in PHASES:
        try:
            owner: Any = importlib.import_module(module)
            *path, name = attr.split(".")
            for part in path:
                owner = getattr(owner, part)
            fn = getattr(owner, name)
        except (ImportError, AttributeError) as e:  # a renamed module or function: say so, do not time less
            raise AttributeError(f"index_profile.PHASES names {module}.{attr}, which this ckptstore lacks: {e}") from e

        def timed(*a: Any, __fn: Any = fn, __phase: str = phase, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return __fn(*a, **kw)
            finally:
                with lock:
                    entry = timers.setdefault(__phase, [0.0, 0])
                    entry[0] += time.perf_counter() - t0
                    entry[1] += 1

        setattr(owner, name, timed)


def profile_phases(src_dir: str, strategy: str, out: str) -> dict[str, Any]:
    """``ckptstore.index`` with its main phases timed (wall time summed per phase, calls counted)."""
    import ckptstore

    timers: dict[str, list[float]] = {}
    _wrap_phases(timers)
    t0 = time.perf_counter()
    ckptstore.index(src_dir, out, strategy=[strategy])
    total = time.perf_counter() - t0
    order = [p for _, _, p in PHASES]
    rows = [[p, timers[p][0], timers[p][1]] for p in order if p in timers]
    return {"total_s": total, "phases": json.dumps(rows)}


def profile_cprofile(src_dir: str, strategy: str, out: str) -> dict[str, Any]:
    """``ckptstore.index`` under cProfile: the main thread, plus each call of
    ``IndexWriter.write_param`` in the worker threads under a profiler of its own, merged."""
    import cProfile
    import io
    import pstats

    import ckptstore

    threads: list[cProfile.Profile] = []
    try:
        from ckptstore.write.kinds.index import IndexWriter

        original = IndexWriter.write_param

        def write_param(self: Any, plan: Any) -> Any:
            prof = cProfile.Profile()
            threads.append(prof)
            prof.enable()
            try:
                return original(self, plan)
            finally:
                prof.disable()

        IndexWriter.write_param = write_param  # type: ignore[method-assign]  # profiled for this run, put back after
    except (ImportError, AttributeError):
        pass
    prof = cProfile.Profile()
    prof.enable()
    ckptstore.index(src_dir, out, strategy=[strategy])
    prof.disable()
    texts: dict[str, int | str] = {"worker_calls": len(threads)}
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        for t in threads:
            stats.add(t)
        stats.sort_stats(key).print_stats(PROFILE_TOP)
        texts[key] = _trim_profile(buf.getvalue())
    return texts


def _trim_profile(text: str) -> str:
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if "ncalls" in ln), 0)
    head = [ln.strip() for ln in lines[:start] if "function calls" in ln]
    repo = str(Path(__file__).resolve().parents[1])
    return "\n".join(head + [ln.replace(str(Path(sys.prefix)), "<venv>").replace(repo, "<repo>")
                             for ln in lines[start:] if ln.strip()])
