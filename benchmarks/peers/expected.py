"""The values a target rank must end up with, computed without ckptstore's layout math.

Global tensors come from :func:`ckptstore.testing.sample_checkpoint.make_global_tensors` (the generator the
synthetic checkpoint was written from, seeded per parameter), and rank ``r``'s slice of each is
cut by **MindSpore's own slicing code** (:func:`ckptstore.testing.sample_checkpoint.mindspore_rank_slice`) with
the target layout's spec. The digest has the form :mod:`benchmarks.contenders` uses, so it can
be compared with every contender's ``check`` result: equal digests mean bit-identical tensors.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np


def expected_arrays(synth: Any, dst: Any, rank: int, names_file: str) -> Iterator[tuple[str, np.ndarray]]:
    """``(name, rank's slice)`` of every in-strategy tensor of the names file, one at a time."""
    from ckptstore.testing.sample import relayout
    from ckptstore.testing.sample_checkpoint import make_global_tensors, mindspore_rank_slice

    specs = {s.name: s for s in relayout(synth.specs, dp=dst.dp, mp=dst.mp)}
    with open(names_file, encoding="utf-8") as f:
        rows = json.load(f)
    for name, shape, _dtype, in_strategy in rows:
        if not in_strategy:
            continue
        spec = specs[name]
        whole = make_global_tensors([spec], synth.seed)[name]
        local = mindspore_rank_slice(spec, whole, rank)
        if tuple(local.shape) != tuple(shape):
            raise AssertionError(f"{name}: MindSpore gives rank {rank} shape {local.shape}, the names file {shape}")
        yield name, local


def expected_digest(synth: Any, dst: Any, rank: int, names_file: str) -> dict[str, Any]:
    """Digest of :func:`expected_arrays` (same form as ``benchmarks.contenders.check_params``)."""
    from benchmarks.contenders import _digest

    return _digest(expected_arrays(synth, dst, rank, names_file), names_file)
