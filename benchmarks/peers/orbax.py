"""Orbax (``orbax-checkpoint`` over TensorStore) as a peer of ckptstore.

**Save** (once, cached next to the synthetic checkpoint): one process with ``world`` virtual
CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=<world>``). Each parameter
becomes a global ``jax.Array`` whose shard on device ``r`` is the local tensor of MindSpore
rank file ``r`` (read with ``benchmarks.fixtures.read_rank_file``), with a
``NamedSharding`` equivalent to
the MindSpore layout (:mod:`benchmarks.peers.layouts`; checked against ``Layout.box`` for every
device). ``ocp.StandardCheckpointer().save`` writes it with Orbax's defaults (OCDBT + Zarr via
TensorStore; replicated shards written once).

**Load** (the measured call, :func:`load_rank`): the restore of rank ``r`` of the target
layout *as one process of a multi-host JAX job*. The worker joins a ``jax.distributed`` job of
``target world`` CPU processes before the measured call (:mod:`benchmarks.peers.jaxdist`; the
other processes are idle helpers), so the target mesh has one device per process and Orbax reads
only the shards addressable by this process — rank ``r``'s slices, the same bytes ckptstore and
DCP load. The unmeasured setup (:func:`setup_rank`) builds the abstract tree: a
``jax.ShapeDtypeStruct`` (global shape, dtype, target ``NamedSharding`` over the job's devices)
per tensor, what a model built for the target would give Orbax. Measured (:func:`restore`):
``with StandardCheckpointer(multiprocessing_options=...) as c: c.restore(path, abstract_tree)``,
i.e. creating (and closing) the checkpointer, reading Orbax's metadata, planning, TensorStore
reads and building the ``jax.Array`` s (whose one addressable shard each is rank ``r``'s slice).
Orbax cannot restore into existing buffers: the arrays it returns are new (their allocation is
in the timed span, as with ``ckptstore.load_rank``). ``active_processes={r}`` keeps Orbax from
waiting at barriers for the helpers, which do not restore anything.

:func:`load_all_ranks` is the single-process variant (all ``target world`` devices virtual in
one process): the restore then reads every rank's shards; reported separately, for reference.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.peers.layouts import MeshLayout, check_boxes, mesh_layout

SAVE_VERSION = 1


def checkpoint_dir(synth_root: Path) -> Path:
    return Path(synth_root) / "peers" / f"orbax-v{SAVE_VERSION}"


def device_env(count: int) -> dict[str, str]:
    """Environment of a process with ``count`` virtual CPU devices."""
    return {"XLA_FLAGS": f"--xla_force_host_platform_device_count={count}", "JAX_PLATFORMS": "cpu"}


def save_checkpoint(synth: Any, *, log: Any = print) -> Path:
    """The Orbax checkpoint of ``synth``'s source layout, saved on first use (one subprocess)."""
    out = checkpoint_dir(synth.root)
    if (out / "DONE").exists():
        return out
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    world = synth.src.world
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "benchmarks.peers.orbax", "save", "--strategy", str(synth.strategy),
           "--out", str(tmp / "ckpt"), *[str(p) for p in synth.rank_files]]
    proc = subprocess.run(cmd, env={**os.environ, **device_env(world), "GLOG_v": "3"}, capture_output=True,
                          text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"Orbax save failed:\n{proc.stderr[-3000:]}")
    (tmp / "DONE").write_text(json.dumps({"seconds": round(time.perf_counter() - t0, 2), "world": world}))
    os.replace(tmp, out)
    log(f"saved Orbax checkpoint {out} ({_du(out) / 2**20:.1f} MiB) in {time.perf_counter() - t0:.1f} s")
    return out


def restore_path(synth_root: Path) -> Path:
    return checkpoint_dir(synth_root) / "ckpt"


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------
# jax helpers


def _sharding(mesh: MeshLayout, devices: Sequence[Any], ndim: int) -> Any:
    """``NamedSharding`` of ``mesh`` with ``devices[r]`` standing for rank ``r``."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    names = tuple(f"d{i}" for i in range(len(mesh.mesh_shape)))
    grid = np.empty(mesh.mesh_shape, dtype=object)
    for idx, r in np.ndenumerate(mesh.ranks):
        grid[idx] = devices[int(r)]
    return NamedSharding(Mesh(grid, names), PartitionSpec(*mesh.partition_spec(ndim, names)))


def _replicated(world: int) -> MeshLayout:
    return MeshLayout(np.arange(world), (None,))


def _index_box(index: tuple[slice, ...], shape: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    spans = [s.indices(n)[:2] for s, n in zip(index, shape, strict=False)]
    return tuple(lo for lo, _ in spans), tuple(hi for _, hi in spans)


def _save(strategy: str, out: str, rank_files: Sequence[str]) -> None:
    import jax
    import orbax.checkpoint as ocp

    from benchmarks.fixtures import load_layouts, read_rank_file

    world = len(rank_files)
    devices = sorted(jax.devices(), key=lambda d: d.id)
    if len(devices) != world:
        raise RuntimeError(f"{len(devices)} jax devices, need {world} (set XLA_FLAGS)")
    src = load_layouts(strategy)
    files = [read_rank_file(p, in_memory=False) for p in rank_files]  # maps of the files: read when put
    state: dict[str, Any] = {}
    for name, local in files[0].items():
        if name in src.layouts:
            layout = src.layouts[name][0]
            mesh, shape = mesh_layout(layout), layout.global_shape(local.shape)
            check_boxes(name, layout, mesh, shape)
        else:
            mesh, shape = _replicated(world), tuple(local.shape)
        sharding = _sharding(mesh, devices, len(shape))
        shards = []
        for dev, index in sharding.addressable_devices_indices_map(shape).items():
            r = devices.index(dev)
            want = mesh.box(r, shape)
            if _index_box(index, shape) != (want.start, want.stop):
                raise AssertionError(f"{name}: jax puts {index} on device {r}, MindSpore rank {r} holds {want}")
            shards.append(jax.device_put(np.array(files[r][name]), dev))
        state[name] = jax.make_array_from_single_device_arrays(shape, sharding, shards)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(os.path.abspath(out), state)
    ckptr.wait_until_finished()


# ---------------------------------------------------------------------------------------------
# load: the measured call


def _names(names_file: str) -> list[tuple[str, tuple[int, ...], str, bool]]:
    with open(names_file, encoding="utf-8") as f:
        return [(n, tuple(s), d, bool(k)) for n, s, d, k in json.load(f)]


def _abstract_tree(strategy: str, names_file: str, devices: Sequence[Any]) -> dict[str, Any]:
    import jax

    from benchmarks.fixtures import load_layouts

    target = load_layouts(strategy)
    tree = {}
    for name, lshape, dtype, in_strategy in _names(names_file):
        if in_strategy:
            layout = target.layouts[name][0]
            mesh, shape = mesh_layout(layout), layout.global_shape(lshape)
        else:
            mesh, shape = _replicated(target.world_size), tuple(lshape)
        tree[name] = jax.ShapeDtypeStruct(shape, np.dtype(dtype), sharding=_sharding(mesh, devices, len(shape)))
    return tree


def setup_rank(ckpt: str, strategy: str, rank: int, names_file: str) -> dict[str, Any]:
    """Unmeasured: the abstract tree of target rank ``rank``, as process ``rank`` of a
    ``jax.distributed`` job, for :func:`restore`.

    Needs the worker to have joined the job first (``preimport`` of :mod:`benchmarks.peers.jaxdist`
    with ``CKPTSTORE_JAX_DIST``); see the module docstring.
    """
    import jax

    if jax.process_count() == 1:
        raise RuntimeError("load_rank needs a jax.distributed job (preimport benchmarks.peers.jaxdist with "
                           "CKPTSTORE_JAX_DIST set); use load_all_ranks for one process")
    devices = sorted(jax.devices(), key=lambda d: d.process_index)
    return {"ckpt": ckpt, "tree": _abstract_tree(strategy, names_file, devices), "rank": rank}


def setup_all_ranks(ckpt: str, strategy: str, rank: int, names_file: str) -> dict[str, Any]:
    """Unmeasured: the abstract tree of the whole target layout in one process (``target world``
    virtual devices), for :func:`restore`."""
    import jax

    devices = sorted(jax.devices(), key=lambda d: d.id)
    return {"ckpt": ckpt, "tree": _abstract_tree(strategy, names_file, devices), "rank": None}


def restore(prepared: Mapping[str, Any]) -> dict[str, Any]:
    """The measured call: ``StandardCheckpointer(...).restore(ckpt, abstract tree)`` (checkpointer
    created and closed inside). Returns name -> ``jax.Array``."""
    import orbax.checkpoint as ocp

    rank = prepared["rank"]
    kw = {} if rank is None else {
        "multiprocessing_options": ocp.options.MultiprocessingOptions(primary_host=rank, active_processes={rank})}
    with ocp.StandardCheckpointer(**kw) as ckptr:
        return dict(ckptr.restore(prepared["ckpt"], prepared["tree"]))


def load_rank(ckpt: str, strategy: str, rank: int, names_file: str) -> dict[str, Any]:
    """:func:`setup_rank` then :func:`restore` in one call (for use outside the benchmark worker)."""
    return restore(setup_rank(ckpt, strategy, rank, names_file))


def load_all_ranks(ckpt: str, strategy: str, rank: int, names_file: str) -> dict[str, Any]:
    """Orbax restore of the whole target layout in one process (``target world`` virtual devices)."""
    return restore(setup_all_ranks(ckpt, strategy, rank, names_file))


def local_shards(out: Mapping[str, Any], rank: int) -> dict[str, np.ndarray]:
    """Rank ``rank``'s shard of each restored array, as numpy (the device whose index is ``rank``)."""
    import jax

    multi = jax.process_count() > 1
    devices = sorted(jax.devices(), key=(lambda d: d.process_index) if multi else (lambda d: d.id))
    mine = devices[rank]
    result = {}
    for name, arr in out.items():
        shard = next(s for s in arr.addressable_shards if s.device == mine)
        result[name] = np.asarray(shard.data)
    return result


def check(out: Mapping[str, Any], **args: Any) -> dict[str, Any]:
    """Digest of rank ``rank``'s shards, comparable with :mod:`benchmarks.contenders`' checks."""
    from benchmarks.contenders import check_params

    return check_params(local_shards(out, args["rank"]), **args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers.orbax")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save", help="internal: save the source layout (run by save_checkpoint)")
    s.add_argument("--strategy", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("rank_files", nargs="+")
    a = p.parse_args(argv)
    _save(a.strategy, a.out, a.rank_files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
