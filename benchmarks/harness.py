"""Run contenders in fresh subprocesses, repeat them in alternating order, record the results.

A *contender* is a Python callable named by module and function, with JSON keyword arguments.
Each measurement runs it in a new ``python -m benchmarks.worker`` process, so no contender
inherits another's heap, page-table state or imports. Rounds alternate the order (A B C, C B A,
A B C, ...) because this machine's speed drifts over minutes: a fixed order would charge the
drift to whoever runs last. Records go to ``benchmarks/results/raw/<name>.json``, the latest run
of each scenario (:func:`append_result`): the ``raw/`` folders are not in git (``.gitignore``),
only the Markdown summaries beside them are.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks import procfs

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
#: The subfolder of a results folder that holds the raw records (JSON) and plots (PNG): ignored by
#: git, so the repository keeps the Markdown summaries and not megabytes of data that each run rewrites.
RAW = "raw"


def raw_path(results_dir: str | os.PathLike[str], filename: str) -> Path:
    """Where a benchmark keeps a raw record or plot of ``results_dir``: ``results_dir/raw/filename``."""
    return Path(results_dir) / RAW / filename

#: Set in every worker. numpy's madvise(MADV_HUGEPAGE) makes large allocations fault in huge
#: pages whose zeroing cost swings timings up to 10x here; GLOG_v=3 silences MindSpore's logging.
WORKER_ENV = {"NUMPY_MADVISE_HUGEPAGE": "0", "GLOG_v": "3"}

#: Measurements summarised as median/min/max (see ``worker.measure`` and README.md).
METRICS = ("wall_s", "cpu_s", "peak_above_start", "peak_rss", "rss_before", "rss_after",
           "rchar", "read_bytes", "syscr", "minflt", "majflt", "children_cpu_s", "children_peak",
           "tree_peak_above_start", "setup_s", "setup_rss")


class BenchmarkError(RuntimeError):
    """A contender failed, or the benchmark could not be set up as asked."""


#: What a ckptstore contender that converts or indexes imports before it is measured: the write
#: side, which ``import ckptstore`` leaves to first use (as MindSpore's contenders preimport
#: ``mindspore``), so that every contender times the work, not its library's imports. Named by
#: the public function (``"module:name"``, see :func:`benchmarks.worker.preimport`), not by the
#: module that holds it.
WRITE_SIDE = ("ckptstore:convert",)


@dataclass(frozen=True)
class Contender:
    """One thing to measure: ``module.func(**args)``, run in a fresh worker process.

    ``preimport`` lists modules the worker imports before measuring, so a contender that imports
    MindSpore lazily is not charged for the import (``"module:name"`` also takes that attribute,
    e.g. ``"ckptstore:load_rank"``, which imports ckptstore's MindSpore adapter). ``reps`` caps
    this contender's repetitions
    (for a slow baseline); ``None`` means the benchmark's ``reps``. ``env`` is added to the
    worker's environment (e.g. ``RANK_ID``). ``check`` names a function of ``module`` called
    after the measurement as ``check(result, **args)`` (e.g. a digest of the loaded values).
    ``setup`` names a function of ``module`` the worker calls *unmeasured* as
    ``state = setup(**args)`` (building the model or state dict a load fills); the measured call
    is then ``func(state)``, and the setup's time is recorded as ``setup_s``.
    ``track_children`` samples the memory of processes the call starts (a ``multiprocessing``
    pool, ``cp``), which the worker's own peak does not see. A contender with ``unavailable``
    set is not run: the reason is reported in its place.
    """

    name: str
    module: str
    func: str
    args: Mapping[str, Any] = field(default_factory=dict)
    preimport: tuple[str, ...] = ()
    reps: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    check: str | None = None
    setup: str | None = None
    track_children: bool = False
    unavailable: str | None = None


def _spec(contender: Contender, barrier: Mapping[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"module": contender.module, "func": contender.func, "args": dict(contender.args),
                            "preimport": list(contender.preimport)}
    if contender.check:
        spec["check"] = contender.check
    if contender.setup:
        spec["setup"] = contender.setup
    if barrier:
        spec["barrier"] = dict(barrier)
    return spec


def _popen(contender: Contender, spec: Mapping[str, Any], result_path: str) -> subprocess.Popen[bytes]:
    """Start a worker; its stderr goes to ``result_path + ".err"`` (no pipe to fill up)."""
    cmd = [sys.executable, "-m", "benchmarks.worker", json.dumps(spec), result_path]
    with open(result_path + ".err", "wb") as err:
        return subprocess.Popen(cmd, cwd=REPO_ROOT, env={**os.environ, **WORKER_ENV, **contender.env},
                                stdout=subprocess.DEVNULL, stderr=err)


def _finish(contender: Contender, proc: subprocess.Popen[bytes], result_path: str,
            timeout: float | None) -> dict[str, Any]:
    """Wait for a worker and return its result; :class:`BenchmarkError` if it failed."""
    note = ""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        note = f"timed out after {timeout:.0f} s\n"
    result = _read_result(result_path)
    if proc.returncode != 0 or result is None or "error" in result:
        try:
            with open(result_path + ".err", encoding="utf-8", errors="replace") as f:
                stderr = f.read()[-4000:]
        except OSError:
            stderr = ""
        detail = (result or {}).get("error") or note + _killed(proc.returncode) + stderr
        raise BenchmarkError(f"contender {contender.name!r} failed (exit {proc.returncode}):\n{detail}")
    return result


class ChildSampler(threading.Thread):
    """Samples, every ``period`` s, the resident memory of processes started by the workers.

    ``roots`` are worker pids. For each one it keeps a timeline of its own RSS and of the
    *growth* of its descendants (each descendant's RSS minus its RSS when first seen, so a
    forked child is not charged for the pages it shares with its parent). Runs in the harness
    process, so it takes no time from the measured call's interpreter.
    """

    def __init__(self, roots: Sequence[int], *, children: bool, period: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.roots, self.children, self.period = list(roots), children, period
        self.timeline: list[tuple[int, list[int], int]] = []  # (monotonic ns, rss per root, children growth)
        self._first: dict[int, int] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.period)

    def sample(self) -> None:
        now = time.monotonic_ns()
        rss = [procfs.process_rss(p) or 0 for p in self.roots]
        growth = 0
        if self.children:
            for kids in procfs.descendants_of(self.roots).values():
                for kid in kids:
                    r = procfs.process_rss(kid)
                    if r is not None:
                        growth += max(0, r - self._first.setdefault(kid, r))
        self.timeline.append((now, rss, growth))

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def children_peak(self, start_ns: int, end_ns: int) -> int:
        """Largest growth of the descendants' memory between ``start_ns`` and ``end_ns``."""
        return max((g for t, _, g in self.timeline if start_ns <= t <= end_ns), default=0)

    def peak_of_sum(self, before: Sequence[int], start_ns: int, end_ns: int) -> int:
        """Largest ``sum(rss_i - before_i)`` over the roots between ``start_ns`` and ``end_ns``."""
        return max((sum(max(0, r - b) for r, b in zip(rss, before, strict=False)) + g
                    for t, rss, g in self.timeline if start_ns <= t <= end_ns), default=0)


def run_contender(contender: Contender, *, timeout: float | None = None) -> dict[str, Any]:
    """Measure one call of ``contender`` in a fresh subprocess and return the worker's measurements.

    Adds ``process_s``: the subprocess's whole life (interpreter start and imports included).
    With ``track_children``, adds ``children_peak`` (largest growth of the memory of the
    processes the call started) and ``tree_peak_above_start`` (the worker's own peak above
    start plus that: an upper bound on the process tree's). Raises :class:`BenchmarkError`
    with the worker's traceback if the call fails.
    """
    if contender.unavailable:
        raise BenchmarkError(f"contender {contender.name!r} is unavailable: {contender.unavailable}")
    with tempfile.TemporaryDirectory(prefix="ckptstore_bench_") as tmp:
        result_path = os.path.join(tmp, "result.json")
        t0 = time.perf_counter()
        proc = _popen(contender, _spec(contender), result_path)
        sampler = ChildSampler([proc.pid], children=True, period=0.05) if contender.track_children else None
        if sampler:
            sampler.start()
        try:
            result = _finish(contender, proc, result_path, timeout)
        finally:
            if sampler:
                sampler.stop()
        process_s = time.perf_counter() - t0
    result["process_s"] = process_s
    if sampler:
        result["children_peak"] = sampler.children_peak(result["start_ns"], result["end_ns"])
        result["tree_peak_above_start"] = result["peak_above_start"] + result["children_peak"]
    return result


def _killed(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        return f"killed by signal {-returncode}{' (SIGKILL: out of memory?)' if returncode == -9 else ''}\n"
    return ""


def _read_result(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None  # the worker died before writing (killed, out of memory)


def schedule(contenders: Sequence[Contender], reps: int) -> Iterator[tuple[int, Contender]]:
    """``(round, contender)`` pairs: forward order in even rounds, reversed in odd rounds."""
    for rnd in range(reps):
        order = contenders if rnd % 2 == 0 else list(reversed(contenders))
        for c in order:
            if rnd < (c.reps if c.reps is not None else reps):
                yield rnd, c


def warm_page_cache(paths: Sequence[str | os.PathLike[str]]) -> None:
    """Read each file once so the first contender does not pay for a cold cache the others skip."""
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass


def summarize(samples: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per contender and metric: ``{"median", "min", "max", "n"}`` over the repetitions."""
    by_contender: dict[str, list[Mapping[str, Any]]] = {}
    for s in samples:
        by_contender.setdefault(s["contender"], []).append(s)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, runs in by_contender.items():
        out[name] = {}
        for metric in METRICS + ("process_s",):
            values = [r[metric] for r in runs if metric in r]
            if values:
                out[name][metric] = {"median": statistics.median(values), "min": min(values),
                                     "max": max(values), "n": len(values)}
    return out


def environment() -> dict[str, Any]:
    """Machine and software versions, recorded with every result."""
    info: dict[str, Any] = dict(procfs.machine_info())
    info["python"] = sys.version.split()[0]
    for dist in ("numpy", "mindspore", "zarr", "ckptstore"):
        try:
            info[dist] = metadata.version(dist)  # not imported: MindSpore's import costs ~1 s
        except metadata.PackageNotFoundError:
            info[dist] = None
    info["git"] = _git_revision()
    return info


def _git_revision() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def command_line(module: str, argv: Sequence[str] | None = None) -> str:
    """The command that reproduces this run, e.g. ``python -m benchmarks.bench_load --size 1GB``."""
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", "-m", module, *args])


def run_benchmark(
    name: str,
    contenders: Sequence[Contender],
    *,
    reps: int = 3,
    cold: bool = False,
    warm_paths: Sequence[str | os.PathLike[str]] = (),
    evict_paths: Sequence[str | os.PathLike[str]] = (),
    params: Mapping[str, Any] | None = None,
    command: str = "",
    timeout: float | None = None,
    results_dir: Path | None = RESULTS_DIR,
    log: Callable[[str], None] | None = None,
    sync_before: bool = False,
    keep_going: bool = False,
    before_each: Callable[[Contender], None] | None = None,
) -> dict[str, Any]:
    """Measure every contender ``reps`` times in alternating order and return the run record.

    ``cold`` drops the page cache before every measurement: all of it where
    ``/proc/sys/vm/drop_caches`` is writable, else the pages of ``evict_paths`` (every file a
    contender reads) with ``posix_fadvise(DONTNEED)``; :class:`BenchmarkError` when neither is
    possible. Otherwise ``warm_paths`` are read once first so every contender starts warm.
    ``sync_before`` writes dirty pages back before each measurement (for
    benchmarks that write, so one contender's write-back is not charged to the next).
    ``before_each`` runs before each measurement (e.g. to remove a previous output). With
    ``keep_going`` a failing contender is recorded under ``failed`` (with its error) and the
    others go on; contenders marked ``unavailable`` are recorded under ``unavailable``.
    ``params`` (sizes, seeds, paths) are stored with the record. The record is added to
    ``results_dir/raw/<name>.json`` (replacing the earlier one of its scenario) unless ``results_dir`` is None.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    cold_method = None
    if cold:
        ok, why = procfs.drop_page_cache()
        if ok:
            cold_method = "drop_caches"
        elif evict_paths:
            cold_method = f"posix_fadvise(DONTNEED) of the {len(evict_paths)} files the contenders read"
        else:
            raise BenchmarkError(f"--cold needs a writable /proc/sys/vm/drop_caches ({why}) or the files to "
                                 "evict; run warm instead")
    else:
        warm_page_cache(warm_paths)
    unavailable = {c.name: c.unavailable for c in contenders if c.unavailable}
    failed: dict[str, str] = {}
    samples = []
    load_before = os.getloadavg()
    foreign = procfs.ForeignLoad()
    for rnd, c in schedule([c for c in contenders if not c.unavailable], reps):
        if c.name in failed:
            continue
        if before_each:
            before_each(c)
        if sync_before:
            os.sync()
        if cold_method == "drop_caches":
            procfs.drop_page_cache()
        elif cold_method:
            procfs.evict_files(evict_paths)
        try:
            m = run_contender(c, timeout=timeout)
        except BenchmarkError as e:
            if not keep_going:
                raise
            failed[c.name] = str(e)
            log(f"  round {rnd} {c.name:<24} FAILED: {str(e).strip().splitlines()[-1][:200]}")
            continue
        m.update(contender=c.name, round=rnd)
        samples.append(m)
        log(f"  round {rnd} {c.name:<40} wall {m['wall_s']:8.3f} s  peak+ {m['peak_above_start'] / 2**20:9.1f} MiB"
            f"  rchar {m['rchar'] / 2**20:10.1f} MiB"
            + (f"  (setup {m['setup_s']:.3f} s, untimed)" if "setup_s" in m else ""))
    record = {
        "name": name,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "cache": "cold" if cold else "warm",
        "cold_method": cold_method,
        "reps": reps,
        "params": dict(params or {}),
        "environment": environment(),
        "worker_env": WORKER_ENV,
        "contenders": [asdict(c) for c in contenders],
        "summary": summarize(samples),
        "checks": collect_checks(samples),
        "unavailable": unavailable,
        "failed": failed,
        "hwm_reset": all(s["hwm_reset"] for s in samples),  # False: peaks are upper bounds
        "loadavg": {"before": list(load_before), "after": list(os.getloadavg())},
        "foreign_cpu_cores": foreign.cores(),  # cores other processes kept busy during the run
        "samples": samples,
    }
    if results_dir is not None:
        append_result(name, record, results_dir)
    return record


def collect_checks(samples: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per contender, the ``check`` dict of its runs (``"consistent": False`` if runs disagree)."""
    out: dict[str, dict[str, Any]] = {}
    for s in samples:
        if "check" not in s:
            continue
        prev = out.get(s["contender"])
        if prev is None:
            out[s["contender"]] = {**s["check"], "consistent": True}
        elif any(prev.get(k) != v for k, v in s["check"].items()):
            prev["consistent"] = False
    return out


class MemoryGuard(threading.Thread):
    """Kills the given processes when ``MemAvailable`` falls below ``floor`` bytes (polled every
    ``period`` s): a benchmark that holds most of a shared machine's memory stops itself before the
    kernel has to kill anything. ``tripped`` is the ``MemAvailable`` seen when it fired, else 0."""

    def __init__(self, pids: Sequence[int], floor: int, *, period: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pids, self.floor, self.period = list(pids), floor, period
        self.tripped = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            avail = procfs.mem_available()
            if 0 < avail < self.floor:
                self.tripped = avail
                for pid in self.pids:
                    try:
                        os.kill(pid, 9)
                    except OSError:
                        pass  # already gone
                return
            self._stop_event.wait(self.period)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def run_concurrent(contenders: Sequence[Contender], *, timeout: float | None = None,
                   sample_period: float = 0.02, min_available: int = 0) -> dict[str, Any]:
    """Run ``contenders`` at the same time, one worker each, their measured calls started together.

    Each worker does its imports, then waits at a barrier; when all are ready they are released
    at once. Returns ``{"samples": [...], "makespan_s", "peak_sum_above_start"}``: the per-worker
    measurements, the time from the first measured call's start to the last one's end, and the
    largest *simultaneous* sum of the workers' memory above their start (sampled every
    ``sample_period`` s; the processes they start too if a contender has ``track_children``).
    Raises :class:`BenchmarkError` if any worker fails (the others are killed). Every worker is
    made the kernel's first choice should memory run out (``oom_score_adj`` 1000); with
    ``min_available`` they are all killed (and a :class:`BenchmarkError` raised) as soon as
    ``MemAvailable`` falls below that many bytes.
    """
    with tempfile.TemporaryDirectory(prefix="ckptstore_node_") as tmp:
        go = os.path.join(tmp, "go")
        procs = []
        guard = None
        try:
            for i, c in enumerate(contenders):
                if c.unavailable:
                    raise BenchmarkError(f"contender {c.name!r} is unavailable: {c.unavailable}")
                barrier = {"ready": os.path.join(tmp, f"ready{i}"), "go": go}
                path = os.path.join(tmp, f"result{i}.json")
                procs.append((c, _popen(c, _spec(c, barrier), path), path, barrier["ready"]))
                procfs.make_first_oom_victim(procs[-1][1].pid)
            if min_available:
                guard = MemoryGuard([p.pid for _, p, *_ in procs], min_available)
                guard.start()
            deadline = time.monotonic() + (timeout or 600)
            while not all(os.path.exists(r) for *_, r in procs):
                dead = [(c, p) for c, p, *_ in procs if p.poll() is not None]
                if dead or time.monotonic() > deadline:
                    c, p = dead[0] if dead else procs[0][:2]
                    raise BenchmarkError(f"contender {c.name!r} did not reach the start barrier "
                                         f"(exit {p.returncode}): {_tail(procs[0][2] + '.err')}")
                time.sleep(0.005)
            sampler = ChildSampler([p.pid for _, p, *_ in procs], period=sample_period,
                                   children=any(c.track_children for c in contenders))
            sampler.sample()
            sampler.start()
            with open(go, "w", encoding="utf-8"):
                pass
            try:
                samples = [_finish(c, p, path, timeout) for c, p, path, _ in procs]
            except BenchmarkError as e:
                if guard is not None and guard.tripped:
                    raise BenchmarkError(f"stopped: MemAvailable fell to {guard.tripped / 2**30:.1f} GiB, below the "
                                         f"{min_available / 2**30:.1f} GiB kept free; every worker was killed") from e
                raise
            finally:
                sampler.stop()
        finally:
            if guard is not None:
                guard.stop()
            for _, p, *_ in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    start = min(s["start_ns"] for s in samples)
    end = max(s["end_ns"] for s in samples)
    for c, s in zip(contenders, samples, strict=False):
        s["contender"] = c.name
    return {"samples": samples, "makespan_s": (end - start) / 1e9,
            "peak_sum_above_start": sampler.peak_of_sum([s["rss_before"] for s in samples], start, end)}


def _tail(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()[-2000:]
    except OSError:
        return ""


def append_result(name: str, record: Mapping[str, Any], results_dir: Path = RESULTS_DIR) -> Path:
    """Add ``record`` to ``results_dir/raw/<name>.json`` (``{"runs": [...]}``), atomically, in place
    of the earlier record of the same scenario (:func:`scenario_key`): the records kept are the
    latest of each scenario, not every run ever made (the reports cite their commands)."""
    path = raw_path(results_dir, f"{name}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    runs = latest_per_scenario([*load_results(path), dict(record)])
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"runs": runs}, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)  # a crash mid-write leaves the previous history intact
    return path


def scenario_key(record: Any) -> str | None:
    """What makes two records runs of one scenario: the benchmark's name, its parameters (size,
    layout, ``--quick``...), warm or cold page cache; ``None`` for a record of another shape."""
    if not isinstance(record, dict):
        return None
    return json.dumps([record.get(k) for k in ("name", "params", "cache", "cold_method")], sort_keys=True,
                      default=str)


def latest_per_scenario(runs: Sequence[Any]) -> list[Any]:
    """``runs`` (oldest first) with only the newest record of each scenario, in their order."""
    newest = {scenario_key(r): i for i, r in enumerate(runs) if scenario_key(r) is not None}
    return [r for i, r in enumerate(runs) if scenario_key(r) is None or newest[scenario_key(r)] == i]


def load_results(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All run records in a results file, oldest first; ``[]`` when it does not exist yet."""
    try:
        with open(path, encoding="utf-8") as f:
            return list(json.load(f)["runs"])
    except FileNotFoundError:
        return []


def run_and_publish(make_record: Callable[[], Mapping[str, Any]], render: Callable[[Any], str],
                    results_dir: Path, name: str) -> int:
    """A scenario CLI's ending: run, then write and print the report (exit 0); a
    :class:`BenchmarkError` becomes one line on stderr and exit 1."""
    from benchmarks.report import publish

    try:
        record = make_record()
    except BenchmarkError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return publish(render(record), results_dir, name)
