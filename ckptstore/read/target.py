"""Which slices one rank of a target layout holds: the target resolved, the rank, the boxes (no I/O of payloads).

A *target* is a :class:`~ckptstore.checkpoint.strategy.Strategy` (the new card count's strategy file, a
compiled network's layouts, or the store's own source layout) plus a global rank. For every
parameter the rank holds, the target gives a global box; parameters the target does not
describe are returned whole (as ``transform_checkpoints`` copies such scalars and counters).
:mod:`ckptstore.read.loader` reads those boxes; a cooperative load groups the ranks whose boxes
agree (:func:`replica_ranks`).
"""
from __future__ import annotations

import fnmatch
import operator
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ckptstore.boxes import Box
from ckptstore.checkpoint.strategy import Strategy, load_strategy, strategy_from_summary
from ckptstore.dtypes import lookup
from ckptstore.errors import ForeignStrategyError, InvalidOptionError, LayoutMismatchError, StrategyError
from ckptstore.launcher import process_rank
from ckptstore.store.store import Store

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


def check_rank(rank: object) -> int:
    """``rank`` as an int; :class:`InvalidOptionError` for non-integers (``1.5``, ``True``, ``"0"``)."""
    if isinstance(rank, bool):
        raise InvalidOptionError(f"rank must be an integer, not {rank!r}")
    try:
        return operator.index(rank)  # type: ignore[arg-type]  # any object: TypeError for a non-integer
    except TypeError:
        raise InvalidOptionError(f"rank must be an integer, not {rank!r}") from None


def resolve_rank(rank: object, target: Strategy | None) -> int:
    """The rank to read for ``target``: ``rank`` when given, else this process's rank.

    ``rank=None`` asks :func:`process_rank`. A one-rank target (whole tensors; a pure
    data-parallel job) is the same for every process, so any process rank reads rank 0 of it;
    for a target of several ranks, nothing saying which rank this process is is an error (not
    rank 0: every process would silently load the same slices).
    """
    world = 1 if target is None else target.world_size
    if rank is not None:
        rank = check_rank(rank)
        return 0 if world == 1 and rank > 0 else rank
    if world == 1:
        return 0
    found = process_rank()
    if found is None:
        raise InvalidOptionError(
            f"which rank of the {world}-rank target layout is this process? Nothing says: pass the rank (rank=, "
            "--rank), or run under a launcher that sets RANK_ID (msrun) or OMPI_COMM_WORLD_RANK (mpirun), or "
            "initialise mindspore.communication first")
    return found


def include_globs(include: str | Sequence[str] | None,
                  names: str | Sequence[str] | None) -> str | Sequence[str] | None:
    """The globs of ``include=``, or of ``names=``: the published API (``load_rank(store, strategy,
    rank, names=None)``) spells the option so, and both spellings are accepted; passing both at
    once is refused."""
    if include is not None and names is not None:
        raise InvalidOptionError("include= and names= are the same option; pass only one")
    return include if include is not None else names


def name_patterns(names: str | Sequence[str] | None) -> list[str] | None:
    """``names`` as a list of globs: one string is one pattern, not a sequence of characters."""
    if names is None:
        return None
    if isinstance(names, str):
        return [names]
    out = list(names)
    if not all(isinstance(n, str) for n in out):
        raise InvalidOptionError(f"names must be strings (globs), got {out!r}")
    return out


def float_dtype(dtype: Any) -> np.dtype | None:
    """A floating-point target dtype (numpy, MindSpore or a name), or ``None``.

    Converting trained weights to an integer or bool type would truncate or wrap every value,
    so only float16, bfloat16, float32 and float64 are accepted.
    """
    if dtype is None:
        return None
    try:
        found = lookup(dtype)
    except ValueError as e:
        raise InvalidOptionError(f"dtype: {e}") from None
    if not found.is_float:
        raise InvalidOptionError(f"dtype {found.name} is not a floating-point type; converting weights to it would "
                                 "truncate or wrap their values (choose float16, bfloat16, float32 or float64)")
    return found.numpy


def target_boxes(store: Store, target: Strategy | None, rank: int,
                 names: Sequence[str] | None = None, *, exact: bool = False) -> dict[str, Box | None]:
    """Global box of each parameter rank ``rank`` of ``target`` holds (``None`` = the whole tensor).

    ``names`` are globs (or exact names with ``exact=True``; all parameters when ``None``).
    Parameters that the target places only on other pipeline stages are left out. Raises
    :class:`~ckptstore.errors.LayoutMismatchError` when the target cannot split a parameter of
    the store's shape.
    """
    rank = check_rank(rank)
    if target is not None and not 0 <= rank < target.world_size:
        raise StrategyError(f"rank {rank} is outside the target layout's {target.world_size} ranks")
    wanted = set(names) if exact and names is not None else None
    out: dict[str, Box | None] = {}
    for name in store.names():
        if wanted is not None:
            if name not in wanted:
                continue
        elif names is not None and not any(fnmatch.fnmatchcase(name, g) for g in names):
            continue
        info = store.info(name)
        if target is None or name not in target.layouts or info.is_str:
            out[name] = None
            continue
        layout = target.layout(name, rank)
        if layout is None:
            continue
        try:
            layout.check_tensor_shape(info.shape)
            out[name] = layout.box(rank % target.stage_devices, info.shape)
            layout.check_local_shape(out[name])  # type: ignore[arg-type]  # set to a Box on the line above
        except StrategyError as e:
            raise LayoutMismatchError(f"parameter {name!r} (shape {list(info.shape)} in the store) does not fit "
                                      f"the target layout: {e}") from None
    return out


def check_target_describes(store: Store, target: Strategy, boxes: Mapping[str, Box | None]) -> None:
    """Refuse a target strategy that lays out fewer than half of the store's parameters a layout could split.

    A parameter the target does not lay out is loaded whole on every rank (as
    ``transform_checkpoints`` copies counters), so another model's strategy would silently load
    the whole model into every rank. Counted among ``boxes`` (what the rank was asked for):
    tensors with an axis longer than 1; one also counts as laid out when the target lays out
    its name without the first dotted part (the optimizer state ``adam_m.w`` of a weight ``w``,
    for an inference strategy that has no optimizer). Raises
    :class:`~ckptstore.errors.ForeignStrategyError` naming examples on both sides.
    """
    splittable = [n for n in boxes if not store.info(n).is_str and any(s > 1 for s in store.info(n).shape)]
    laid_out = [n for n in splittable if n in target.layouts or n.partition(".")[2] in target.layouts]
    if 2 * len(laid_out) >= len(splittable):
        return
    missing = [n for n in splittable if n not in laid_out]
    theirs = [n for n in target.layouts if n not in store][:3]
    where = f" ({', '.join(target.sources)})" if target.sources else ""
    raise ForeignStrategyError(
        f"the target strategy{where} describes {len(laid_out)} of the {len(splittable)} parameters of the store "
        f"{store.location.url} that it could split (optimizer state such as 'adam_m.w' counts with its weight 'w'; "
        f"not described: {', '.join(map(repr, missing[:3]))}"
        + (f"; it lays out {', '.join(map(repr, theirs))} instead" if theirs else "")
        + "): is it another model's strategy? Parameters it does not lay out would be loaded whole on every rank; "
        "pass allow_whole=True (--allow-whole) if that is what you want")


def replica_ranks(store: Store, target: Strategy | None, rank: int, world: int,
                  names: Sequence[str] | None = None) -> tuple[int, ...]:
    """The ranks of a ``world``-rank job that hold exactly the boxes ``rank`` holds of ``target`` (itself
    included): with whole tensors (no target, or a one-rank target), every rank of the job."""
    if target is None or target.world_size == 1:
        return tuple(range(world))
    mine = target_boxes(store, target, rank, names)
    return tuple(r for r in range(min(world, target.world_size))
                 if r == rank or target_boxes(store, target, r, names) == mine)
