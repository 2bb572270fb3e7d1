"""The exchange seam: how the ranks of a cooperative load talk (:class:`Exchange`), like ByteSource for reads.

A cooperative load needs three things from the job's collectives and nothing more: every rank's
small array (to share plans and a status flag), a broadcast of a byte buffer from one rank to a
subset of the group (an owner sending pieces to exactly the ranks that need them), and nothing
that moves a full-size buffer to a rank that does not need it. Implementations: MindSpore's
collectives (:class:`ckptstore.mindspore.exchange.MindSporeExchange`, HCCL on Ascend, mccl on the
CPU wheel) and threads of one process (:class:`ckptstore.testing.exchange.ThreadExchange`), both
checked by :mod:`ckptstore.testing.exchange_tests`. Ranks are global ranks of the job.

A job's collectives are a pluggable part (:class:`Collectives`, found in :data:`COLLECTIVES` by
name, as byte sources are): the read side names ``"mindspore"`` and never imports the MindSpore
package, which declares the built-in one in :mod:`ckptstore.mindspore.exchange`; another framework's
collectives can be added under the entry-point group ``ckptstore.collectives``.

:meth:`Exchange.agree` is the rule that keeps an error from becoming a hang: before each data
collective every rank reports whether what it did so far succeeded (one small gather of a flag);
if one failed, every rank raises (the failing rank its own error, the others a
:class:`~ckptstore.errors.CooperativeLoadError` naming it and its message) and none goes on to wait
for bytes that will never come.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ckptstore.errors import CooperativeLoadError, InvalidOptionError
from ckptstore.registry import Registry

#: Characters of a failed rank's message passed to the others.
MESSAGE_CHARS = 1000


class Exchange(ABC):
    """Collectives among ``ranks`` (global ranks, sorted), seen from rank ``rank``."""

    rank: int
    ranks: tuple[int, ...]

    @abstractmethod
    def gather(self, array: np.ndarray) -> list[np.ndarray]:
        """Every rank's ``array`` (same shape and dtype on every rank), in the order of :attr:`ranks`."""

    @abstractmethod
    def broadcast(self, buffer: np.ndarray, root: int, ranks: Sequence[int]) -> None:
        """Fill ``buffer`` (a contiguous ``uint8`` array of the same size on every rank of ``ranks``)
        with ``root``'s: called by every rank of ``ranks`` (sorted, a subset of :attr:`ranks`, holding
        ``root``) and by no other."""

    def close(self) -> None:  # noqa: B027  (optional hook: most exchanges hold nothing to release)
        """Release what the exchange holds (groups, threads)."""

    def gather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's ``data`` (any length), in the order of :attr:`ranks`: the lengths first, then
        the bytes padded to the longest."""
        sizes = [int(s[0]) for s in self.gather(np.array([len(data)], dtype=np.int64))]
        padded = np.zeros(max(sizes, default=0) or 1, dtype=np.uint8)
        padded[:len(data)] = np.frombuffer(data, dtype=np.uint8)
        return [g[:n].tobytes() for g, n in zip(self.gather(padded), sizes, strict=True)]

    def agree(self, error: BaseException | None, what: str) -> None:
        """Raise on every rank if ``error`` happened on any (see the module docstring); ``what`` says
        which step, for the message. Costs one gather of one int when every rank succeeded."""
        flags = [int(f[0]) for f in self.gather(np.array([error is not None], dtype=np.int32))]
        failed = [r for r, f in zip(self.ranks, flags, strict=True) if f]
        if not failed:
            return
        text = "" if error is None else f"{type(error).__name__}: {error}"[:MESSAGE_CHARS]
        messages = self.gather_bytes(text.encode("utf-8", "replace"))
        if error is not None:
            raise error
        said = "; ".join(f"rank {r}: {messages[self.ranks.index(r)].decode('utf-8', 'replace')}" for r in failed)
        raise CooperativeLoadError(
            f"cooperative load ({what}) failed on rank{'s' if len(failed) > 1 else ''} "
            f"{', '.join(map(str, failed))} of the group {list(self.ranks)}, so rank {self.rank} stops too: {said}")


class SoloExchange(Exchange):
    """A group of one rank: nothing to exchange (no collective is called)."""

    def __init__(self, rank: int) -> None:
        self.rank, self.ranks = rank, (rank,)

    def gather(self, array: np.ndarray) -> list[np.ndarray]:
        return [np.array(array, copy=True)]

    def broadcast(self, buffer: np.ndarray, root: int, ranks: Sequence[int]) -> None:
        if tuple(ranks) != self.ranks or root != self.rank:
            raise ValueError(f"broadcast among {list(ranks)} from {root} in a group of rank {self.rank} alone")


@dataclass(frozen=True)
class Collectives:
    """A job's collectives as a cooperative load uses them: which rank this process is and how
    large the job is (``whoami``, an :class:`InvalidOptionError` outside a running job), whether
    this process is in a running job of several ranks, asked without importing anything
    (``active``), the global ranks of this process's node (``node_ranks``), and an
    :class:`Exchange` among given ranks (``exchange``), called by exactly those ranks."""

    name: str
    whoami: Callable[[], tuple[int, int]]
    active: Callable[[], bool]
    node_ranks: Callable[[], tuple[int, ...]]
    exchange: Callable[[Sequence[int]], Exchange]


#: The job collectives ckptstore knows, by name: a module of :mod:`ckptstore.mindspore` declaring
#: ``COLLECTIVES`` (MindSpore's, imported only when looked up), then plugins' entry points.
COLLECTIVES: Registry[Collectives] = Registry("job collectives", Collectives, "ckptstore.mindspore", "COLLECTIVES",
                                              "ckptstore.collectives", lambda c: [c.name])


def collectives(name: str = "mindspore") -> Collectives:
    """The job collectives registered as ``name`` (MindSpore's by default)."""
    found = COLLECTIVES.get(name)
    if found is None:
        raise InvalidOptionError(f"no job collectives named {name!r} (known: {', '.join(COLLECTIVES.names())})")
    return found


def job_agreement(name: str = "mindspore") -> Callable[[int], tuple[int, int]] | None:
    """The smallest and largest of an int every rank of the job offers (one gather of one int over
    the job), when this process is in a running job of several ranks; ``None`` otherwise. Every
    rank must call what it returns the same number of times (a fallback's rounds of agreement)."""
    found = COLLECTIVES.get(name)
    if found is None or not found.active():
        return None
    job = found
    _, world = job.whoami()
    exchange = job.exchange(tuple(range(world)))

    def agree(offer: int) -> tuple[int, int]:
        offers = [int(a[0]) for a in exchange.gather(np.array([offer], dtype=np.int64))]
        return min(offers), max(offers)

    return agree
