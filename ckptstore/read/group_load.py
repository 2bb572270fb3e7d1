"""Run a cooperative load: each byte read once per group, sent only to the ranks that need it.

Each rank of the group has planned its own reads (the :class:`~ckptstore.store.read_plan.ParamReadPlan`
of every parameter it loads, as a solo load would run them) and has a destination array for each.
:func:`load_together` then

1. agrees that every rank planned without error (:meth:`Exchange.agree`), gathers every rank's wanted
   byte ranges (small: file keys and offsets) and computes the same
   :class:`~ckptstore.read.cooperative.GroupPlan` on every rank;
2. if the ranks share little, each runs its own plans alone (no more collectives);
3. else, window by window: the owner of each piece reads it from storage through the store's byte
   source (counted in :func:`ckptstore.io_counts`), every rank agrees that those reads succeeded,
   owners broadcast each message (pieces of one owner for one set of ranks) to exactly that set while
   the next window is read, and each rank puts the bytes it now holds where its own plans put them
   (:class:`HeldBytes`; not counted as I/O), so its values are what a solo load gives, bit for bit.

Memory: the destination arrays plus two half-windows of held pieces (one exchanged, one read).
"""
from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ckptstore.errors import CooperativeLoadError, InvalidOptionError
from ckptstore.io.base import ByteSource, FileStat, ReadableFile, Request
from ckptstore.read.cooperative import (
    WINDOW_BYTES,
    GroupPlan,
    Need,
    Piece,
    Window,
    owned_requests,
    plan_group,
    transfers,
)
from ckptstore.read.exchange import Exchange, SoloExchange, collectives
from ckptstore.store.executor import IO_STATS, Executor, IOStats
from ckptstore.store.read_plan import ParamReadPlan
from ckptstore.store.store import Store

#: What ``cooperative=`` takes: ``"replicas"`` (the ranks holding the same slices), ``"node"`` (the
#: ranks of this host), a list of global ranks, an :class:`Exchange` (its ranks), or ``None`` (read alone).
Cooperative = str | Sequence[int] | Exchange | None

#: What :func:`load_together` did last in this process: the group plan (a test and ``plan`` hook).
LAST_PLAN: list[GroupPlan] = []


def wanted_ranges(plans: Mapping[str, ParamReadPlan]) -> list[tuple[str, str, int, int]]:
    """``(param, key, start, end)`` of every byte range the plans read (gaps of merged requests not included)."""
    return [(name, key, offset, offset + length) for name, plan in plans.items()
            for key, offset, length, _ in plan.ranges()]


def load_together(exchange: Exchange, store: Store, plans: Mapping[str, ParamReadPlan] | None,
                  outs: Mapping[str, np.ndarray] | None, *, error: BaseException | None = None, workers: int = 1,
                  window_bytes: int | None = None, piece_bytes: int | None = None) -> GroupPlan:
    """Fill ``outs[name]`` with ``plans[name]``'s bytes on every rank of ``exchange``'s group.

    ``error`` is what went wrong on this rank while planning (``plans`` then ``None``): every rank
    raises. Returns the group plan that ran (``cooperative`` False when each rank read alone).
    """
    exchange.agree(error, "planning")
    if plans is None or outs is None:
        raise CooperativeLoadError(f"rank {exchange.rank}: nothing was planned, yet no error was said")
    mine = json.dumps({"ranges": wanted_ranges(plans), "whole": whole_params(plans)}, separators=(",", ":")).encode()
    stated = [json.loads(blob) for blob in exchange.gather_bytes(mine)]
    needs = [Need(rank, *row) for rank, said in zip(exchange.ranks, stated, strict=True) for row in said["ranges"]]
    whole = {name for said in stated for name in said["whole"]}
    # two windows are held at once (one exchanged and placed while the next is read): each gets half
    sizes = {"window_bytes": WINDOW_BYTES // 2 if window_bytes is None else window_bytes}
    if piece_bytes is not None:
        sizes["piece_bytes"] = piece_bytes
    group = plan_group(exchange.ranks, needs, cost=store.data.read_cost(), whole=whole, **sizes)
    LAST_PLAN[:] = [group]
    if not group.cooperative:
        Executor(store.data, workers=workers).run([(plans[n], outs[n]) for n in plans])
        return group
    pending: BaseException | None = None
    placed: dict[str, int] = {}
    with ThreadPoolExecutor(1, thread_name_prefix="ckptstore-coop-ahead") as ahead:
        reading = _read_ahead(ahead, store, group, 0, exchange.rank, workers)
        for k, window in enumerate(group.windows):
            held: Held = {}
            messages: Messages = {}
            try:
                assert reading is not None  # started for every window that exists
                held, messages = reading.result()
            except Exception as e:  # any error: said on every rank by the agreement below
                pending = pending or e
            exchange.agree(pending, "reading from storage")
            reading = _read_ahead(ahead, store, group, k + 1, exchange.rank, workers)
            _receive(exchange, group, window, held, messages)
            try:
                _place(HeldBytes(store.data, held), plans, outs, window, whole, placed)
            except Exception as e:  # any error: said on every rank at the next agreement
                pending = e
    short = [n for n in plans if n not in whole and placed.get(n, 0) != plans[n].nbytes]
    if pending is None and short:  # a bug of the group plan, never to pass as values
        pending = CooperativeLoadError(f"rank {exchange.rank}: parameter {short[0]!r} got {placed.get(short[0], 0):,} "
                                       f"of its {plans[short[0]].nbytes:,} bytes (a cooperative plan bug)")
    exchange.agree(pending, "placing the received bytes")
    return group


Held = dict[str, list[tuple[int, int, np.ndarray]]]
Messages = dict[tuple[int, tuple[int, ...]], np.ndarray]


def _read_ahead(pool: ThreadPoolExecutor, store: Store, group: GroupPlan, k: int, rank: int,
                workers: int) -> Future[tuple[Held, Messages]] | None:
    """Start reading window ``k``'s owned pieces (while the caller exchanges the window before it)."""
    if k >= len(group.windows):
        return None

    def read() -> tuple[Held, Messages]:
        held: Held = {}
        return held, _read_owned(store, group, group.windows[k], rank, held, workers)

    return pool.submit(read)


def _receive(exchange: Exchange, group: GroupPlan, window: Window, held: Held, messages: Messages) -> None:
    """Send this rank's messages of ``window`` and receive those meant for it (into ``held``)."""
    for owner, needers, pieces in transfers(group, window):
        if exchange.rank not in needers:
            continue
        buffer = messages[(owner, needers)] if owner == exchange.rank else \
            np.empty(sum(p.nbytes for p in pieces), dtype=np.uint8)
        try:
            exchange.broadcast(buffer, owner, needers)
        except CooperativeLoadError:
            raise
        except Exception as e:
            raise CooperativeLoadError(f"cooperative load: rank {exchange.rank} could not receive from rank "
                                       f"{owner} ({e}); a rank of the group failed or is gone") from e
        if owner != exchange.rank:
            _hold(held, pieces, buffer)


def _read_owned(store: Store, group: GroupPlan, window: Window, rank: int,
                held: dict[str, list[tuple[int, int, np.ndarray]]], workers: int
                ) -> dict[tuple[int, tuple[int, ...]], np.ndarray]:
    """Read the pieces ``rank`` owns in ``window`` from storage into one buffer, laid out message by
    message (each message a contiguous slice, sent without a copy); return the messages.

    The requests are :func:`~ckptstore.read.cooperative.owned_requests` (what the group plan counted),
    up to ``workers`` at once through the store's byte source, and count in :func:`ckptstore.io_counts`
    as a solo load's do: this is what the rank fetches from storage.
    """
    ordered: list[tuple[tuple[int, tuple[int, ...]] | None, Piece]] = []
    for owner, needers, pieces in transfers(group, window):
        if owner == rank:
            ordered += [((owner, needers), p) for p in pieces]
    ordered += [(None, p) for p in group.pieces[window.first:window.stop] if p.owner == rank and len(p.needers) == 1]
    if not ordered:
        return {}
    flat = np.empty(sum(p.nbytes for _, p in ordered), dtype=np.uint8)
    where: dict[Piece, np.ndarray] = {}
    messages: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    at = 0
    for message, p in ordered:
        where[p] = flat[at:at + p.nbytes]
        _hold(held, [p], where[p])
        if message is not None:
            span = messages.setdefault(message, [at, at])
            span[1] = at + p.nbytes
        at += p.nbytes
    requests = owned_requests(group.pieces[window.first:window.stop], rank, group.cost)

    def fetch(request: tuple[str, list[Piece]]) -> None:
        key, pieces = request
        f = store.data.open(key)
        f.read_span([(p.start, where[p].data) for p in pieces])
        IO_STATS.add_read(sum(p.nbytes for p in pieces), len(pieces), 1, [f.url], pieces[-1].end - pieces[0].start)

    if workers > 1 and len(requests) > 1:
        with ThreadPoolExecutor(min(workers, len(requests)), thread_name_prefix="ckptstore-coop") as pool:
            list(pool.map(fetch, requests))
    else:
        for request in requests:
            fetch(request)
    return {m: flat[a:b] for m, (a, b) in messages.items()}


def _hold(held: dict[str, list[tuple[int, int, np.ndarray]]], pieces: Sequence[Piece], buffer: np.ndarray) -> None:
    at = 0
    for p in pieces:
        held.setdefault(p.key, []).append((p.start, p.end, buffer[at:at + p.nbytes]))
        at += p.nbytes


def _place(source: HeldBytes, plans: Mapping[str, ParamReadPlan], outs: Mapping[str, np.ndarray],
           window: Window, whole: set[str], placed: dict[str, int]) -> None:
    """Put the bytes this rank holds in ``window`` where its plans put them (not counted as I/O).

    Ranges read straight into a destination are copied from the held pieces, as far as this window
    holds them (a parameter may span windows); a parameter read through scratch chunks (checked,
    decoded or converted) lies in one window and its plan runs whole against the held bytes.
    ``placed`` counts the bytes copied per parameter (a parameter cut between windows must add up).
    """
    jobs = []
    for name in window.params:
        plan = plans.get(name)
        if plan is None:
            continue
        if name in whole:
            jobs.append((plan, outs[name]))
            continue
        flat = outs[name].reshape(-1).view(np.uint8)
        for g in plan.groups:  # (every group goes into the destination: the parameter is not in `whole`)
            for f, offset, length, dest in zip(g.files.tolist(), g.offsets.tolist(), g.lengths.tolist(),
                                               g.dests.tolist(), strict=True):
                placed[name] = placed.get(name, 0) + source.copy_held(plan.keys[f], offset, flat[dest:dest + length])
    if jobs:
        Executor(source, workers=1, stats=IOStats()).run(jobs)


def whole_params(plans: Mapping[str, ParamReadPlan]) -> list[str]:
    """The parameters whose plans read through scratch chunks (a chunk checked, decoded or converted as a
    whole): they must not be cut between windows."""
    return [name for name, plan in plans.items() if any(not g.into_destination for g in plan.groups)]


class HeldBytes(ByteSource):
    """The bytes of a window a rank holds (read or received), served as files of the store's keys.

    A request for bytes it does not hold is a bug of the group plan: :class:`CooperativeLoadError`.
    """

    def __init__(self, store_source: ByteSource, held: Mapping[str, list[tuple[int, int, np.ndarray]]]) -> None:
        self.inner = store_source
        self.files = {key: _HeldFile(key, sorted(segments, key=lambda s: s[0]), store_source.key_url(key))
                      for key, segments in held.items()}

    @property
    def url(self) -> str:
        return self.inner.url

    def copy_held(self, key: str, offset: int, out: np.ndarray) -> int:
        """Copy the bytes of ``[offset, offset + len(out))`` of ``key`` that this window holds into ``out``
        (the rest belongs to other windows); return how many were copied."""
        found = self.files.get(key)
        return 0 if found is None else found.copy_held(offset, out)

    def open(self, key: str) -> ReadableFile:
        found = self.files.get(key)
        if found is None:
            raise CooperativeLoadError(f"{self.inner.key_url(key)}: no bytes of it were received in this window "
                                       "(a cooperative plan bug)")
        return found

    def stat(self, key: str) -> FileStat | None:
        return None

    def read_bytes(self, key: str, *, limit: int) -> bytes | None:
        return None

    def list(self, prefix: str = "") -> tuple[list[str], list[str]]:
        return [], sorted(self.files)


class _HeldFile(ReadableFile):
    def __init__(self, key: str, segments: list[tuple[int, int, np.ndarray]], url: str) -> None:
        self.key, self.segments, self._url = key, segments, url
        self.starts = [s for s, _, _ in segments]
        self.size = max(e for _, e, _ in segments)

    @property
    def url(self) -> str:
        return self._url

    def read_requests(self, requests: Sequence[Request]) -> None:
        for offset, buf in requests:
            view = memoryview(buf).cast("B")
            at, end = offset, offset + len(view)
            while at < end:
                i = bisect.bisect_right(self.starts, at) - 1
                # segments of one key may overlap (two parameters' pieces); any that holds `at` will do
                while i >= 0 and self.segments[i][1] <= at:
                    i -= 1
                if i < 0:
                    raise CooperativeLoadError(f"{self._url}: bytes at {at} were not received (a cooperative plan bug)")
                start, stop, data = self.segments[i]
                n = min(stop, end) - at
                view[at - offset:at - offset + n] = data[at - start:at - start + n].data
                at += n

    def read_span(self, requests: Sequence[Request]) -> None:
        self.read_requests(requests)  # only the wanted ranges: the gaps were never fetched

    def copy_held(self, offset: int, out: np.ndarray) -> int:
        end, at, copied = offset + len(out), offset, 0  # bytes before `at` are done (no byte counted twice)
        i = max(0, bisect.bisect_right(self.starts, offset) - 1)
        while i > 0 and self.segments[i - 1][1] > offset:  # an earlier, longer segment may reach in
            i -= 1
        for start, stop, data in self.segments[i:]:
            if start >= end:
                break
            lo, hi = max(start, at), min(stop, end)
            if lo < hi:
                out[lo - offset:hi - offset] = data[lo - start:hi - start]
                copied, at = copied + hi - lo, hi
        return copied


def group_ranks(cooperative: Cooperative, replicas: Callable[[int], tuple[int, ...]]) -> tuple[int, ...]:
    """The global ranks ``cooperative`` names for this process (see :data:`Cooperative`): ``"replicas"``
    from ``replicas(job_size)`` (the target layout's replica group), ``"node"`` from MindSpore's local
    rank size."""
    if isinstance(cooperative, Exchange):
        return cooperative.ranks
    job = collectives()
    _, world = job.whoami()
    if cooperative == "replicas":
        return replicas(world)
    if cooperative == "node":
        return job.node_ranks()
    if isinstance(cooperative, str) or not isinstance(cooperative, Sequence) \
            or not all(isinstance(r, int) and not isinstance(r, bool) for r in cooperative):
        raise InvalidOptionError(f"cooperative must be 'replicas', 'node' or a list of ranks, not {cooperative!r}")
    return tuple(sorted({int(r) for r in cooperative}))


def exchange_for(cooperative: Cooperative, replicas: Callable[[int], tuple[int, ...]]) -> Exchange:
    """The :class:`Exchange` of the group ``cooperative`` names: itself when it is one, else one over the
    job's collectives (MindSpore's, found by name: see :data:`~ckptstore.read.exchange.COLLECTIVES`)."""
    if isinstance(cooperative, Exchange):
        return cooperative
    job = collectives()
    ranks = group_ranks(cooperative, replicas)
    me, _ = job.whoami()
    if ranks == (me,):  # a rank with no replica (or a list of itself) reads alone, calling no collective
        return SoloExchange(me)
    return job.exchange(ranks)
