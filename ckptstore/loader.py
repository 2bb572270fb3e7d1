"""What one rank of a target layout needs from a store, as numpy arrays (no MindSpore here).

A *target* is a :class:`~ckptstore.strategy.Strategy` (the new card count's strategy file, a
compiled network's layouts, or the store's own source layout) plus a global rank. For every
parameter the rank holds, the target gives a global box; parameters the target does not
describe are returned whole (as ``transform_checkpoints`` copies such scalars and counters).
:class:`RankView` plans those boxes at once (so ``plan.nbytes`` is known before any read) and
reads each parameter only when asked.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import numpy as np

from .boxes import Box
from .dtypes import BFLOAT16
from .errors import LayoutMismatchError, StrategyError
from .planner import ParamReadPlan, ReadPlan, plan_param
from .reader import execute
from .store import Store
from .strategy import Strategy, load_strategy, strategy_from_summary

StrategyLike = Strategy | str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None


def resolve_target(store: Store, strategy: StrategyLike) -> Strategy | None:
    """The target layout: ``strategy`` as given or read from file(s); ``None`` means the store's
    source layout (``None`` again if the store came from a single file, i.e. whole tensors)."""
    if isinstance(strategy, Strategy):
        return strategy
    if strategy is None:
        summary = store.source.get("strategy")
        return None if summary is None else strategy_from_summary(summary)
    if isinstance(strategy, (str, os.PathLike)):
        return load_strategy(strategy)
    return load_strategy(list(strategy))


def target_boxes(store: Store, target: Strategy | None, rank: int,
                 names: Sequence[str] | None = None) -> dict[str, Box | None]:
    """Global box of each parameter rank ``rank`` of ``target`` holds (``None`` = the whole tensor).

    ``names`` are globs (all parameters when ``None``). Parameters that the target places only on
    other pipeline stages are left out. Raises :class:`~ckptstore.errors.LayoutMismatchError`
    when the target cannot split a parameter of the store's shape.
    """
    if target is not None and not 0 <= rank < target.world_size:
        raise StrategyError(f"rank {rank} is outside the target layout's {target.world_size} ranks")
    out: dict[str, Box | None] = {}
    for name in store.names():
        if names is not None and not any(fnmatch.fnmatchcase(name, g) for g in names):
            continue
        info = store.info(name)
        if target is None or name not in target.layouts or info.is_str:
            out[name] = None
            continue
        layout = target.layout(name, rank)
        if layout is None:
            continue
        try:
            out[name] = layout.box(rank % target.stage_devices, info.shape)
        except StrategyError as e:
            raise LayoutMismatchError(f"parameter {name!r} (shape {list(info.shape)} in the store) does not fit "
                                      f"the target layout: {e}") from None
    return out


@dataclass
class RankView:
    """The parameters one target rank holds, planned up front and read on demand.

    ``dtype`` (a numpy dtype) converts floating-point values chunk by chunk while reading. ``workers`` threads
    read the chunks of one parameter when it is large (>= 64 MiB); the default is 1 because on
    a warm page cache the copy is memory-bound and a second thread made 3 GB loads slower here
    (benchmarks/results/3gb/load.md: 1.99 s with 2, 1.07 s with 1).
    """

    store: Store
    boxes: Mapping[str, Box | None]
    dtype: np.dtype | None = None
    verify: bool = False
    workers: int = 1

    def names(self) -> list[str]:
        return list(self.boxes)

    def __iter__(self) -> Iterator[str]:
        return iter(self.boxes)

    def __len__(self) -> int:
        return len(self.boxes)

    def dtype_of(self, name: str) -> np.dtype:
        """The dtype ``name`` is read as: ``dtype`` for floating-point parameters, else as stored
        (converting fp32 weights to fp16 must not turn integer counters into floats)."""
        stored = self.store.info(name).np_dtype
        return self.dtype if self.dtype is not None and _is_float(stored) else stored

    def plan_for(self, name: str) -> ParamReadPlan:
        return plan_param(self.store.info(name), self.boxes[name])

    @property
    def plan(self) -> ReadPlan:
        """Every read this rank needs (inspect ``plan.nbytes`` and ``plan.files`` before reading)."""
        return ReadPlan({n: self.plan_for(n) for n in self.boxes if not self.store.info(n).is_str})

    def read(self, name: str) -> np.ndarray | str:
        """The rank's slice of ``name`` in a fresh, ordinary (anonymous) numpy array."""
        info = self.store.info(name)
        if info.is_str:
            return info.value or ""
        plan = self.plan_for(name)
        out = np.empty(plan.shape, dtype=self.dtype_of(name))
        return execute(plan, self.store._files, out=out, verify=self.verify, workers=self.workers)  # noqa: SLF001

    def mapped(self, name: str) -> np.ndarray | None:
        """A read-only memory-mapped view of the slice when it is one whole raw chunk, else ``None``.

        No bytes are copied; pages come from the page cache as they are touched. Use for
        host-side work only (see ``copy=False`` in :func:`ckptstore.load_rank`).
        """
        info = self.store.info(name)
        if info.is_str or info.codec is not None or self.dtype_of(name) != info.np_dtype:
            return None
        plan = self.plan_for(name)
        if not plan.chunks or plan.box.size == 0:
            return None
        c = plan.chunks[0]
        # One contiguous block holds exactly the slice: a whole chunk, or a whole dense tensor.
        if plan.box != c.container or any(x.container != c.container or x.offset != c.offset for x in plan.chunks):
            return None
        return np.memmap(self.store.root / c.file, dtype=info.np_dtype, mode="r", offset=c.offset,
                         shape=c.container.shape)


def _is_float(dtype: np.dtype) -> bool:
    return dtype == BFLOAT16 or np.issubdtype(dtype, np.floating)


def rank_view(store: Store, strategy: StrategyLike = None, rank: int = 0, *, names: Sequence[str] | None = None,
              dtype: np.dtype | None = None, verify: bool = False, workers: int = 1) -> RankView:
    """Plan what rank ``rank`` of ``strategy`` (the source layout when ``None``) needs from ``store``."""
    target = resolve_target(store, strategy)
    return RankView(store, target_boxes(store, target, rank, names), None if dtype is None else np.dtype(dtype),
                    verify, workers)
