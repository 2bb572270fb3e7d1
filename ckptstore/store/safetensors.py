"""The safetensors layout of a store: global tensors, whole and contiguous, in a few files.

``STORE/model-00001-of-00003.safetensors`` ... hold every parameter as one tensor with its
global shape (files are filled in source order up to a size limit), so ``safetensors.safe_open``
and any safetensors reader see ordinary named tensors. ``STORE/ckptstore.json`` is the same
manifest as in a Zarr store (``layout: "dense"`` per parameter: each chunk is a logical box of
the tensor with its checksum and source rank) and is written last: a folder without it is an
unfinished conversion. This module is the writer's half; reading needs only the manifest.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

import numpy as np

from ckptstore.formats.safetensors_header import build_header
from ckptstore.io.sink import ByteSink, partial_key

DEFAULT_FILE_BYTES = 4 << 30


@dataclass(frozen=True)
class TensorSlot:
    """Where one parameter's global tensor lives: file, and byte offset of its data."""

    name: str
    file: str
    data_offset: int
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class FileLayout:
    """One safetensors file: its header bytes and the tensors it holds."""

    name: str
    header: bytes
    slots: tuple[TensorSlot, ...]

    @property
    def size(self) -> int:
        return len(self.header) + sum(s.nbytes for s in self.slots)


def plan_files(tensors: Sequence[tuple[str, np.dtype, tuple[int, ...]]], *,
               max_file_bytes: int = DEFAULT_FILE_BYTES) -> list[FileLayout]:
    """Assign tensors, in order, to files of at most ``max_file_bytes`` (one tensor may exceed it)."""
    groups: list[list[tuple[str, np.dtype, tuple[int, ...]]]] = [[]]
    used = 0
    for name, dtype, shape in tensors:
        n = prod(shape) * np.dtype(dtype).itemsize
        if groups[-1] and used + n > max_file_bytes:
            groups.append([])
            used = 0
        groups[-1].append((name, np.dtype(dtype), tuple(shape)))
        used += n
    total = len(groups)
    return [_layout(f"model-{i + 1:05d}-of-{total:05d}.safetensors", g) for i, g in enumerate(groups)]


def _layout(file: str, group: Sequence[tuple[str, np.dtype, tuple[int, ...]]]) -> FileLayout:
    head, infos = build_header(group, {"format": "pt", "written_by": "ckptstore"})
    slots = tuple(TensorSlot(t.name, file, t.start, t.dtype, t.shape) for t in infos)
    return FileLayout(file, head, slots)


def reuse_file(sink: ByteSink, layout: FileLayout) -> bool:
    """Make ``layout``'s partial file ready to (re)fill; return whether existing bytes were kept.

    An interrupted run leaves the partial file (or, if it died during the commit, the published
    one, which is moved back). Either is kept when it has exactly this header and size; anything
    else is replaced by a new file of zeros, whose tensors must then all be written.
    """
    with sink.create(layout.name, resume=True) as f:
        if f.size == layout.size and f.pread(0, len(layout.header)) == layout.header:
            return True
        if _published(sink, layout):
            f.close()
            sink.unpublish(layout.name)
            return True
        f.truncate(0)
        f.pwrite(layout.header, 0)
        f.truncate(layout.size)
    return False


def _published(sink: ByteSink, layout: FileLayout) -> bool:
    if sink.size(layout.name) != layout.size:
        return False
    try:
        return sink.source.open(layout.name).pread(0, len(layout.header)) == layout.header
    finally:
        sink.source.close()  # the file may be renamed next: keep no open file of it


def finish_file(sink: ByteSink, layout: FileLayout) -> None:
    """Publish a filled partial file (idempotent; a streamed file is published already)."""
    if sink.size(partial_key(layout.name)) is None and sink.size(layout.name) == layout.size:
        return  # an earlier commit of this run already moved it, or it was streamed whole
    sink.publish(layout.name)
