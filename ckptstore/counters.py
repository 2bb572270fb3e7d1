"""What this process has read and sent so far: the public view of ckptstore's request counters.

:func:`io_counts` returns a snapshot; the difference of two snapshots is what happened between
them (``after - before``), which is how a user checks what :func:`ckptstore.plan_rank` predicted
(requests, bytes fetched) against what a load really did, or counts the requests a save sent to
a bucket. The counters are per process and never reset: take a snapshot before and after rather
than relying on a zero start, so that other code counting in the same process is not disturbed.
"""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class IOCounts:
    """Counts of this process's I/O since it started (or, as a difference, between two snapshots).

    Loads (``load_rank``, ``load_into_net``, ``read_rank``, ``export``) through any source:
    ``requests`` read calls (one vectored read of a local file, one ranged GET of an object),
    ``bytes_fetched`` the bytes they transferred, ``bytes_read`` the tensor bytes wanted of them
    (``bytes_fetched - bytes_read`` is the over-read the planner chose), ``reads`` the byte ranges
    planned. Object storage, for every caller (loads, saves, conversions, listings): ``gets``,
    ``heads``, ``lists`` (one per page), ``puts`` (one per uploaded part or object), ``deletes``,
    ``bytes_in`` and ``bytes_out`` of payload.
    """

    requests: int = 0
    bytes_read: int = 0
    bytes_fetched: int = 0
    reads: int = 0
    gets: int = 0
    heads: int = 0
    lists: int = 0
    puts: int = 0
    deletes: int = 0
    bytes_in: int = 0
    bytes_out: int = 0

    def __sub__(self, other: IOCounts) -> IOCounts:
        return IOCounts(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    @property
    def object_requests(self) -> int:
        """Every request sent to object storage (GETs, HEADs, LISTs, PUTs and DELETEs)."""
        return self.gets + self.heads + self.lists + self.puts + self.deletes


def io_counts() -> IOCounts:
    """A snapshot of this process's I/O counters (:class:`IOCounts`); subtract two for an interval.

    Reads nothing and sends nothing; it is safe to call from any thread while loads run (each
    counter is consistent, the snapshot as a whole is taken without stopping them).
    """
    # Imported here: the counters live with the executor and the object-store client, which are
    # already imported by anything that did I/O; a snapshot before any I/O imports them for zeros.
    from ckptstore.io.s3_client import REQUEST_STATS as objects
    from ckptstore.store.executor import IO_STATS as loads

    # each field is a counter of the loads' IOStats or of the object-store client's RequestStats
    return IOCounts(**{f.name: getattr(loads if hasattr(loads, f.name) else objects, f.name) for f in fields(IOCounts)})
