"""An :class:`~ckptstore.read.exchange.Exchange` among threads of one process, for tests.

:func:`run_group` runs a function on N ranks at once, each in its own thread with its own
:class:`ThreadExchange` over one shared :class:`Hub`; a rank that waits longer than the hub's
``timeout`` for its peers raises :class:`~ckptstore.errors.CooperativeLoadError`, as MindSpore's
collectives raise when a peer is gone, so a broken test fails instead of hanging.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ckptstore.errors import CooperativeLoadError
from ckptstore.read.exchange import Exchange


class Hub:
    """Mailboxes shared by the ranks of one group: each collective call of a set of ranks is matched
    with the calls of the same set in the same order (a per-rank, per-set sequence number)."""

    def __init__(self, ranks: Sequence[int], timeout: float = 30.0) -> None:
        self.ranks = tuple(sorted(ranks))
        self.timeout = timeout
        self.cond = threading.Condition()
        self.boxes: dict[tuple[Any, ...], dict[int, np.ndarray]] = {}
        self.seq: dict[tuple[int, tuple[int, ...]], int] = {}
        self.seen: dict[tuple[Any, ...], set[int]] = {}
        #: Bytes each rank received through broadcasts (a test's way of checking who got what).
        self.received: dict[int, int] = {r: 0 for r in self.ranks}

    def _next(self, rank: int, members: tuple[int, ...]) -> tuple[Any, ...]:
        with self.cond:
            n = self.seq.get((rank, members), 0)
            self.seq[(rank, members)] = n + 1
        return (members, n)

    def post_and_wait(self, rank: int, members: tuple[int, ...], value: np.ndarray | None,
                      want: Sequence[int]) -> dict[int, np.ndarray]:
        """Post ``value`` (if any) for this call of ``members`` and wait for the values of ``want``."""
        key = self._next(rank, members)
        with self.cond:
            box = self.boxes.setdefault(key, {})
            if value is not None:
                box[rank] = value
                self.cond.notify_all()
            if not self.cond.wait_for(lambda: all(r in box for r in want), self.timeout):
                raise CooperativeLoadError(f"rank {rank}: peers {[r for r in want if r not in box]} did not answer "
                                           f"within {self.timeout} s")
            out = {r: box[r] for r in want}
            seen = self.seen.setdefault(key, set())
            seen.add(rank)
            if len(seen) == len(members):  # every member has taken what it waited for
                del self.boxes[key], self.seen[key]
            return out


class ThreadExchange(Exchange):
    """Rank ``rank`` of the threads sharing ``hub``."""

    def __init__(self, hub: Hub, rank: int) -> None:
        self.hub, self.rank, self.ranks = hub, rank, hub.ranks

    def gather(self, array: np.ndarray) -> list[np.ndarray]:
        got = self.hub.post_and_wait(self.rank, self.ranks, np.array(array, copy=True), self.ranks)
        return [got[r] for r in self.ranks]

    def broadcast(self, buffer: np.ndarray, root: int, ranks: Sequence[int]) -> None:
        members = tuple(sorted(ranks))
        if self.rank not in members or root not in members:
            raise ValueError(f"broadcast among {members} from {root} called by rank {self.rank}")
        value = np.array(buffer, copy=True) if self.rank == root else None
        got = self.hub.post_and_wait(self.rank, members, value, (root,))
        if self.rank != root:
            buffer[...] = got[root]
            with self.hub.cond:
                self.hub.received[self.rank] += buffer.nbytes


def run_group(ranks: Sequence[int], fn: Callable[[ThreadExchange], Any], *, timeout: float = 30.0,
              raise_errors: bool = True) -> dict[int, Any]:
    """``fn(exchange)`` on every rank of ``ranks`` at once (a thread each); their results by rank.

    An exception on any rank is raised here (the lowest rank's) after every thread has finished;
    with ``raise_errors=False`` each rank's exception is returned as its result instead.
    """
    hub = Hub(ranks, timeout)
    with ThreadPoolExecutor(len(hub.ranks)) as pool:
        futures = {r: pool.submit(fn, ThreadExchange(hub, r)) for r in hub.ranks}
        results: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        for r, f in futures.items():
            try:
                results[r] = f.result()
            except BaseException as e:  # collected, then re-raised below
                errors[r] = e
    if errors and raise_errors:
        raise errors[min(errors)]
    return {**results, **errors}
