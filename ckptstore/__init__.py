"""ckptstore: bounded-memory resharding of MindSpore distributed checkpoints.

The public API is what a user calls::

    ckptstore.convert(src, out, strategy=[...])      # rank files + strategy -> a store
    ckptstore.index(src, out, strategy=[...])        # a store that points into the rank files
    ckptstore.commit(store)                          # complete a store whose parts have all finished
    store = ckptstore.open(path)                      # a store: names, info, read, plan
    ckptstore.plan_rank(store, strategy, rank)        # what a rank will read, before it reads
    ckptstore.read_rank(store, strategy, rank)        # numpy arrays of one target rank (no MindSpore)
    ckptstore.load_rank(store, strategy, rank)        # mindspore.Parameters of one target rank
    ckptstore.load_into_net(net, store, strategy)     # straight into a network
    ckptstore.export(store, out, strategy=...)        # per-rank .ckpt / .safetensors files
    ckptstore.verify(store)                           # checksums (and the source, with against=)
    ckptstore.save_rank(params, root, step=N, strategy=...)   # every rank of a training job saves its slices
    ckptstore.StoreCheckpoint(root, save_checkpoint_steps=N)  # the same from a MindSpore callback

Every function that takes a store takes a path, an ``s3://``/``obs://`` URL or a :class:`Store`;
``rank=None`` (the default) means this process's rank (``mindspore.communication`` when
initialised, else ``RANK_ID``). Errors are :class:`CkptStoreError` (subclasses in
:mod:`ckptstore.errors`). Everything else stays importable from its module. ``import ckptstore``
imports neither MindSpore nor zarr-python: functions that need them import them on first use.
"""
from __future__ import annotations

from typing import Any

from ckptstore.errors import CkptStoreError
from ckptstore.read.export import export
from ckptstore.read.loader import read_rank
from ckptstore.read.rank_plan import plan_rank
from ckptstore.read.verify import verify
from ckptstore.store.store import Store, open
from ckptstore.write.convert import commit_store as commit
from ckptstore.write.convert import convert, index
from ckptstore.write.save import save_rank
from ckptstore.version import __version__

_ADAPTER = ("load_rank", "load_into_net", "StoreCheckpoint")


def __getattr__(name: str) -> Any:
    # The MindSpore adapter is imported on first use, so `import ckptstore` stays light.
    if name in _ADAPTER:
        from ckptstore import mindspore as mindspore_adapter

        return getattr(mindspore_adapter, name)
    raise AttributeError(f"module 'ckptstore' has no attribute {name!r}")


__all__ = ["CkptStoreError", "Store", "StoreCheckpoint", "__version__", "commit", "convert", "export", "index",
           "load_into_net", "load_rank", "open", "plan_rank", "read_rank", "save_rank", "verify"]
