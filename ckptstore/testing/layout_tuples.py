"""Layout-tuple strategies (``mindspore.parallel.Layout`` with a tensor axis over several device axes) in both forms.

The parallel compiler does not run on the CPU wheel, so these are written the way it writes them:

* the protobuf form as MindSpore's own readers take it (``_convert_to_list``): one ``TensorMap``
  per tensor axis when any axis is split over several device axes, e.g. ``[[-1], [1, 0]]``;
* the JSON form as ``StrategyCheckpointInfo::to_json`` writes it after
  ``TensorLayout::InitFromExtendVector``: flattened, one tensor-map entry per device axis, with
  ``tensor_shape`` reshaped so that each entry but an axis's last covers exactly its device axis:
  a ``[16, 16]`` weight split ``("None", ("dp", "mp"))`` over ``[2, 4]`` is map ``[-1, 1, 0]`` and
  shape ``[16, 2, 8]``.

Rank files for such a layout come from ``mindspore.transform_checkpoints`` of a whole checkpoint
into the protobuf form (:func:`save_layout_tuple_checkpoint`). MindSpore is imported only there.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

#: Per tensor axis: -1 (whole) or the device axes (numbered from the right) that split it, outermost first.
NestedMap = Sequence[int | Sequence[int]]


def _axes(entry: int | Sequence[int]) -> list[int]:
    return [entry] if isinstance(entry, int) else list(entry)


def flatten_layout(dev_matrix: Sequence[int], tensor_map: NestedMap,
                   shape: Sequence[int]) -> tuple[list[int], list[int]]:
    """The flattened ``(tensor_map, tensor_shape)`` the compiler's JSON file holds for a nested map."""
    flat_map: list[int] = []
    flat_shape: list[int] = []
    n = len(dev_matrix)
    for entry, size in zip(tensor_map, shape, strict=True):
        axes = _axes(entry)
        outer = [int(dev_matrix[n - 1 - m]) for m in axes[:-1]]
        flat_map += axes
        flat_shape += outer + [int(size) // prod(outer)]
    return flat_map, flat_shape


def write_layout_tuple_strategies(folder, dev_matrix: Sequence[int],
                                  layouts: Mapping[str, tuple[Sequence[int], NestedMap]],
                                  opt_shard: Mapping[str, tuple[int, int]] | None = None) -> tuple[Path, Path]:
    """Write ``folder/nested.ckpt`` (protobuf) and ``folder/flat.json`` (the compiler's JSON) for ``layouts``.

    ``layouts[name] = (global shape, nested tensor map)``; one pipeline stage. ``opt_shard[name] =
    (opt_weight_shard_step, opt_weight_shard_size)`` shards that parameter over the optimizer
    (both forms record the two numbers as they are). Returns the two paths.
    """
    os.environ.setdefault("GLOG_v", "3")
    from mindspore.train import node_strategy_pb2 as pb2

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    smap = pb2.ParallelStrategyMap()
    smap.current_stage = 1
    doc: dict[str, Any] = {"current_stage": 1, "parallel_strategy_item": {}, "parallel_layout_item": {}}
    n = len(dev_matrix)
    for i, (name, (shape, tmap)) in enumerate(layouts.items()):
        splits = [prod(int(dev_matrix[n - 1 - m]) for m in _axes(e) if m != -1) for e in tmap]
        node = f"Default/network-WithLossCell/_backbone-Net/MatMul-op{i}"
        item = smap.parallel_strategy_item.add()
        item.node_name = node
        item.parallel_strategys.stage = 0
        item.parallel_strategys.parallel_strategy.add().dim.extend(splits)
        doc["parallel_strategy_item"][node] = {"stage": 0, "parallel_strategy": [splits]}
        lay = smap.parallel_layout_item.add()
        lay.param_name = name
        pl = lay.parallel_layouts
        pl.dev_matrix.add().dim.extend(int(d) for d in dev_matrix)
        if any(not isinstance(e, int) for e in tmap):
            for e in tmap:
                pl.tensor_map.add().dim.extend(_axes(e))
        else:
            pl.tensor_map.add().dim.extend(e for e in tmap if isinstance(e, int))  # (all are, see above)
        pl.param_split_shape.add()
        pl.indices_offset.add()
        step, size = (opt_shard or {}).get(name, (0, 0))
        pl.field = 0
        pl.opt_weight_shard_step = step
        pl.opt_weight_shard_size = size
        flat_map, flat_shape = flatten_layout(dev_matrix, tmap, shape)
        doc["parallel_layout_item"][name] = {
            "dev_matrix": [int(d) for d in dev_matrix], "tensor_map": flat_map, "tensor_shape": flat_shape,
            "field": 0, "opt_weight_shard_step": step, "opt_weight_shard_size": size}
    nested = folder / "nested.ckpt"
    nested.write_bytes(smap.SerializeToString())
    flat = folder / "flat.json"
    flat.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")), encoding="utf-8")
    return nested, flat


def save_layout_tuple_checkpoint(root, values: Mapping[str, np.ndarray], nested_strategy,
                                 prefix: str = "net-1_") -> Path:
    """Rank files of ``values`` under ``nested_strategy``, written by MindSpore: ``save_checkpoint``
    of the whole tensors, then ``transform_checkpoints`` into ``root/dist/rank_<r>/<prefix><r>.ckpt``."""
    os.environ.setdefault("GLOG_v", "3")
    import mindspore as ms

    root = Path(root)
    whole = root / "whole" / "rank_0"
    whole.mkdir(parents=True)
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(v)} for n, v in values.items()], str(whole / "net-1_1.ckpt"))
    ms.transform_checkpoints(str(root / "whole"), str(root / "dist"), prefix, None, str(nested_strategy))
    return root / "dist"
