"""Does the strategy describe these rank files? A check of a few sampled bytes.

Shapes alone agree with many wrong strategies: a strategy file cut short at an item boundary
(the parameters it no longer lists look like whole tensors), one of another layout with the
same world size, or rank files saved with ``integrated_save=True`` (every rank holds whole
tensors where the strategy says split). Bytes tell them apart. Ranks the strategy calls
replicas of a slice must hold the same bytes; ranks it gives *different* slices of a trained
tensor practically never do, unless every element of the sample is the same value (zeros of
a fresh optimizer moment, a LayerNorm gamma of ones), which proves nothing and is skipped.

For each parameter, up to :data:`SLICES` of its distinct slices (evenly spread, first and last
included) and up to :data:`MEMBERS` ranks of each of their replica groups are sampled, each
sample being the first and last :data:`WINDOW` bytes of the rank's slice, so the check reads at
most a few hundred KiB per parameter, whatever the checkpoint size or the number of ranks.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import crc32c
import numpy as np

from ckptstore.boxes import Box
from ckptstore.checkpoint.params import SourceParam, SourceSlice
from ckptstore.checkpoint.rank_bytes import RankFiles
from ckptstore.errors import LayoutMismatchError, ReplicaMismatchError
from ckptstore.formats.ckpt_reader import CkptEntry

WINDOW = 1024
MEMBERS = 4
SLICES = 16


@dataclass(frozen=True)
class Sample:
    """A digest of a slice's sampled bytes, and whether they are all one repeated value."""

    digest: int
    trivial: bool


class Sampler:
    """Reads and digests samples of rank-file entries (the files stay open for the next sample)."""

    def __init__(self, files: RankFiles) -> None:
        self.files = files
        self._cache: dict[tuple[str, str], Sample] = {}

    def read(self, path: str, entry: CkptEntry, start: int, nbytes: int) -> bytes:
        """Bytes ``[start, start + nbytes)`` of an entry (its pieces concatenated)."""
        buf = bytearray(nbytes)
        self.files.read_windows(path, entry, [(start, memoryview(buf))])
        return bytes(buf)

    def sample(self, path: str, entry: CkptEntry) -> Sample:
        key = (path, entry.name)
        if key not in self._cache:
            self._cache[key] = self._take(path, entry)
        return self._cache[key]

    def _take(self, path: str, entry: CkptEntry) -> Sample:
        n = entry.nbytes
        head = min(WINDOW, n)
        tail = min(WINDOW, n - head)
        buf = bytearray(head + tail)
        self.files.read_windows(path, entry, [(0, memoryview(buf)[:head]), (n - tail, memoryview(buf)[head:])])
        item = entry.dtype.itemsize
        values = np.frombuffer(buf, dtype=f"u{item}" if item in (1, 2, 4, 8) else "u1")
        trivial = values.size == 0 or bool(np.all(values == values[0]))
        return Sample(crc32c.crc32c(buf), trivial)


def spread(items: Sequence[object], k: int = MEMBERS) -> list[int]:
    """Up to ``k`` positions in ``items``, evenly spaced, first and last included."""
    n = len(items)
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


@dataclass(frozen=True)
class Verdict:
    """What the sampled bytes say: consistent, or every split parameter whole on every rank."""

    integrated: bool = False
    compared: int = 0


def check_against_strategy(params: Mapping[str, SourceParam], sampler: Sampler, *, strategy_given: bool) -> Verdict:
    """Sample every parameter's slices; raise :class:`LayoutMismatchError` when they contradict the
    layout the strategy gave them.

    ``params`` maps names to :class:`~ckptstore.checkpoint.params.SourceParam`. Returns a :class:`Verdict`
    whose ``integrated`` is true when *every* split parameter with an informative sample holds
    the same bytes on ranks the strategy gives different slices: the files were saved with
    ``integrated_save=True`` (whole tensors on every rank).
    """
    identical: list[tuple[str, tuple[int, int]]] = []
    distinct: list[str] = []
    compared = 0
    for p in params.values():
        if p.is_str:
            continue
        chosen = spread(p.slices, SLICES)
        for i in chosen:
            compared += _check_replicas(p, p.slices[i], sampler, strategy_given)
        for copy in p.copies:
            compared += _check_copy(p, copy, sampler)
        if len(p.slices) > 1:
            kind, pair = _compare_distinct(p, chosen, sampler)
            if kind == "collision":
                raise LayoutMismatchError(_same_bytes_message(p, pair, None))  # type: ignore[arg-type]  # pair: set
            if kind == "identical":
                identical.append((p.name, pair))  # type: ignore[arg-type]  # an "identical" pair is never None
            elif kind == "distinct":
                distinct.append(p.name)
    if identical and not distinct:
        return Verdict(integrated=True, compared=compared)
    if identical:
        name, pair = identical[0]
        raise LayoutMismatchError(_same_bytes_message(params[name], pair, distinct[0]))
    return Verdict(compared=compared)


def _same_bytes_message(p: SourceParam, pair: tuple[int, int], split_as_said: str | None) -> str:
    a, b = p.slices[pair[0]], p.slices[pair[1]]
    others = (f"; other parameters such as {split_as_said!r} are split as it says" if split_as_said else "")
    return (f"parameter {p.name!r}: rank {a.rank} ({a.path}) and rank {b.rank} ({b.path}) hold the same bytes, but "
            f"the strategy gives them different slices ({_box(a.box)} and {_box(b.box)}){others}. The strategy file "
            "does not describe these rank files (is it from another job or layout?). If ranks really hold identical "
            "slices, pass --no-layout-check")


def _check_replicas(p: SourceParam, sl: SourceSlice, sampler: Sampler, strategy_given: bool) -> int:
    members = spread(sl.ranks)
    first = members[0]
    ref = sampler.sample(sl.paths[first], sl.entries[first])
    for i in members[1:]:
        s = sampler.sample(sl.paths[i], sl.entries[i])
        if s.digest != ref.digest:
            error = ReplicaMismatchError if p.in_strategy else LayoutMismatchError
            raise error(_replica_message(p, sl, first, i, strategy_given))
    return len(members)


def _check_copy(p: SourceParam, copy: SourceSlice, sampler: Sampler) -> int:
    """Compare the start of another pipeline stage's copy (another layout) with the stored slices."""
    item = p.dtype.itemsize
    start = copy.box.start
    held = next((sl for sl in p.slices if sl.box.contains(Box(start, tuple(a + 1 for a in start)))), None)
    if held is None or not start:
        return 0
    # the first row segment of the copy, clipped to the stored slice that holds its first element:
    # contiguous in both, so one read on each side
    run = min(WINDOW // item or 1, copy.box.stop[-1] - start[-1], held.box.stop[-1] - start[-1])
    segment = Box(start, (*(a + 1 for a in start[:-1]), start[-1] + run))
    mine = sampler.read(copy.path, copy.entry, _offset(segment, copy.box) * item, run * item)
    theirs = sampler.read(held.path, held.entry, _offset(segment, held.box) * item, run * item)
    if mine != theirs:
        raise ReplicaMismatchError(
            f"parameter {p.name!r}: rank {copy.rank} ({copy.path}) holds a copy of it in another pipeline stage's "
            f"layout whose bytes at {_box(segment)} differ from rank {held.rank}'s ({held.path}); the copies of a "
            "shared parameter must agree")
    return 1


def _offset(inner: Box, outer: Box) -> int:
    """Element offset of ``inner.start`` in the C-order block ``outer``."""
    offset = 0
    for lo, olo, ohi in zip(inner.start, outer.start, outer.stop, strict=True):
        offset = offset * (ohi - olo) + (lo - olo)
    return offset


def _replica_message(p: SourceParam, sl: SourceSlice, i: int, j: int, strategy_given: bool) -> str:
    ri, rj = sl.ranks[i], sl.ranks[j]
    where = f"rank {ri} ({sl.paths[i]}) and rank {rj} ({sl.paths[j]})"
    if not p.in_strategy:
        why = ("the strategy does not describe it, so every rank should hold the whole tensor"
               if strategy_given else "no strategy was given, so every rank should hold the whole tensor")
        fix = ("The strategy file does not describe these rank files: it may be cut short, or from another job"
               if strategy_given else "Pass the strategy file the job wrote (--strategy)")
        return f"parameter {p.name!r}: {why}, but {where} hold different bytes. {fix}"
    return (f"parameter {p.name!r}: the strategy says {where} hold the same slice {_box(sl.box)}, but their bytes "
            "differ: one of the files is damaged, or the strategy file does not describe these rank files (another "
            "layout or job?)")


def _compare_distinct(p: SourceParam, chosen: Sequence[int],
                      sampler: Sampler) -> tuple[str, tuple[int, int] | None]:
    """``("identical"|"collision"|"distinct"|"unknown", (i, j))``: whether the first ranks of the
    ``chosen`` slices hold the same bytes (all of them, or two), naming two such slices."""
    samples = {i: sampler.sample(p.slices[i].path, p.slices[i].entry) for i in chosen}
    seen: dict[int, int] = {}
    pair = None
    for i, s in samples.items():
        if s.trivial:
            continue
        if s.digest in seen and pair is None:
            pair = (seen[s.digest], i)
        seen.setdefault(s.digest, i)
    informative = sum(not s.trivial for s in samples.values())
    if informative < 2:
        return "unknown", None
    if len(seen) == 1:
        return "identical", pair
    return ("collision", pair) if pair else ("distinct", None)


def _box(box: Box) -> str:
    return " x ".join(f"[{a}:{b})" for a, b in zip(box.start, box.stop, strict=True))
