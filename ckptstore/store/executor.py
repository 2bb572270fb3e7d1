"""Execute read plans: the planned requests, straight into their destination buffers.

The executor sends exactly the requests of a :class:`~ckptstore.store.read_plan.ParamReadPlan`
(:attr:`ReadGroup.cuts <ckptstore.store.read_plan.ReadGroup.cuts>`, priced and chosen by the
planner from the source's :class:`~ckptstore.io.base.ReadCost`) through a
:class:`~ckptstore.io.ByteSource`: one :meth:`~ckptstore.io.base.ReadableFile.read_span` per
request, its ranges landing in their buffers and the gaps between them dropped. It decides
nothing about requests; it only hands them to threads. Requests into the destination are
packed into units of about :data:`UNIT_SECONDS` of modelled time (many small ``preadv`` calls
of a local file per unit, one GET of an object store per unit, so that the pool keeps as many
requests in flight as it has threads); ``preadv`` releases the GIL, and an object store's
requests wait on the network, so the copies and the waits of several units overlap. Scratch
groups (compressed, checksummed or converted chunks) are read whole, checked, decoded and
copied, with the scratch memory held at once capped by ``max_inflight``. One
:class:`Executor` runs the plans of many parameters together, so small parameters share the
pool instead of each paying for threads.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import crc32c
import numpy as np

from ckptstore.errors import (
    AccessDeniedError,
    FileAccessError,
    MissingFileError,
    ShortReadError,
    StoreCorruptError,
    StoreUnavailableError,
)
from ckptstore.io.base import ByteSource
from ckptstore.io.counting import Counters
from ckptstore.store.codecs import decode
from ckptstore.store.read_plan import AnyParamReadPlan, ByteRangesPlan, ReadGroup

#: Modelled time per unit of work handed to a thread: long enough that a unit's requests
#: dominate its scheduling cost (about 8 MiB of local reads), short enough that the threads
#: finish together; a request of an object store is a unit of its own.
UNIT_SECONDS = 1e-3
#: Bytes of a :class:`~ckptstore.store.read_plan.ByteRangesPlan` read on the calling thread.
UNIT_BYTES = 8 << 20
#: Scratch bytes (decoded/verified/converted chunks) held at once by default.
MAX_INFLIGHT = 256 << 20
#: Below this many planned bytes, reading on the calling thread beats starting a pool.
POOL_MIN_BYTES = 4 << 20
#: What one answer of a windowed source holds while it streams into its buffers, whatever its
#: length (measured on S3 with obstore: a thread's share grew to 0.9 MiB for 2 MiB answers); a
#: longer request counts this much in :class:`_Window`, so long GETs still run several at once.
ANSWER_BYTES = 1 << 20
#: Destinations at least this large are allocated only once the files are known to hold the
#: planned bytes (:func:`check_extents`).
CHECKED_ALLOCATION = 64 << 20


@dataclass
class IOStats(Counters):
    """What this process's loads read through the executor: a test and benchmark hook (an
    executor given its own ``stats``, such as a converter's reading rank files, counts there).

    ``bytes_read`` and ``reads`` (byte ranges) as planned; ``requests``: calls to a byte source
    (one vectored read of a local file, one ranged GET of an object); ``bytes_fetched``: the bytes
    those requests transferred (the wanted ones and the gaps inside requests); ``files``: the locations
    read; ``scratch_peak``: the most scratch memory (compressed, checksummed or converted chunks)
    held at once. :func:`ckptstore.plan_rank` predicts each of them before a byte is read.
    """

    bytes_read: int = 0
    reads: int = 0
    requests: int = 0
    bytes_fetched: int = 0
    files: set[str] = field(default_factory=set)
    scratch_peak: int = 0
    _scratch_held: int = 0

    def add_read(self, nbytes: int, reads: int = 1, requests: int = 0, files: Sequence[str] = (),
                 fetched: int | None = None) -> None:
        """Count ``reads`` planned ranges of ``nbytes`` in ``requests`` calls to ``files``
        (``fetched`` bytes transferred: ``nbytes`` unless the requests spanned gaps)."""
        with self._lock:
            self.bytes_read += nbytes
            self.reads += reads
            self.requests += requests
            self.bytes_fetched += nbytes if fetched is None else fetched
            self.files.update(files)

    def hold(self, nbytes: int) -> None:
        """Scratch memory taken (``nbytes`` > 0) or given back (< 0)."""
        with self._lock:
            self._scratch_held += nbytes
            self.scratch_peak = max(self.scratch_peak, self._scratch_held)


IO_STATS = IOStats()


def execute(plan: AnyParamReadPlan, source: ByteSource, *, out: np.ndarray | None = None,
            workers: int = 1) -> np.ndarray:
    """Fill and return an array of ``plan.shape`` (``out`` if given; its dtype may differ when the
    plan was made with that ``out_dtype``)."""
    if out is None:
        check_extents(plan, source)
        out = np.empty(plan.shape, dtype=plan.dtype)
    Executor(source, workers=workers).run([(plan, out)])
    return out


@contextmanager
def _reading(plan: AnyParamReadPlan) -> Iterator[None]:
    """Errors met opening or reading ``plan``'s files, as what they say about the store."""
    try:
        yield
    except (AccessDeniedError, StoreUnavailableError):
        raise  # the server refused or did not answer: the store itself is not known to be damaged
    except (ShortReadError, MissingFileError, FileAccessError) as e:
        raise StoreCorruptError(f"cannot read parameter {plan.name!r}: {e}. The store is damaged or "
                                "incomplete; run 'ckptstore verify' on it") from None


def check_extents(plan: AnyParamReadPlan, source: ByteSource) -> None:
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


class ByteBudget:
    """A cap on bytes held at once, shared by threads: the executor's scratch buffers, a
    background save's staged copies. :meth:`take` waits until ``n`` more bytes fit (one
    oversized take may always proceed alone; ``limit=None``: unbounded), :meth:`give` returns
    them; :meth:`stop` ends every wait, after which :meth:`take` returns ``False``. ``on_wait``
    is called (under the budget's lock) each time a take has to wait. ``peak`` is the most held."""

    def __init__(self, limit: int | None, *, on_wait: Callable[[], None] | None = None) -> None:
        self.limit, self.used, self.peak = limit, 0, 0
        self.stopped = False
        self._on_wait = on_wait
        self._cond = threading.Condition()

    def take(self, n: int) -> bool:
        with self._cond:
            while not self.stopped and self.limit is not None and self.used and self.used + n > self.limit:
                if self._on_wait is not None:
                    self._on_wait()
                self._cond.wait()
            if self.stopped:
                return False
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def give(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()


@dataclass(frozen=True)
class _Requests:
    """Requests ``first:stop`` of a group (their ranges ``cuts[first]:cuts[stop]``)."""

    group: ReadGroup
    cuts: np.ndarray
    first: int
    stop: int


class Executor:
    """Runs read plans through one byte source with a bounded pool of ``workers`` threads.

    :meth:`submit` starts a plan's reads and returns at once (the caller can plan the next
    parameter, or build the previous one, while the pool reads); :meth:`run` submits plans and
    waits for all of them. Use it as a context manager, or :meth:`close` it, to stop the pool.
    ``unit_bytes`` packs requests into units by their bytes instead of their modelled time (a
    test's way of forcing many units).
    """

    def __init__(self, source: ByteSource, *, workers: int = 1, max_inflight: int = MAX_INFLIGHT,
                 unit_bytes: int | None = None, pool_min_bytes: int = POOL_MIN_BYTES,
                 reading: Callable[[AnyParamReadPlan], AbstractContextManager[None]] | None = None,
                 stats: IOStats | None = None) -> None:
        self.source = source
        self.cost = source.read_cost()
        # a load's reads count in IO_STATS (what plan_rank predicts); a converter keeps its own
        self.stats = IO_STATS if stats is None else stats
        # what a failed open or read says: by default, about a store (a converter reading rank
        # files says it about the checkpoint instead)
        self._reading_ctx = reading or _reading
        self.workers = max(1, int(workers))
        self.unit_bytes = None if unit_bytes is None else max(1, unit_bytes)
        self.pool_min_bytes = pool_min_bytes
        self._budget = ByteBudget(max_inflight)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        # a source that bounds its requests in flight by bytes (object storage: what their answers
        # hold); None: the threads alone bound them (a local file's reads are copies, not waits)
        limit = source.inflight_bytes
        self._window = _Window(limit, self._start) if limit else None

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._window is not None:
            self._window.cancel()  # units not started are not read (an error, or nobody waiting)
            self._window = _Window(self._window.limit, self._start)  # for the plans submitted after this
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def submit(self, plan: AnyParamReadPlan, out: np.ndarray, *, parallel: bool = True) -> Job:
        """Start filling ``out`` with ``plan``'s bytes; ``Job.wait()`` returns when it is full.

        With one worker, or ``parallel=False``, the reads happen here, before this returns.
        """
        if type(plan) is ByteRangesPlan and plan.nbytes <= (self.unit_bytes or UNIT_BYTES) \
                and (self.workers == 1 or not parallel):
            self._read_byte_ranges(plan, out)  # a converter's chunk or batch of small chunks
            return _DONE
        _check_out(plan, out)
        units = self._work(plan, out)
        if self.workers == 1 or not parallel:  # the same units, run here in order
            for fn, args in units:
                fn(*args)
            return _DONE
        if self._window is not None:
            return Job([self._window.add(fn, args, min(_unit_bytes(args), ANSWER_BYTES)) for fn, args in units])
        return Job([self._start(fn, *args) for fn, args in units])

    def _start(self, fn: Callable[..., None], *args: Any) -> Future[None]:
        with self._pool_lock:  # the window's runners start runners too
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="ckptstore-read")
            return self._pool.submit(fn, *args)

    def _work(self, plan: AnyParamReadPlan, out: np.ndarray) -> list[tuple[Callable[..., None], tuple[Any, ...]]]:
        """The units of work that fill ``out``, in order: ``(method, arguments)`` each."""
        units: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        for g in plan.groups:
            if g.into_destination:
                flat = out.reshape(-1).view(np.uint8)
                units += [(self._read, (plan, r, flat)) for r in self._units(g)]
            else:
                units.append((self._scratch, (plan, g, out)))
        return units

    def run(self, jobs: Sequence[tuple[AnyParamReadPlan, np.ndarray]]) -> None:
        """Fill each destination array with its plan's bytes (all plans share the pool)."""
        parallel = self.workers > 1 and sum(p.nbytes for p, _ in jobs) >= self.pool_min_bytes
        try:
            for job in [self.submit(plan, out, parallel=parallel) for plan, out in jobs]:
                job.wait()
        finally:
            self.close()

    def requests(self, plan: AnyParamReadPlan) -> int:
        """The requests :meth:`submit` sends for ``plan``: the plan's own (pure: nothing is read)."""
        return plan.requests

    def _units(self, g: ReadGroup) -> list[_Requests]:
        """The group's requests packed into units of work, in order."""
        cuts = g.request_cuts
        n = len(cuts) - 1
        if n <= 1:
            return [_Requests(g, cuts, 0, n)] if n else []
        first, last = cuts[:-1], cuts[1:] - 1
        span = g.offsets[last] + g.lengths[last] - g.offsets[first]
        if self.unit_bytes is not None:
            cost, unit = span.astype(np.float64), float(self.unit_bytes)
        else:
            cost, unit = self.cost.request_seconds + span / self.cost.bytes_per_second, UNIT_SECONDS
        if float(cost.sum()) <= unit:
            return [_Requests(g, cuts, 0, n)]
        ids = (np.cumsum(cost) - cost) // unit  # modelled time (or bytes) before each request
        bounds = [0, *(np.flatnonzero(np.diff(ids)) + 1).tolist(), n]
        return [_Requests(g, cuts, a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def _read(self, plan: AnyParamReadPlan, r: _Requests, flat: np.ndarray) -> None:
        """Send requests ``r`` of a group, each one :meth:`ReadableFile.read_span`, into ``flat`` (uint8)."""
        g, cuts = r.group, r.cuts
        lo, hi = int(cuts[r.first]), int(cuts[r.stop])
        files, offsets = g.files[lo:hi].tolist(), g.offsets[lo:hi].tolist()
        lengths, dests = g.lengths[lo:hi].tolist(), g.dests[lo:hi].tolist()
        bounds = (cuts[r.first:r.stop + 1] - lo).tolist()
        opened: dict[int, Any] = {}
        fetched = 0
        try:
            for a, b in zip(bounds[:-1], bounds[1:], strict=True):
                f_id = files[a]
                f = opened.get(f_id)
                if f is None:
                    f = opened[f_id] = self.source.open(plan.keys[f_id])
                    if f_id in plan.partial_files:
                        f.expect_holes()
                if b - a == 1:
                    d, m = dests[a], lengths[a]
                    f.read_span([(offsets[a], flat[d:d + m].data)])
                else:
                    bufs = _buffers(flat, g.dests[lo + a:lo + b], g.lengths[lo + a:lo + b])
                    f.read_span(list(zip(offsets[a:b], bufs, strict=True)))
                fetched += offsets[b - 1] + lengths[b - 1] - offsets[a]
        except Exception:
            # said in the plan's words; entered only on failure (a context per read costs more
            # than the read of a small chunk)
            with self._reading_ctx(plan):
                raise
        self.stats.add_read(sum(lengths), hi - lo, len(bounds) - 1, [f.url for f in opened.values()], fetched)

    def _read_byte_ranges(self, plan: ByteRangesPlan, out: np.ndarray) -> None:
        """Run a :class:`~ckptstore.store.read_plan.ByteRangesPlan` here, from its columns as they
        are: one request per range (what its one group says), without building the group, so
        that a converter's small reads cost about what a direct read costs."""
        if out.dtype != np.uint8 or out.shape != (plan.nbytes,) or not out.flags.c_contiguous \
                or not out.flags.writeable:
            _check_out(plan, out)  # raises, saying what is wrong
        files, offsets, lengths, dests = plan.range_files, plan.offsets, plan.lengths, plan.dests
        opened: dict[int, Any] = {}
        try:
            for f_id, offset, m, d in zip(files, offsets, lengths, dests, strict=True):
                f = opened.get(f_id)
                if f is None:
                    f = opened[f_id] = self.source.open(plan.keys[f_id])
                f.read_span([(offset, out[d:d + m].data)])
        except Exception:
            with self._reading_ctx(plan):
                raise
        self.stats.add_read(plan.nbytes, len(files), len(files), [f.url for f in opened.values()])

    def _scratch(self, plan: AnyParamReadPlan, g: ReadGroup, out: np.ndarray) -> None:
        n = g.scratch_nbytes
        self._budget.take(n)
        self.stats.hold(n)
        try:
            buf = np.empty(n, dtype=np.uint8)
            cuts = g.request_cuts
            if len(cuts) > 1:
                self._read(plan, _Requests(g, cuts, 0, len(cuts) - 1), buf)
            if g.crc32c is not None and crc32c.crc32c(buf.data) != g.crc32c:
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
            self._budget.give(n)


def _unit_bytes(args: tuple[Any, ...]) -> int:
    """The bytes a unit of work fetches: its requests' spans (gaps included), or a scratch group's."""
    unit = args[1]
    if isinstance(unit, _Requests):
        g, cuts = unit.group, unit.cuts
        first, last = cuts[unit.first:unit.stop], cuts[unit.first + 1:unit.stop + 1] - 1
        return int((g.offsets[last] + g.lengths[last] - g.offsets[first]).sum())
    return int(unit.fetched)


class _Window:
    """Units of work started so that the bytes they fetch, in flight at once, stay within ``limit``
    (a unit larger than that runs alone), in the order given.

    A unit is counted in flight from the moment a runner is handed it; a runner thread runs its
    unit, then the next one that fits, and hands units to new runners only while the window has
    room for more than it runs: the pool then has as many threads as units in flight. Each thread
    that has read an answer keeps what the object-store client allocated for it (0.13 MiB for
    64 KiB answers, 0.6 MiB for 600 KiB, 0.9 MiB for 2 MiB, measured one answer per thread), so
    starting every unit at once on ``workers`` threads, or a runner per unit queued, would cost
    every thread's share even when few requests were in flight.
    """

    def __init__(self, limit: int, start: Callable[..., Future[None]]) -> None:
        self.limit, self._start = limit, start
        self.used = 0
        self._queue: deque[tuple[Callable[..., None], tuple[Any, ...], int, Future[None]]] = deque()
        self._lock = threading.Lock()
        self._cancelled = False

    def add(self, fn: Callable[..., None], args: tuple[Any, ...], nbytes: int) -> Future[None]:
        """Queue ``fn(*args)``, which fetches ``nbytes``; its future is done when it has run."""
        future: Future[None] = Future()
        with self._lock:
            self._queue.append((fn, args, min(nbytes, self.limit), future))
            first = self._take()
        if first is not None:
            self._start(self._run, first)
        return future

    def cancel(self) -> None:
        """Drop the units not started (their futures are cancelled); the runners take no more."""
        with self._lock:
            queued, self._queue = self._queue, deque()
            self._cancelled = True
        for *_, future in queued:
            future.cancel()

    def _take(self) -> tuple[Callable[..., None], tuple[Any, ...], int, Future[None]] | None:
        """The next unit if it fits, counted in flight from now (the lock held)."""
        if not self._queue or self._cancelled or (self.used and self.used + self._queue[0][2] > self.limit):
            return None
        unit = self._queue.popleft()
        self.used += unit[2]
        return unit

    def _run(self, unit: tuple[Callable[..., None], tuple[Any, ...], int, Future[None]] | None) -> None:
        while unit is not None:
            fn, args, nbytes, future = unit
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        fn(*args)
                    except BaseException as e:
                        future.set_exception(e)
                    else:
                        future.set_result(None)
            finally:
                with self._lock:
                    self.used -= nbytes
                    unit = self._take()
                    others = []  # the bytes this unit gave back may let several smaller ones start
                    while unit is not None and (other := self._take()) is not None:
                        others.append(other)
                    for other in others:
                        self._start(self._run, other)


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


def _buffers(flat: np.ndarray, dests: np.ndarray, lengths: np.ndarray) -> list[Any]:
    """Views of ``flat`` at ``dests`` of ``lengths`` bytes, in order.

    Runs of equal lengths at a constant positive stride (a chunk's rows landing in the rows of a
    wider destination) become the rows of one strided view, made in C rather than one Python
    slice per row.
    """
    n = len(dests)
    if n < 3:
        return [flat[d:d + m] for d, m in zip(dests.tolist(), lengths.tolist(), strict=True)]
    steps = np.diff(dests)
    cuts = np.flatnonzero((steps[1:] != steps[:-1]) | (lengths[2:] != lengths[1:-1])) + 2
    cuts = np.union1d(cuts, np.flatnonzero(lengths[1:] != lengths[:-1]) + 1)
    out: list[Any] = []
    bounds = [0, *cuts.tolist(), n]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        length, start = int(lengths[a]), int(dests[a])
        stride = int(dests[a + 1] - dests[a]) if b - a > 1 else 0
        if b - a > 2 and stride >= length:
            out += list(np.lib.stride_tricks.as_strided(flat[start:], shape=(b - a, length), strides=(stride, 1)))
        else:
            out += [flat[d:d + m] for d, m in zip(dests[a:b].tolist(), lengths[a:b].tolist(), strict=True)]
    return out


def _check_out(plan: AnyParamReadPlan, out: np.ndarray) -> None:
    if out.shape != plan.shape or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"out must be a writeable C-contiguous array of shape {list(plan.shape)}, got "
                         f"{list(out.shape)}")
    if out.dtype != plan.dtype and any(g.into_destination for g in plan.groups):
        raise ValueError(f"out has dtype {out.dtype} but the plan reads {plan.dtype} straight into it; "
                         "plan with out_dtype= to convert")
