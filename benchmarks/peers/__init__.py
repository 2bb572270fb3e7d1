"""Peers: what a MindSpore user could pick instead of ckptstore, on the same tensors and reshard.

* :mod:`.dcp` — PyTorch Distributed Checkpoint: the source layout saved as DTensors by one
  ``gloo`` process per source rank; target rank ``r`` loaded in one process (fake process
  group, ``no_dist=True``). Setup (untimed): process group, meshes, zero-filled target
  DTensors; timed: ``dcp.load`` alone.
* :mod:`.orbax` — Orbax/TensorStore: the source layout saved over virtual CPU devices; target
  rank ``r`` restored as one process of a ``jax.distributed`` CPU job (:mod:`.jaxdist`).
  Setup (untimed): the abstract tree with target shardings; timed: the checkpointer's restore.
* :mod:`.layouts` — MindSpore layouts as DTensor placements / jax ``PartitionSpec`` s, checked
  box for box against ckptstore's (and so MindSpore's) slicing.
* :mod:`.expected` — the values each rank must get, from the seeded generator and MindSpore's
  slicing code (no ckptstore math), as a digest every contender's check is compared with.

Importing this package is cheap (no torch, no jax): :mod:`benchmarks.registry` imports it to
collect :func:`peer_contenders` for ``bench_load``. ``python -m benchmarks.peers`` runs
ckptstore, the lower bound and the peers alone (see ``__main__``).
"""
from __future__ import annotations

import importlib.util
import json
from typing import Any

from benchmarks.harness import Contender
from benchmarks.registry import register

DCP = "torch DCP dcp.load (1 process, fake PG)"
DCP_1T = "torch DCP dcp.load, 1 torch thread (OMP_NUM_THREADS=1)"
ORBAX = "orbax restore (1 process of a jax.distributed job)"
ORBAX_ALL = "orbax restore (all target ranks, 1 process)"

#: One line per peer contender: the span its wall time covers (setup = before, not timed).
TIMED_SPANS = {
    DCP: "`dcp.load(state, storage_reader=dcp.FileSystemReader(dir), no_dist=True)` alone (metadata, planning, "
         "copies into the shards); setup: the target strategy, `init_process_group('fake')`, the meshes and the "
         "target DTensors with `torch.zeros` local shards (memory touched)",
    DCP_1T: f"as `{DCP}`, with `OMP_NUM_THREADS=1` (torch's intra-op threads 2 → 1)",
    ORBAX: "`with StandardCheckpointer(active_processes={r}) as c: c.restore(dir, abstract tree)` (checkpointer "
           "made and closed inside; Orbax allocates new `jax.Array`s, it cannot fill existing ones); setup: the "
           "abstract tree (`ShapeDtypeStruct` + target `NamedSharding` per tensor); `jax.distributed` joined "
           "before (imports)",
    ORBAX_ALL: "the same restore in one process with every target rank's device: reads every rank's shards",
}

#: modules imported before the measured call (their import is not what we compare)
DCP_PREIMPORT = ("torch", "torch._dynamo", "torch.distributed.checkpoint", "torch.distributed.tensor",
                 "torch.distributed.device_mesh",
                 "torch.testing._internal.distributed.fake_pg", "ckptstore", "benchmarks.peers.dcp")
JAX_PREIMPORT = ("jax", "orbax.checkpoint", "ckptstore", "benchmarks.peers.orbax")


def missing(*modules: str) -> str | None:
    """Why a peer cannot run here, in one line for its table cell (its packages are not
    installed), or ``None``."""
    gone = [m for m in modules if not _installed(m)]
    if not gone:
        return None
    return f"{', '.join(gone)} not installed (pip install 'ckptstore[bench]')"


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported; a submodule of a package that is not installed
    (``orbax.checkpoint`` without ``orbax``) is not, where ``find_spec`` raises instead of answering."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def dcp_contender(setup: Any, *, one_thread: bool = False, log: Any = print) -> Contender:
    """DCP loading ``setup.rank`` of ``setup.dst`` (the DCP checkpoint is saved first if needed).

    ``one_thread`` runs torch with one intra-op thread: on this 2-core machine shared with other
    processes, torch's default 2 OpenMP threads make ``dcp.load`` 2-4x slower whenever the other
    core is busy (its parallel ``copy_`` waits for a descheduled thread).
    """
    name = DCP_1T if one_thread else DCP
    why = missing("torch")
    if why:
        return Contender(name, "benchmarks.peers.dcp", "load_rank", unavailable=why)
    from benchmarks.peers import dcp

    ckpt = dcp.save_checkpoint(setup.synth, log=log)
    return Contender(name, "benchmarks.peers.dcp", "load",
                     {"ckpt": str(ckpt), "strategy": setup.dst_strategy, "rank": setup.rank,
                      "names_file": setup.names_file}, setup="setup_rank", preimport=DCP_PREIMPORT, check="check",
                     env={"OMP_NUM_THREADS": "1"} if one_thread else {})


def orbax_contenders(setup: Any, *, all_ranks: bool = False, log: Any = print) -> list[Contender]:
    """Orbax restoring ``setup.rank`` as one process of a ``dst.world``-process job (and, with
    ``all_ranks``, the whole target layout in one process, for reference)."""
    why = missing("jax", "orbax.checkpoint")
    if why:
        return [Contender(ORBAX, "benchmarks.peers.orbax", "load_rank", unavailable=why)]
    from benchmarks.peers import orbax

    ckpt = str(orbax.save_checkpoint(setup.synth, log=log) / "ckpt")
    args = {"ckpt": ckpt, "strategy": setup.dst_strategy, "rank": setup.rank, "names_file": setup.names_file}
    dist = json.dumps({"rank": setup.rank, "world": setup.dst.world})
    out = [Contender(ORBAX, "benchmarks.peers.orbax", "restore", args, setup="setup_rank",
                     preimport=(*JAX_PREIMPORT, "benchmarks.peers.jaxdist"),
                     env={"CKPTSTORE_JAX_DIST": dist, "JAX_PLATFORMS": "cpu"}, check="check")]
    if all_ranks:
        out.append(Contender(ORBAX_ALL, "benchmarks.peers.orbax", "restore", args, setup="setup_all_ranks",
                             preimport=JAX_PREIMPORT, env=orbax.device_env(setup.dst.world), check="check", reps=1))
    return out


@register("load")
def peer_contenders(setup: Any) -> list[Contender]:
    """The peers' contenders for a ``bench_load.LoadSetup`` (or anything with its attributes:
    ``synth``, ``dst``, ``rank``, ``dst_strategy``, ``names_file``). Saving each peer's copy of
    the source checkpoint happens here, once per checkpoint (cached under ``synth.root/peers``)."""
    return [dcp_contender(setup), dcp_contender(setup, one_thread=True), *orbax_contenders(setup)]
