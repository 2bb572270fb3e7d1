"""What one rank of a target layout needs from a store, as numpy arrays (no MindSpore here).

A *target* is a :class:`~ckptstore.checkpoint.strategy.Strategy` (the new card count's strategy file, a
compiled network's layouts, or the store's own source layout) plus a global rank. For every
parameter the rank holds, the target gives a global box; parameters the target does not
describe are returned whole (as ``transform_checkpoints`` copies such scalars and counters).
:class:`RankView` plans those boxes at once (so ``plan.nbytes`` is known before any read) and
reads each parameter only when asked, or many at once through one pool of threads.
"""
from __future__ import annotations

import contextlib
import functools
import mmap
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptstore.boxes import Box
from ckptstore.collector import collector_paused
from ckptstore.dtypes import is_float
from ckptstore.errors import CooperativeLoadError, InvalidOptionError
from ckptstore.io import LocalFile
from ckptstore.io.base import LOCAL_COST, ReadCost
from ckptstore.progress import Progress, binary_size
from ckptstore.read.exchange import job_agreement
from ckptstore.read.group_load import Cooperative, exchange_for, load_together
from ckptstore.read.target import (  # noqa: F401 - target resolution lives in read/target.py; names kept here
    StrategyLike,
    check_rank,
    check_target_describes,
    float_dtype,
    include_globs,
    name_patterns,
    replica_ranks,
    resolve_rank,
    resolve_target,
    target_boxes,
)
from ckptstore.store.executor import Executor, Job, check_extents
from ckptstore.store.memory import empty
from ckptstore.store.read_plan import ParamReadPlan, ReadPlan, plan_param
from ckptstore.store.store import Store, StoreLike, open_verified, store_argument

#: Threads that read one load by default: measured at 1, 2 and 4 on 2 cores (the workers rows of
#: benchmarks/results/load.md: 2 beat 1 by 1.35x, 4 gained nothing), never more than the CPUs this
#: process may run on (an 8-rank job on a 192-core host pinned to 24 cores a rank reads with 4).
DEFAULT_WORKERS = LOCAL_COST.in_flight
#: Plans modelled to take less than this (a local 256 KiB parameter) are read by the thread that
#: plans them, not handed to the pool: the hand-off would cost more. Any request of an object
#: store takes longer, so its requests always go to the pool and stay in flight together.
HAND_OFF_SECONDS = 30e-6
#: A parameter read alone (:meth:`RankView.read`) uses the pool when it is modelled to take at
#: least this (4 MiB of local reads) in more than one request.
POOL_MIN_SECONDS = 0.5e-3
#: Parameters taken one by one (``params[name]`` in a loop) are read ahead in the view's order,
#: up to this many bytes of arrays not asked for yet, from sources whose requests take at least
#: :data:`READ_AHEAD_LATENCY` (object stores: there the next parameter's requests can wait on
#: the network while the caller builds the previous one; a local read is a copy that competes
#: with the caller for the cores).
READ_AHEAD_BYTES = 128 << 20
READ_AHEAD_LATENCY = 1e-3


@dataclass
class RankView:
    """The parameters one target rank holds, planned up front and read on demand.

    ``dtype`` (a numpy float dtype) converts floating-point values chunk by chunk while reading.
    ``workers`` threads read each load (several parameters at once with :meth:`read_many`).
    """

    store: Store
    boxes: Mapping[str, Box | None]
    dtype: np.dtype | None = None
    verify: bool = False
    workers: int = DEFAULT_WORKERS
    #: The target rank planned, and the number of ranks of its layout.
    rank: int = 0
    world_size: int = 1
    #: ``False``: :meth:`stream` and :meth:`read_many` show progress (:class:`~ckptstore.progress.Progress`:
    #: a bar on a terminal, a log line every 10 s and one at the end otherwise).
    quiet: bool = True

    def names(self) -> list[str]:
        return list(self.boxes)

    def __iter__(self) -> Iterator[str]:
        return iter(self.boxes)

    def __len__(self) -> int:
        return len(self.boxes)

    @property
    def nbytes(self) -> int:
        """Bytes of this rank's slices as they are returned (after any ``dtype`` conversion)."""
        return self.slice_bytes(self.boxes)

    def slice_bytes(self, names: Iterable[str]) -> int:
        """Bytes of the slices of ``names`` as they are returned (text values count 0)."""
        total = 0
        for name in names:
            info = self.store.info(name)
            if not info.is_str:
                total += (self.boxes[name] or Box.full(info.shape)).size * self.dtype_of(name).itemsize
        return total

    def summary(self) -> str:
        """One line: the rank, the store and its step, parameters and bytes, e.g. ``rank 0 of 4 from
        /x (step 20): 32 parameters, 12.0 MiB``."""
        step = "" if self.store.step is None else f" (step {self.store.step})"
        n = len(self.boxes)
        return (f"rank {self.rank} of {self.world_size} from {self.store.location.url}{step}: {n} "
                f"parameter{'' if n == 1 else 's'}, {binary_size(self.nbytes)}")

    def __repr__(self) -> str:
        return f"<RankView {self.summary()}>"

    def dtype_of(self, name: str) -> np.dtype:
        """The dtype ``name`` is read as: ``dtype`` for floating-point parameters, else as stored
        (converting fp32 weights to fp16 must not turn integer counters into floats)."""
        stored = self.store.info(name).np_dtype
        return self.dtype if self.dtype is not None and is_float(stored) else stored

    @functools.cached_property
    def _cost(self) -> ReadCost:
        """What the store's byte source says a request and a byte cost (read once per view)."""
        return self.store.data.read_cost()

    def plan_for(self, name: str) -> ParamReadPlan:
        info = self.store.read_info(name, verify=self.verify)
        return plan_param(info, self.boxes[name], out_dtype=self.dtype_of(name), verify=self.verify, cost=self._cost)

    @property
    def plan(self) -> ReadPlan:
        """Every read this rank needs (inspect ``plan.nbytes`` and ``plan.files`` before reading)."""
        return ReadPlan({n: self.plan_for(n) for n in self.boxes if not self.store.info(n).is_str})

    def read(self, name: str) -> np.ndarray | str:
        """The rank's slice of ``name`` in a fresh, ordinary (anonymous) numpy array.

        Reading parameters one after another in the view's order starts reading the next ones
        (:data:`READ_AHEAD_BYTES`) from an object store while the caller works on this one.
        """
        info = self.store.info(name)
        if info.is_str:
            return info.value or ""
        if self._cost.request_seconds >= READ_AHEAD_LATENCY:
            return self._ahead.read(name)
        plan = self.plan_for(name)
        check_extents(plan, self.store.data)
        array = empty(plan.shape, self.dtype_of(name))
        with Executor(self.store.data, workers=self.workers) as executor:
            executor.submit(plan, array, parallel=self._worth_pool(plan)).wait()
        return array

    def _worth_pool(self, plan: ParamReadPlan) -> bool:
        return plan.requests > 1 and self._cost.seconds(plan.requests, plan.fetched) >= POOL_MIN_SECONDS

    def _worth_hand_off(self, plan: ParamReadPlan) -> bool:
        return self._cost.seconds(plan.requests, plan.fetched) >= HAND_OFF_SECONDS

    @functools.cached_property
    def _ahead(self) -> _ReadAhead:
        return _ReadAhead(self)

    def read_many(self, names: Sequence[str]) -> dict[str, np.ndarray | str]:
        """Several parameters at once, their reads sharing one pool of ``workers`` threads."""
        with collector_paused():
            if self.quiet and self._cost.request_seconds < READ_AHEAD_LATENCY:
                return self._read_all(names)
            return dict(self.stream(names))

    def _read_all(self, names: Sequence[str]) -> dict[str, np.ndarray | str]:
        """Every value of ``names`` from a local source: every parameter planned first, then the
        large ones handed to the pool, then the small ones read here while the pool copies.

        Planning between hand-offs (as :meth:`stream` does, to yield early) kept this thread
        running Python while the readers needed the interpreter between their ``preadv`` calls:
        the 1 GB bench's warm ``load_rank`` took 258 ms and 388 ms of CPU that way, 244 ms and
        359 ms planned first (median of 6 fresh processes each, one run).
        """
        values: dict[str, np.ndarray | str] = {}
        planned = []
        for name in names:
            info = self.store.info(name)
            if info.is_str:
                values[name] = info.value or ""
                continue
            plan = self.plan_for(name)
            check_extents(plan, self.store.data)
            array = values[name] = empty(plan.shape, self.dtype_of(name))
            planned.append((plan, array, self._worth_hand_off(plan)))
        with Executor(self.store.data, workers=self.workers) as executor:
            jobs = [executor.submit(plan, array) for plan, array, hand_off in planned if hand_off]
            for plan, array, hand_off in planned:
                if not hand_off:
                    executor.submit(plan, array, parallel=False)
            for job in jobs:
                job.wait()
        return values

    def stream(self, names: Sequence[str]) -> Iterator[tuple[str, np.ndarray | str]]:
        """``(name, value)`` for each of ``names``, in order, each as soon as its reads are done.

        Every parameter is planned and its reads handed to the pool right away, so the pool reads
        while the next parameters are planned and while the caller works on the values already
        yielded (building MindSpore Parameters, say).
        """
        if self.quiet:  # the load path as it is, with no counting
            yield from self._stream(names)
            return
        progress = Progress(self.slice_bytes(names), len(names), desc=f"load rank {self.rank}")
        with progress:
            for name, value in self._stream(names):
                progress.add(0 if isinstance(value, str) else value.nbytes, 1)
                yield name, value

    def _stream(self, names: Sequence[str]) -> Iterator[tuple[str, np.ndarray | str]]:
        pending: deque[tuple[str, np.ndarray | str, Job | None]] = deque()
        ahead: _ReadAhead | None = self.__dict__.get("_ahead")  # parameters already being read ahead
        with Executor(self.store.data, workers=self.workers) as executor:
            for name in names:
                info = self.store.info(name)
                claimed = None if ahead is None or info.is_str else ahead.claim(name)
                if info.is_str:
                    pending.append((name, info.value or "", None))
                elif claimed is not None:
                    pending.append((name, claimed[0], _Claimed(claimed[1], ahead)))  # type: ignore[arg-type]  # ahead: set
                else:
                    plan = self.plan_for(name)
                    check_extents(plan, self.store.data)
                    array = empty(plan.shape, self.dtype_of(name))
                    # a quick parameter is read here, before the next is planned: cheaper than a hand-off
                    job = executor.submit(plan, array, parallel=self._worth_hand_off(plan))
                    pending.append((name, array, job))
                while pending and (pending[0][2] is None or pending[0][2].done()):
                    yield self._ready(pending.popleft())
            while pending:
                yield self._ready(pending.popleft())

    @staticmethod
    def _ready(item: tuple[str, np.ndarray | str, Job | None]) -> tuple[str, np.ndarray | str]:
        name, value, job = item
        if job is not None:
            job.wait()
        return name, value

    def mapped(self, name: str) -> np.ndarray | None:
        """A copy-on-write memory map of the slice when it is one whole raw chunk of a local file,
        else ``None``.

        No bytes are copied; pages come from the page cache as they are touched. Use for
        host-side work only (see ``copy=False`` in :func:`ckptstore.load_rank`).
        """
        info = self.store.info(name)
        if info.is_str or info.codec is not None or self.dtype_of(name) != info.np_dtype:
            return None
        box = self.boxes[name] or Box.full(info.shape)
        chunks = info.chunks_overlapping(box)
        if len(chunks) != 1 or box.size == 0:
            return None
        container, pieces = info.container(chunks[0])
        if container != box or len(pieces) != 1:
            return None
        key, offset, nbytes = pieces[0]
        f = self.store.data.open(key)
        if not isinstance(f, LocalFile):
            return None
        if offset + nbytes > f.size:
            return None  # a truncated file: let the normal read report it
        base = offset - offset % mmap.ALLOCATIONGRANULARITY
        mm = mmap.mmap(f.fd, offset - base + nbytes, access=mmap.ACCESS_COPY, offset=base)
        return np.frombuffer(mm, dtype=info.np_dtype, count=box.size, offset=offset - base).reshape(box.shape)


class _Claimed(Job):
    """A read-ahead job taken over by :meth:`RankView.stream`: released once waited for."""

    def __init__(self, job: Job, ahead: _ReadAhead) -> None:
        super().__init__([])
        self.job, self.ahead, self.released = job, ahead, False

    def done(self) -> bool:
        return self.job.done()

    def wait(self) -> None:
        try:
            self.job.wait()
        finally:
            if not self.released:
                self.released = True
                self.ahead.release()


class _ReadAhead:
    """The lazy path's read-ahead: parameters read one by one through :meth:`RankView.read`.

    When the parameter asked for follows the previous one in the view's order, the reads of the
    next parameters (planned, in the view's order, up to :data:`READ_AHEAD_BYTES` of arrays) are
    handed to a pool that keeps the source's requests in flight; a parameter asked for that was
    read ahead waits only for what is left of its reads. A read ahead that failed raises when
    its parameter is asked for, never before. The pool stops when nothing is read ahead.
    """

    def __init__(self, view: RankView) -> None:
        self.view = view
        self.order = [n for n in view.boxes if not view.store.info(n).is_str]
        self.position = {n: i for i, n in enumerate(self.order)}
        self.pending: dict[str, tuple[np.ndarray, Job]] = {}
        self.taken: set[str] = set()
        self.last = -2
        self.active = 0  # readers waiting for a job of the pool
        self.executor: Executor | None = None
        self.lock = threading.Lock()

    def read(self, name: str) -> np.ndarray:
        with self.lock:
            ahead = self.pending.pop(name, None)
            i = self.position.get(name, -2)
            sequential, self.last = i == self.last + 1, i
            self.taken.add(name)
            if ahead is None:
                plan = self.view.plan_for(name)
                check_extents(plan, self.view.store.data)
                array = empty(plan.shape, self.view.dtype_of(name))
                ahead = (array, self._pool().submit(plan, array, parallel=True))
            if sequential:
                self._schedule(i + 1)
            self.active += 1
        array, job = ahead
        try:
            job.wait()
        finally:
            self.release()
        return array

    def claim(self, name: str) -> tuple[np.ndarray, Job] | None:
        """The array and reads of ``name`` if it is being read ahead (the caller waits for the
        job, then calls :meth:`release`), else ``None``."""
        with self.lock:
            ahead = self.pending.pop(name, None)
            self.taken.add(name)
            if ahead is not None:
                self.active += 1
            return ahead

    def release(self) -> None:
        with self.lock:
            self.active -= 1
            executor = self.executor
            if not self.pending and not self.active and executor is not None:
                self.executor = None  # nothing read ahead: let the pool's threads go
                executor.close()

    def _pool(self) -> Executor:
        if self.executor is None:
            self.executor = Executor(self.view.store.data, workers=self.view.workers)
        return self.executor

    def _schedule(self, start: int) -> None:
        held = sum(a.nbytes for a, _ in self.pending.values())
        for name in self.order[start:]:
            if held >= READ_AHEAD_BYTES:
                return
            if name in self.pending or name in self.taken:
                continue
            plan = self.view.plan_for(name)
            try:
                check_extents(plan, self.view.store.data)
            except Exception:
                return  # said when the parameter is asked for
            array = empty(plan.shape, self.view.dtype_of(name))
            self.pending[name] = (array, self._pool().submit(plan, array, parallel=True))
            held += array.nbytes


def check_workers(workers: int | None, store: Store) -> int:
    """The number of reading threads: ``workers`` when given, else what the store's byte source wants."""
    if workers is None:
        return store.data.read_cost().in_flight
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise InvalidOptionError(f"workers must be a positive integer, not {workers!r}")
    return workers


def rank_view(store: Store, strategy: StrategyLike = None, rank: int | None = None, *,
              names: str | Sequence[str] | None = None, dtype: Any = None, verify: bool = False,
              workers: int | None = None, allow_whole: bool = False, quiet: bool = True) -> RankView:
    """Plan what rank ``rank`` of ``strategy`` (the source layout when ``None``) needs from ``store``.

    ``rank=None`` is this process's rank (:func:`resolve_rank`). A given ``strategy`` that lays
    out fewer than half of the parameters asked for is refused (:func:`check_target_describes`)
    unless ``allow_whole``: those it does not lay out would come whole. ``quiet=False`` shows
    the progress of reads of many parameters at once (:attr:`RankView.quiet`).
    """
    out_dtype = float_dtype(dtype)
    workers = check_workers(workers, store)
    patterns = name_patterns(names)
    target = resolve_target(store, strategy)
    rank = resolve_rank(rank, target)
    boxes = target_boxes(store, target, rank, patterns)
    if strategy is not None and target is not None and target.layouts and not allow_whole:
        check_target_describes(store, target, boxes)  # (a strategy of no layouts asks for whole tensors)
    return RankView(store, boxes, out_dtype, verify, workers, rank, 1 if target is None else target.world_size,
                    quiet)


def read_rank(store: StoreLike, strategy: StrategyLike = None, rank: int | None = None, *,
              include: str | Sequence[str] | None = None, dtype: Any = None, verify: bool = False,
              workers: int | None = None, allow_whole: bool = False, quiet: bool = True,
              names: str | Sequence[str] | None = None, cooperative: Cooperative = None,
              fallback: bool = False) -> dict[str, np.ndarray | str]:
    """The slices rank ``rank`` of ``strategy`` holds, read from ``store`` as numpy arrays (no MindSpore).

    ``store`` is a path, an ``s3://``/``obs://`` URL or a :class:`~ckptstore.store.store.Store`;
    ``strategy`` the target's strategy file(s) or a :class:`~ckptstore.checkpoint.strategy.Strategy`
    (``None``: the store's source layout); ``rank=None`` this process's rank (``RANK_ID``);
    ``include`` globs of the parameters to read, as ``--include`` (``names=`` is the same option);
    ``dtype`` a float type to convert floating-point values to while reading;
    ``allow_whole`` as for ``load_rank`` (a strategy that lays out few of the parameters);
    ``quiet=False`` shows progress (a bar on a terminal, log lines otherwise). Values equal what
    ``load_rank`` gives, as ordinary numpy arrays (``str`` for text values); parameters the
    target does not describe come whole. Everything is read at once, through one
    pool of ``workers`` threads. ``fallback=True`` (``store`` a root of steps) reads the newest
    committed step whose chunks this rank reads verify, agreed by every rank of the job
    (:func:`verified_store`).

    ``cooperative`` (in a MindSpore job, after ``mindspore.communication.init()``; every rank of the
    group calls at once): ``"replicas"`` (the ranks holding the same slices), ``"node"`` (the ranks of
    this host) or a list of global ranks read each distinct byte once in the group and send it to
    the ranks that need it (:mod:`ckptstore.read.group_load`); the values are the same, bit for bit,
    and :func:`ckptstore.io_counts` counts only what this rank fetched from storage.
    """
    include = include_globs(include, names)
    opened = verified_store(store, strategy, rank, include, workers) if fallback else None
    with store_argument(store if opened is None else opened) as st, opened or contextlib.nullcontext():
        if cooperative is not None:
            return read_together(st, strategy, rank, cooperative, names=include, dtype=dtype, verify=verify,
                                 workers=workers, allow_whole=allow_whole)[1]
        view = rank_view(st, strategy, rank, names=include, dtype=dtype, verify=verify, workers=workers,
                         allow_whole=allow_whole, quiet=quiet)
        return view.read_many(view.names())


def read_together(store: Store, strategy: StrategyLike, rank: int | None, cooperative: Cooperative, *,
                  names: str | Sequence[str] | None = None, dtype: Any = None, verify: bool = False,
                  workers: int | None = None,
                  allow_whole: bool = False) -> tuple[RankView, dict[str, np.ndarray | str]]:
    """:func:`read_rank` with ``cooperative=``: this rank's view and slices, read together with its group.

    A rank that cannot plan (a wrong strategy, a missing file) says so to the group before any data
    moves, and every rank raises. Only ``"replicas"`` needs the target layout to know the group: a
    rank that cannot even read the layout raises at once, and the others' first collective fails
    (MindSpore's collectives time out after about 30 s).
    """
    view: RankView | None = None
    error: BaseException | None = None
    try:
        view = rank_view(store, strategy, rank, names=names, dtype=dtype, verify=verify, workers=workers,
                         allow_whole=allow_whole)
    except Exception as e:
        if cooperative == "replicas":
            raise
        error = e
    patterns = name_patterns(names)
    target = resolve_target(store, strategy) if view is not None else None
    me = view.rank if view is not None else -1
    exchange = exchange_for(cooperative, lambda world: replica_ranks(store, target, me, world, patterns))
    plans: dict[str, ParamReadPlan] | None = None
    outs: dict[str, np.ndarray] | None = None
    out: dict[str, np.ndarray | str] = {}
    if view is not None:
        try:
            plans, outs = {}, {}
            for name in view.names():
                info = store.info(name)
                if info.is_str:
                    out[name] = info.value or ""
                    continue
                plans[name] = view.plan_for(name)
                check_extents(plans[name], store.data)
                outs[name] = empty(plans[name].shape, view.dtype_of(name))
        except Exception as e:  # any error: said to the group, then raised on every rank
            error, plans, outs = e, None, None
    load_together(exchange, store, plans, outs, error=error, workers=1 if view is None else view.workers)
    if view is None or outs is None:  # (load_together raised already)
        raise CooperativeLoadError("cooperative load: this rank planned nothing")
    out.update(outs)
    return view, {name: out[name] for name in view.names()}
def verified_store(store: StoreLike, strategy: StrategyLike, rank: int | None,
                   include: str | Sequence[str] | None, workers: int | None) -> Store:
    """The newest committed step of the root ``store`` whose chunks rank ``rank`` of ``strategy``
    reads (``include`` globs of them) verify, for every rank of the job when MindSpore's
    communication is initialised (:func:`~ckptstore.store.store.open_verified`)."""
    if isinstance(store, Store):
        raise InvalidOptionError("fallback=True needs the path or URL of the root of steps, not an open Store (it "
                                 "chooses which step to open)")

    def reads(st: Store) -> Mapping[str, Box | None]:
        target = resolve_target(st, strategy)
        return target_boxes(st, target, resolve_rank(rank, target), name_patterns(include))

    return open_verified(store, reads, workers=workers if workers is not None else DEFAULT_WORKERS,
                         agree=job_agreement())
