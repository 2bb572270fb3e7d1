"""``ckptstore export``: per-rank ``.ckpt`` files for a target layout, like ``transform_checkpoints``.

For each target rank, the rank's parameters are read from the store one at a time (only the
bytes of its slice) and appended to ``OUT/rank_<j>/checkpoint_<j>.ckpt``, which MindSpore's
``load_checkpoint`` reads. Memory stays at one parameter slice; MindSpore is not needed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .ckpt_writer import CheckpointWriter
from .loader import StrategyLike, rank_view, resolve_target
from .store import Store


@dataclass(frozen=True)
class ExportSummary:
    """Files written by :func:`export`, and bytes read from the store."""

    files: tuple[str, ...]
    bytes_read: int


def export(store: Store, out: str | os.PathLike[str], *, strategy: StrategyLike = None,
           ranks: Sequence[int] | None = None, names: Sequence[str] | None = None,
           dtype: np.dtype | None = None, crc: bool = False, prefix: str = "checkpoint_") -> ExportSummary:
    """Write ``out/rank_<j>/<prefix><j>.ckpt`` for each rank ``j`` of ``strategy`` (all ranks when
    ``ranks`` is ``None``; the store's source layout when ``strategy`` is ``None``)."""
    target = resolve_target(store, strategy)
    world = 1 if target is None else target.world_size
    chosen = list(range(world)) if ranks is None else list(ranks)
    written, nbytes = [], 0
    for j in chosen:
        view = rank_view(store, target, j, names=names, dtype=dtype)
        path = Path(out) / f"rank_{j}" / f"{prefix}{j}.ckpt"
        path.parent.mkdir(parents=True, exist_ok=True)
        with CheckpointWriter(path, crc=crc) as writer:
            for name in view.names():
                writer.add(name, view.read(name))
        nbytes += view.plan.nbytes
        written.append(str(path))
    return ExportSummary(tuple(written), nbytes)
