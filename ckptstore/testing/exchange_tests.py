"""What every :class:`~ckptstore.read.exchange.Exchange` must do, as checks each rank runs.

An exchange spans processes, so its conformance is a list of functions that every rank of a group
calls with its own exchange, in the same order (:func:`run_checks`); each raises ``AssertionError``
when the exchange misbehaves. ``tests/read/test_exchange.py`` runs them on threads
(:class:`~ckptstore.testing.exchange.ThreadExchange`), the msrun test on MindSpore's collectives.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ckptstore.errors import CooperativeLoadError
from ckptstore.read.exchange import Exchange


def check_gather(ex: Exchange) -> None:
    """Every rank gets every rank's array, in the order of the group's ranks."""
    got = ex.gather(np.array([ex.rank, 10 * ex.rank], dtype=np.int64))
    assert [g.tolist() for g in got] == [[r, 10 * r] for r in ex.ranks], got


def check_gather_bytes(ex: Exchange) -> None:
    """Byte strings of different lengths (one empty) come back whole."""
    got = ex.gather_bytes(b"x" * ex.rank)
    assert got == [b"x" * r for r in ex.ranks], got


def check_broadcast_to_all(ex: Exchange) -> None:
    """A broadcast from the last rank fills every rank's buffer in place."""
    root = ex.ranks[-1]
    buf = np.arange(1000, dtype=np.uint8) if ex.rank == root else np.zeros(1000, dtype=np.uint8)
    ex.broadcast(buf, root, ex.ranks)
    assert buf.tobytes() == np.arange(1000, dtype=np.uint8).tobytes()


def check_broadcast_to_a_subset(ex: Exchange) -> None:
    """A broadcast among the first two ranks only: the others take no part and their buffers stay."""
    members = ex.ranks[:2]
    buf = np.full(64, 7 if ex.rank == members[0] else 0, dtype=np.uint8)
    if ex.rank in members:
        ex.broadcast(buf, members[0], members)
        assert set(buf.tolist()) == {7}
    else:
        assert set(buf.tolist()) == {0}


def check_agree_passes_when_all_succeed(ex: Exchange) -> None:
    """No rank failed: agree returns on every rank."""
    ex.agree(None, "a check")


def check_agree_raises_everywhere(ex: Exchange) -> None:
    """The last rank failed: it raises its own error, every other rank a CooperativeLoadError naming it."""
    last = ex.ranks[-1]
    mine = ValueError("bad strategy") if ex.rank == last else None
    try:
        ex.agree(mine, "a check")
    except ValueError as e:
        assert ex.rank == last and e is mine
    except CooperativeLoadError as e:
        assert ex.rank != last
        assert str(e) == (f"cooperative load (a check) failed on rank {last} of the group {list(ex.ranks)}, so rank "
                          f"{ex.rank} stops too: rank {last}: ValueError: bad strategy")
    else:
        raise AssertionError(f"rank {ex.rank}: agree did not raise")


CHECKS: tuple[Callable[[Exchange], None], ...] = (
    check_gather, check_gather_bytes, check_broadcast_to_all, check_broadcast_to_a_subset,
    check_agree_passes_when_all_succeed, check_agree_raises_everywhere)


def run_checks(ex: Exchange) -> list[str]:
    """Run every check on this rank, in order (every rank of the group must call it); their names."""
    for check in CHECKS:
        check(ex)
    return [c.__name__ for c in CHECKS]
