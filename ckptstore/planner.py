"""Plan reads: which chunk bytes fill which part of a destination box (pure; no I/O).

Given a parameter's manifest and the global box a rank needs, the plan lists every chunk that
overlaps it with the overlap (global frame). For raw chunks, :meth:`ParamReadPlan.ranges`
expands that into byte ranges ``(file, offset, length, dest_offset)``, coalesced where both
sides are contiguous; compressed chunks are read (and decoded) whole. ``nbytes`` is what the
execution will read, so tests and benchmarks can assert it before a byte moves.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np

from .boxes import Box, paired_runs
from .manifest import ParamManifest


@dataclass(frozen=True)
class ChunkRead:
    """One chunk's contribution to a destination: the chunk, where its bytes are, and the overlap.

    ``container`` is the C-order block that holds the chunk in the file, starting at byte
    ``offset``: the chunk itself in a chunked store, the whole tensor in a dense one. All boxes
    are in the global frame.
    """

    index: int
    file: str
    offset: int
    stored_nbytes: int
    crc32c: int
    chunk_box: Box
    overlap: Box
    container: Box


@dataclass(frozen=True)
class ParamReadPlan:
    """Reads that fill one parameter's destination box (global frame ``box``)."""

    name: str
    dtype: np.dtype
    box: Box
    chunks: tuple[ChunkRead, ...]
    codec: Mapping[str, Any] | None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.box.shape

    @property
    def nbytes(self) -> int:
        """Bytes the execution reads: the overlaps of raw chunks, whole compressed chunks."""
        if self.codec is not None:
            return sum(c.stored_nbytes for c in self.chunks)
        return sum(c.overlap.size for c in self.chunks) * self.dtype.itemsize

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.file for c in self.chunks))

    def runs(self, chunk: ChunkRead) -> tuple[np.ndarray, np.ndarray, int]:
        """Byte runs of one raw chunk's overlap: (file offsets, destination offsets, run length)."""
        src, dst, run = paired_runs(chunk.overlap, chunk.container, self.box)
        item = self.dtype.itemsize
        return src * item + chunk.offset, dst * item, run * item

    def ranges(self) -> Iterator[tuple[str, int, int, int | None]]:
        """Coalesced ``(file, offset, length, dest_offset)`` byte ranges, in order.

        Compressed chunks are read whole and decoded before their overlap is copied, so for them
        each range is a whole stored chunk and ``dest_offset`` is ``None``.
        """
        if self.codec is not None:
            yield from ((c.file, c.offset, c.stored_nbytes, None) for c in self.chunks)
            return
        cur: list[Any] | None = None
        for chunk in self.chunks:
            src, dst, run = self.runs(chunk)
            for s, d in zip(src.tolist(), dst.tolist()):
                if cur and cur[0] == chunk.file and cur[1] + cur[2] == s and cur[3] + cur[2] == d:
                    cur[2] += run
                    continue
                if cur:
                    yield tuple(cur)  # type: ignore[misc]
                cur = [chunk.file, s, run, d]
        if cur:
            yield tuple(cur)  # type: ignore[misc]


@dataclass(frozen=True)
class ReadPlan:
    """Reads for several parameters (e.g. everything one rank needs)."""

    params: Mapping[str, ParamReadPlan]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.params.values())

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f for p in self.params.values() for f in p.files))


def plan_param(manifest: ParamManifest, box: Box | None = None) -> ParamReadPlan:
    """The reads that fill global ``box`` (whole tensor when ``None``) of one parameter."""
    box = Box.full(manifest.shape) if box is None else box
    if not Box.full(manifest.shape).contains(box):
        raise ValueError(f"box [{list(box.start)}, {list(box.stop)}) is outside parameter {manifest.name!r} "
                         f"of shape {list(manifest.shape)}")
    t = manifest.chunks
    reads = []
    for i in manifest.chunks_overlapping(box):
        cbox = manifest.chunk_box(i)
        overlap = cbox.intersect(box)
        if overlap is None or (overlap.size == 0 and overlap.ndim):
            continue
        container, offset = (cbox, t.offsets[i]) if not manifest.dense else manifest.container(i)
        reads.append(ChunkRead(i, t.files[i], offset, t.nbytes[i], t.crc32c[i], cbox, overlap, container))
    return ParamReadPlan(manifest.name, manifest.np_dtype, box, tuple(reads), manifest.codec)


def plan_reads(manifests: Mapping[str, ParamManifest], boxes: Mapping[str, Box | None]) -> ReadPlan:
    """Plans for every named parameter's box."""
    return ReadPlan({n: plan_param(manifests[n], b) for n, b in boxes.items()})
