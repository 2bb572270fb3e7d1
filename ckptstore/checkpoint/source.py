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
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ckptstore.boxes import Box
from ckptstore.checkpoint.layout import Layout, stage_slices
from ckptstore.checkpoint.layout_check import Sampler, check_against_strategy
from ckptstore.checkpoint.params import SourceParam, SourceSlice
from ckptstore.checkpoint.rank_bytes import RankFiles
from ckptstore.checkpoint.rank_files import (  # noqa: F401  (find_rank_files, pick_rank_file re-exported)
    RankFileChoice,
    choose_rank_files,
    find_rank_files,
    pick_rank_file,
    scan_rank_file,
)
from ckptstore.checkpoint.strategy import Strategy, StrategyPaths, load_strategy
from ckptstore.errors import LayoutMismatchError, MissingFileError, MissingRankError, StrategyError
from ckptstore.formats.ckpt_cipher import Decryption
from ckptstore.formats.ckpt_reader import CkptEntry, CkptIndex
from ckptstore.io.locations import is_url
from ckptstore.io.s3_source import READ_CONCURRENCY as S3_READ_CONCURRENCY


@dataclass(frozen=True)
class DistributedSource:
    """Rank files, their indexes and the global parameters they make up.

    ``integrated_save`` is true when the rank files hold whole tensors although the strategy
    splits them (``save_checkpoint(integrated_save=True)``); parameters are then whole.
    ``unsaved`` names what the strategy lays out and no rank file holds (see :func:`open_source`).
    ``files`` reads the rank files (through the load's planner and executor) and keeps them open
    for whoever reads them next; close the source after use.
    """

    rank_files: Mapping[int, str]
    indexes: Mapping[int, CkptIndex]
    strategy: Strategy | None
    params: Mapping[str, SourceParam]
    integrated_save: bool = False
    files: RankFiles = field(default_factory=lambda: RankFiles(()), compare=False, repr=False)
    #: parameters the strategy lays out but no rank file holds: not saved (a filtered save), so not stored
    unsaved: tuple[str, ...] = ()
    #: which checkpoint was taken when rank folders held several, and why (see ``choose_rank_files``)
    chosen: str | None = None

    @property
    def world_size(self) -> int:
        return len(self.rank_files)

    def close(self) -> None:
        self.files.close()


def _scan_all(files: Mapping[int, str], verify_crc: bool, decryption: Decryption | None = None) -> dict[int, CkptIndex]:
    """Every rank file's index; files in object storage are scanned many at once (each header
    read is a round trip there).

    Local files are scanned one after another: spreading them over processes would need
    ``spawn``, which re-imports the caller's main module (a training script without a
    ``__main__`` guard would run again), and saved only 2 of 12 s on the 128-file benchmark here.
    """
    if not any(is_url(p) for p in files.values()) or len(files) == 1:
        return {r: scan_rank_file(p, verify_crc=verify_crc, decryption=decryption) for r, p in files.items()}
    with ThreadPoolExecutor(min(len(files), S3_READ_CONCURRENCY), thread_name_prefix="ckptstore-scan") as pool:
        done = {r: pool.submit(scan_rank_file, p, verify_crc=verify_crc, decryption=decryption)
                for r, p in files.items()}
        return {r: f.result() for r, f in done.items()}


def open_source(rank_files: Mapping[int, str | os.PathLike[str]], strategy: Strategy | None, *,
                verify_crc: bool = False, check_layout: bool = True,
                keep: Callable[[list[str]], Iterable[str]] | None = None,
                decryption: Decryption | None = None) -> DistributedSource:
    """Scan every rank file and resolve each parameter's global shape and slices.

    With ``strategy=None`` every parameter must have the same shape on every rank that holds it
    (a single file, or a purely data-parallel job). With ``check_layout`` (the default) a few
    bytes of every slice are sampled to prove the strategy describes the files
    (:mod:`ckptstore.checkpoint.layout_check`); files saved with ``integrated_save=True`` are recognised
    there and taken as whole tensors. Raises :class:`~ckptstore.errors.LayoutMismatchError` or
    :class:`~ckptstore.errors.MissingRankError` naming the file, rank and parameter when the
    files and the strategy disagree.

    A parameter the strategy lays out that *no* rank file holds was not saved: MindFormers'
    ``CheckpointMonitor`` filters saves (``accu_grads.*``, ``*_cache``, ``expert_load``) while
    the strategy still lists them, and ``transform_checkpoints`` leaves them out. It is skipped
    and named in ``unsaved``. One missing from only *some* of the ranks that must hold it stays
    an error. ``keep`` (``--include``/``--exclude``/``--drop-optimizer``) takes every name at once and
    returns those to keep, before any of these checks. ``decryption`` (key, mode or ``None``) reads
    rank files saved with ``enc_key`` as their plaintext (:mod:`ckptstore.formats.ckpt_cipher`).
    """
    files = {r: os.fspath(p) for r, p in sorted(rank_files.items())}
    if strategy is not None and strategy.world_size != len(files):
        told = f"the strategy describes {strategy.world_size} ranks but {len(files)} rank files were found"
        missing = [r for r in range(strategy.world_size) if r not in files]
        extra = [r for r in files if r >= strategy.world_size]
        more = ", ..." if len(extra) > 1 else ""
        culprit = (f"no checkpoint file for rank(s) {_ranges(missing)} (rank_{missing[0]}/ is missing)" if missing
                   else f"rank(s) {_ranges(extra)} are not in it ({files[extra[0]]}{more})")
        raise MissingRankError(f"{told}: {culprit}; strategy file(s): {', '.join(strategy.sources)}")
    indexes = _scan_all(files, verify_crc, decryption)
    held = dict.fromkeys(n for idx in indexes.values() for n in idx.entries)
    laid_out = [] if strategy is None else [n for n in strategy.names() if n not in held]
    # the selection sees every name at once: optimizer state is recognised by its parameter's name
    kept = None if keep is None else set(keep(list(held) + laid_out))
    names = [n for n in held if kept is None or n in kept]
    unsaved = tuple(n for n in laid_out if kept is None or n in kept)
    params: dict[str, SourceParam] = {}
    uncovered: _Uncovered | None = None
    for n in names:
        try:
            params[n] = _resolve(n, indexes, strategy)
        except _Uncovered as e:  # reported after the check below, which says more about a cut file
            uncovered = uncovered or e
    _check_redundancy(params, indexes)
    if uncovered is not None:
        raise uncovered
    opened = RankFiles([idx.path for idx in indexes.values()], decryption)  # the paths slices name their files by
    integrated = False
    if check_layout and len(files) > 1:
        try:
            _check_counters(params, Sampler(opened))
            verdict = check_against_strategy(params, Sampler(opened), strategy_given=strategy is not None)
        except BaseException:
            opened.close()
            raise
        if verdict.integrated:
            integrated = True
            params = {n: _resolve_whole(n, _holders(n, indexes), indexes) for n in names}
    if strategy is not None and not integrated:
        _check_declared_shapes(params, strategy)
        strategy = strategy.fitted({n: p.shape for n, p in params.items() if p.in_strategy})
    return DistributedSource(files, indexes, strategy, params, integrated, opened, unsaved)


#: Counters a training save appends (``Model.train``'s ``epoch_num``/``step_num``, optimizers' ``global_step``):
#: equal on every rank of one checkpoint, so ranks that differ hold checkpoints of different steps.
STEP_COUNTERS = ("epoch_num", "step_num", "global_step", "current_iterator_step")


def _check_counters(params: Mapping[str, SourceParam], sampler: Sampler) -> None:
    """Refuse rank files of different training steps, naming the counters that tell, before the
    sampled layout check would blame the strategy (a folder of mixed checkpoints is no wrong strategy)."""
    for name in STEP_COUNTERS:
        p = params.get(name)
        if p is None or p.in_strategy or p.is_str or len(p.slices) != 1 or p.slices[0].entry.nbytes > 64:
            continue
        sl = p.slices[0]
        values: dict[str, list[int]] = {}
        for rank, entry, path in zip(sl.ranks, sl.entries, sl.paths, strict=True):
            raw = np.frombuffer(sampler.read(path, entry, 0, entry.nbytes), dtype=entry.dtype)
            values.setdefault(", ".join(str(v) for v in raw.tolist()), []).append(rank)
        if len(values) > 1:
            shown = "; ".join(f"{v} in rank(s) {_ranges(rs)} ({sl.paths[sl.ranks.index(rs[0])]})"
                              for v, rs in list(values.items())[:4])
            raise LayoutMismatchError(
                f"the rank files are of different training steps: {name} is {shown}. The folder mixes checkpoints "
                "(a save cut short, or files of several runs); choose one with --epoch and --step, or --prefix")


def _check_declared_shapes(params: Mapping[str, SourceParam], strategy: Strategy) -> None:
    """Global shapes the rank files imply against those a JSON strategy declares (``tensor_shape``).

    Rank files of another layout can agree with a strategy in every shape and every sampled
    byte: ranks 0-3 of a dp 2 x mp 4 job with optimizer sharding, under an mp 4 strategy, hold
    distinct slices of the shapes that strategy gives a tensor of half the rows. Only a declared
    global shape tells them apart; the protobuf form MindSpore's compiler writes declares none
    (a MindFormers ``param_split_shape`` does: checked in :func:`~ckptstore.checkpoint.layout.stage_slices`).
    """
    for p in params.values():
        if not p.in_strategy:
            continue
        for layout in strategy.layouts[p.name].values():
            try:
                layout.check_tensor_shape(p.shape)
            except StrategyError as e:
                sl = p.slices[0]
                raise LayoutMismatchError(
                    f"parameter {p.name!r}: its slices in the rank files (shape {list(sl.entry.shape)} in {sl.path}, "
                    f"rank {sl.rank}) make a tensor of shape {list(p.shape)} under the strategy's layout, but {e}. "
                    "The rank files are of another layout or job (some ranks of a larger one?)") from None


class _Uncovered(LayoutMismatchError):
    """No rank file holds some slice of a parameter."""


def _check_redundancy(params: Mapping[str, SourceParam], indexes: Mapping[int, CkptIndex]) -> None:
    """Replicated slices are on all the ranks of their group (a full save) or, for most of them,
    on one (``remove_redundancy=True``): when most slices are on every rank of their group, one
    that is missing from some is a damaged file (a file cut between two records is valid
    protobuf), named here in the files' parameter order."""
    replicated = [(p, sl) for p in params.values() for sl in p.slices if len(sl.group) > 1]
    short = [(p, sl) for p, sl in replicated if len(sl.ranks) < len(sl.group)]
    if not short or 2 * len(short) > len(replicated):
        return  # every replica present, or a redundancy-free save (extra copies do no harm)
    p, sl = short[0]
    r = next(r for r in sl.group if r not in sl.ranks)
    raise LayoutMismatchError(
        f"parameter {p.name!r} is missing from {indexes[r].path} (rank {r}), though rank(s) {_ranges(sl.ranks)} hold "
        f"the same slice and other replicated parameters are on every rank of their group (so this is not a "
        "redundancy-free save). The file may be truncated or from another job")


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
    """The global shape and slices of a parameter the strategy lays out.

    Not every rank the strategy places a slice on need hold it: ``remove_redundancy=True``
    saves each replicated slice on one rank of its group only. Every slice must be held by at
    least one of its ranks. A parameter shared by several pipeline stages with different layouts
    (a tied embedding, whole on the first stage and split on the last) is stored from the
    lowest stage whose ranks hold all of it; the other stages' copies are kept as ``copies``,
    checked against it.
    """
    expected = strategy.ranks_holding(name)
    placed = set(expected)
    extra = [r for r in holders if r not in placed]
    if extra:
        r = extra[0]
        raise LayoutMismatchError(
            f"parameter {name!r} is in {indexes[r].path} (rank {r}) but the strategy places it only on ranks "
            f"{_ranges(expected)}; is the strategy file from this job?")
    _check_same_type(name, holders, indexes)
    first_rank = min(holders)
    first = holders[first_rank]
    if first.is_str:
        raise LayoutMismatchError(f"parameter {name!r} is a string value but the strategy splits it")
    shape = _global_shape(name, holders, indexes, strategy, first_rank)
    stages: dict[int, dict[Box, list[int]]] = {}
    sd = strategy.stage_devices
    for stage in sorted(strategy.layouts[name]):
        layout = strategy.layouts[name][stage]
        try:
            boxes, groups = stage_slices(layout, shape, sd)
        except StrategyError as e:
            raise LayoutMismatchError(f"parameter {name!r} of global shape {list(shape)}: {e}") from None
        base = stage * sd
        for r in range(base, base + sd):
            if r in holders and boxes[r - base].shape != holders[r].shape:
                raise LayoutMismatchError(
                    f"parameter {name!r} in {indexes[r].path} (rank {r}) has shape {list(holders[r].shape)} but the "
                    f"strategy gives rank {r} a slice of shape {list(boxes[r - base].shape)}")
        stages[stage] = {b: [base + i for i in members] for b, members in groups}

    def held(groups: Mapping[Box, list[int]]) -> tuple[SourceSlice, ...]:
        out = []
        for b, rs in sorted(groups.items(), key=lambda kv: kv[0].start):
            have = [r for r in rs if r in holders]
            if have:
                out.append(SourceSlice(b, tuple(have), tuple(holders[r] for r in have),
                                       tuple(indexes[r].path for r in have), tuple(rs)))
        return tuple(out)

    # stages whose ranks, between them, hold every slice of their layout
    complete = [s for s, groups in sorted(stages.items()) if all(any(r in holders for r in rs)
                                                                 for rs in groups.values())]
    if not complete:
        lowest = min(stages)
        box, rs = next((b, rs) for b, rs in stages[lowest].items() if not any(r in holders for r in rs))
        raise _Uncovered(
            f"no rank holds the slice {_box(box)} of parameter {name!r} (global shape {list(shape)}); ranks "
            f"{_ranges(rs)} should have held it. Their files may be truncated or from another job")
    supplier = complete[0]
    copies = tuple(sl for s, groups in sorted(stages.items()) if s != supplier for sl in held(groups))
    return SourceParam(name, first.tensor_type, first.dtype, shape, held(stages[supplier]), True, copies)


def _global_shape(name: str, holders: Mapping[int, CkptEntry], indexes: Mapping[int, CkptIndex],
                  strategy: Strategy, first_rank: int) -> tuple[int, ...]:
    """The global shape every holder's local shape gives under its stage's layout (they must agree)."""
    shapes = {}
    seen: dict[tuple[Layout | None, tuple[int, ...]], tuple[int, ...]] = {}  # a few pairs, many ranks
    layouts, sd = strategy.layouts[name], strategy.stage_devices  # holders are ranks of the strategy
    for r, entry in holders.items():
        layout = layouts.get(r // sd)
        if layout is None:
            raise LayoutMismatchError(f"parameter {name!r}: the strategy gives rank {r} no layout")
        key = (layout, entry.shape)
        if key not in seen:
            try:
                seen[key] = layout.global_shape(entry.shape)
            except StrategyError as e:
                if layout.tensor_shape and len(layout.tensor_map) != len(entry.shape):
                    # a JSON layout that no reading of its flattened Layout tuples fits: the strategy's fault
                    raise StrategyError(f"strategy file {', '.join(strategy.sources) or '(in memory)'}: parameter "
                                        f"{name!r}: {e}; its tensor_shape {list(layout.tensor_shape)} is no reshape "
                                        f"of the rank files' slices (rank {r}: {indexes[r].path})") from None
                raise LayoutMismatchError(f"parameter {name!r} in {indexes[r].path} (rank {r}): {e}") from None
        shapes[r] = seen[key]
    shape = shapes[first_rank]
    for r, other in shapes.items():
        if other != shape:
            raise LayoutMismatchError(
                f"parameter {name!r} has local shape {list(holders[first_rank].shape)} in {indexes[first_rank].path} "
                f"(rank {first_rank}) but {list(holders[r].shape)} in {indexes[r].path} (rank {r}); with the "
                f"strategy's layout these give global shapes {list(shape)} and {list(other)}")
    return shape


def _box(box: Box) -> str:
    return " x ".join(f"[{a}:{b})" for a, b in zip(box.start, box.stop, strict=True))


def _ranges(ranks: Sequence[int]) -> str:
    if ranks and list(ranks) == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}..{ranks[-1]}"
    return ", ".join(map(str, ranks))


def resolve_source(src: str | os.PathLike[str], strategy: StrategyPaths = (), *,
                   step: int | None = None, prefix: str | None = None, verify_crc: bool = False,
                   check_layout: bool = True, src_format: str | None = None,
                   keep: Callable[[list[str]], Iterable[str]] | None = None,
                   epoch: int | None = None, decryption: Decryption | None = None) -> DistributedSource:
    """Open ``src`` (a folder of ``rank_<i>/`` or one ``.ckpt``/``.safetensors`` file) with its
    strategy files (or folders of them); ``step``, ``epoch``, ``prefix`` and ``src_format`` choose
    each rank's file (one checkpoint every rank holds, see
    :func:`~ckptstore.checkpoint.rank_files.choose_rank_files`; the source's ``chosen`` says what was
    taken when there was a choice), ``keep`` the parameters, ``decryption`` the key of files saved
    with ``enc_key`` (see :func:`open_source`)."""
    strat: Strategy | None = load_strategy(strategy) if strategy else None
    if is_url(src):
        if str(src).endswith((".ckpt", ".safetensors")):
            p: Any = str(src)
            if strat is not None and strat.world_size != 1:
                raise LayoutMismatchError(f"{p} is a single checkpoint file but the strategy describes "
                                          f"{strat.world_size} ranks; pass the prefix that holds rank_<i>/ instead")
            return open_source({0: p}, strat, verify_crc=verify_crc, check_layout=check_layout, keep=keep,
                               decryption=decryption)
        return _open_chosen(choose_rank_files(src, step=step, prefix=prefix, fmt=src_format, epoch=epoch), strat,
                            verify_crc=verify_crc, check_layout=check_layout, keep=keep,
                            decryption=decryption)
    p = Path(src)
    if p.is_file():
        if strat is not None and strat.world_size != 1:
            raise LayoutMismatchError(f"{p} is a single checkpoint file but the strategy describes "
                                      f"{strat.world_size} ranks; pass the folder of rank_<i>/ instead")
        return open_source({0: p}, strat, verify_crc=verify_crc, check_layout=check_layout, keep=keep,
                           decryption=decryption)
    if not p.exists():
        raise MissingFileError(errno.ENOENT, f"no checkpoint file or folder at {p}", str(p))
    return _open_chosen(choose_rank_files(p, step=step, prefix=prefix, fmt=src_format, epoch=epoch), strat,
                        verify_crc=verify_crc, check_layout=check_layout, keep=keep,
                        decryption=decryption)


def _open_chosen(choice: RankFileChoice, strategy: Strategy | None, **options: Any) -> DistributedSource:
    source = open_source(choice.files, strategy, **options)
    return source if choice.note is None else replace(source, chosen=choice.note)
