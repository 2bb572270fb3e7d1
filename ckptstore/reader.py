"""Execute read plans: the planned byte ranges, straight into their destination buffers.

The executor runs exactly the ranges of a :class:`~ckptstore.planner.ParamReadPlan` through a
:class:`~ckptstore.sources.ByteSource`. Ranges whose buffer is the destination array are cut
into units of about :data:`UNIT_BYTES` and read by a pool of threads (``preadv`` releases the
GIL, so reads from the page cache and the first-touch faults of fresh destination pages run on
several cores); scratch groups (compressed, checksummed or converted chunks) are read whole,
checked, decoded and copied, with the scratch memory held at once capped by ``max_inflight``.
One :class:`Executor` can run the plans of many parameters together, so small parameters share
the pool instead of each paying for threads.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import crc32c
import numpy as np

from .codecs import decode
from .errors import FileAccessError, MissingFileError, ShortReadError, StoreCorruptError
from .planner import ParamReadPlan, ReadGroup
from .sources.base import ByteSource, Request

#: Bytes per unit of work handed to a thread: big enough that a unit's system calls dominate
#: its scheduling cost, small enough that two threads finish together.
UNIT_BYTES = 8 << 20
#: Scratch bytes (decoded/verified/converted chunks) held at once by default.
MAX_INFLIGHT = 256 << 20
#: Below this many planned bytes, reading on the calling thread beats starting a pool.
POOL_MIN_BYTES = 4 << 20


@dataclass
class IOStats:
    """Bytes this process read through the executor (a test and benchmark hook)."""

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


def execute(plan: ParamReadPlan, source: ByteSource, *, out: np.ndarray | None = None,
            workers: int = 1) -> np.ndarray:
    """Fill and return an array of ``plan.shape`` (``out`` if given; its dtype may differ when the
    plan was made with that ``out_dtype``)."""
    if out is None:
        out = np.empty(plan.shape, dtype=plan.dtype)
    Executor(source, workers=workers).run([(plan, out)])
    return out


class _Budget:
    """A cap on scratch bytes held at once (one oversized request may always proceed alone)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self._cond = threading.Condition()

    def acquire(self, n: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n

    def release(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()


class Executor:
    """Runs read plans through one byte source with a bounded pool of ``workers`` threads."""

    def __init__(self, source: ByteSource, *, workers: int = 1, max_inflight: int = MAX_INFLIGHT,
                 unit_bytes: int = UNIT_BYTES, pool_min_bytes: int = POOL_MIN_BYTES) -> None:
        self.source = source
        self.workers = max(1, int(workers))
        self.unit_bytes = unit_bytes
        self.pool_min_bytes = pool_min_bytes
        self._budget = _Budget(max_inflight)

    def run(self, jobs: Sequence[tuple[ParamReadPlan, np.ndarray]]) -> None:
        """Fill each destination array with its plan's bytes (all plans share the pool)."""
        units: list[Callable[[], None]] = []
        total = 0
        for plan, out in jobs:
            _check_out(plan, out)
            for g in plan.groups:
                total += g.nbytes
                if g.into_destination:
                    units += self._direct_units(plan, g, out)
                else:
                    units.append(_bind(self._scratch, plan, g, out))
        if self.workers == 1 or total < self.pool_min_bytes or len(units) < 2:
            for u in units:
                u()
            return
        with ThreadPoolExecutor(min(self.workers, len(units))) as pool:
            for f in [pool.submit(u) for u in units]:
                f.result()

    def _direct_units(self, plan: ParamReadPlan, g: ReadGroup, out: np.ndarray) -> list[Callable[[], None]]:
        view = memoryview(out.reshape(-1).view(np.uint8)) if out.size else memoryview(b"")
        units: list[Callable[[], None]] = []
        batch: list[tuple[int, int, int, int]] = []
        size = 0
        for f, o, n, d in zip(g.files.tolist(), g.offsets.tolist(), g.lengths.tolist(), g.dests.tolist()):
            while n:  # cut long ranges so threads share them
                take = min(n, self.unit_bytes - size)
                batch.append((f, o, take, d))
                size += take
                o, d, n = o + take, d + take, n - take
                if size >= self.unit_bytes:
                    units.append(_bind(self._read_batch, plan, batch, view))
                    batch, size = [], 0
        if batch:
            units.append(_bind(self._read_batch, plan, batch, view))
        return units

    def _read_batch(self, plan: ParamReadPlan, batch: list[tuple[int, int, int, int]], view: memoryview) -> None:
        by_file: dict[int, list[Request]] = {}
        for f, o, n, d in batch:
            by_file.setdefault(f, []).append((o, view[d:d + n]))
        for f, requests in by_file.items():
            self._read(plan, f, requests)

    def _read(self, plan: ParamReadPlan, f: int, requests: list[Request]) -> None:
        key = plan.keys[f]
        try:
            self.source.open(key).read_requests(requests)
        except (ShortReadError, MissingFileError, FileAccessError) as e:
            raise StoreCorruptError(f"cannot read parameter {plan.name!r}: {e}. The store is damaged or "
                                    "incomplete; run 'ckptstore verify' on it") from None
        IO_STATS.add(sum(len(b) for _, b in requests), len(requests))

    def _scratch(self, plan: ParamReadPlan, g: ReadGroup, out: np.ndarray) -> None:
        n = g.scratch_nbytes
        self._budget.acquire(n)
        try:
            buf = bytearray(n)
            view = memoryview(buf)
            by_file: dict[int, list[Request]] = {}
            for f, o, m, d in zip(g.files.tolist(), g.offsets.tolist(), g.lengths.tolist(), g.dests.tolist()):
                by_file.setdefault(f, []).append((o, view[d:d + m]))
            for f, requests in by_file.items():
                self._read(plan, f, requests)
            if g.crc32c is not None and crc32c.crc32c(buf) != g.crc32c:
                first = plan.keys[int(g.files[0])] if len(g.files) else "?"
                raise StoreCorruptError(
                    f"checksum mismatch in chunk {g.chunk} of parameter {plan.name!r} (file "
                    f"{self.source.key_url(first)}, byte offset {int(g.offsets[0]) if len(g.offsets) else 0}, "
                    f"{n} bytes): the store is damaged; convert again or restore it from a copy")
            data: Any = buf
            if g.decode:
                data = decode(plan.codec, buf, g.frame.size * plan.dtype.itemsize, plan.name, g.chunk)
            block = np.frombuffer(data, dtype=plan.dtype, count=g.frame.size).reshape(g.frame.shape)
            out[g.overlap.relative_to(plan.box).slices()] = block[g.overlap.relative_to(g.frame).slices()]
        finally:
            self._budget.release(n)


def _bind(fn: Callable[..., None], *args: Any) -> Callable[[], None]:
    return lambda: fn(*args)


def _check_out(plan: ParamReadPlan, out: np.ndarray) -> None:
    if out.shape != plan.shape or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"out must be a writeable C-contiguous array of shape {list(plan.shape)}, got "
                         f"{list(out.shape)}")
    if any(g.into_destination for g in plan.groups) and out.dtype != plan.dtype:
        raise ValueError(f"out has dtype {out.dtype} but the plan reads {plan.dtype} straight into it; "
                         "plan with out_dtype= to convert")
