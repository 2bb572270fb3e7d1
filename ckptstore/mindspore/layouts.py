"""The layouts of a compiled Cell: ``parameter_layout_dict`` as ckptstore's :class:`Layout`\\ s.

Loading (a network's own target layout) and saving (a Cell's slices) both read it here. No
MindSpore import: the dict is plain lists.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckptstore.checkpoint.layout import Layout
from ckptstore.checkpoint.strategy import Strategy, strategy_from_layouts
from ckptstore.formats.strategy_file import tensor_map_axes
from ckptstore.store.store import Store


def net_strategy(net: Any, store: Store) -> Strategy | None:
    """The layouts of a Cell compiled in (semi-)auto parallel mode, or ``None`` if it has none.

    Reads ``net.parameter_layout_dict`` as MindSpore's parallel compiler fills it: per
    ``Parameter.name``, ``[dev_matrix, tensor_map, slice_shape, field_size, uniform_split,
    opt_shard_group, ...]``. Optimizer sharding shows as a slice with fewer rows than the
    model-parallel split gives; the number of shards is that ratio, taken over the replica
    axes as MindSpore's optimizer does.
    """
    layouts = {name: compiled_layout(lay, store.info(name).shape if name in store else None)
               for name, lay in (getattr(net, "parameter_layout_dict", None) or {}).items()}
    return strategy_from_layouts(layouts) if layouts else None


def compiled_layout(lay: Sequence[Any], full_shape: Sequence[int] | None) -> Layout:
    """One ``parameter_layout_dict`` entry as a :class:`Layout`, given the parameter's global shape
    (optimizer sharding is the ratio of the model-parallel slice to the compiled slice)."""
    maps = tensor_map_axes(lay[1], "parameter_layout_dict tensor map")
    base = Layout(tuple(int(d) for d in lay[0]), maps)
    slice_shape, parts = [int(x) for x in lay[2]], 0
    if full_shape and slice_shape and base.splits():
        mp_rows = int(full_shape[0]) // base.splits()[0]
        parts = mp_rows // slice_shape[0] if slice_shape[0] and slice_shape[0] < mp_rows else 0
    return Layout(base.dev_matrix, maps, 1 if parts else 0, parts)

