"""Conversion split across processes and hosts: ``convert --part I/N``.

Every part opens the same source and makes the same plan, then converts a deterministic,
byte-balanced share of it: the work units (a parameter; for a safetensors store, a data file
with its tensors) are dealt largest first to the part with the fewest bytes so far (LPT), so
parts never write the same file and finish close together. A part records each finished
parameter in the work folder, then a marker ``parts/<I>-of-<N>``; the part that finds all N
markers commits the store (under the folder's lock on a filesystem; on object storage every
committer writes the same manifest, so a race is harmless). ``ckptstore commit`` does it
explicitly. Parts are numbered from 0, like ``RANK_ID``.
"""
from __future__ import annotations

import heapq
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ckptstore.errors import InvalidOptionError
from ckptstore.launcher import is_scheduler, job
from ckptstore.store.work import PARTS_DIR, marker

__all__ = ["MAX_PARTS", "PARTS_DIR", "Part", "assign", "parse_part"]
#: Parts of one conversion (a process per rank file of the largest jobs, and then some).
MAX_PARTS = 1 << 16
_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Part:
    """Part ``index`` (from 0) of ``count``."""

    index: int = 0
    count: int = 1

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def marker(self) -> str:
        """The work-folder key that says this part has finished."""
        return marker(self.index, self.count)


#: Why a process takes no part in ``--part auto``.
SCHEDULER_NO_PART = ("this is msrun's scheduler process (MS_ROLE=MS_SCHED), which is no rank of the job: it takes "
                     "no part; the worker processes convert")


def parse_part(spec: str | Part | None, environ: Mapping[str, str] | None = None) -> Part | None:
    """``"I/N"`` (``0 <= I < N``), ``"auto"`` (from msrun's or mpirun's environment) or ``None`` (one part).

    Returns ``None`` for ``"auto"`` in msrun's scheduler process, which runs the job's command
    too (with ``RANK_ID=0``) but is no rank: it must take no part (:data:`SCHEDULER_NO_PART`).
    """
    if spec is None or isinstance(spec, Part):
        return spec or Part()
    if isinstance(spec, str) and spec.strip().lower() == "auto":
        if is_scheduler(environ):
            return None
        place = job(environ)  # the one rank/size lookup (MindSpore's communication when initialised)
        if place.rank is not None and place.world is not None:
            return _checked(str(place.rank), str(place.world), place.said_by)
        raise InvalidOptionError("--part auto needs RANK_ID and RANK_SIZE (set by msrun) or OMPI_COMM_WORLD_RANK and "
                                 "OMPI_COMM_WORLD_SIZE (set by mpirun) in the environment; or pass --part I/N")
    m = _SPEC.match(spec) if isinstance(spec, str) else None
    if m is None:
        raise InvalidOptionError(f"--part must be I/N (e.g. 0/4 for the first of four parts) or auto, not {spec!r}")
    return _checked(m.group(1), m.group(2), "--part")


def _checked(index: str, count: str, what: str) -> Part:
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise InvalidOptionError(f"{what} must be whole numbers, not {index!r}/{count!r}") from None
    if not 1 <= n <= MAX_PARTS or not 0 <= i < n:
        raise InvalidOptionError(f"{what} gives part {i} of {n}: parts are numbered 0..N-1 with 1 <= N <= {MAX_PARTS}")
    return Part(i, n)


def assign(sizes: Sequence[int], count: int) -> list[int]:
    """The part of each work unit (by its bytes): largest first to the least-loaded part.

    Deterministic (ties go to the earlier unit and the lower part), so every part computes the
    same assignment.
    """
    order = sorted(range(len(sizes)), key=lambda u: (-sizes[u], u))
    heap = [(0, p) for p in range(count)]
    out = [0] * len(sizes)
    for u in order:
        load, p = heapq.heappop(heap)
        out[u] = p
        heapq.heappush(heap, (load + sizes[u], p))
    return out
