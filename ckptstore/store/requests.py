"""Cut a read's byte ranges into requests: the request coalescing of the read planner (pure; no I/O).

:mod:`ckptstore.store.read_plan` works out which byte ranges fill which bytes of a destination
(the geometry); :func:`plan_requests` decides how those ranges are fetched. Per file it compares
three coalescing modes (:data:`COALESCE_MODES`), priced by the source's
:class:`~ckptstore.io.base.ReadCost`: exact ranges (one request per run contiguous in the file),
merged spans (one request also reads a gap shorter than what a request's latency would transfer)
and whole spans (one request per file region up to the source's limits, every gap read), and
keeps the one of least modelled time (``coalesce="auto"``), or applies the one asked for.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ckptstore.io.base import ReadCost

#: Up to this many ranges, :func:`plan_requests` works with plain ints.
FEW_RANGES = 32
_ONE = np.array([0, 1], dtype=np.int64)
_ONE.flags.writeable = False
#: How a file's ranges become requests (:func:`plan_requests`); ``"auto"`` picks per file.
COALESCE_MODES = ("exact", "merged", "whole")

#: Range columns, int64 arrays of one row per range: ``(files, offsets, lengths, dests)``.
Columns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
#: The columns of :data:`Columns` sorted into requests, and the request boundaries ``cuts``.
Requests = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def check_coalesce(coalesce: str) -> None:
    """Raise ``ValueError`` unless ``coalesce`` is ``"auto"`` or one of :data:`COALESCE_MODES`."""
    if coalesce != "auto" and coalesce not in COALESCE_MODES:
        raise ValueError(f"coalesce must be 'auto' or one of {', '.join(COALESCE_MODES)}, not {coalesce!r}")


def plan_requests(cols: Columns, cost: ReadCost, coalesce: str = "auto",
                  within: Iterable[tuple[int, int, int]] | None = None) -> Requests:
    """``(files, offsets, lengths, dests, cuts)``: the ranges ``cols`` cut to the source's request
    size and sorted by file and offset, and the request boundaries ``cuts`` (request ``k`` reads
    ranges ``cuts[k]:cuts[k + 1]`` in one call, see :attr:`ReadGroup.cuts`).

    ``within`` are the ``(file, start, end)`` extents a request may read (the chunks the ranges
    come from; ``None``: the ranges only): a gap is read only inside one of them, so no request
    reads a byte of another parameter, a header, or a chunk the plan does not need.

    Every mode respects the source's limits on one request (its length, its buffers, its
    longest gap: see :class:`~ckptstore.io.base.ReadCost`); within them, ``"exact"`` starts a
    request at every gap, ``"merged"`` at gaps longer than :attr:`ReadCost.gap_bytes` and
    ``"whole"`` only where a limit says so. ``"auto"`` takes, per file, the mode of least
    :meth:`ReadCost.seconds` (a tie goes to the one fetching fewer bytes: exact, merged, whole).
    """
    if len(cols[0]) == 1 and int(cols[2][0]) <= cost.max_request_bytes:  # most parameters: one range
        return cols[0], cols[1], cols[2], cols[3], _ONE
    if len(cols[0]) <= FEW_RANGES and int(cols[2].max(initial=0)) <= cost.max_request_bytes:
        return _plan_few(cols, cost, coalesce, within)
    files, offsets, lengths, dests = _split_long(cols, cost.max_request_bytes)
    n = len(files)
    if n == 0:
        return files, offsets, lengths, dests, np.zeros(1, dtype=np.int64)
    if n > 1 and not (np.all(files[1:] >= files[:-1])
                      and np.all((files[1:] > files[:-1]) | (offsets[1:] > offsets[:-1]))):
        order = np.lexsort((offsets, files))
        files, offsets, lengths, dests = files[order], offsets[order], lengths[order], dests[order]
    ends = offsets + lengths
    gaps = offsets[1:] - ends[:-1]
    hard = (files[1:] != files[:-1]) | (gaps < 0)  # another file; (overlapping ranges: never in one request)
    size = cost.max_request_bytes
    hard |= (offsets[1:] // size) != (offsets[:-1] // size)  # a request spans at most about its size
    if cost.max_gap_bytes is not None:
        hard |= gaps > cost.max_gap_bytes
    if within is None:
        hard |= gaps > 0
    else:
        region = _regions(files, offsets, within)
        hard |= region[1:] != region[:-1]
    if cost.max_buffers is not None:  # each range takes a buffer, each gap before it another
        used = np.cumsum(np.concatenate([[1], 1 + (gaps > 0)]))
        slot = (used - 1) // max(2, cost.max_buffers)
        hard |= slot[1:] != slot[:-1]
    starts = {"exact": hard | (gaps != 0), "merged": hard | (gaps > cost.gap_bytes), "whole": hard}
    if coalesce != "auto":
        breaks = starts[coalesce]
    else:
        nfiles = int(files.max()) + 1
        times = []
        for name in COALESCE_MODES:
            first = np.flatnonzero(np.concatenate([[True], starts[name]]))
            last = np.concatenate([first[1:], [n]]) - 1
            f = files[first]
            count = np.bincount(f, minlength=nfiles)
            fetched = np.bincount(f, weights=ends[last] - offsets[first], minlength=nfiles)
            times.append(count * cost.request_seconds / cost.in_flight + fetched / cost.bytes_per_second)
        best = np.argmin(np.stack(times), axis=0)  # per file; argmin keeps the first of equals
        choice = best[files[1:]]
        breaks = np.choose(choice, [starts[name] for name in COALESCE_MODES])
    cuts = np.concatenate([[0], np.flatnonzero(breaks) + 1, [n]]).astype(np.int64)
    return files, offsets, lengths, dests, cuts


def _plan_few(cols: Columns, cost: ReadCost, coalesce: str,
              within: Iterable[tuple[int, int, int]] | None) -> Requests:
    """:func:`plan_requests` for a few ranges none longer than a request, with plain ints (numpy's
    cost per call would be most of the work): the same rules, the same result."""
    order = sorted(range(len(cols[0])), key=lambda i: (int(cols[0][i]), int(cols[1][i])))
    files, offsets, lengths, dests = ([int(c[i]) for i in order] for c in cols)
    extents = None if within is None else _merged(within)
    size, gap_ok, max_gap, most = cost.max_request_bytes, cost.gap_bytes, cost.max_gap_bytes, cost.max_buffers
    used = [1]  # buffers, gaps included, up to each range (as the numpy rule counts them)
    region = []
    for i in range(len(files)):
        if i:
            used.append(used[-1] + 1 + (offsets[i] > offsets[i - 1] + lengths[i - 1]))
        if extents is not None:  # the file's last extent starting at or before the range (else its first)
            mine = [j for j, (f, _, _) in enumerate(extents) if f == files[i]]
            before = [j for j in mine if extents[j][1] <= offsets[i]]
            region.append(before[-1] if before else mine[0] if mine else -1)
    starts: dict[str, list[bool]] = {s: [] for s in COALESCE_MODES}
    for i in range(1, len(files)):
        gap = offsets[i] - offsets[i - 1] - lengths[i - 1]
        hard = (files[i] != files[i - 1] or gap < 0 or offsets[i] // size != offsets[i - 1] // size
                or (max_gap is not None and gap > max_gap) or (extents is None and gap > 0)
                or (extents is not None and region[i] != region[i - 1])
                or (most is not None and (used[i] - 1) // max(2, most) != (used[i - 1] - 1) // max(2, most)))
        starts["exact"].append(hard or gap != 0)
        starts["merged"].append(hard or gap > gap_ok)
        starts["whole"].append(hard)
    if coalesce == "auto":
        best: dict[int, tuple[float, str]] = {}
        for name in COALESCE_MODES:
            per_file: dict[int, list[int]] = {}
            first = 0
            for i in range(1, len(files) + 1):
                if i == len(files) or starts[name][i - 1]:
                    t = per_file.setdefault(files[first], [0, 0])
                    t[0] += 1
                    t[1] += offsets[i - 1] + lengths[i - 1] - offsets[first]
                    first = i
            for f, (count, fetched) in per_file.items():
                seconds = count * cost.request_seconds / cost.in_flight + fetched / cost.bytes_per_second
                if f not in best or seconds < best[f][0]:
                    best[f] = (seconds, name)
        breaks = [starts[best[files[i]][1]][i - 1] for i in range(1, len(files))]
    else:
        breaks = starts[coalesce]
    cuts = [0, *(i + 1 for i, b in enumerate(breaks) if b), len(files)]
    out = [np.array(v, dtype=np.int64) for v in (files, offsets, lengths, dests, cuts)]
    return out[0], out[1], out[2], out[3], out[4]


def _merged(within: Iterable[tuple[int, int, int]]) -> list[list[int]]:
    """``within``'s extents sorted, those touching or overlapping in one file joined."""
    merged: list[list[int]] = []
    for f, a, b in sorted(within):
        if merged and merged[-1][0] == f and a <= merged[-1][2]:
            merged[-1][2] = max(merged[-1][2], b)
        else:
            merged.append([f, a, b])
    return merged


def _regions(files: np.ndarray, offsets: np.ndarray, within: Iterable[tuple[int, int, int]]) -> np.ndarray:
    """For each range, the index of the merged extent of ``within`` holding its start (ranges
    of one index may share a request: the bytes between them belong to the extents)."""
    merged = _merged(within)
    if len(merged) == 1:
        return np.zeros(len(files), dtype=np.int64)
    out = np.full(len(files), -1, dtype=np.int64)
    by_file: dict[int, list[int]] = {}
    for k, (f, _, _) in enumerate(merged):
        by_file.setdefault(f, []).append(k)
    for f, ks in by_file.items():  # a plan reads few files: a search per file
        rows = files == f
        starts = np.array([merged[k][1] for k in ks], dtype=np.int64)
        out[rows] = np.asarray(ks, dtype=np.int64)[np.maximum(np.searchsorted(starts, offsets[rows], "right") - 1, 0)]
    return out


def _split_long(cols: Columns, unit: int) -> Columns:
    """The same ranges, those longer than ``unit`` cut into consecutive pieces of at most ``unit``
    (several requests, so that several threads or connections share a long run)."""
    files, offsets, lengths, dests = cols
    pieces = -(-lengths // unit)
    if not len(pieces) or pieces.max() <= 1:
        return files, offsets, lengths, dests
    index = np.repeat(np.arange(len(pieces)), pieces)
    step = np.arange(len(index)) - np.repeat(np.cumsum(pieces) - pieces, pieces)  # 0, 1, .. within a range
    shift = step * unit
    return files[index], offsets[index] + shift, np.minimum(unit, lengths[index] - shift), dests[index] + shift
