"""Execute read plans: bytes from store files straight into one preallocated array.

Raw chunks are read with ``preadv`` into the destination's memory when their overlap is a few
long runs, and through a read-only ``mmap`` of the chunk plus one numpy copy when it is many
short runs (a column slice), so either way each needed byte is copied once from the page
cache into the destination. Compressed chunks are read whole, decoded, and copied. With
``verify=True`` each touched chunk is read whole and its CRC-32C checked first.
"""
from __future__ import annotations

import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
import numpy as np

from .backends.zarr_backend import numcodecs_codec
from .boxes import Box, paired_runs
from .errors import StoreCorruptError
from .planner import ChunkRead, ParamReadPlan

_PAGE = mmap.ALLOCATIONGRANULARITY
_FEW_RUNS = 64
_LONG_RUN = 256 * 1024
_PARALLEL_BYTES = 64 << 20


@dataclass
class IOStats:
    """Bytes this process read from store files (a test and benchmark hook)."""

    bytes_read: int = 0
    reads: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, nbytes: int, reads: int = 1) -> None:
        with self._lock:
            self.bytes_read += nbytes
            self.reads += reads

    def reset(self) -> None:
        with self._lock:
            self.bytes_read = self.reads = 0


IO_STATS = IOStats()


class StoreFiles:
    """Open file descriptors of one store's data files, shared by threads, opened on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def fd(self, rel: str) -> int:
        with self._lock:
            fd = self._fds.get(rel)
            if fd is None:
                try:
                    fd = os.open(self.root / rel, os.O_RDONLY)
                except FileNotFoundError:
                    raise StoreCorruptError(f"store file {self.root / rel} is missing") from None
                self._fds[rel] = fd
            return fd

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def execute(plan: ParamReadPlan, files: StoreFiles, *, out: np.ndarray | None = None,
            verify: bool = False, workers: int = 1) -> np.ndarray:
    """Fill and return an array of ``plan.shape`` (``out`` if given; its dtype may differ, then
    each chunk's overlap is cast on the way, one chunk at a time)."""
    if out is None:
        out = np.empty(plan.shape, dtype=plan.dtype)
    elif out.shape != plan.shape or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous with shape {list(plan.shape)}, got {list(out.shape)}")
    job = _Job(plan, files, out, verify)
    # Threads pay off only for big reads: for small ones, starting them costs more than the copy.
    if workers > 1 and len(plan.chunks) > 1 and plan.nbytes >= _PARALLEL_BYTES:
        with ThreadPoolExecutor(min(workers, len(plan.chunks))) as pool:
            list(pool.map(job.chunk, plan.chunks))
    else:
        for c in plan.chunks:
            job.chunk(c)
    return out


class _Job:
    def __init__(self, plan: ParamReadPlan, files: StoreFiles, out: np.ndarray, verify: bool) -> None:
        self.plan, self.files, self.out, self.verify = plan, files, out, verify
        self.cast = out.dtype != plan.dtype
        self._codec = numcodecs_codec(plan.codec)

    def chunk(self, c: ChunkRead) -> None:
        if self._codec is not None or self.verify:
            self._whole(c)
        elif self.cast:
            tmp = np.empty(c.overlap.shape, dtype=self.plan.dtype)
            self._raw(c, tmp, c.overlap)
            self.out[c.overlap.relative_to(self.plan.box).slices()] = tmp
        else:
            self._raw(c, self.out, self.plan.box)

    def _raw(self, c: ChunkRead, dest: np.ndarray, dest_box: Box) -> None:
        item = self.plan.dtype.itemsize
        src, dst, run = paired_runs(c.overlap, c.container, dest_box)
        fd = self.files.fd(c.file)
        if len(src) <= _FEW_RUNS or run * item >= _LONG_RUN:
            view = memoryview(dest.reshape(-1).view(np.uint8))
            nbytes = run * item
            for s, d in zip((src * item + c.offset).tolist(), (dst * item).tolist()):
                self._pread(fd, view[d:d + nbytes], s, c)
            IO_STATS.add(len(src) * nbytes, len(src))
            return
        base = c.offset - c.offset % _PAGE
        with mmap.mmap(fd, c.offset - base + c.container.size * item, prot=mmap.PROT_READ, offset=base) as mm:
            block = np.frombuffer(mm, dtype=self.plan.dtype, count=c.container.size,
                                  offset=c.offset - base).reshape(c.container.shape)
            dest[c.overlap.relative_to(dest_box).slices()] = block[c.overlap.relative_to(c.container).slices()]
            del block
        IO_STATS.add(c.overlap.size * item)

    def _whole(self, c: ChunkRead) -> None:
        if c.container != c.chunk_box:  # dense layout: gather the chunk's elements first
            gathered = np.empty(c.chunk_box.shape, dtype=self.plan.dtype)
            self._raw(ChunkRead(c.index, c.file, c.offset, c.stored_nbytes, c.crc32c, c.chunk_box, c.chunk_box,
                                c.container), gathered, c.chunk_box)
            raw: bytes | bytearray = gathered.tobytes()
        else:
            raw = bytearray(c.stored_nbytes)
            self._pread(self.files.fd(c.file), memoryview(raw), c.offset, c)
            IO_STATS.add(len(raw))
        if self.verify and crc32c.crc32c(raw) != c.crc32c:
            raise StoreCorruptError(
                f"checksum mismatch in chunk {c.index} of parameter {self.plan.name!r} "
                f"(file {self.files.root / c.file}, byte offset {c.offset}, {c.stored_nbytes} bytes): the store "
                "is damaged; convert again or restore it from a copy")
        data = self._codec.decode(raw) if self._codec is not None else raw
        chunk = np.frombuffer(data, dtype=self.plan.dtype, count=c.chunk_box.size).reshape(c.chunk_box.shape)
        self.out[c.overlap.relative_to(self.plan.box).slices()] = chunk[c.overlap.relative_to(c.chunk_box).slices()]

    def _pread(self, fd: int, view: memoryview, offset: int, c: ChunkRead) -> None:
        done = 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], offset + done)
            if n <= 0:
                raise StoreCorruptError(
                    f"store file {self.files.root / c.file} ends before chunk {c.index} of parameter "
                    f"{self.plan.name!r} (byte offset {offset + done}); the store is truncated")
            done += n
