"""A MindSpore distributed checkpoint on disk: rank files + strategy -> global parameters.

MindSpore saves ``SRC/rank_<i>/<prefix>-<epoch>_<step>.ckpt`` per rank. This module picks each
rank's file, scans them all (headers only), and, with the strategy, works out for every
parameter its global shape and dtype and which rank files hold which global box, grouping
replicas. Everything is checked against everything else: a rank missing or extra, a parameter
missing from a rank that must hold it, shapes or dtypes that disagree with the strategy or
between ranks. The result is pure metadata; no payload byte is read.
"""
from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .boxes import Box
from .ckpt_reader import CkptEntry, CkptIndex, scan_checkpoint
from .layout_check import Sampler, check_against_strategy
from .source_files import SourceFiles
from .errors import LayoutMismatchError, MissingFileError, MissingRankError, StrategyError
from .strategy import Strategy, load_strategy

_RANK_DIR = re.compile(r"^rank_(\d+)$")
_STEP_SUFFIX = re.compile(r"-(\d+)_(\d+)(?:_breakpoint)?\.ckpt$")


@dataclass(frozen=True)
class SourceSlice:
    """One distinct global box of a parameter and the rank files that hold it (replicas)."""

    box: Box
    ranks: tuple[int, ...]
    entries: tuple[CkptEntry, ...]
    paths: tuple[str, ...]

    @property
    def rank(self) -> int:
        """The rank whose file supplies this box (the first replica)."""
        return self.ranks[0]

    @property
    def entry(self) -> CkptEntry:
        return self.entries[0]

    @property
    def path(self) -> str:
        """The file of the rank that supplies this box."""
        return self.paths[0]


@dataclass(frozen=True)
class SourceParam:
    """A parameter of the whole job: global shape, dtype, and its distinct slices."""

    name: str
    tensor_type: str
    dtype: np.dtype
    shape: tuple[int, ...]
    slices: tuple[SourceSlice, ...]
    in_strategy: bool

    @property
    def is_str(self) -> bool:
        return self.tensor_type == "str"

    @property
    def nbytes(self) -> int:
        return sum(s.entry.nbytes for s in self.slices)


@dataclass(frozen=True)
class DistributedSource:
    """Rank files, their indexes and the global parameters they make up.

    ``integrated_save`` is true when the rank files hold whole tensors although the strategy
    splits them (``save_checkpoint(integrated_save=True)``); parameters are then whole.
    ``files`` keeps the rank files open for whoever reads them next; close the source after use.
    """

    rank_files: Mapping[int, str]
    indexes: Mapping[int, CkptIndex]
    strategy: Strategy | None
    params: Mapping[str, SourceParam]
    integrated_save: bool = False
    files: SourceFiles = field(default_factory=SourceFiles, compare=False, repr=False)

    @property
    def world_size(self) -> int:
        return len(self.rank_files)

    def close(self) -> None:
        self.files.close()


def _step_key(path: Path) -> tuple[int, int] | None:
    m = _STEP_SUFFIX.search(path.name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def pick_rank_file(rank_dir: Path, *, step: int | None = None, prefix: str | None = None) -> Path:
    """Choose the checkpoint of one rank folder: the newest by its ``-<epoch>_<step>`` suffix.

    ``prefix`` keeps only files whose name starts with it; ``step`` keeps only files of that
    step. Raises :class:`~ckptstore.errors.MissingRankError` when nothing matches and
    :class:`~ckptstore.errors.LayoutMismatchError` when the choice is ambiguous.
    """
    files = sorted(p for p in rank_dir.glob("*.ckpt") if p.is_file())
    if prefix is not None:
        files = [p for p in files if p.name.startswith(prefix)]
    if step is not None:
        files = [p for p in files if (_step_key(p) or (None, None))[1] == step]
    if not files:
        what = " and ".join(x for x in [f"prefix {prefix!r}" if prefix else "", f"step {step}" if step is not None
                                         else ""] if x) or "any name"
        raise MissingRankError(f"no .ckpt file with {what} in {rank_dir}")
    if len(files) == 1:
        return files[0]
    keyed = [(k, p) for p in files if (k := _step_key(p)) is not None]
    if len(keyed) != len(files):
        raise LayoutMismatchError(f"{rank_dir} holds several checkpoints ({', '.join(p.name for p in files)}) "
                                  "and not all are named <prefix>-<epoch>_<step>.ckpt; pick one with --prefix")
    keyed.sort()
    if len(keyed) > 1 and keyed[-1][0] == keyed[-2][0]:
        raise LayoutMismatchError(f"{rank_dir} holds {keyed[-1][1].name} and {keyed[-2][1].name} for the same "
                                  "step; pick one with --prefix")
    return keyed[-1][1]


def find_rank_files(src: str | os.PathLike[str], *, step: int | None = None,
                    prefix: str | None = None) -> dict[int, Path]:
    """Map each rank to its checkpoint file under ``src/rank_<i>/``.

    Raises :class:`~ckptstore.errors.MissingRankError` when ``src`` has no rank folders or the
    rank numbers have a gap (a rank folder was not copied).
    """
    root = Path(src)
    if not root.is_dir():
        raise MissingRankError(f"{root} is not a directory of rank_<i>/ folders")
    ranks = {int(m.group(1)): p for p in root.iterdir() if p.is_dir() and (m := _RANK_DIR.match(p.name))}
    if not ranks:
        raise MissingRankError(f"{root} has no rank_<i>/ folders (MindSpore saves each rank's checkpoint in "
                               "rank_<i>/); pass the folder that contains them")
    missing = sorted(set(range(max(ranks) + 1)) - set(ranks))
    if missing:
        raise MissingRankError(f"{root} has rank folders up to rank_{max(ranks)} but rank_"
                               f"{', rank_'.join(map(str, missing))} missing")
    return {r: pick_rank_file(ranks[r], step=step, prefix=prefix) for r in sorted(ranks)}


def open_source(rank_files: Mapping[int, str | os.PathLike[str]], strategy: Strategy | None, *,
                verify_crc: bool = False, check_layout: bool = True) -> DistributedSource:
    """Scan every rank file and resolve each parameter's global shape and slices.

    With ``strategy=None`` every parameter must have the same shape on every rank that holds it
    (a single file, or a purely data-parallel job). With ``check_layout`` (the default) a few
    bytes of every slice are sampled to prove the strategy describes the files
    (:mod:`ckptstore.layout_check`); files saved with ``integrated_save=True`` are recognised
    there and taken as whole tensors. Raises :class:`~ckptstore.errors.LayoutMismatchError` or
    :class:`~ckptstore.errors.MissingRankError` naming the file, rank and parameter when the
    files and the strategy disagree.
    """
    files = {r: os.fspath(p) for r, p in sorted(rank_files.items())}
    if strategy is not None and strategy.world_size != len(files):
        told = f"the strategy describes {strategy.world_size} ranks but {len(files)} rank files were found"
        missing = [r for r in range(strategy.world_size) if r not in files]
        extra = [r for r in files if r >= strategy.world_size]
        culprit = (f"no checkpoint file for rank(s) {_ranges(missing)} (rank_{missing[0]}/ is missing)" if missing
                   else f"rank(s) {_ranges(extra)} are not in it ({files[extra[0]]}{', ...' if len(extra) > 1 else ''})")
        raise MissingRankError(f"{told}: {culprit}; strategy file(s): {', '.join(strategy.sources)}")
    indexes = {r: scan_checkpoint(p, verify_crc=verify_crc) for r, p in files.items()}
    names = list(dict.fromkeys(n for idx in indexes.values() for n in idx.entries))
    if strategy is not None:
        absent = [n for n in strategy.names() if n not in names]
        names += absent  # reported below as missing from the ranks that must hold them
    params = {n: _resolve(n, indexes, strategy) for n in names}
    opened = SourceFiles()
    integrated = False
    if check_layout and len(files) > 1:
        try:
            verdict = check_against_strategy(params, Sampler(opened), strategy_given=strategy is not None)
        except BaseException:
            opened.close()
            raise
        if verdict.integrated:
            integrated = True
            params = {n: _resolve_whole(n, _holders(n, indexes), indexes) for n in names}
    return DistributedSource(files, indexes, strategy, params, integrated, opened)


def _holders(name: str, indexes: Mapping[int, CkptIndex]) -> dict[int, CkptEntry]:
    return {r: idx.entries[name] for r, idx in indexes.items() if name in idx.entries}


def _resolve(name: str, indexes: Mapping[int, CkptIndex], strategy: Strategy | None) -> SourceParam:
    holders = _holders(name, indexes)
    if strategy is not None and name in strategy.layouts:
        return _resolve_laid_out(name, holders, indexes, strategy)
    return _resolve_whole(name, holders, indexes)


def _check_same_type(name: str, holders: Mapping[int, CkptEntry], indexes: Mapping[int, CkptIndex]) -> None:
    first_rank, first = next(iter(holders.items()))
    for r, e in holders.items():
        if e.tensor_type != first.tensor_type:
            raise LayoutMismatchError(
                f"parameter {name!r} is {first.tensor_type} in {indexes[first_rank].path} (rank {first_rank}) "
                f"but {e.tensor_type} in {indexes[r].path} (rank {r})")


def _resolve_whole(name: str, holders: Mapping[int, CkptEntry], indexes: Mapping[int, CkptIndex]) -> SourceParam:
    _check_same_type(name, holders, indexes)
    first_rank, first = next(iter(holders.items()))
    for r, e in holders.items():
        if e.shape != first.shape or (e.is_str and e.nbytes != first.nbytes):
            raise LayoutMismatchError(
                f"parameter {name!r} is not in the strategy, so it must be whole on every rank, but it has "
                f"shape {list(first.shape)} in {indexes[first_rank].path} (rank {first_rank}) and "
                f"{list(e.shape)} in {indexes[r].path} (rank {r}); pass the strategy file that describes it")
    ranks = tuple(holders)
    sl = SourceSlice(Box.full(first.shape), ranks, tuple(holders[r] for r in ranks),
                     tuple(indexes[r].path for r in ranks))
    return SourceParam(name, first.tensor_type, first.dtype, first.shape, (sl,), False)


def _resolve_laid_out(name: str, holders: Mapping[int, CkptEntry], indexes: Mapping[int, CkptIndex],
                      strategy: Strategy) -> SourceParam:
    expected = strategy.ranks_holding(name)
    missing = [r for r in expected if r not in holders]
    if missing:
        r = missing[0]
        raise LayoutMismatchError(
            f"parameter {name!r} is missing from {indexes[r].path} (rank {r}); the strategy places it on "
            f"ranks {_ranges(expected)}. The file may be truncated or from another job")
    extra = [r for r in holders if r not in expected]
    if extra:
        r = extra[0]
        raise LayoutMismatchError(
            f"parameter {name!r} is in {indexes[r].path} (rank {r}) but the strategy places it only on ranks "
            f"{_ranges(expected)}; is the strategy file from this job?")
    _check_same_type(name, holders, indexes)
    first = holders[expected[0]]
    if first.is_str:
        raise LayoutMismatchError(f"parameter {name!r} is a string value but the strategy splits it")
    shapes = {}
    for r in expected:
        layout = strategy.layout(name, r)
        if layout is None:
            raise LayoutMismatchError(f"parameter {name!r}: the strategy gives rank {r} no layout")
        try:
            shapes[r] = layout.global_shape(holders[r].shape)
        except StrategyError as e:
            raise LayoutMismatchError(f"parameter {name!r} in {indexes[r].path} (rank {r}): {e}") from None
    shape = shapes[expected[0]]
    for r, s in shapes.items():
        if s != shape:
            raise LayoutMismatchError(
                f"parameter {name!r} has local shape {list(first.shape)} in {indexes[expected[0]].path} "
                f"(rank {expected[0]}) but {list(holders[r].shape)} in {indexes[r].path} (rank {r}); with the "
                f"strategy's layout these give global shapes {list(shape)} and {list(s)}")
    groups: dict[Box, list[int]] = {}
    for r in expected:
        try:
            box = strategy.box(name, r, shape)
        except StrategyError as e:
            raise LayoutMismatchError(f"parameter {name!r} of global shape {list(shape)}: {e}") from None
        if box is None:
            raise LayoutMismatchError(f"parameter {name!r}: the strategy places it on rank {r} but gives it no slice")
        if box.shape != holders[r].shape:
            raise LayoutMismatchError(
                f"parameter {name!r} in {indexes[r].path} (rank {r}) has shape {list(holders[r].shape)} but the "
                f"strategy gives rank {r} a slice of shape {list(box.shape)}")
        groups.setdefault(box, []).append(r)
    slices = tuple(SourceSlice(b, tuple(rs), tuple(holders[r] for r in rs), tuple(indexes[r].path for r in rs))
                   for b, rs in sorted(groups.items(), key=lambda kv: kv[0].start))
    return SourceParam(name, first.tensor_type, first.dtype, shape, slices, True)


def _ranges(ranks: Sequence[int]) -> str:
    if ranks and list(ranks) == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}..{ranks[-1]}"
    return ", ".join(map(str, ranks))


def resolve_source(src: str | os.PathLike[str], strategy: Sequence[str | os.PathLike[str]] = (), *,
                   step: int | None = None, prefix: str | None = None, verify_crc: bool = False,
                   check_layout: bool = True) -> DistributedSource:
    """Open ``src`` (a folder of ``rank_<i>/`` or one checkpoint file) with its strategy files."""
    strat: Strategy | None = load_strategy(list(strategy)) if strategy else None
    p = Path(src)
    if p.is_file():
        if strat is not None and strat.world_size != 1:
            raise LayoutMismatchError(f"{p} is a single checkpoint file but the strategy describes "
                                      f"{strat.world_size} ranks; pass the folder of rank_<i>/ instead")
        return open_source({0: p}, strat, verify_crc=verify_crc, check_layout=check_layout)
    if not p.exists():
        raise MissingFileError(errno.ENOENT, f"no checkpoint file or folder at {p}", str(p))
    return open_source(find_rank_files(p, step=step, prefix=prefix), strat, verify_crc=verify_crc,
                       check_layout=check_layout)
