"""Tensor-parallel strategy files for a Hugging Face import (``ckptstore strategy``).

An index over a Hugging Face folder holds whole tensors under a rule set's target names. To load
it for ``tp`` cards (and ``pp`` pipeline stages) a loader needs a strategy file saying how each
parameter is cut; the rule set's ``tensor_parallel`` section (see
:class:`~ckptstore.formats.hf_rules.TensorParallel`) says which targets are column-parallel (cut
along axis 0), which row-parallel (axis 1), and which stay whole. This module turns that and the
store's names and shapes into layouts (pure: no I/O) and writes them in the JSON form MindSpore's
compiler writes (``StrategyCheckpointInfo::to_json``; MindSpore reads a strategy file as JSON
when its name ends in ``.json``): one file for one stage, one file per stage in a folder for
several (the folder ``merge_pipeline_strategys`` and ``--strategy`` both take).
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ckptstore.errors import InvalidOptionError, NameMapError, StoreExistsError
from ckptstore.formats.hf_rules import TensorParallel, load_name_map

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class TPLayout:
    """One parameter's layout: global ``shape``, ``tensor_map`` over the device matrix ``[tp]``
    (``0``: cut over the ``tp`` cards; ``-1``: whole), and its pipeline ``stage``."""

    name: str
    shape: tuple[int, ...]
    tensor_map: tuple[int, ...]
    stage: int


def tp_layouts(shapes: Mapping[str, Sequence[int]], rules: TensorParallel, *, tp: int, pp: int = 1,
               where: str = "the name map") -> list[TPLayout]:
    """The layout of each parameter of ``shapes`` (name -> global shape) for ``tp`` cards per
    stage and ``pp`` stages, by ``rules``. Layer ``i`` of ``L`` goes to stage
    ``min(i // (L // pp), pp - 1)`` (MindFormers' default placement). Raises
    :class:`InvalidOptionError` naming the parameter when an axis to cut does not divide by
    ``tp`` or is missing, and when there are fewer layers than stages."""
    layers = sorted({int(m.group(1)) for m in map(_LAYER.search, shapes) if m is not None})
    if pp > 1 and len(layers) < pp:
        raise InvalidOptionError(f"--pp {pp} needs at least {pp} layers; the store has {len(layers)}")
    per_stage = max(len(layers) // pp, 1)
    rank_of = {layer: i for i, layer in enumerate(layers)}
    out = []
    for name, raw in shapes.items():
        shape = tuple(int(d) for d in raw)
        axis = _cut_axis(name, rules)
        if axis is not None and (len(shape) <= axis or shape[axis] % tp):
            raise InvalidOptionError(f"parameter {name!r} of shape {list(shape)} cannot be cut into {tp} along axis "
                                     f"{axis}, as {where} says it is for tensor parallelism; choose a --tp that "
                                     "divides it")
        tmap = tuple(0 if a == axis and tp > 1 else -1 for a in range(len(shape)))
        m = _LAYER.search(name)
        if m is not None:
            stage = min(rank_of[int(m.group(1))] // per_stage, pp - 1)
        elif any(p.fullmatch(name) for p in rules.first_stage):
            stage = 0
        else:
            stage = pp - 1
        out.append(TPLayout(name, shape, tmap, stage))
    return out


def _cut_axis(name: str, rules: TensorParallel) -> int | None:
    if any(p.fullmatch(name) for p in rules.split_rows):
        return 0
    if any(p.fullmatch(name) for p in rules.split_columns):
        return 1
    return None


def strategy_json(layouts: Sequence[TPLayout], *, tp: int, stage: int) -> bytes:
    """The JSON strategy file of ``stage`` (the layouts of that stage), as MindSpore's compiler
    writes it: keys sorted, compact separators; one stand-in operator item per parameter carrying
    the stage (MindSpore reads a file's stage from its first strategy item)."""
    mine = [lay for lay in layouts if lay.stage == stage]
    strategy_items, layout_items = {}, {}
    for i, lay in enumerate(mine):
        strategy_items[f"Default/network-ckptstore_strategy/MatMul-op{i}"] = {
            "parallel_strategy": [[tp if m == 0 else 1 for m in lay.tensor_map]], "stage": stage}
        layout_items[lay.name] = {"dev_matrix": [tp], "field": 0, "opt_weight_shard_size": 0,
                                  "opt_weight_shard_step": 0, "tensor_map": list(lay.tensor_map),
                                  "tensor_shape": list(lay.shape)}
    doc = {"current_stage": 1, "parallel_layout_item": layout_items, "parallel_strategy_item": strategy_items}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def write_tp_strategy(shapes: Mapping[str, Sequence[int]], out: str | os.PathLike[str], *,
                      name_map: str | os.PathLike[str], tp: int, pp: int = 1, overwrite: bool = False) -> list[str]:
    """Write the strategy for loading a store of parameters ``shapes`` (name -> global shape: an
    index over a Hugging Face folder, say) on ``tp`` cards per stage and ``pp`` stages, by the
    ``tensor_parallel`` section of rule set ``name_map``; return the files written. With
    ``pp == 1``, ``out`` is the file (``.json``); with more, a folder that gets
    ``stage_<s>.json`` per stage. An existing file is a :class:`StoreExistsError` unless
    ``overwrite``."""
    from ckptstore.io.sink import open_sink

    for what, v in (("--tp", tp), ("--pp", pp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidOptionError(f"{what} must be a positive integer, not {v!r}")
    rules = load_name_map(name_map)
    if rules.tensor_parallel is None:
        raise NameMapError("it has no 'tensor_parallel' section saying which targets are cut; add one (see the "
                           "shipped llama.json)", path=rules.path)
    layouts = tp_layouts(shapes, rules.tensor_parallel, tp=tp, pp=pp, where=f"rule file {rules.path}")
    target = os.fspath(out)
    if pp == 1:
        if not target.endswith(".json"):
            raise InvalidOptionError(f"--out {target}: name the file *.json (ckptstore writes the JSON form of a "
                                     "strategy file, which MindSpore reads as JSON by that suffix)")
        folder, _, name = target.rpartition("/")
        files = {name: strategy_json(layouts, tp=tp, stage=0)}
    else:
        folder = target
        files = {f"stage_{s}.json": strategy_json(layouts, tp=tp, stage=s) for s in range(pp)}
    sink = open_sink(folder or ".")
    for name in files:
        if not overwrite and sink.size(name) is not None:
            raise StoreExistsError(f"{sink.key_url(name)} exists; pass --overwrite to replace it")
    for name, data in files.items():
        sink.put(name, data)
    sink.sync()
    return [sink.key_url(name) for name in files]
