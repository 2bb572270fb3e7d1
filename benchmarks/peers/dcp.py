"""PyTorch Distributed Checkpoint (``torch.distributed.checkpoint``) as a peer of ckptstore.

**Save** (once, cached next to the synthetic checkpoint): one process per source rank, a real
``gloo`` process group on this machine (``init_method=file://``), each process wrapping the
local tensors of *its own MindSpore rank file* (read with
``benchmarks.fixtures.read_rank_file``, i.e. the
slices MindSpore's own code cut) as DTensors on a CPU ``DeviceMesh`` equivalent to the
MindSpore layout (:mod:`benchmarks.peers.layouts`: ``Shard``/``Replicate`` per tensor-map
entry, optimizer sharding as a second ``Shard(0)`` after the model-parallel one), then one
collective ``dcp.save`` (into a folder with ``FileSystemWriter``, or into a bucket with
``s3torchconnector``'s ``S3StorageWriter``: :func:`save_ranks`). DCP's default planner writes
each replicated shard once. Parameters
absent from the strategy (``global_step``, ``learning_rate``) are plain tensors.

**Load**: one process playing rank ``r`` of the target layout. The unmeasured setup
(:func:`setup_rank`, the worker's ``setup``) reads the target strategy, initialises a *fake*
process group (``torch.testing._internal.distributed.fake_pg``: no communication; it only tells
DTensor which rank it is), builds the meshes and the target DTensors: local shards of the target
placements, the shapes a network for the target would declare, zero-filled with ``torch.zeros``
(memory touched, as an existing model's state dict is). The measured call (:func:`load`) is only
``dcp.load(state, storage_reader=dcp.FileSystemReader(ckpt), no_dist=True)``: DCP reads its
metadata, plans which stored chunks overlap each local shard and copies the overlaps in place.
The check digests each tensor's local shard.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.peers.layouts import MeshLayout, check_boxes, mesh_layout

#: Bump when the saved layout changes, so stale cached DCP checkpoints are not reused.
SAVE_VERSION = 1


def checkpoint_dir(synth_root: Path) -> Path:
    return Path(synth_root) / "peers" / f"dcp-v{SAVE_VERSION}"


def save_checkpoint(synth: Any, *, log: Any = print) -> Path:
    """The DCP checkpoint of ``synth``'s source layout, saved on first use by ``world`` processes."""
    out = checkpoint_dir(synth.root)
    if (out / "DONE").exists():
        return out
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.perf_counter()
    save_ranks(synth, str(tmp))
    (tmp / "DONE").write_text(json.dumps({"seconds": round(time.perf_counter() - t0, 2), "world": synth.src.world}))
    os.replace(tmp, out)
    log(f"saved DCP checkpoint {out} ({_du(out) / 2**20:.1f} MiB) in {time.perf_counter() - t0:.1f} s")
    return out


def save_ranks(synth: Any, out: str, env: Mapping[str, str] | None = None) -> None:
    """One collective ``dcp.save`` of ``synth``'s source layout into ``out`` (a folder, or an
    ``s3://bucket/prefix`` written through ``s3torchconnector``'s ``S3StorageWriter``) by one
    process per source rank; ``env`` is added to their environment (e.g. the ``AWS_*`` variables)."""
    world = synth.src.world
    with tempfile.TemporaryDirectory(prefix="ckptstore_dcp_") as rdv:
        procs = []
        for r in range(world):
            cmd = [sys.executable, "-m", "benchmarks.peers.dcp", "save-rank", "--rank", str(r), "--world",
                   str(world), "--rendezvous", os.path.join(rdv, "store"), "--rank-file", str(synth.rank_file(r)),
                   "--strategy", str(synth.strategy), "--out", out]
            procs.append(subprocess.Popen(cmd, env={**os.environ, **(env or {}), "GLOG_v": "3"},
                                          stderr=subprocess.PIPE))
        errors = [(r, p.communicate()[1], p.returncode) for r, p in enumerate(procs)]
    bad = [(r, e) for r, e, code in errors if code]
    if bad:
        r, err = bad[0]
        raise RuntimeError(f"DCP save failed on rank {r}:\n{err.decode(errors='replace')[-3000:]}")


def storage_writer(out: str) -> Any:
    """DCP's writer for ``out``: ``FileSystemWriter`` for a folder; for ``s3://bucket/prefix``,
    ``s3torchconnector``'s ``S3StorageWriter`` (endpoint and credentials from the ``AWS_*``
    environment, path-style addressing as an S3-compatible endpoint on an IP address needs)."""
    import torch.distributed.checkpoint as dcp

    if not out.startswith("s3://"):
        return dcp.FileSystemWriter(out)
    from s3torchconnector import S3ClientConfig
    from s3torchconnector.dcp import S3StorageWriter

    return S3StorageWriter(os.environ.get("AWS_REGION", "us-east-1"), out,
                           s3client_config=S3ClientConfig(force_path_style=True))


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------
# torch helpers


def _placements(mesh: MeshLayout) -> list[Any]:
    from torch.distributed.tensor import Replicate, Shard

    return [Replicate() if a is None else Shard(a) for a in mesh.shard_axis]


class _Meshes:
    """One ``DeviceMesh`` per distinct rank arrangement (every layout of a model shares a few)."""

    def __init__(self) -> None:
        self._meshes: dict[Any, Any] = {}

    def get(self, mesh: MeshLayout) -> Any:
        import torch
        from torch.distributed.device_mesh import DeviceMesh

        if mesh.key not in self._meshes:
            self._meshes[mesh.key] = DeviceMesh("cpu", torch.from_numpy(np.ascontiguousarray(mesh.ranks)))
        return self._meshes[mesh.key]


def _dtensor(local: Any, dmesh: Any, mesh: MeshLayout, shape: tuple[int, ...], rank: int, name: str) -> Any:
    """Wrap ``local`` as a DTensor of global ``shape``; check DTensor puts it where MindSpore does."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    placements = _placements(mesh)
    lshape, offset = compute_local_shape_and_global_offset(shape, dmesh, placements)
    want = mesh.box(rank, shape)
    if tuple(offset) != want.start or tuple(lshape) != want.shape or tuple(local.shape) != want.shape:
        raise AssertionError(f"{name}: DTensor places rank {rank}'s shard at {tuple(offset)} {tuple(lshape)}, "
                             f"MindSpore at {want}; local tensor {tuple(local.shape)}")
    stride = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape)))
    return DTensor.from_local(local, dmesh, placements, run_check=False, shape=shape, stride=stride)


def _torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
            "float64": torch.float64, "int32": torch.int32, "int64": torch.int64}[name]


def _from_numpy(array: np.ndarray) -> Any:
    import torch

    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def to_numpy(tensor: Any) -> np.ndarray:
    """A numpy view of a (local) torch tensor; bfloat16 as ``ml_dtypes.bfloat16``."""
    import torch

    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


# ---------------------------------------------------------------------------------------------
# save: one process per source rank


def rank_state(rank: int, rank_file: str, strategy: str, *, in_memory: bool = False) -> dict[str, Any]:
    """The state dict DCP saves for source rank ``rank``: the tensors of its MindSpore rank file as
    DTensors of the source layout (plain tensors for names absent from the strategy). Needs the
    process group initialised (the meshes are built collectively, in the same order on every
    rank). ``in_memory`` reads every tensor into its own memory, as a training job holds its
    weights; otherwise single-piece tensors are private copy-on-write maps of the file."""
    from benchmarks.fixtures import load_layouts, read_rank_file

    src = load_layouts(strategy)
    layouts = {n: mesh_layout(st[0]) for n, st in src.layouts.items()}
    meshes = _Meshes()
    for key in sorted({m.key for m in layouts.values()}):  # same order on every rank: collective
        meshes.get(next(m for m in layouts.values() if m.key == key))
    state: dict[str, Any] = {}
    for name, array in read_rank_file(rank_file, in_memory=in_memory).items():  # no read up front unless in_memory
        local = _from_numpy(np.asarray(array))
        if name in layouts:
            layout = src.layouts[name][0]
            shape = layout.global_shape(array.shape)
            check_boxes(name, layout, layouts[name], shape)
            state[name] = _dtensor(local, meshes.get(layouts[name]), layouts[name], shape, rank, name)
        else:
            state[name] = local
    return state


def _save_rank(rank: int, world: int, rendezvous: str, rank_file: str, strategy: str, out: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    state = rank_state(rank, rank_file, strategy)
    dcp.save(state, storage_writer=storage_writer(out))
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# load: the measured call


def _names(names_file: str) -> list[tuple[str, tuple[int, ...], str, bool]]:
    with open(names_file, encoding="utf-8") as f:
        return [(n, tuple(s), d, bool(k)) for n, s, d, k in json.load(f)]


def setup_rank(ckpt: str, strategy: str, rank: int, names_file: str) -> dict[str, Any]:
    """Unmeasured: the state dict of target rank ``rank`` (target layout = ``strategy``) that
    :func:`load` fills, after the fake process group is initialised.

    ``names_file`` lists the target rank's tensors (name, local shape, dtype, in strategy), as a
    network built for the target would declare them; each local shard is ``torch.zeros`` (its
    memory touched, like an existing model's). Returns ``{"ckpt", "state"}``.
    """
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from benchmarks.fixtures import load_layouts

    target = load_layouts(strategy)
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=target.world_size)
    meshes = _Meshes()
    state: dict[str, Any] = {}
    for name, lshape, dtype, in_strategy in _names(names_file):
        local = torch.zeros(lshape, dtype=_torch_dtype(dtype))
        if in_strategy:
            layout = target.layouts[name][0]
            mesh = mesh_layout(layout)
            shape = layout.global_shape(lshape)
            state[name] = _dtensor(local, meshes.get(mesh), mesh, shape, rank, name)
        else:
            state[name] = local
    return {"ckpt": ckpt, "state": state}


def load(prepared: Mapping[str, Any]) -> dict[str, Any]:
    """The measured call: ``dcp.load(state, storage_reader=dcp.FileSystemReader(ckpt), no_dist=True)``
    into the state dict :func:`setup_rank` built; returns that state dict (DTensors, filled)."""
    import torch.distributed.checkpoint as dcp

    state = prepared["state"]
    dcp.load(state, storage_reader=dcp.FileSystemReader(prepared["ckpt"]), no_dist=True)
    return state


def load_s3(prepared: Mapping[str, Any]) -> dict[str, Any]:
    """The measured call from object storage: ``dcp.load(state, storage_reader=S3StorageReader(region,
    url, s3client_config=S3ClientConfig(force_path_style=True)), no_dist=True)`` into the state dict
    :func:`setup_rank` built (``ckpt`` = the ``s3://`` URL). ``s3torchconnector``'s defaults
    otherwise: its DCP-optimised reader (items sorted by offset, neighbouring ranges of an object
    coalesced), its CRT client (8 MiB parts fetched concurrently, 10 Gb/s throughput target); the
    endpoint and credentials come from the ``AWS_*`` environment, as for ckptstore."""
    import torch.distributed.checkpoint as dcp
    from s3torchconnector import S3ClientConfig
    from s3torchconnector.dcp import S3StorageReader

    state = prepared["state"]
    reader = S3StorageReader(os.environ.get("AWS_REGION", "us-east-1"), prepared["ckpt"],
                             s3client_config=S3ClientConfig(force_path_style=True))
    dcp.load(state, storage_reader=reader, no_dist=True)
    return state


def load_rank(ckpt: str, strategy: str, rank: int, names_file: str) -> dict[str, Any]:
    """:func:`setup_rank` then :func:`load` in one call (for use outside the benchmark worker)."""
    return load(setup_rank(ckpt, strategy, rank, names_file))


def local_shards(state: Mapping[str, Any]) -> dict[str, Any]:
    """Each tensor's local shard (``DTensor.to_local()``; plain tensors as they are)."""
    return {n: (t.to_local() if hasattr(t, "to_local") else t) for n, t in state.items()}


def check(out: Mapping[str, Any], **args: Any) -> dict[str, Any]:
    """Digest of the loaded local shards, comparable with :mod:`benchmarks.contenders`' checks."""
    from benchmarks.contenders import check_params

    return check_params({n: to_numpy(t) for n, t in local_shards(out).items()}, **args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers.dcp")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save-rank", help="internal: save one source rank's shards (run by save_checkpoint)")
    s.add_argument("--rank", type=int, required=True)
    s.add_argument("--world", type=int, required=True)
    s.add_argument("--rendezvous", required=True)
    s.add_argument("--rank-file", required=True)
    s.add_argument("--strategy", required=True)
    s.add_argument("--out", required=True)
    a = p.parse_args(argv)
    _save_rank(a.rank, a.world, a.rendezvous, a.rank_file, a.strategy, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
