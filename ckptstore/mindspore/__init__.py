"""The MindSpore side of ckptstore: the only package that imports MindSpore, and only on first use.

One module per job: :mod:`~ckptstore.mindspore.params` builds Parameters lazily from a store
(:func:`load_rank`), :mod:`~ckptstore.mindspore.load` loads a store into a Cell
(:func:`load_into_net`), :mod:`~ckptstore.mindspore.values` turns Cells and Tensors into the
host values saving writes, :mod:`~ckptstore.mindspore.callback` is the training callback
(:class:`StoreCheckpoint`), :mod:`~ckptstore.mindspore.layouts` reads a compiled Cell's layouts,
and :mod:`~ckptstore.mindspore._import` imports MindSpore itself.
"""
from __future__ import annotations

from typing import Any

from ckptstore.mindspore.layouts import net_strategy
from ckptstore.mindspore.load import load_into_net
from ckptstore.mindspore.params import RankParameters, load_rank, to_parameter

__all__ = ["RankParameters", "StoreCheckpoint", "load_into_net", "load_rank", "net_strategy", "to_parameter"]


def __getattr__(name: str) -> Any:
    if name == "StoreCheckpoint":  # a mindspore.train.Callback: built (importing MindSpore) when first asked for
        from ckptstore.mindspore.callback import store_checkpoint_class

        return store_checkpoint_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
