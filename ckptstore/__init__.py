"""ckptstore: bounded-memory resharding of MindSpore distributed checkpoints.

The public API is what a user calls::

    ckptstore.convert(src, out, strategy=[...])      # rank files + strategy -> a store
    ckptstore.index(src, out, strategy=[...])        # a store that points into the rank files
    ckptstore.commit(store)                          # complete a store whose parts have all finished
    store = ckptstore.open(path)                      # a store: names, info, read, plan
    ckptstore.plan_rank(store, strategy, rank)        # what a rank will read, before it reads
    ckptstore.plan_cooperative(store, strategy, rank)  # what a group loading together fetches
    ckptstore.read_rank(store, strategy, rank)        # numpy arrays of one target rank (no MindSpore)
    ckptstore.load_rank(store, strategy, rank)        # mindspore.Parameters of one target rank
    ckptstore.load_into_net(net, store, strategy)     # straight into a network
    ckptstore.export(store, out, strategy=...)        # per-rank .ckpt / .safetensors files
    ckptstore.verify(store)                           # checksums (and the source, with against=)
    ckptstore.io_counts()                             # requests and bytes this process has read and sent
    ckptstore.save_rank(params, root, step=N, strategy=...)   # every rank of a training job saves its slices
    ckptstore.StoreCheckpoint(root, save_checkpoint_steps=N)  # the same from a MindSpore callback
    ckptstore.StoreSaver(root, keep=K).save(step, net)         # the same from a custom training loop

Every function that takes a store takes a path, an ``s3://``/``obs://`` URL or a :class:`Store`;
``rank=None`` (the default) means this process's rank (``mindspore.communication`` when
initialised, else ``RANK_ID``). Errors are :class:`CkptStoreError` (subclasses in
:mod:`ckptstore.errors`). Everything else stays importable from its module. ``import ckptstore``
imports neither MindSpore nor zarr-python (functions that need them import them on first use),
nor the write side (:mod:`ckptstore.write`: ``convert``, ``index``, ``commit`` and ``save_rank``
are imported on first use), so that opening and reading a store imports no writer.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ckptstore.adapters import set_value_adapter
from ckptstore.counters import IOCounts, io_counts
from ckptstore.errors import CkptStoreError
from ckptstore.read.export import export
from ckptstore.read.loader import read_rank
from ckptstore.read.rank_plan import plan_cooperative, plan_rank
from ckptstore.read.verify import verify
from ckptstore.store.store import Store, open
from ckptstore.version import __version__

if TYPE_CHECKING:
    from ckptstore.mindspore import StoreCheckpoint, load_into_net, load_rank
    from ckptstore.write.convert import commit_store as commit
    from ckptstore.write.convert import convert, index
    from ckptstore.write.save import save_rank
    from ckptstore.write.saver import StoreSaver

#: Public names imported on first use: ``(module, attribute)``.
_ON_FIRST_USE = {
    "load_rank": ("ckptstore.mindspore", "load_rank"),
    "load_into_net": ("ckptstore.mindspore", "load_into_net"),
    "StoreCheckpoint": ("ckptstore.mindspore", "StoreCheckpoint"),
    "convert": ("ckptstore.write.convert", "convert"),
    "index": ("ckptstore.write.convert", "index"),
    "commit": ("ckptstore.write.convert", "commit_store"),
    "save_rank": ("ckptstore.write.save", "save_rank"),
    "StoreSaver": ("ckptstore.write.saver", "StoreSaver"),
}


def _mindspore_values(params: Any) -> Any:
    # the write side's adapter of Cells and Tensors (ckptstore.adapters): MindSpore's side sits
    # above the write side, so the package, above both, connects them; imported on first use
    from ckptstore.mindspore.values import host_values

    return host_values(params)


set_value_adapter(_mindspore_values)


def __getattr__(name: str) -> Any:
    # The MindSpore adapter and the write side are imported on first use, so `import ckptstore`
    # stays light and a process that only reads stores never imports a writer.
    if name in _ON_FIRST_USE:
        module, attr = _ON_FIRST_USE[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'ckptstore' has no attribute {name!r}")


__all__ = ["CkptStoreError", "IOCounts", "Store", "StoreCheckpoint", "StoreSaver", "__version__", "commit", "convert",
           "export", "index", "io_counts", "load_into_net", "load_rank", "open", "plan_cooperative",
           "plan_rank", "read_rank", "save_rank", "verify"]
