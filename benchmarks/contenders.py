"""Contender functions: "give me target rank r's tensors", each route as one call.

Every function here runs inside a fresh worker (:mod:`benchmarks.worker`) and is measured as
one call, after the worker imported what the contender's ``preimport`` names (``mindspore``,
``ckptstore``, ``numpy``). A route that fills an existing model has a ``setup_*`` function the
worker calls first, unmeasured (``state = setup(**args)``: the Cell with the target rank's
Parameters, the target layout, ...); the measured function then takes that ``state`` alone. So
every load is timed from "a model with the target shapes exists" to "its tensors are filled".
They return the loaded values (kept alive until measured); the ``check_*`` functions run after
the measurement and return a digest of those values, so the report can say whether each route
produced the same tensors as ckptstore.

``names_file`` (every contender takes it) is a JSON list of ``[name, shape, dtype,
in_strategy]`` for the tensors the target rank holds, in store order: what a network built for
the target layout would declare. It is written by :func:`write_names_file` before the run.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def write_names_file(path: Path, store: str | os.PathLike[str], strategy: str | os.PathLike[str], rank: int) -> Path:
    """``[name, shape, dtype, in_strategy]`` of every tensor rank ``rank`` of ``strategy`` holds
    (:func:`benchmarks.fixtures.rank_tensors`)."""
    from benchmarks.fixtures import rank_tensors

    rows = rank_tensors(store, strategy, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(rows), encoding="utf-8")
    os.replace(tmp, path)
    return path


def _names(names_file: str) -> list[tuple[str, tuple[int, ...], str, bool]]:
    with open(names_file, encoding="utf-8") as f:
        return [(n, tuple(s), d, bool(k)) for n, s, d, k in json.load(f)]


# ---------------------------------------------------------------------------------------------
# ckptstore


def ckptstore_load_rank(store: str, strategy: str, rank: int, names_file: str,
                        workers: int | None = None) -> dict[str, Any]:
    """``ckptstore.load_rank(...).materialize()``: every Parameter of the rank built.

    ``materialize`` reads everything with ``workers`` threads, then builds every Parameter;
    ``workers=None`` is ckptstore's default (``ckptstore.plan_rank(...).workers`` says it).
    """
    import ckptstore

    kw = {} if workers is None else {"workers": workers}
    return ckptstore.load_rank(store, strategy, rank, **kw).materialize()


def ckptstore_read_rank(store: str, strategy: str, rank: int, names_file: str,
                        workers: int | None = None) -> dict[str, Any]:
    """``ckptstore.read_rank(store, strategy, rank)``: numpy arrays, no MindSpore."""
    import ckptstore

    kw = {} if workers is None else {"workers": workers}
    return ckptstore.read_rank(store, strategy, rank, **kw)


def setup_target_net(store: str, strategy: str, rank: int, names_file: str) -> dict[str, Any]:
    """Unmeasured: a Cell with the target rank's Parameters, zero-filled, as a model built for the
    target would have them (then :func:`ckptstore_load_into_net` is measured)."""
    return {"net": target_net(names_file), "store": store, "strategy": strategy, "rank": rank}


def ckptstore_load_into_net(state: Mapping[str, Any]) -> dict[str, Any]:
    """``ckptstore.load_into_net(net, store, strategy=..., rank=...)`` into the prebuilt Cell."""
    import ckptstore

    param_not_load, ckpt_not_load = ckptstore.load_into_net(state["net"], state["store"], strategy=state["strategy"],
                                                            rank=state["rank"])
    return {"net": state["net"], "param_not_load": param_not_load, "ckpt_not_load": ckpt_not_load}


# ---------------------------------------------------------------------------------------------
# the lower bound


def pread_flat(path: str, nbytes: int, names_file: str, threads: int = 1) -> np.ndarray:
    """``os.preadv`` of one file holding exactly the rank's bytes into one preallocated array.

    ``threads > 1`` splits the file into that many equal parts read concurrently (the copy from
    the page cache is CPU-bound, so two cores copy faster than one).
    """
    out = np.empty(nbytes, dtype=np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        if threads <= 1:
            _pread_into(fd, memoryview(out), 0)
        else:
            from concurrent.futures import ThreadPoolExecutor

            step = -(-nbytes // threads)
            view = memoryview(out)
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda lo: _pread_into(fd, view[lo:lo + step], lo), range(0, nbytes, step)))
    finally:
        os.close(fd)
    return out


def _pread_into(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):  # one call returns at most 2 GiB - 4 KiB
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise EOFError(f"file ends at byte {offset + done}")
        done += n


# ---------------------------------------------------------------------------------------------
# MindSpore

MEMORY_CHECK_NOTE = (
    "MindSpore 2.10's `load_checkpoint` refuses a `.ckpt` larger than `os.sysconf('SC_AVPHYS_PAGES')` "
    "× page size, i.e. MemFree, which leaves out the reclaimable page cache: with the checkpoint files "
    "in the page cache (any machine that has just read them) it fails with `_CheckpointProtobufSizeError: "
    "... the checkpoint protobuf content size 256362913 bytes exceeds current available memory 224165888 "
    "bytes` although ~20 GiB were available (this happened here to `transform_checkpoints` and "
    "`ckpt_to_safetensors` on 256 MB rank files). The benchmark's MindSpore contenders give that check "
    "MemAvailable instead (`mindspore.train.serialization._get_available_memory` replaced), so they can be "
    "measured; nothing else in MindSpore is changed.")


def patched_mindspore() -> Any:
    """``mindspore``, with ``load_checkpoint``'s memory pre-check using MemAvailable (see MEMORY_CHECK_NOTE)."""
    import mindspore
    from mindspore.train import serialization

    if not getattr(serialization, "_bench_memavailable", False):
        serialization._get_available_memory = _mem_available
        serialization._bench_memavailable = True
    return mindspore


def _mem_available() -> int | None:
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


_MS_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "float64": "float64",
              "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8", "bool": "bool_"}


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def target_net(names_file: str) -> Any:
    """A Cell whose Parameters have exactly the target rank's names, local shapes and dtypes, zero-filled.

    The memory of every Parameter exists and is touched (written with zeros), like a model that
    was built and initialised before its checkpoint is loaded. ``Parameter.name`` is the
    checkpoint's name (dots included), as ckptstore and MindSpore match by it; the Parameters are
    held in a ``ParameterTuple``, which keeps their names. Each is created empty on the ``meta``
    device and given a zero-filled numpy buffer (``Parameter(Tensor(bfloat16 numpy))`` and
    ``initializer`` for bfloat16 fail under numpy 2 with MindSpore 2.10; ``initializer('zeros')``
    alone would leave untouched ``calloc`` pages).
    """
    import mindspore as ms
    from mindspore.common.initializer import Zero

    params = []
    for name, shape, dtype, _ in _names(names_file):
        array = np.empty(shape, _np_dtype(dtype))
        array.reshape(-1).view(np.uint8).fill(0)  # touch every page
        ms_dtype = getattr(ms, _MS_DTYPES[dtype])
        p = ms.Parameter(ms.Tensor(shape=tuple(shape), dtype=ms_dtype, init=Zero(), device="meta"), name=name)
        p.set_data(ms.Tensor.from_numpy(array))
        params.append(p)

    class TargetNet(ms.nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.params = ms.ParameterTuple(params)

    return TargetNet()


def _holder(names_file: str) -> Any:
    """A Cell declaring the target rank's Parameters (shapes of the target layout), unallocated.

    Built under ``no_init_parameters``, so the network costs no memory until the load fills it:
    the memory measured is the load's, as with ckptstore's Parameters.
    """
    import mindspore as ms
    from mindspore.common.initializer import Zero, initializer
    from mindspore.nn.utils import no_init_parameters

    dtypes = {"float32": ms.float32, "float16": ms.float16, "int32": ms.int32, "int64": ms.int64,
              "float64": ms.float64}

    class TargetNet(ms.nn.Cell):
        def __init__(self, rows: Sequence[tuple[str, tuple[int, ...], str, bool]]) -> None:
            super().__init__()
            with no_init_parameters():
                self.params = ms.ParameterTuple([ms.Parameter(initializer(Zero(), shape, dtypes[dtype]), name=name)
                                                 for name, shape, dtype, _ in rows])

    return TargetNet(_names(names_file))


def predict_layout(strategy: str) -> dict[str, list[Any]]:
    """The target layout as ``model.infer_predict_layout`` returns it, from the target strategy file.

    ``[dev_matrix, tensor_map, param_split_shape, field_size, uniform_split, opt_shard_group]``
    per parameter (no optimizer sharding in the targets: the group is empty).
    """
    from mindspore.parallel import build_searched_strategy

    out = {}
    for name, lay in build_searched_strategy(strategy).items():
        out[name] = [list(lay.dev_matrix[0].dim), list(lay.tensor_map[0].dim), list(lay.param_split_shape[0].dim),
                     int(lay.field), 1, ""]
    return out


def setup_ms_load_distributed(rank_files: Sequence[str], src_strategy: str, dst_strategy: str, names_file: str,
                              parallel_context: Sequence[int] | None = None) -> dict[str, Any]:
    """Unmeasured: the parallel context, the Cell (:func:`_holder`) and the target layout
    (:func:`predict_layout`) for :func:`ms_load_distributed`.

    The rank is ``get_rank()``: without ``init()`` MindSpore returns the ``RANK_ID`` environment
    variable (0 if unset), which the harness sets per contender. But the choice of source slices
    (``_infer_rank_list``) asks ``_get_global_rank()``, which is 0 in stand-alone mode whatever
    ``RANK_ID`` says; ``parallel_context=(device_num, rank)`` sets the parallel context a real
    job has (``semi_auto_parallel``, ``global_rank``) so that every rank gets its own slices.
    """
    ms = patched_mindspore()
    if parallel_context:
        device_num, rank = parallel_context
        ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=int(device_num),
                                     global_rank=int(rank))
    return {"net": _holder(names_file), "rank_files": list(rank_files), "layout": predict_layout(dst_strategy),
            "src_strategy": src_strategy}


def ms_load_distributed(state: Mapping[str, Any]) -> Any:
    """``mindspore.load_distributed_checkpoint(net, all rank files, predict_layout, train_strategy)``
    (the Cell and layout from :func:`setup_ms_load_distributed`)."""
    import mindspore as ms

    ms.load_distributed_checkpoint(state["net"], state["rank_files"], state["layout"],
                                   train_strategy_filename=state["src_strategy"])
    return state["net"]


def setup_ms_load_distributed_safetensors(unified_dir: str, dst_strategy: str, names_file: str) -> dict[str, Any]:
    """Unmeasured: the Cell (:func:`_holder`) for :func:`ms_load_distributed_safetensors`."""
    patched_mindspore()
    return {"net": _holder(names_file), "unified_dir": unified_dir, "dst_strategy": dst_strategy}


def ms_load_distributed_safetensors(state: Mapping[str, Any]) -> Any:
    """``mindspore.load_distributed_checkpoint(net, format="safetensors", unified_safetensors_dir=...)``.

    Reads the global tensors written by ``unified_safetensors`` and cuts this rank's slices
    (``predict_strategy`` = the target strategy file; rank = ``get_rank()``, i.e. ``RANK_ID``).
    """
    import mindspore as ms

    ms.load_distributed_checkpoint(state["net"], predict_strategy=state["dst_strategy"], format="safetensors",
                                   unified_safetensors_dir=state["unified_dir"])
    return state["net"]


def ms_transform_by_rank(rank: int, rank_files: Sequence[str], src_strategy: str, dst_strategy: str, out_dir: str,
                         names_file: str) -> Any:
    """``transform_checkpoint_by_rank`` (only the source files ``rank_list_for_transform`` names)
    into a new ``.ckpt``, then ``load_checkpoint`` of it."""
    ms = patched_mindspore()
    needed = ms.rank_list_for_transform(rank, src_strategy, dst_strategy)
    out = os.path.join(out_dir, f"rank{rank}_{os.getpid()}.ckpt")
    ms.transform_checkpoint_by_rank(rank, {r: rank_files[r] for r in needed}, out, src_strategy, dst_strategy)
    params = ms.load_checkpoint(out)
    params["__file__"] = out  # removed by the check, which also deletes the file
    return params


def ms_load_needed_files(rank: int, rank_files: Sequence[str], src_strategy: str, dst_strategy: str,
                         names_file: str) -> list[Any]:
    """``load_checkpoint`` of every source file ``rank_list_for_transform`` says rank ``rank`` needs.

    Only the reading MindSpore does before any resharding: no slice of the target is produced.
    """
    ms = patched_mindspore()
    needed = ms.rank_list_for_transform(rank, src_strategy, dst_strategy)
    return [ms.load_checkpoint(rank_files[r]) for r in sorted(needed)]


# ---------------------------------------------------------------------------------------------
# checks: digests of what was loaded (run after the measurement)


def _digest(arrays: Iterable[tuple[str, np.ndarray]], names_file: str) -> dict[str, Any]:
    import crc32c

    wanted = {n: shape for n, shape, _, in_strategy in _names(names_file) if in_strategy}
    got = {n: a for n, a in arrays if n in wanted}
    h, nbytes, bad = 0, 0, []
    for name in sorted(wanted):
        a = got.get(name)
        if a is None or tuple(a.shape) != wanted[name]:
            bad.append(name)
            continue
        a = np.ascontiguousarray(a)
        h = crc32c.crc32c(name.encode() + repr(tuple(a.shape)).encode(), h)
        h = crc32c.crc32c(memoryview(a.reshape(-1).view(np.uint8)), h)
        nbytes += a.nbytes
    return {"tensors": len(wanted) - len(bad), "missing_or_misshapen": len(bad), "bytes": nbytes,
            "digest": f"{h:08x}"}


def _numpy(value: Any) -> np.ndarray:
    return value if isinstance(value, np.ndarray) else value.asnumpy()


def check_params(out: Mapping[str, Any], **args: Any) -> dict[str, Any]:
    """Digest of a name -> Parameter/array mapping (the ckptstore routes)."""
    return _digest(((n, _numpy(v)) for n, v in out.items() if not isinstance(v, str)), args["names_file"])


def check_ckptstore(out: Mapping[str, Any], **args: Any) -> dict[str, Any]:
    """Digest, plus what ckptstore says its loads in this process read (:func:`io_fields`)."""
    out_check = check_params(out, **args)
    out_check.update(io_fields())
    return out_check


def io_fields() -> dict[str, Any]:
    """``ckptstore.io_counts()`` of this worker (whose only load is the measured call): ``requests``
    (read calls) and ``bytes_fetched``, which ``rchar`` misses where bytes come from memory maps."""
    import ckptstore

    if not hasattr(ckptstore, "io_counts"):  # a revision before eb090ba: not recorded
        return {}
    counts = ckptstore.io_counts()
    return {"requests": counts.requests, "bytes_fetched": counts.bytes_fetched}


def _param_numpy(p: Any) -> np.ndarray:
    """A Parameter's values as numpy; bfloat16 (which ``asnumpy`` refuses under numpy 2) through an
    exact float32 cast."""
    import mindspore as ms

    if p.dtype == ms.bfloat16:
        import ml_dtypes

        return p.astype(ms.float32).asnumpy().astype(ml_dtypes.bfloat16)
    return p.asnumpy()


def check_net(out: Any, **args: Any) -> dict[str, Any]:
    """Digest of a Cell's Parameters (the ``load_distributed_checkpoint`` routes)."""
    return _digest(((p.name, _param_numpy(p)) for _, p in out.parameters_and_names() if not p.has_init),
                   args["names_file"])


def check_into_net(out: Mapping[str, Any], **args: Any) -> dict[str, Any]:
    """:func:`check_net` of the filled Cell, what ``load_into_net`` did not load (both lists should
    be empty: the Cell declares exactly the rank's names) and :func:`io_fields`."""
    result = check_net(out["net"], **args)
    result["param_not_load"] = len(out["param_not_load"])
    result["ckpt_not_load"] = len(out["ckpt_not_load"])
    if out["param_not_load"] or out["ckpt_not_load"]:
        result["not_loaded_names"] = ", ".join([*out["param_not_load"], *out["ckpt_not_load"]][:5])
    result.update(io_fields())
    return result


def check_transformed(out: dict[str, Any], **args: Any) -> dict[str, Any]:
    """Digest of the loaded transformed file, then delete that file."""
    path = out.pop("__file__")
    try:
        return check_params(out, **args)
    finally:
        os.chmod(path, 0o600)
        os.remove(path)


def check_flat(out: np.ndarray, **args: Any) -> dict[str, Any]:
    """Digest of the flat buffer cut into the rank's tensors (the file is in names-file order)."""
    arrays, at = [], 0
    for name, shape, dtype, _ in _names(args["names_file"]):
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        arrays.append((name, out[at:at + n].view(dt).reshape(shape)))
        at += n
    return _digest(arrays, args["names_file"])


def check_files(out: list[Any], **args: Any) -> dict[str, Any]:
    """What the source files held: Parameters and bytes (not the rank's tensors: no digest)."""
    return {"tensors": sum(len(d) for d in out),
            "bytes": int(sum(p.nbytes for d in out for p in d.values() if hasattr(p, "nbytes"))),
            "files": len(out)}


# ---------------------------------------------------------------------------------------------
# conversion (every call ends with os.sync(): ckptstore fsyncs its files, so all pay for durability)


def _tree_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def metadata_bytes(store: str) -> int:
    """Bytes of a ckptstore store's metadata: its JSON files (the root ``zarr.json`` with the
    manifest and one ``zarr.json`` per array; an index's ``ckptstore.json``, which is all of it)."""
    total = 0
    for root, _, files in os.walk(store):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files if f.endswith(".json"))
    return total


def ckptstore_convert(src_dir: str, strategy: str, out: str, workers: int = 4) -> dict[str, Any]:
    """``ckptstore.convert`` (what ``ckptstore convert SRC --strategy S --out STORE`` runs)."""
    import ckptstore

    summary = ckptstore.convert(src_dir, out, strategy=[strategy], workers=workers)
    os.sync()
    return {"output_bytes": _tree_bytes(out), "metadata_bytes": metadata_bytes(out), "chunks": summary.chunks}


def ckptstore_index(src_dir: str, strategy: str, out: str, checksum: bool = False, workers: int = 4) -> dict[str, Any]:
    """``ckptstore.index`` (what ``ckptstore index SRC -s S --out STORE [--checksum]`` runs): a store
    that copies no payload, only a manifest of byte ranges in the rank files."""
    import ckptstore

    summary = ckptstore.index(src_dir, out, strategy=[strategy], checksum=checksum, workers=workers)
    os.sync()
    return {"output_bytes": _tree_bytes(out), "metadata_bytes": metadata_bytes(out), "chunks": summary.chunks}


def ckptstore_open(store: str) -> Any:
    """``ckptstore.open(store)``: read, parse and validate the manifest (an index also stats its rank files)."""
    import ckptstore

    return ckptstore.open(store)


def setup_open_store(store: str, strategy: str, rank: int) -> dict[str, Any]:
    """Unmeasured: the store opened, for :func:`ckptstore_plan_rank`."""
    import ckptstore

    return {"store": ckptstore.open(store), "strategy": strategy, "rank": rank}


def ckptstore_plan_rank(state: Mapping[str, Any]) -> dict[str, Any]:
    """``ckptstore.plan_rank(store, strategy, rank)``: what ``load_rank`` works out before it reads a
    byte (the target strategy file read, every parameter's reads planned)."""
    import ckptstore

    plan = ckptstore.plan_rank(state["store"], state["strategy"], state["rank"])
    return {"rank_bytes": int(plan.nbytes), "params": plan.params, "requests": plan.requests, "files": plan.files}


def cp_r(src_dir: str, out: str) -> dict[str, Any]:
    """``cp -r`` of the rank files (and the strategy): the cost of touching every byte once."""
    import subprocess

    subprocess.run(["cp", "-r", src_dir, out], check=True)
    os.sync()
    return {"output_bytes": _tree_bytes(out)}


def ms_transform_checkpoints(src_dir: str, strategy: str, dst_strategy: str, out: str) -> dict[str, Any]:
    """``mindspore.transform_checkpoints``: every target rank's ``.ckpt`` file."""
    ms = patched_mindspore()
    ms.transform_checkpoints(src_dir, out, "checkpoint_", strategy, dst_strategy)
    os.sync()
    return {"output_bytes": _tree_bytes(out)}


def ms_ckpt_to_unified(src_dir: str, strategy: str, out: str) -> dict[str, Any]:
    """``mindspore.ckpt_to_safetensors`` of every rank file, then ``unified_safetensors`` of them."""
    import time

    ms = patched_mindspore()
    t0 = time.perf_counter()
    ms.ckpt_to_safetensors(src_dir, os.path.join(out, "ranks"))
    t1 = time.perf_counter()
    ms.parallel.unified_safetensors(os.path.join(out, "ranks"), strategy, os.path.join(out, "unified"))
    t2 = time.perf_counter()
    os.sync()
    return {"output_bytes": _tree_bytes(out), "ckpt_to_safetensors_s": t1 - t0, "unified_safetensors_s": t2 - t1,
            "unified_bytes": _tree_bytes(os.path.join(out, "unified"))}


# ---------------------------------------------------------------------------------------------
# one node of the sparse 130B checkpoint (bench_node --sparse): numpy arrays, no MindSpore


def ckptstore_read_rank_slice(store: str, strategy: str, rank: int, include: Sequence[str], dtype: str,
                              workers: int | None = None) -> dict[str, Any]:
    """``ckptstore.read_rank(store, strategy, rank, include=, dtype=)``: one node loader's slice as
    numpy arrays (the store opened and the rank planned inside the call); ``workers=None`` is
    ckptstore's default. The loader's ``io_counts`` ride along under ``"__io__"`` for the check."""
    import ckptstore

    before = ckptstore.io_counts()
    out: dict[str, Any] = ckptstore.read_rank(store, strategy, rank, include=include, dtype=dtype, workers=workers)
    out["__io__"] = ckptstore.io_counts() - before
    return out


def check_slice(out: dict[str, Any], **args: Any) -> dict[str, Any]:
    """What one loader holds: tensors, their bytes, and what it fetched (``ckptstore.io_counts``)."""
    io = out.pop("__io__")
    arrays = [v for v in out.values() if isinstance(v, np.ndarray)]
    return {"tensors": len(arrays), "bytes": sum(a.nbytes for a in arrays),
            "dtypes": ",".join(sorted({a.dtype.name for a in arrays})), "requests": io.requests,
            "bytes_fetched": io.bytes_fetched, "gets": io.gets}


def ckptstore_plan_ranks(state: Mapping[str, Any]) -> dict[str, Any]:
    """``ckptstore.plan_rank`` of each rank in ``state["ranks"]``, one after the other, each timed
    (the store opened in the setup): ``plan_s_<r>``, ``result_bytes_<r>``, ``requests_<r>``, ..."""
    import time

    import ckptstore

    out: dict[str, Any] = {}
    for r in state["ranks"]:
        t0 = time.perf_counter()
        plan = ckptstore.plan_rank(state["store"], state["strategy"], r, include=state["include"],
                                   dtype=state["dtype"])
        out[f"plan_s_{r}"] = time.perf_counter() - t0
        for key in ("result_bytes", "nbytes", "fetched_bytes", "requests", "files", "params", "scratch_bytes"):
            out[f"{key}_{r}"] = int(getattr(plan, key))
    return out


def setup_open_store_ranks(store: str, strategy: str, ranks: Sequence[int], include: Sequence[str],
                           dtype: str) -> dict[str, Any]:
    """Unmeasured: the store opened, for :func:`ckptstore_plan_ranks`."""
    import ckptstore

    return {"store": ckptstore.open(store), "strategy": strategy, "ranks": list(ranks), "include": include,
            "dtype": dtype}


def ckptstore_rank_memory(store: str, strategy: str, rank: int, include: Any, dtype: str) -> dict[str, Any]:
    """Where one loader's memory goes, through the public API: resident bytes added by
    ``ckptstore.open`` (the manifest), then the peak of ``ckptstore.read_rank`` on that store (plan,
    scratch and slice), against the slice it returns and the scratch ``ckptstore.plan_rank`` announces."""
    import gc

    import ckptstore
    from benchmarks import procfs

    procfs.reset_peak_rss()
    start = procfs.read_status()["VmRSS"]
    st = ckptstore.open(store)
    gc.collect()
    opened = procfs.read_status()["VmRSS"] - start
    plan = ckptstore.plan_rank(st, strategy, rank, include=include, dtype=dtype)
    out = ckptstore.read_rank(st, strategy, rank, include=include, dtype=dtype)
    held = sum(v.nbytes for v in out.values() if isinstance(v, np.ndarray))
    status = procfs.read_status()
    return {"open_rss": opened, "peak_above_start": status["VmHWM"] - start, "held": held,
            "rss_after": status["VmRSS"] - start, "scratch_bytes": plan.scratch_bytes, "requests": plan.requests}
