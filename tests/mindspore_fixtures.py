"""MindSpore-made fixtures for the tests: the package's sample writer plus test-only layouts.

Everything the tests write is real MindSpore output: strategy files in the compiler's format
(protobuf through :mod:`ckptstore.testing.sample_checkpoint`, or its JSON form here), rank files saved by
``mindspore.save_checkpoint`` with slices cut by MindSpore's own slicing code, and the oracle
``mindspore.transform_checkpoints`` (:mod:`ckptstore.testing.oracle`). Test modules use it as
``import mindspore_fixtures as T``.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Sequence

from ckptstore.testing.oracle import load_oracle, transform_oracle  # noqa: F401
from ckptstore.testing.sample_checkpoint import (  # noqa: F401
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

#: Layout kinds known to :func:`layout_specs`.
LAYOUT_KINDS: tuple[str, ...] = (
    "mp_rows",
    "mp_cols",
    "dp2_mp4",
    "dp2_mp2",
    "opt_shard",
    "pipeline2",
    "mixed_dtypes",
)



_SCALARS = [
    ParamSpec("global_step", (1,), "int32", stage=-1),
    ParamSpec("learning_rate", (), "float32", stage=-1),
]


def _with_adam(specs: list[ParamSpec], names: Sequence[str]) -> list[ParamSpec]:
    """Append Adam moments (same layout as their parameter, as MindSpore's optimizer shards them)."""
    by_name = {s.name: s for s in specs}
    extra = []
    for prefix in ("adam_m", "adam_v"):
        for n in names:
            extra.append(replace(by_name[n], name=f"{prefix}.{n}"))
    return specs + extra


def layout_specs(kind: str) -> tuple[list[ParamSpec], int, int]:
    """Standard fixture layouts: ``(specs, world_size, stages)``. Every fixture is < 2 MB.

    * ``mp_rows``: 8 ranks, ``dev_matrix=(8,)``, weights and biases split on axis 0.
    * ``mp_cols``: 8 ranks, ``dev_matrix=(8,)``, weights split on axis 1 (one 3-d weight too),
      a replicated bias.
    * ``dp2_mp4``: 8 ranks, ``dev_matrix=(2, 4)``: replicated embedding and layernorm
      (``tensor_map`` all ``-1``), row- and column-split weights, one weight split on both device
      axes, Adam moments, ``global_step``/``learning_rate`` (absent from the strategy).
    * ``dp2_mp2``: the same parameters as ``dp2_mp4`` on 4 ranks (``dev_matrix=(2, 2)``), a target
      layout for resharding 8 -> 4.
    * ``opt_shard``: 8 ranks, dp2 x mp4 with optimizer sharding: size ``-1`` on split and replicated
      weights (Adam moments too), an explicit size 2 on a replicated embedding (step 1) and on a
      dp4 x mp2 weight (step 2), and an unsharded small bias.
    * ``pipeline2``: 2 stages x 4 ranks, ``dev_matrix=(2, 2)`` per stage, with an optimizer-sharded
      weight in stage 1, Adam moments, and ``global_step``/``learning_rate`` on every stage.
    * ``mixed_dtypes``: 8 ranks, dp2 x mp4, bfloat16 (split and optimizer-sharded), float16,
      float64, int8/16/32/64, uint8/16/32/64 and bool parameters.
    """
    if kind == "mp_rows":
        d = (8,)
        specs = [
            ParamSpec("layer0.w", (64, 32), dev_matrix=d, tensor_map=(0, -1)),
            ParamSpec("layer0.b", (64,), dev_matrix=d, tensor_map=(0,)),
            ParamSpec("layer1.w", (32, 16), dev_matrix=d, tensor_map=(0, -1)),
            ParamSpec("layer1.b", (32,), dev_matrix=d, tensor_map=(0,)),
        ]
        return specs + list(_SCALARS), 8, 1
    if kind == "mp_cols":
        d = (8,)
        specs = [
            ParamSpec("layer0.w", (16, 64), dev_matrix=d, tensor_map=(-1, 0)),
            ParamSpec("layer0.b", (16,), dev_matrix=d, tensor_map=(-1,)),
            ParamSpec("conv.w", (4, 16, 3), dev_matrix=d, tensor_map=(-1, 0, -1)),
            ParamSpec("layer1.w", (8, 32), dev_matrix=d, tensor_map=(-1, 0)),
        ]
        return specs + list(_SCALARS), 8, 1
    if kind in ("dp2_mp4", "dp2_mp2"):
        d = (2, 4) if kind == "dp2_mp4" else (2, 2)
        specs = [
            ParamSpec("embedding.table", (40, 16), dev_matrix=d, tensor_map=(-1, -1)),
            ParamSpec("layer0.w", (32, 16), dev_matrix=d, tensor_map=(0, -1)),
            ParamSpec("layer0.b", (32,), dev_matrix=d, tensor_map=(0,)),
            ParamSpec("layer1.w", (16, 32), dev_matrix=d, tensor_map=(-1, 0)),
            ParamSpec("moe.w", (4, 8, 8), dev_matrix=d, tensor_map=(1, -1, 0)),
            ParamSpec("layernorm.gamma", (16,), dev_matrix=d, tensor_map=(-1,)),
            ParamSpec("layernorm.beta", (16,), dev_matrix=d, tensor_map=(-1,)),
        ]
        specs = _with_adam(specs, ["layer0.w", "layer1.w"])
        return specs + list(_SCALARS), (8 if kind == "dp2_mp4" else 4), 1
    if kind == "opt_shard":
        d = (2, 4)
        specs = [
            # rows split by mp4; replicas {r, r+4}: step 4, size -1 (= 2)
            ParamSpec("layer0.w", (32, 16), dev_matrix=d, tensor_map=(0, -1), opt_shard_step=4, opt_shard_size=-1),
            # cols split by mp4; the opt shard cuts axis 0
            ParamSpec("layer1.w", (16, 32), dev_matrix=d, tensor_map=(-1, 0), opt_shard_step=4, opt_shard_size=-1),
            # replicated on all 8 ranks: step 1, size -1 (= 8)
            ParamSpec("layernorm.gamma", (64,), dev_matrix=d, tensor_map=(-1,), opt_shard_step=1, opt_shard_size=-1),
            # replicated on all 8 ranks, explicit size 2: groups {0,1},{2,3},...: step 1
            ParamSpec("embedding.table", (64, 16), dev_matrix=d, tensor_map=(-1, -1), opt_shard_step=1, opt_shard_size=2),
            # dp4 x mp2, cols split by 2; 4 replicas {r, r+2, r+4, r+6}, explicit size 2: step 2
            ParamSpec("layer2.w", (16, 8), dev_matrix=(4, 2), tensor_map=(-1, 0), opt_shard_step=2, opt_shard_size=2),
            # below the parallel optimizer threshold: not sharded
            ParamSpec("small.bias", (16,), dev_matrix=d, tensor_map=(-1,)),
        ]
        specs = _with_adam(specs, ["layer0.w", "layernorm.gamma"])
        return specs + list(_SCALARS), 8, 1
    if kind == "pipeline2":
        d = (2, 2)
        specs = [
            ParamSpec("embedding.table", (40, 16), dev_matrix=d, tensor_map=(-1, -1), stage=0),
            ParamSpec("layer0.w", (16, 16), dev_matrix=d, tensor_map=(0, -1), stage=0),
            ParamSpec("layer0.b", (16,), dev_matrix=d, tensor_map=(0,), stage=0),
            ParamSpec("layer1.w", (16, 16), dev_matrix=d, tensor_map=(-1, 0), opt_shard_step=2, opt_shard_size=-1, stage=1),
            ParamSpec("head.w", (8, 16), dev_matrix=d, tensor_map=(-1, -1), stage=1),
        ]
        specs = _with_adam(specs, ["layer0.w", "layer1.w"])
        return specs + list(_SCALARS), 8, 2
    if kind == "mixed_dtypes":
        d = (2, 4)
        specs = [
            ParamSpec("bf16.w", (32, 16), "bfloat16", dev_matrix=d, tensor_map=(0, -1)),
            ParamSpec("bf16.opt", (16, 8), "bfloat16", dev_matrix=d, tensor_map=(-1, 0), opt_shard_step=4, opt_shard_size=-1),
            ParamSpec("bf16.norm", (16,), "bfloat16", dev_matrix=d, tensor_map=(-1,)),
            ParamSpec("fp16.w", (16, 32), "float16", dev_matrix=d, tensor_map=(-1, 0)),
            ParamSpec("fp64.w", (8, 8), "float64", dev_matrix=d, tensor_map=(1, 0)),
            ParamSpec("i8.table", (8, 12), "int8", dev_matrix=d, tensor_map=(0, -1)),
            ParamSpec("i16.table", (8, 4), "int16", dev_matrix=d, tensor_map=(-1, 0)),
            ParamSpec("i32.index", (16, 8), "int32", dev_matrix=d, tensor_map=(0, -1)),
            ParamSpec("i64.count", (8, 4), "int64", dev_matrix=d, tensor_map=(1, -1)),
            ParamSpec("u8.quant", (64,), "uint8", dev_matrix=d, tensor_map=(0,)),
            ParamSpec("u16.quant", (8, 8), "uint16", dev_matrix=d, tensor_map=(-1, -1)),
            ParamSpec("u32.ids", (8,), "uint32", dev_matrix=d, tensor_map=(0,)),
            ParamSpec("u64.ids", (4, 4), "uint64", dev_matrix=d, tensor_map=(0, -1)),
            ParamSpec("mask", (32, 8), "bool", dev_matrix=d, tensor_map=(0, -1)),
            ParamSpec("bf16.scale", (4,), "bfloat16"),
        ]
        return specs + list(_SCALARS), 8, 1
    raise ValueError(f"unknown layout kind {kind!r}; known: {', '.join(LAYOUT_KINDS)}")


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
        lay.param_split_shape.add().dim.extend(n // k for n, k in zip(s.shape, shard))
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
    return specs + list(_SCALARS), 4, 2
