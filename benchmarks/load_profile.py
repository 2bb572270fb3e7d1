"""Where ``ckptstore.load_rank(...).materialize()``'s time goes: the same calls, each step timed.

Run by ``benchmarks.bench_load`` as its step-by-step row (:data:`benchmarks.bench_load.STEPS`)
inside a benchmark worker, like every contender. ``materialize`` is one public call; taking it
apart needs what it calls inside: ``to_parameter`` (MindSpore's ``Parameter`` around an array) and
``collector_paused`` (no garbage collection while Parameters are built). So this module is one of
those ``tests/benchmarks/test_benchmarks_public_api.py`` allow-lists below the public API (with
``compat``, ``fixtures`` and ``index_profile``), and the quick benchmark run of the test suite
(``tests/benchmarks/test_benchmarks_quick.py``) keeps its row running. It serves only the
benchmarks, so it is not part of the installed package.
"""
from __future__ import annotations


class _Steps:
    """Wall and CPU time (this process, every thread) of consecutive steps, each from the last mark."""

    def __init__(self) -> None:
        import time

        self._clock, self._cpu = time.perf_counter, time.process_time
        self._wall0, self._cpu0 = self._clock(), self._cpu()
        self.spans: dict[str, float] = {}

    def mark(self, step: str) -> None:
        wall, cpu = self._clock(), self._cpu()
        self.spans[f"{step}_s"], self.spans[f"{step}_cpu_s"] = wall - self._wall0, cpu - self._cpu0
        self._wall0, self._cpu0 = wall, cpu


#: The steps :func:`ckptstore_load_rank_steps` times, in order, and what each is.
LOAD_STEPS = {
    "open": "`ckptstore.open(store)`: the manifest read, parsed and validated",
    "layout": "`ckptstore.load_rank(st, strategy, rank)`: the strategy file parsed, the rank's boxes cut",
    "read": "`RankParameters.view.read_many(names)`: every read planned, then read by the pool",
    "parameters": "`to_parameter(name, array)` for each: MindSpore's `Parameter` built around the array",
}


def ckptstore_load_rank_steps(store: str, strategy: str, rank: int, names_file: str,
                              workers: int | None = None) -> dict[str, float]:
    """``ckptstore.load_rank(...).materialize()`` taken apart: the same calls, in the same order,
    each timed (:data:`LOAD_STEPS`); returns ``{step}_s`` and ``{step}_cpu_s`` for each step.

    After the four steps, planning alone is timed again (``plan_s``: ``RankParameters.plan``, the
    same plans the read step made before reading), so the report can split the read step into its
    planning and its reads. ``plan`` is not part of the load; the Parameters are dropped after it.
    """
    import contextlib

    import ckptstore
    from ckptstore.mindspore.params import to_parameter

    try:
        from ckptstore.collector import collector_paused
    except ImportError:  # a revision before the collector was paused for loads (--base): as it loaded
        collector_paused = contextlib.nullcontext

    kw = {} if workers is None else {"workers": workers}
    steps = _Steps()
    st = ckptstore.open(store)
    steps.mark("open")
    params = ckptstore.load_rank(st, strategy, rank, **kw)
    steps.mark("layout")
    with collector_paused():  # as materialize() builds: no collection midway
        values = params.view.read_many(list(params))
        steps.mark("read")
        built = {n: v if isinstance(v, str) else to_parameter(n, v) for n, v in values.items()}
        steps.mark("parameters")
    assert len(built) == len(params)
    params.plan  # noqa: B018  # the property plans every parameter: timed as the "plan" step
    steps.mark("plan")
    return steps.spans
