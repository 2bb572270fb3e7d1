"""The measuring subprocess: ``python -m benchmarks.worker SPEC_JSON RESULT_PATH``.

SPEC_JSON is ``{"module", "func", "args", "preimport"}`` and optionally ``"setup"``,
``"check"`` and ``"barrier"``. The worker imports ``preimport`` and the contender's module first
(an entry ``"module:name"`` imports the module and takes its attribute ``name``: a public name
imported on first use, such as ``"ckptstore:convert"``, imports what it needs)
(unmeasured: interpreter start and imports are not what we compare), then measures one call
and writes the measurements as JSON to RESULT_PATH. Only the standard library and
:mod:`benchmarks.procfs` are imported before the contender's own imports, so the baseline is
the contender's, not the harness's.

Without ``setup`` the measured call is ``func(**args)``. With ``setup`` (the name of a function
of the same module) the worker first calls ``state = setup(**args)`` *unmeasured* (building the
model or state dict the load fills, a process group, ...), records its wall time as
``setup_s`` and the resident memory it added as ``setup_rss``, and then measures
``func(state)``. Everything the setup allocated is in ``rss_before``, so ``peak_above_start``
is the load's own.

``check`` names a function of the same module called *after* the measurement as
``check(result, **args)``; the dict of scalars it returns (e.g. a digest of the loaded values)
is recorded under ``"check"``. ``barrier`` is ``{"ready": path, "go": path}``: after its imports
(and setup) the worker creates ``ready`` and waits for ``go`` to exist, so that concurrent
workers (one node's loaders) start their measured calls together.
"""
from __future__ import annotations

import gc
import importlib
import json
import os
import resource
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from benchmarks import procfs

_NO_STATE = object()  # measure(): no setup ran, call fn(**args)


def measure(fn: Callable[..., Any], args: Mapping[str, Any] | None = None, *,
            state: Any = _NO_STATE) -> dict[str, Any]:
    """Call ``fn(**args)`` (or ``fn(state)`` when a setup made ``state``) once and return
    wall/CPU time, memory and I/O deltas around the call."""
    call: Callable[[], Any] = (lambda: fn(**(args or {}))) if state is _NO_STATE else (lambda: fn(state))
    gc.collect()  # garbage left by the imports should not be freed inside the measured call
    hwm_reset = procfs.reset_peak_rss()
    before = procfs.read_status()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    rc0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    io0 = procfs.read_io()
    start_ns = time.monotonic_ns()  # CLOCK_MONOTONIC: comparable between concurrent workers
    t0 = time.perf_counter_ns()
    out = call()
    t1 = time.perf_counter_ns()
    end_ns = time.monotonic_ns()
    io1 = procfs.read_io()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    rc1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    after = procfs.read_status()  # read while `out` is alive: rss_after is what the call retains
    return {
        "wall_s": (t1 - t0) / 1e9,
        "cpu_s": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime),
        "children_cpu_s": (rc1.ru_utime - rc0.ru_utime) + (rc1.ru_stime - rc0.ru_stime),
        "start_ns": start_ns,
        "end_ns": end_ns,
        "rss_before": before["VmRSS"],
        "rss_after": after["VmRSS"],
        "peak_rss": after["VmHWM"],
        "peak_above_start": after["VmHWM"] - before["VmRSS"],
        "hwm_reset": hwm_reset,
        "rchar": io1["rchar"] - io0["rchar"],
        "read_bytes": io1["read_bytes"] - io0["read_bytes"],
        "syscr": io1["syscr"] - io0["syscr"],
        "minflt": ru1.ru_minflt - ru0.ru_minflt,
        "majflt": ru1.ru_majflt - ru0.ru_majflt,
        "returned": describe(out),
        "_out": out,  # removed by run(); kept for the check
    }


def describe(value: Any) -> Any:
    """A small JSON-able account of what the contender returned (never its payload)."""
    if isinstance(value, Mapping) and all(
            isinstance(k, str) and isinstance(v, (int, float, str, bool, type(None))) for k, v in value.items()):
        return dict(value)
    return type(value).__name__


def run(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Import what the spec names, wait at the barrier if any, measure the call, then check it."""
    for name in spec.get("preimport", ()):
        preimport(name)
    module = importlib.import_module(spec["module"])
    fn = getattr(module, spec["func"])
    args = spec.get("args", {})
    state, setup = _NO_STATE, {}
    if spec.get("setup"):
        state, setup = run_setup(getattr(module, spec["setup"]), args)
    if spec.get("barrier"):
        wait_at_barrier(spec["barrier"]["ready"], spec["barrier"]["go"])
    result = measure(fn, args, state=state)
    result.update(setup)
    out = result.pop("_out")
    if spec.get("check"):
        result["check"] = getattr(module, spec["check"])(out, **args)
    del out
    return result


def preimport(name: str) -> None:
    """Import ``name``; ``"module:attr"`` imports ``module`` and takes ``attr`` of it (which imports
    whatever that name is imported on first use with)."""
    module, _, attr = name.partition(":")
    imported = importlib.import_module(module)
    if attr:
        getattr(imported, attr)


def run_setup(setup: Callable[..., Any], args: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``setup(**args)``, unmeasured; returns its result and ``{"setup_s", "setup_rss"}``."""
    rss0 = procfs.read_status()["VmRSS"]
    t0 = time.perf_counter_ns()
    state = setup(**args)
    t1 = time.perf_counter_ns()
    return state, {"setup_s": (t1 - t0) / 1e9, "setup_rss": procfs.read_status()["VmRSS"] - rss0}


def wait_at_barrier(ready: str, go: str, *, timeout: float = 600.0) -> None:
    """Say we are ready (create ``ready``), then wait until ``go`` exists."""
    with open(ready, "w", encoding="utf-8"):
        pass
    deadline = time.monotonic() + timeout
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no start signal ({go}) after {timeout:.0f} s")
        time.sleep(0.002)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m benchmarks.worker SPEC_JSON RESULT_PATH", file=sys.stderr)
        return 2
    spec, result_path = json.loads(argv[1]), argv[2]
    try:
        result: dict[str, Any] = run(spec)
        code = 0
    except BaseException:  # report any failure, KeyboardInterrupt included, to the harness
        result, code = {"error": traceback.format_exc()}, 1
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
