"""MindSpore-made fixtures for the tests: the package's sample writer and standard layouts
(:mod:`ckptstore.testing.layouts`), plus checkpoints as users have them.

Everything the tests write is real MindSpore output: strategy files in the compiler's format
(protobuf or its JSON form, through :mod:`ckptstore.testing.sample_checkpoint`), rank files saved by
``mindspore.save_checkpoint`` with slices cut by MindSpore's own slicing code, and the oracle
``mindspore.transform_checkpoints`` (:mod:`ckptstore.testing.oracle`). Test modules use it as
``import mindspore_fixtures as T``.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from ckptstore.testing.layouts import LAYOUT_KINDS, SCALARS, layout_specs  # noqa: F401  (re-exported for the test modules)
from ckptstore.testing.oracle import load_oracle, transform_oracle  # noqa: F401  (re-exported for the test modules)
from ckptstore.testing.sample_checkpoint import (  # noqa: F401  (re-exported for the test modules)
    NumpyHolder,
    ParamSpec,
    make_global_tensors,
    mindspore_rank_slice,
    normalize_spec,
    save_distributed,
    split_counts,
    strategy_pb2,
    to_ms_tensor,
    write_strategy,
    write_strategy_json,
)


class LazyModule:
    """A module imported when an attribute is first asked for, skipping the test when it is not
    installed: a test module names ``mindspore`` at its top (``ms = T.LazyModule("mindspore")``)
    while only its ``mindspore``-marked tests touch it, so the others run without MindSpore."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):  # what pytest's collection asks every module global (__test__, ...)
            raise AttributeError(attr)
        return getattr(pytest.importorskip(self._name), attr)


# --------------------------------------------------------------------------------------------
# checkpoints as users have them: MindFormers strategies, tied parameters across stages


def write_mindformers_strategy(path, specs: Sequence[ParamSpec]) -> Path:
    """A strategy file written the way MindFormers' ``save_strategy_file`` writes one.

    Per parameter: ``dev_matrix = [repeat] + shard`` (``repeat`` only when it is not 1; entries
    equal to 1 kept), ``tensor_map = [ndim - 1, ..., 0]``, ``param_split_shape`` = the local
    (per-rank) shape even for an even split, and no ``indices_offset`` at all. Optimizer
    sharding is not written (MindFormers writes these for inference layouts). The rank -> slice
    assignment is the same as the specs' own.
    """
    from math import prod

    pb2 = strategy_pb2()
    smap = pb2.ParallelStrategyMap()
    smap.current_stage = 1
    for s in specs:
        if not s.in_strategy:
            continue
        s = normalize_spec(s)
        shard = split_counts(s)
        repeat = prod(s.dev_matrix) // prod(shard)
        item = smap.parallel_layout_item.add()
        item.param_name = s.name
        lay = item.parallel_layouts
        lay.dev_matrix.add().dim.extend(([repeat] if repeat != 1 else []) + shard)
        lay.tensor_map.add().dim.extend(range(len(s.shape) - 1, -1, -1))
        lay.param_split_shape.add().dim.extend(n // k for n, k in zip(s.shape, shard, strict=True))
        lay.field = 0
        lay.opt_weight_shard_step = 0
        lay.opt_weight_shard_size = 0
    path = Path(path)
    path.write_bytes(smap.SerializeToString())
    return path


def tied_pipeline_specs() -> tuple[list[ParamSpec], int, int]:
    """Two pipeline stages of 2 ranks sharing ``word_embedding`` (PanGu-Alpha's tied embedding):
    whole on stage 0 (the embedding lookup), row-split on stage 1 (the output head)."""
    d = (2,)
    specs = [
        ParamSpec("word_embedding", (32, 8), dev_matrix=d, tensor_map=(-1, -1), stage=0),
        ParamSpec("layer0.w", (8, 8), dev_matrix=d, tensor_map=(0, -1), stage=0),
        ParamSpec("word_embedding", (32, 8), dev_matrix=d, tensor_map=(0, -1), stage=1),
        ParamSpec("head.b", (32,), dev_matrix=d, tensor_map=(0,), stage=1),
    ]
    return specs + list(SCALARS), 4, 2
