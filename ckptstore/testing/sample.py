"""A PanGu-Alpha-shaped parameter set, for the demo and the benchmarks.

The names and layouts follow MindSpore's PanGu-Alpha: a word and a position embedding
replicated on every rank, per block two LayerNorms (replicated), attention q/k/v split by rows
and the output projection by columns, the FFN mapping split by rows and its projection by
columns, over a ``[dp, mp]`` device matrix; Adam moments (``adam_m.``/``adam_v.``) mirror the
trainable weights; optimizer sharding (``opt_shard=True``) cuts the split weights and their
moments across the data-parallel replicas, as ``enable_parallel_optimizer`` does.
Everything here is metadata (:class:`~ckptstore.testing.sample_checkpoint.ParamSpec`); values come from
:func:`ckptstore.testing.sample_checkpoint.make_global_tensors`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ckptstore.testing.sample_checkpoint import ParamSpec


def pangu_specs(*, hidden: int, layers: int, vocab: int, seq: int = 64, dp: int = 2, mp: int = 4,
                opt_shard: bool = True, dtype: str = "float32", optimizer: bool = True) -> list[ParamSpec]:
    """Parameter specs of a PanGu-Alpha-like model laid out on ``dp * mp`` ranks."""
    dev = (dp, mp) if dp > 1 else (mp,)
    mp_axis = 0  # the mp device axis, counted from the right

    def spec(name: str, shape: tuple[int, ...], tmap: tuple[int, ...], shard: bool) -> ParamSpec:
        split = any(m >= 0 for m in tmap)
        step, size = 0, 0
        if shard and opt_shard and dp > 1 and shape[0] % (dp * (mp if tmap[0] == mp_axis else 1)) == 0:
            step, size = (mp if split else 1), -1
        return ParamSpec(name, shape, dtype, dev, tmap, step, size)

    weights = [
        spec("backbone.word_embedding.embedding_table", (vocab, hidden), (-1, -1), False),
        spec("backbone.position_embedding.embedding_table", (seq, hidden), (-1, -1), False),
    ]
    h4 = 4 * hidden
    for i in range(layers):
        b = f"backbone.blocks.{i}"
        weights += [
            spec(f"{b}.layernorm1.gamma", (hidden,), (-1,), False),
            spec(f"{b}.layernorm1.beta", (hidden,), (-1,), False),
            spec(f"{b}.attention.dense1.weight", (hidden, hidden), (mp_axis, -1), True),
            spec(f"{b}.attention.dense1.bias", (hidden,), (mp_axis,), False),
            spec(f"{b}.attention.dense2.weight", (hidden, hidden), (mp_axis, -1), True),
            spec(f"{b}.attention.dense2.bias", (hidden,), (mp_axis,), False),
            spec(f"{b}.attention.dense3.weight", (hidden, hidden), (mp_axis, -1), True),
            spec(f"{b}.attention.dense3.bias", (hidden,), (mp_axis,), False),
            spec(f"{b}.attention.projection.weight", (hidden, hidden), (-1, mp_axis), True),
            spec(f"{b}.attention.projection.bias", (hidden,), (-1,), False),
            spec(f"{b}.layernorm2.gamma", (hidden,), (-1,), False),
            spec(f"{b}.layernorm2.beta", (hidden,), (-1,), False),
            spec(f"{b}.output.mapping.weight", (h4, hidden), (mp_axis, -1), True),
            spec(f"{b}.output.mapping.bias", (h4,), (mp_axis,), False),
            spec(f"{b}.output.projection.weight", (hidden, h4), (-1, mp_axis), True),
            spec(f"{b}.output.projection.bias", (hidden,), (-1,), False),
        ]
    weights += [spec("backbone.layernorm.gamma", (hidden,), (-1,), False),
                spec("backbone.layernorm.beta", (hidden,), (-1,), False)]
    if not optimizer:
        return weights
    moments = [dataclasses.replace(w, name=f"{kind}.{w.name}") for kind in ("adam_m", "adam_v") for w in weights]
    counters = [ParamSpec("global_step", (1,), "int32", stage=-1), ParamSpec("learning_rate", (), "float32", stage=-1)]
    return weights + moments + counters


def relayout(specs: Sequence[ParamSpec], *, dp: int, mp: int, opt_shard: bool = False) -> list[ParamSpec]:
    """The same parameters laid out on ``dp * mp`` ranks (a target strategy for a new card count)."""
    dev = (dp, mp) if dp > 1 else (mp,)
    out = []
    for s in specs:
        if not s.dev_matrix:
            out.append(s)
            continue
        split = any(m >= 0 for m in s.tensor_map)
        shardable = opt_shard and dp > 1 and s.opt_shard_size != 0
        step = (mp if split else 1) if shardable else 0
        out.append(dataclasses.replace(s, dev_matrix=dev, opt_shard_step=step, opt_shard_size=-1 if shardable else 0))
    return out


def model_bytes(specs: Sequence[ParamSpec]) -> int:
    """Bytes of all global tensors (each parameter once)."""
    from math import prod

    return sum(prod(s.shape) * s.np_dtype.itemsize for s in specs)
