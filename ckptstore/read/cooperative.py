"""Who reads what when ranks load together: the union of their needs, one owner per byte (pure; no I/O).

Every rank of a cooperating group states what it needs as byte ranges of the store's files,
tagged with the parameter they fill (:class:`Need`). :func:`plan_group` takes the union: per
parameter and file, the ranges are cut at every rank's range ends into *pieces*, each piece a
distinct run of bytes with the set of ranks that need it. Pieces longer than ``piece_bytes`` are
split, so that the reading of one large shared slice can be spread over its holders. Each piece
gets one owner among the ranks that need it, largest piece first onto the least-loaded of them,
loads priced by the store's :class:`~ckptstore.io.base.ReadCost` (a request's latency and the
bytes). The owner reads the piece from storage and sends it to the other ranks that need it and
to no one else. Pieces are then grouped, in order, into *windows* holding at most ``window_bytes``
per rank (a parameter read through whole scratch chunks is never cut between windows), so that
memory stays bounded: a window is read, exchanged, placed and dropped before the next.

When the ranks share little (the distinct bytes are more than :data:`SHARED_MIN` of the sum of
what they need), cooperating would cost collectives for nothing: :attr:`GroupPlan.cooperative`
is ``False`` and each rank reads alone, which :attr:`GroupPlan.reason` says.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from ckptstore.io.base import LOCAL_COST, ReadCost

#: Longest piece one owner reads by default: short enough to spread a shared slice over its
#: holders, long enough that a request's latency stays small against its transfer.
PIECE_BYTES = 16 << 20
#: Bytes of received pieces one rank holds at once by default (one exchange window).
WINDOW_BYTES = 64 << 20
#: Cooperate only when the distinct bytes are at most this fraction of the bytes all ranks need
#: (the ranks share at least 1 - SHARED_MIN of their reads); otherwise read independently.
SHARED_MIN = 0.95


@dataclass(frozen=True)
class Need:
    """Bytes ``[start, end)`` of file ``key`` that rank ``rank`` needs to fill parameter ``param``."""

    rank: int
    param: str
    key: str
    start: int
    end: int


@dataclass(frozen=True)
class Piece:
    """A distinct byte range ``[start, end)`` of ``key`` (filling ``param``), read once by ``owner``
    and sent to the other ranks of ``needers`` (sorted; the owner is one of them)."""

    param: str
    key: str
    start: int
    end: int
    owner: int
    needers: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Window:
    """Pieces exchanged together: ``pieces[first:stop]`` of the plan, filling (parts of) the parameters ``params``."""

    params: tuple[str, ...]
    first: int
    stop: int


@dataclass(frozen=True)
class GroupPlan:
    """What a group of ranks reads from storage and sends to each other (see the module docstring).

    ``ranks`` the group (global ranks, sorted); ``pieces`` in window order, each window's pieces
    sorted by (param, key, start); ``needed`` the bytes each rank needs (the sum over ranks is what
    independent reads would fetch); ``cooperative`` whether the group exchanges at all.
    """

    ranks: tuple[int, ...]
    pieces: tuple[Piece, ...]
    windows: tuple[Window, ...]
    needed: Mapping[int, int]
    cooperative: bool
    reason: str
    cost: ReadCost = LOCAL_COST

    @property
    def distinct_bytes(self) -> int:
        """Bytes the group needs, each counted once: what it fetches from storage together."""
        return sum(p.nbytes for p in self.pieces)

    @property
    def independent_bytes(self) -> int:
        """Bytes the group would fetch with each rank reading alone."""
        return sum(self.needed.values())

    def fetched_by(self, rank: int) -> int:
        """Bytes ``rank`` reads from storage (its own needs when the group does not cooperate)."""
        if not self.cooperative:
            return self.needed.get(rank, 0)
        return sum(p.nbytes for p in self.pieces if p.owner == rank)

    def requests_by(self, rank: int) -> int:
        """Requests ``rank`` sends to storage for its pieces, window by window (:func:`owned_requests`;
        0 here when the group does not cooperate: each rank's own plan counts its requests)."""
        if not self.cooperative:
            return 0
        return sum(len(owned_requests(self.pieces[w.first:w.stop], rank, self.cost)) for w in self.windows)

    def received_by(self, rank: int) -> int:
        """Bytes ``rank`` receives from the others."""
        if not self.cooperative:
            return 0
        return sum(p.nbytes for p in self.pieces if rank in p.needers and p.owner != rank)

    def window_bytes(self, window: Window, rank: int) -> int:
        """Bytes of ``window``'s pieces that ``rank`` holds at once (those it needs)."""
        return sum(p.nbytes for p in self.pieces[window.first:window.stop] if rank in p.needers)


def owned_requests(pieces: Iterable[Piece], rank: int, cost: ReadCost = LOCAL_COST) -> list[tuple[str, list[Piece]]]:
    """The requests ``rank`` sends to storage for the pieces it owns: ``(key, pieces)`` each, the pieces
    sorted by offset and not overlapping. Neighbours in a file share a request while the gap between
    them is at most what a request's latency would transfer (:attr:`ReadCost.gap_bytes`, read and
    dropped) and the request stays within the source's limits, as the read planner merges a solo
    rank's ranges."""
    out: list[tuple[str, list[Piece]]] = []
    end = first = buffers = 0
    for p in sorted((p for p in pieces if p.owner == rank), key=lambda p: (p.key, p.start, p.param)):
        gap = p.start - end
        joined = bool(out) and out[-1][0] == p.key and 0 <= gap <= cost.gap_bytes \
            and p.end - first <= cost.max_request_bytes \
            and (cost.max_buffers is None or buffers + 1 + (gap > 0) <= cost.max_buffers)
        if joined:
            out[-1][1].append(p)
            buffers += 1 + (gap > 0)
        else:
            out.append((p.key, [p]))
            first, buffers = p.start, 1
        end = p.end
    return out


def union_pieces(needs: Iterable[Need],
                 piece_bytes: int = PIECE_BYTES) -> list[tuple[str, str, int, int, tuple[int, ...]]]:
    """The distinct byte ranges of ``needs``: ``(param, key, start, end, needers)``, sorted.

    Per parameter and file, every range end cuts; a stretch between two cuts that some rank needs
    is a piece, needed by exactly the ranks whose ranges cover it. Neighbouring stretches needed by
    the same ranks are joined, then cut again into pieces of at most ``piece_bytes``.
    """
    by_file: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    for n in needs:
        if n.end > n.start:
            by_file.setdefault((n.param, n.key), []).append((n.start, n.end, n.rank))
    out: list[tuple[str, str, int, int, tuple[int, ...]]] = []
    for (param, key), ranges in sorted(by_file.items()):
        # a sweep over the range ends: +rank at a start, -rank at an end
        events: dict[int, list[tuple[int, int]]] = {}
        for start, end, rank in ranges:
            events.setdefault(start, []).append((rank, 1))
            events.setdefault(end, []).append((rank, -1))
        covering: dict[int, int] = {}
        joined: list[list] = []  # [start, end, needers]
        points = sorted(events)
        for here, there in zip(points, points[1:] + [points[-1]], strict=True):
            for rank, step in events[here]:
                covering[rank] = covering.get(rank, 0) + step
                if not covering[rank]:
                    del covering[rank]
            if not covering or there <= here:
                continue
            needers = tuple(sorted(covering))
            if joined and joined[-1][1] == here and joined[-1][2] == needers:
                joined[-1][1] = there
            else:
                joined.append([here, there, needers])
        for start, end, needers in joined:
            for s in range(start, end, piece_bytes):
                out.append((param, key, s, min(end, s + piece_bytes), needers))
    return out


def assign_owners(pieces: Sequence[tuple[str, str, int, int, tuple[int, ...]]],
                  cost: ReadCost = LOCAL_COST) -> list[int]:
    """The owner of each piece: the least-loaded of its needers, largest piece first (pieces that one
    rank alone needs are that rank's, counted first).

    A rank's load is the modelled time of its requests (one per piece) and bytes; ties go to the
    lowest rank, so every rank computes the same owners from the same pieces.
    """
    load: dict[int, float] = {}
    owners = [0] * len(pieces)
    # pieces only one rank needs go first (no choice), then the rest largest first
    order = sorted(range(len(pieces)), key=lambda i: (len(pieces[i][4]) > 1, -(pieces[i][3] - pieces[i][2]), i))
    for i in order:
        _, _, start, end, needers = pieces[i]
        owner = min(needers, key=lambda r: (load.get(r, 0.0), r))
        owners[i] = owner
        load[owner] = load.get(owner, 0.0) + cost.seconds(1, end - start)
    return owners


def plan_group(ranks: Sequence[int], needs: Iterable[Need], *, cost: ReadCost = LOCAL_COST,
               piece_bytes: int = PIECE_BYTES, window_bytes: int = WINDOW_BYTES,
               shared_min: float = SHARED_MIN, whole: Iterable[str] = ()) -> GroupPlan:
    """The group plan of ``ranks`` (global ranks) for their ``needs``; see the module docstring.

    Deterministic: every rank of the group, given the same needs in any order, computes the same
    plan. ``whole`` names parameters that must not be cut between windows (:func:`_windows`). A need of
    a rank outside ``ranks`` is a :class:`ValueError` (a bug, not bad input).
    """
    group = tuple(sorted(set(ranks)))
    needs = list(needs)
    if any(n.rank not in group for n in needs):
        raise ValueError(f"a need names a rank outside the group {group}")
    needed = {r: 0 for r in group}
    for n in needs:
        needed[n.rank] += max(0, n.end - n.start)
    raw = union_pieces(needs, piece_bytes)
    owners = assign_owners(raw, cost)
    pieces = [Piece(param, key, s, e, owner, needers)
              for (param, key, s, e, needers), owner in zip(raw, owners, strict=True)]
    windows = _windows(pieces, window_bytes, frozenset(whole))
    distinct, total = sum(p.nbytes for p in pieces), sum(needed.values())
    if len(group) < 2:
        cooperative, reason = False, "a group of one rank reads alone"
    elif total == 0:
        cooperative, reason = False, "nothing to read"
    elif distinct > shared_min * total:
        cooperative, reason = False, (f"the ranks share little: {distinct:,} distinct bytes of {total:,} needed "
                                      f"({distinct / total:.0%} > {shared_min:.0%})")
    else:
        cooperative, reason = True, (f"{distinct:,} distinct bytes of {total:,} needed "
                                     f"({distinct / total:.0%}): each read once")
    return GroupPlan(group, tuple(pieces), tuple(windows), needed, cooperative, reason, cost)


def _windows(pieces: Sequence[Piece], window_bytes: int, whole: AbstractSet[str] = frozenset()) -> list[Window]:
    """Pieces (sorted by parameter) grouped in order while every rank holds at most ``window_bytes``.

    A parameter of ``whole`` (one that some rank reads through scratch chunks: checked, decoded or
    converted whole) stays in one window; any other may be cut between two pieces. A window holds
    more than ``window_bytes`` only when one piece or one such parameter does.
    """
    out: list[Window] = []
    held: dict[int, int] = {}
    first = i = 0

    def close(stop: int) -> None:
        nonlocal first
        if stop > first:
            out.append(Window(tuple(dict.fromkeys(p.param for p in pieces[first:stop])), first, stop))
            held.clear()
            first = stop

    while i < len(pieces):
        j = i + 1
        if pieces[i].param in whole:
            while j < len(pieces) and pieces[j].param == pieces[i].param:
                j += 1
        mine: dict[int, int] = {}
        for p in pieces[i:j]:
            for r in p.needers:
                mine[r] = mine.get(r, 0) + p.nbytes
        if any(held.get(r, 0) + mine.get(r, 0) > window_bytes for r in {*held, *mine}):
            close(i)
        for r, b in mine.items():
            held[r] = held.get(r, 0) + b
        i = j
    close(len(pieces))
    return out


def transfers(plan: GroupPlan, window: Window) -> list[tuple[int, tuple[int, ...], list[Piece]]]:
    """The messages of ``window``: ``(owner, receivers, pieces)`` per owner and set of receivers, in a
    fixed order (every rank walks the same list, so collectives meet in the same order everywhere).
    Each message carries its pieces back to back in the order listed."""
    grouped: dict[tuple[int, tuple[int, ...]], list[Piece]] = {}
    for p in plan.pieces[window.first:window.stop]:
        if len(p.needers) > 1:
            grouped.setdefault((p.owner, p.needers), []).append(p)
    return [(owner, needers, ps) for (owner, needers), ps in sorted(grouped.items())]


def heaviest_load(plan: GroupPlan, cost: ReadCost = LOCAL_COST) -> float:
    """The largest modelled storage time of one rank of the group (its owned runs and bytes)."""
    loads = [cost.seconds(plan.requests_by(r), plan.fetched_by(r)) for r in plan.ranks]
    return max(loads, default=0.0)


__all__ = [
    "PIECE_BYTES",
    "SHARED_MIN",
    "WINDOW_BYTES",
    "GroupPlan",
    "Need",
    "Piece",
    "Window",
    "assign_owners",
    "heaviest_load",
    "owned_requests",
    "plan_group",
    "transfers",
    "union_pieces",
]
