"""Execute read plans: the planned byte ranges, straight into their destination buffers.

The executor runs exactly the ranges of a :class:`~ckptstore.store.read_plan.ParamReadPlan` through a
:class:`~ckptstore.io.ByteSource`. Ranges whose buffer is the destination array are cut
into units of about :data:`UNIT_BYTES` and read by a pool of threads (``preadv`` releases the
GIL, so copies from the page cache and the first-touch faults of fresh destination pages run on
several cores). Within a unit, ranges that follow each other in one file are read by one
vectored call into many buffers (a column slice of a chunk is one call, not one per row).
Scratch groups (compressed, checksummed or converted chunks) are read whole, checked, decoded
and copied, with the scratch memory held at once capped by ``max_inflight``. One
:class:`Executor` runs the plans of many parameters together, so small parameters share the
pool instead of each paying for threads.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Sequence

import crc32c
import numpy as np

from ckptstore.store.codecs import decode
from ckptstore.errors import (AccessDeniedError, FileAccessError, MissingFileError, ShortReadError, StoreCorruptError,
                              StoreUnavailableError)
from ckptstore.store.read_plan import ByteRangesPlan, ParamReadPlan, ReadGroup
from ckptstore.io.base import ByteSource, worth_merging

#: Bytes per unit of work handed to a thread: big enough that a unit's system calls dominate
#: its scheduling cost, small enough that the threads finish together.
UNIT_BYTES = 8 << 20
#: Scratch bytes (decoded/verified/converted chunks) held at once by default.
MAX_INFLIGHT = 256 << 20
#: Below this many planned bytes, reading on the calling thread beats starting a pool.
POOL_MIN_BYTES = 4 << 20
#: Up to this many ranges, a read's calls are found with plain ints rather than numpy.
_FEW_RANGES = 64
#: Destinations at least this large are allocated only once the files are known to hold the
#: planned bytes (:func:`check_extents`).
CHECKED_ALLOCATION = 64 << 20


@dataclass
class IOStats:
    """What this process's loads read through the executor: a test and benchmark hook (an
    executor given its own ``stats``, such as a converter's reading rank files, counts there).

    ``bytes_read`` and ``reads`` (byte ranges) as planned; ``requests``: calls to a byte source
    (one vectored read of a local file, one ranged GET of an object); ``files``: the locations
    read; ``scratch_peak``: the most scratch memory (compressed, checksummed or converted chunks)
    held at once. :func:`ckptstore.plan_rank` predicts each of them before a byte is read.
    """

    bytes_read: int = 0
    reads: int = 0
    requests: int = 0
    files: set[str] = field(default_factory=set)
    scratch_peak: int = 0
    _scratch_held: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, nbytes: int, reads: int = 1, requests: int = 0, files: Sequence[str] = ()) -> None:
        with self._lock:
            self.bytes_read += nbytes
            self.reads += reads
            self.requests += requests
            self.files.update(files)

    def hold(self, nbytes: int) -> None:
        """Scratch memory taken (``nbytes`` > 0) or given back (< 0)."""
        with self._lock:
            self._scratch_held += nbytes
            self.scratch_peak = max(self.scratch_peak, self._scratch_held)

    def reset(self) -> None:
        with self._lock:
            self.bytes_read = self.reads = self.requests = self.scratch_peak = self._scratch_held = 0
            self.files = set()


IO_STATS = IOStats()


def execute(plan: ParamReadPlan, source: ByteSource, *, out: np.ndarray | None = None,
            workers: int = 1) -> np.ndarray:
    """Fill and return an array of ``plan.shape`` (``out`` if given; its dtype may differ when the
    plan was made with that ``out_dtype``)."""
    if out is None:
        check_extents(plan, source)
        out = np.empty(plan.shape, dtype=plan.dtype)
    Executor(source, workers=workers).run([(plan, out)])
    return out


@contextmanager
def _reading(plan: ParamReadPlan) -> Iterator[None]:
    """Errors met opening or reading ``plan``'s files, as what they say about the store."""
    try:
        yield
    except (AccessDeniedError, StoreUnavailableError):
        raise  # the server refused or did not answer: the store itself is not known to be damaged
    except (ShortReadError, MissingFileError, FileAccessError) as e:
        raise StoreCorruptError(f"cannot read parameter {plan.name!r}: {e}. The store is damaged or "
                                "incomplete; run 'ckptstore verify' on it") from None


def check_extents(plan: ParamReadPlan, source: ByteSource) -> None:
    """Raise :class:`StoreCorruptError` if a range of ``plan`` reaches past the end of its file.

    Call it before allocating the plan's destination: a manifest is data, and one that declares
    an 8 TiB parameter over a 4 KiB file must fail here, naming both sizes, not in a MemoryError
    (or an mmap's ENOMEM) for the destination or a chunk's scratch buffer. Only plans that
    allocate at least :data:`CHECKED_ALLOCATION` bytes at once are checked: a smaller buffer costs
    nothing to allocate, the reads report a short file themselves, and an object's size costs a
    request.
    """
    groups = [g for g in plan.groups if len(g.files)]
    largest = max([plan.box.size * plan.dtype.itemsize, *(g.scratch_nbytes for g in groups)])
    if not groups or largest < CHECKED_ALLOCATION:
        return
    ends = np.zeros(len(plan.keys), dtype=np.int64)
    for g in groups:
        np.maximum.at(ends, g.files, g.offsets + g.lengths)
    for i in np.flatnonzero(ends).tolist():
        key, end = plan.keys[i], int(ends[i])
        with _reading(plan):
            size = source.open(key).size
        if end > size:
            raise StoreCorruptError(
                f"parameter {plan.name!r} (shape {list(plan.box.shape)} of {plan.dtype}) needs bytes up to byte "
                f"offset {end} of file {source.key_url(key)}, which is only {size} bytes: the manifest does not "
                "describe the data files (damaged, or a file was truncated or replaced); run 'ckptstore verify' on "
                "the store, or convert again")


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


@dataclass(frozen=True)
class _Ranges:
    """A slice of a group's range columns (file ids, file offsets, lengths, buffer offsets)."""

    files: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    dests: np.ndarray

    def __getitem__(self, s: slice | np.ndarray) -> "_Ranges":
        return _Ranges(self.files[s], self.offsets[s], self.lengths[s], self.dests[s])


class Executor:
    """Runs read plans through one byte source with a bounded pool of ``workers`` threads.

    :meth:`submit` starts a plan's reads and returns at once (the caller can plan the next
    parameter, or build the previous one, while the pool reads); :meth:`run` submits plans and
    waits for all of them. Use it as a context manager, or :meth:`close` it, to stop the pool.
    """

    def __init__(self, source: ByteSource, *, workers: int = 1, max_inflight: int = MAX_INFLIGHT,
                 unit_bytes: int | None = None, pool_min_bytes: int = POOL_MIN_BYTES,
                 reading: Callable[[ParamReadPlan], ContextManager[None]] | None = None,
                 stats: IOStats | None = None) -> None:
        self.source = source
        # a load's reads count in IO_STATS (what plan_rank predicts); a converter keeps its own
        self.stats = IO_STATS if stats is None else stats
        # what a failed open or read says: by default, about a store (a converter reading rank
        # files says it about the checkpoint instead)
        self._reading_ctx = reading or _reading
        self.workers = max(1, int(workers))
        self.unit_bytes = max(1, unit_bytes or source.unit_bytes or UNIT_BYTES)
        self.pool_min_bytes = pool_min_bytes
        self._budget = _Budget(max_inflight)
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def submit(self, plan: ParamReadPlan, out: np.ndarray, *, parallel: bool = True) -> "Job":
        """Start filling ``out`` with ``plan``'s bytes; ``Job.wait()`` returns when it is full.

        With one worker, or ``parallel=False``, the reads happen here, before this returns.
        """
        if type(plan) is ByteRangesPlan and plan.nbytes <= self.unit_bytes and not self.source.coalesces \
                and (self.workers == 1 or not parallel):
            self._read_byte_ranges(plan, out)  # a converter's chunk or batch of small chunks
            return _DONE
        _check_out(plan, out)
        units = self._work(plan, out)
        if self.workers == 1 or not parallel:  # the same units, run here in order
            for fn, args in units:
                fn(*args)
            return _DONE
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="ckptstore-read")
        return Job([self._pool.submit(fn, *args) for fn, args in units])

    def _work(self, plan: ParamReadPlan, out: np.ndarray) -> list[tuple[Callable[..., None], tuple[Any, ...]]]:
        """The units of work that fill ``out``, in order: ``(method, arguments)`` each."""
        units: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        for g in plan.groups:
            if g.into_destination:
                flat = out.reshape(-1).view(np.uint8)
                units += [(self._read, (plan, r, flat)) for r in self._units(g)]
            else:
                units.append((self._scratch, (plan, g, out)))
        return units

    def run(self, jobs: Sequence[tuple[ParamReadPlan, np.ndarray]]) -> None:
        """Fill each destination array with its plan's bytes (all plans share the pool)."""
        parallel = self.workers > 1 and sum(p.nbytes for p, _ in jobs) >= self.pool_min_bytes
        try:
            for job in [self.submit(plan, out, parallel=parallel) for plan, out in jobs]:
                job.wait()
        finally:
            self.close()

    def requests(self, plan: ParamReadPlan) -> int:
        """The read calls :meth:`submit` will make for ``plan`` (pure: nothing is read)."""
        count = 0
        for g in plan.groups:
            units = self._units(g) if g.into_destination else [_Ranges(g.files, g.offsets, g.lengths, g.dests)]
            count += sum(len(_calls(r, self.source.coalesces)) for r in units)
        return count

    def _units(self, g: ReadGroup) -> list[_Ranges]:
        """The group's ranges cut into pieces of at most one unit, grouped into units."""
        r = _Ranges(g.files, g.offsets, g.lengths, g.dests)
        n = len(r.lengths)
        # at most a unit in all (a converter's block, a small parameter): nothing to cut or group (a
        # source that coalesces groups several ranges by their gaps, below)
        if n == 1 and int(r.lengths[0]) <= self.unit_bytes:
            return [r]
        if n > 1 and not self.source.coalesces and int(r.lengths.sum()) <= self.unit_bytes:
            return [r]
        r = _split_long(r, self.unit_bytes)
        if not len(r.lengths):
            return []
        if self.source.coalesces:
            return _request_units(r, self.unit_bytes, self.source.gap_fraction)
        before = np.cumsum(r.lengths) - r.lengths  # bytes before each range
        ids = before // self.unit_bytes
        cuts = [0, *(np.flatnonzero(np.diff(ids)) + 1).tolist(), len(ids)]
        return [r[a:b] for a, b in zip(cuts[:-1], cuts[1:])]

    def _read(self, plan: ParamReadPlan, r: _Ranges, flat: np.ndarray) -> None:
        """Read ranges into ``flat`` (uint8): one vectored call per run that is contiguous in a file."""
        if not self.source.coalesces and len(r.lengths) <= _FEW_RANGES:
            # found with plain ints: numpy's fixed cost per call would exceed the work
            self._read_few(plan, r.files.tolist(), r.offsets.tolist(), r.lengths.tolist(), r.dests.tolist(), flat)
            return
        calls = _calls(r, self.source.coalesces)
        keys = []
        with self._reading_ctx(plan):
            for a, b in calls:
                f = self.source.open(plan.keys[int(r.files[a])])
                keys.append(f.url)
                buffers = _buffers(flat, r.dests[a:b], r.lengths[a:b])
                if self.source.coalesces:  # every range of the file in one call: near ones share a request
                    f.read_requests(list(zip(r.offsets[a:b].tolist(), buffers)))
                else:
                    f.readv(int(r.offsets[a]), buffers)
        self.stats.add(int(r.lengths.sum()), len(r.lengths), len(calls), keys)

    def _read_byte_ranges(self, plan: ByteRangesPlan, out: np.ndarray) -> None:
        """Run a :class:`~ckptstore.store.read_plan.ByteRangesPlan` of at most one unit here, from
        its columns as they are: the calls its one group would make (one unit, one vectored call
        per run contiguous in a file), without building the group, so that a converter's small
        reads cost about what a direct read costs."""
        if out.dtype != np.uint8 or out.shape != (plan.nbytes,) or not out.flags.c_contiguous \
                or not out.flags.writeable:
            _check_out(plan, out)  # raises, saying what is wrong
        self._read_few(plan, plan.range_files, plan.offsets, plan.lengths, plan.dests, out)

    def _read_few(self, plan: ParamReadPlan | ByteRangesPlan, files: list[int], offsets: list[int],
                  lengths: list[int], dests: list[int], flat: np.ndarray) -> None:
        """Read ranges given as plain ints from a source that does not coalesce: one vectored call
        per run contiguous in a file (what :func:`_calls` finds with numpy)."""
        n, i, calls = len(files), 0, 0
        opened: dict[int, Any] = {}
        try:
            while i < n:
                f_id, end, j = files[i], offsets[i] + lengths[i], i + 1
                while j < n and files[j] == f_id and offsets[j] == end:  # a run contiguous in the file
                    end += lengths[j]
                    j += 1
                f = opened.get(f_id)
                if f is None:
                    f = opened[f_id] = self.source.open(plan.keys[f_id])
                f.readv(offsets[i], [flat[d:d + m] for d, m in zip(dests[i:j], lengths[i:j])])
                calls += 1
                i = j
        except Exception:
            # said in the plan's words; entered only on failure (a context per read costs more
            # than the read of a small chunk)
            with self._reading_ctx(plan):
                raise
        self.stats.add(sum(lengths), n, calls, [f.url for f in opened.values()])

    def _scratch(self, plan: ParamReadPlan, g: ReadGroup, out: np.ndarray) -> None:
        n = g.scratch_nbytes
        self._budget.acquire(n)
        self.stats.hold(n)
        try:
            buf = np.empty(n, dtype=np.uint8)
            self._read(plan, _Ranges(g.files, g.offsets, g.lengths, g.dests), buf)
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
            self.stats.hold(-n)
            self._budget.release(n)


class Job:
    """The reads of one submitted plan."""

    def __init__(self, futures: list[Future[None]]) -> None:
        self._futures = futures

    def done(self) -> bool:
        return all(f.done() for f in self._futures)

    def wait(self) -> None:
        """Block until every read is done; raise the first error one of them met."""
        for f in self._futures:
            f.result()


#: The job of a plan read on the calling thread (nothing left to wait for).
_DONE = Job([])


def _calls(r: _Ranges, coalesces: bool) -> list[tuple[int, int]]:
    """``(first, stop)`` of the ranges each read call covers: a run contiguous in one file, or for
    a source that coalesces (an object store), every range of one file."""
    n = len(r.lengths)
    if n < 2:
        return [(0, n)] if n else []
    breaks = r.files[1:] != r.files[:-1]
    if not coalesces:
        breaks = breaks | (r.offsets[:-1] + r.lengths[:-1] != r.offsets[1:])
    cuts = [0, *(np.flatnonzero(breaks) + 1).tolist(), n]
    return list(zip(cuts[:-1], cuts[1:]))


def _split_long(r: _Ranges, unit: int) -> _Ranges:
    """The same ranges, those longer than ``unit`` cut into consecutive pieces of at most ``unit``."""
    pieces = -(-r.lengths // unit)
    if not len(pieces) or pieces.max() <= 1:
        return r
    index = np.repeat(np.arange(len(pieces)), pieces)
    step = np.arange(len(index)) - np.repeat(np.cumsum(pieces) - pieces, pieces)  # 0, 1, .. within a range
    shift = step * unit
    lengths = np.minimum(unit, r.lengths[index] - shift)
    return _Ranges(r.files[index], r.offsets[index] + shift, lengths, r.dests[index] + shift)


def _request_units(r: _Ranges, most: int, fraction: float) -> list[_Ranges]:
    """For a source that pays per request: units that are one request each (ranges of one file,
    near enough that the bytes between them cost at most ``fraction`` more, spanning at most
    ``most`` bytes), so the requests issued are exactly the merged ranges."""
    order = np.lexsort((r.offsets, r.files))
    files, offsets, lengths = r.files[order].tolist(), r.offsets[order].tolist(), r.lengths[order].tolist()
    cuts = [0]
    start, stop, wanted = offsets[0], offsets[0] + lengths[0], lengths[0]
    for i in range(1, len(files)):
        off, n = offsets[i], lengths[i]
        end = max(stop, off + n)
        if (files[i] == files[i - 1] and end - start <= most
                and worth_merging(stop - start, wanted, off - stop, n, fraction)):
            stop, wanted = end, wanted + n
        else:
            cuts.append(i)
            start, stop, wanted = off, off + n, n
    cuts.append(len(files))
    return [r[order[a:b]] for a, b in zip(cuts[:-1], cuts[1:])]


def _buffers(flat: np.ndarray, dests: np.ndarray, lengths: np.ndarray) -> list[Any]:
    """Views of ``flat`` at ``dests`` of ``lengths`` bytes, in order.

    Runs of equal lengths at a constant positive stride (a chunk's rows landing in the rows of a
    wider destination) become the rows of one strided view, made in C rather than one Python
    slice per row.
    """
    n = len(dests)
    if n < 3:
        return [flat[d:d + m] for d, m in zip(dests.tolist(), lengths.tolist())]
    steps = np.diff(dests)
    cuts = np.flatnonzero((steps[1:] != steps[:-1]) | (lengths[2:] != lengths[1:-1])) + 2
    cuts = np.union1d(cuts, np.flatnonzero(lengths[1:] != lengths[:-1]) + 1)
    out: list[Any] = []
    bounds = [0, *cuts.tolist(), n]
    for a, b in zip(bounds[:-1], bounds[1:]):
        length, start = int(lengths[a]), int(dests[a])
        stride = int(dests[a + 1] - dests[a]) if b - a > 1 else 0
        if b - a > 2 and stride >= length:
            out += list(np.lib.stride_tricks.as_strided(flat[start:], shape=(b - a, length), strides=(stride, 1)))
        else:
            out += [flat[d:d + m] for d, m in zip(dests[a:b].tolist(), lengths[a:b].tolist())]
    return out


def _check_out(plan: ParamReadPlan, out: np.ndarray) -> None:
    if out.shape != plan.shape or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"out must be a writeable C-contiguous array of shape {list(plan.shape)}, got "
                         f"{list(out.shape)}")
    if out.dtype != plan.dtype and any(g.into_destination for g in plan.groups):
        raise ValueError(f"out has dtype {out.dtype} but the plan reads {plan.dtype} straight into it; "
                         "plan with out_dtype= to convert")
