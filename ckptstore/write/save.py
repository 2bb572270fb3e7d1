"""Saving from training straight into a store: ``save_rank`` on every rank of the job.

Each step goes to its own store, ``ROOT/step_<N>`` (a Zarr store like a converted one). Every
rank passes its local slices; :mod:`ckptstore.write.save_plan` says which chunks it writes
(each distinct slice once, by one rank of its replica group, balanced by bytes). Ranks write
disjoint files as the parts of one conversion (:mod:`ckptstore.write.parts`: part index = rank,
count = world size): each claims the step folder for its part, writes one file per slice it
was given (the slice's chunk, or a Zarr shard of its chunks, so ranks never share a file,
locally or in a bucket), makes them durable together (concurrent fsyncs, which a journaling
file system commits in a few batches, not one after another), records what it wrote in
``.ckptstore-work/records/<rank>-of-<world>.json`` (:mod:`ckptstore.write.records`), marks
its part done, and the last rank to finish merges the records into the manifest and commits:
the one commit protocol of :mod:`ckptstore.write.commit`. Every record belongs to one save
*attempt* (:mod:`ckptstore.write.attempt`): a save that finds the step unfinished by another
attempt starts it over, and a committed step is never written again. Until the commit the step
is incomplete: :func:`ckptstore.open` on ``ROOT`` takes the newest *committed* step, and a rank
of the same attempt that died mid-save completes the step when it saves it again.

:class:`SaveJob` separates *what* is written (a plan and the local arrays) from writing it,
so :mod:`ckptstore.write.async_save` can copy the bytes to host memory and write them later.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ckptstore.checkpoint.selection import select_params
from ckptstore.checkpoint.strategy import Strategy, load_strategy
from ckptstore.collector import collector_paused
from ckptstore.errors import InvalidOptionError, StoreExistsError, check_int
from ckptstore.io.locations import is_url, join
from ckptstore.io.sink import ByteSink
from ckptstore.launcher import is_scheduler, job
from ckptstore.store import zarr as zb
from ckptstore.store.kinds import ROOT_METADATA
from ckptstore.store.manifest import dtype_label
from ckptstore.store.steps import step_name, step_sink
from ckptstore.store.work import CommitPlan, write_commit_plan
from ckptstore.version import __version__
from ckptstore.write import incremental as inc
from ckptstore.write.attempt import save_attempt, say_no_attempt
from ckptstore.write.commit import commit_if_last, mark_done
from ckptstore.write.kinds.zarr import Segment, write_zarr_data
from ckptstore.write.output_folder import claim, complete_manifest
from ckptstore.write.parts import Part
from ckptstore.write.save_plan import SaveParam, SavePlan, plan_save
from ckptstore.write.values import LazyArray, host_values

#: Largest chunk a save writes (a slice bigger than this is cut along its leading axes), as
#: ``ckptstore convert``'s default.
DEFAULT_SAVE_CHUNK_MB = 256
#: Largest piece of a file handed to the writer at once (what a background save copies to host
#: memory in one go, within its budget), whatever the chunk size.
PIECE_BYTES = 64 << 20

Piece = tuple[SaveParam, int, Any]  # a parameter, an offset in the file of its slice, a buffer of bytes from there


@dataclass(frozen=True)
class SaveSummary:
    """What one rank's save did (``committed``: this rank's save completed the step)."""

    store: str
    step: int
    rank: int
    world: int
    params: int
    chunks_written: int
    bytes_written: int
    committed: bool
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def step_location(root: str | os.PathLike[str], step: int) -> str:
    """Where step ``step`` of ``root`` is stored (``ROOT/step_<N>``)."""
    return join(os.fspath(root), step_name(step))


def save_rank(params: Any, root: str | os.PathLike[str], *, step: int, strategy: Any = None,
              rank: int | None = None, format: str = "zarr", include: Sequence[str] = (),
              exclude: Sequence[str] = (), chunk_mb: int | None = None, attempt: str | None = None,
              incremental: bool = False) -> SaveSummary:
    """Save this rank's local slices as step ``step`` of the store folder ``root``; every rank calls it.

    ``params`` maps names to numpy arrays, ``mindspore.Parameter``/``Tensor`` values, Python
    scalars or strings (what ``net.parameters_dict()`` or ``mindspore.load_checkpoint`` gives),
    or is a MindSpore Cell (its parameters by ``Parameter.name``, optimizer state included).
    ``strategy`` is the job's strategy file(s) (several for pipeline stages) or a
    :class:`~ckptstore.checkpoint.strategy.Strategy`; ``None`` means whole tensors (one process,
    or pure data parallelism where every rank holds everything). ``rank`` defaults to this
    process's rank. Each distinct slice is written once, by one rank of its replica group; the
    last rank to finish commits ``root/step_<step>``, which :func:`ckptstore.open` then finds
    as the newest step. ``root`` may be an ``s3://``/``obs://`` URL. ``include``/``exclude``
    are name globs (every rank must pass the same); ``chunk_mb`` caps a chunk (default 256; every
    rank must pass the same). ``attempt`` names this save attempt, the same on every rank of the
    job (by default MindSpore's communication or the launcher gives one:
    :mod:`ckptstore.write.attempt`): only records of one attempt are committed together, and a
    save that finds the step unfinished by another attempt starts it over. Returns a
    :class:`SaveSummary` of this rank's share. In msrun's scheduler process (which runs the job's
    script too but is no rank) nothing is saved: one log line says so and the summary has
    ``rank=-1`` (:func:`skipped_in_scheduler`). ``incremental=True`` (every rank must pass the
    same) writes only the slices that differ from the newest committed incremental step and
    references that step's files for the others (:mod:`ckptstore.write.incremental`).
    """
    if is_scheduler():
        return skipped_in_scheduler(root, step)
    return prepare_save(params, root, step=step, strategy=strategy, rank=rank, format=format, include=include,
                        exclude=exclude, chunk_mb=chunk_mb, attempt=attempt, incremental=incremental).write()


def skipped_in_scheduler(root: str | os.PathLike[str], step: int) -> SaveSummary:
    """What a save does in msrun's scheduler process: nothing, said in one log line (so the
    script, and msrun with it, ends normally while the workers save)."""
    where = step_location(root, step)
    logging.getLogger("ckptstore").warning("ckptstore: not saving %s in msrun's scheduler process (MS_ROLE=MS_SCHED), "
                                           "which is no rank of the job; the worker processes save it", where)
    return SaveSummary(where, step, -1, 0, 0, 0, 0, False, 0.0)


def prepare_save(params: Any, root: str | os.PathLike[str], *, step: int, strategy: Any = None,
                 rank: int | None = None, format: str = "zarr", include: Sequence[str] = (),
                 exclude: Sequence[str] = (), chunk_mb: int | None = None, attempt: str | None = None,
                 incremental: bool = False) -> SaveJob:
    """Work out what :func:`save_rank` writes (nothing is copied or written yet)."""
    check_int(step, "step", least=0)
    return save_job(params, root, step=step, strategy=strategy, rank=rank, format=format, include=include,
                    exclude=exclude, chunk_mb=chunk_mb, attempt=attempt, incremental=incremental)


def save_job(params: Any, root: str | os.PathLike[str], *, step: int, strategy: Any = None,
             rank: int | None = None, format: str = "zarr", include: Sequence[str] = (),
             exclude: Sequence[str] = (), chunk_mb: int | None = None, attempt: str | None = None,
             incremental: bool = False) -> SaveJob:
    """:func:`prepare_save` for a ``step`` its caller checked already (a
    :class:`~ckptstore.write.saver.StoreSaver` checks it before it compares it with the last one)."""
    if format != "zarr":
        raise InvalidOptionError(f"save_rank writes zarr stores only, not {format!r}; convert a saved step with "
                                 "'ckptstore convert' for another format")
    chunk_bytes = _chunk_bytes(chunk_mb)
    arrays, cell_strategy = host_values(params)
    keep = select_params(list(arrays), include=include, exclude=exclude)
    arrays = {n: arrays[n] for n in keep}
    st = _strategy(strategy if strategy is not None else cell_strategy)
    me, world = _place(rank, st.world_size if st is not None else None)
    plan = _plan(arrays, rank=me, world=world, strategy=st, max_chunk_bytes=chunk_bytes)
    shared = save_attempt(attempt, world)
    if shared is None:
        say_no_attempt(os.fspath(root), world)
    return SaveJob(step_location(root, step), step, plan, arrays, st, chunk_bytes, shared, incremental=incremental)


def _chunk_bytes(chunk_mb: int | None) -> int:
    return check_int(DEFAULT_SAVE_CHUNK_MB if chunk_mb is None else chunk_mb, "chunk_mb") << 20


class _Recent:
    """The last few entries, newest first, found by a predicate (savers of several roots may
    look from several threads)."""

    KEEP = 4

    def __init__(self) -> None:
        self._items: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()

    def find(self, matches: Callable[[tuple[Any, ...]], bool]) -> tuple[Any, ...] | None:
        with self._lock:
            for i, item in enumerate(self._items):
                if matches(item):
                    self._items.insert(0, self._items.pop(i))
                    return item
        return None

    def add(self, item: tuple[Any, ...]) -> None:
        with self._lock:
            self._items = [item, *self._items[:self.KEEP - 1]]


#: The plans of the last saves, reused while the parameters, the strategy, the rank and the chunk
#: size stay the same (a training loop saves the same parameters every step). Planning again each
#: step allocated ~100k Python objects per save, which set off a full garbage collection of a heap
#: holding MindSpore (180k objects) inside the training loop's stall: 0.4-0.6 s a rank with 8
#: ranks on 2 cores (issue 24's save route).
_PLANS = _Recent()
#: The strategy files read by the last saves: (their paths and stat identities, the strategy).
_STRATEGIES = _Recent()


def _plan(arrays: Mapping[str, Any], *, rank: int, world: int, strategy: Strategy | None,
          max_chunk_bytes: int) -> SavePlan:
    """:func:`plan_save`'s plan, or the same plan of a recent save (:data:`_PLANS`)."""
    key = (rank, world, max_chunk_bytes, tuple(_shape_key(n, v) for n, v in arrays.items()))
    hit = _PLANS.find(lambda e: e[1] == key and (e[0] is strategy or e[0] == strategy))
    if hit is not None:
        return hit[2]
    plan = plan_save(arrays, rank=rank, world=world, strategy=strategy, max_chunk_bytes=max_chunk_bytes)
    _PLANS.add((strategy, key, plan))
    return plan


def _shape_key(name: str, value: Any) -> tuple[Any, ...]:
    """What the plan reads of one value: its shape and dtype, or a string's text (its length
    sizes the slice and the text is checked, so the text itself is the key)."""
    if isinstance(value, str):
        return name, value
    return name, tuple(value.shape), value.dtype.str


def _strategy(strategy: Any) -> Strategy | None:
    """The strategy object; files are read again only when one of them changed (by inode, size
    and modification time), as each step of a training loop passes the same ones."""
    if strategy is None or isinstance(strategy, Strategy):
        return strategy
    files = [strategy] if isinstance(strategy, (str, os.PathLike)) else list(strategy)
    key = _files_key(files)
    hit = None if key is None else _STRATEGIES.find(lambda e: e[0] == key)
    if hit is not None:
        return hit[1]
    st = load_strategy(files)
    if key is not None:
        _STRATEGIES.add((key, st))
    return st


def _files_key(files: Sequence[Any]) -> tuple[Any, ...] | None:
    """Local regular files' paths with what tells a changed file apart; ``None`` for anything
    else (an object-store URL, a folder of MindFormers' per-rank files, a missing file)."""
    key = []
    for f in files:
        if not isinstance(f, (str, os.PathLike)) or is_url(os.fspath(f)):
            return None
        try:
            st = os.stat(f)
        except (OSError, ValueError):
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        key.append((os.path.abspath(f), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(key)


def _place(rank: int | None, world: int | None) -> tuple[int, int]:
    """This rank and the job's size: ``world`` from the strategy when it has one, else the job's
    (:func:`~ckptstore.launcher.job`, the one lookup loads and ``--part auto`` use too), else 1."""
    if rank is None and is_scheduler():  # said here in a saver's words; process_rank would say it in a loader's
        raise InvalidOptionError("this is msrun's scheduler process (MS_ROLE=MS_SCHED), which holds no rank: "
                                 "save from the worker processes only")
    place = job() if rank is None or world is None else None
    if world is None:
        world = place.world if place is not None and place.world is not None else 1
    if rank is None:
        rank = place.rank if place is not None else None
        if rank is None and world > 1:
            raise InvalidOptionError(f"which rank is this process? The job has {world} ranks but neither MindSpore's "
                                     "communication nor RANK_ID says; pass rank=")
        rank = 0 if rank is None else rank
    return check_int(rank, "rank", least=0, most=world - 1), world


class SaveJob:
    """One rank's save of one step: the plan and the local arrays it reads chunks from."""

    def __init__(self, location: str, step: int, plan: SavePlan, arrays: Mapping[str, np.ndarray | str],
                 strategy: Strategy | None, chunk_bytes: int, attempt: str | None = None, *,
                 incremental: bool = False) -> None:
        self.location, self.step, self.plan, self.arrays = location, step, plan, arrays
        self.strategy, self.chunk_bytes = strategy, chunk_bytes
        #: Bytes of one piece at most (a background saver lowers it to fit its budget).
        self.piece_bytes = min(chunk_bytes, PIECE_BYTES)
        self.part = Part(plan.rank, plan.world)
        #: The attempt all ranks of this job agree on (:mod:`ckptstore.write.attempt`), ``None`` without one.
        self.attempt = attempt
        #: Whether unchanged slices are referenced from the previous step (:mod:`ckptstore.write.incremental`).
        self.incremental = incremental
        #: The slices found equal to the previous step's, by parameter: (its file, CRCs, hashes).
        self.reused: dict[str, tuple[str, list[int], list[str]]] = {}
        #: The strong hash of every chunk this rank wrote (incremental steps only), by parameter and chunk.
        self.hashes: dict[str, dict[int, str]] = {}
        self._previous: Any = None
        blob = json.dumps({"step": step, "world": plan.world, "chunk_bytes": chunk_bytes, "version": __version__,
                           "strategy": None if strategy is None else strategy.summary(),
                           **({"attempt": attempt} if attempt is not None else {}),
                           **({"incremental": True} if incremental else {})}, sort_keys=True)
        self.fingerprint = hashlib.sha256(blob.encode()).hexdigest()

    def pieces(self) -> Iterator[Piece]:
        """What this rank writes, in order: each slice it writes (the bytes of its one file, which
        are the local array's) in pieces of at most :attr:`piece_bytes`, as views of the local
        array (no copy; a MindSpore tensor is brought to host memory when its first piece comes)."""
        step = max(self.piece_bytes, 1)
        previous = self._previous = inc.previous_step(self.location, self.step) if self.incremental else None
        self.reused = {}
        for p in self.plan.params:
            if p.chunks:
                flat = _bytes_of(self.arrays[p.name])  # type: ignore[arg-type]  # chunks: a tensor, not a str
                same = None if previous is None else inc.reusable(p, flat, previous)
                if same is not None:  # referenced, neither copied nor written
                    self.reused[p.name] = same
                    continue
                for offset in range(0, p.nbytes, step):
                    yield p, offset, flat[p.local_start + offset:p.local_start + min(offset + step, p.nbytes)]

    def write(self, pieces: Iterable[Piece] | None = None, *, commit: bool = True) -> SaveSummary:
        """Write ``pieces`` (by default straight from the arrays), record them, and commit if this
        rank is the last to finish (unless ``commit=False``: ``ckptstore commit`` does it later).

        The same protocol as a conversion's parts (:mod:`ckptstore.write.commit`): claim the step
        for this attempt (an unfinished step of another attempt is started over; a committed one
        is refused, untouched), write the plan, the slices' files, this rank's record and its
        marker, and the last rank commits."""
        started = time.monotonic()
        sink = step_sink(self.location)
        with collector_paused():
            return self._write(sink, started, pieces, commit=commit)

    def _write(self, sink: ByteSink, started: float, pieces: Iterable[Piece] | None, *, commit: bool) -> SaveSummary:
        hold = self._claim(sink)
        try:
            if hold.complete:
                raise StoreExistsError(self._committed_message())
            write_commit_plan(sink, CommitPlan("index", (), self._header(), {inc.SOURCE_ROOT: inc.SOURCE_ROOT_OF_STEP},
                                               self.part.count, records="ranks") if self.incremental else
                              CommitPlan("zarr", (), self._header(), {}, self.part.count, records="ranks"))
            crcs, written = self._write_chunks(sink, self.pieces() if pieces is None else pieces)
            mark_done(sink, self.part, self.fingerprint, self._header(), self._entries(crcs))
            committed = commit and commit_if_last(hold, self.fingerprint) is not None
        finally:
            hold.release()
        return SaveSummary(self.location, self.step, self.plan.rank, self.plan.world, len(self.plan.params),
                           len(crcs), written, committed, round(time.monotonic() - started, 3))

    def _committed_message(self) -> str:
        return (f"step {self.step} is already committed in {self.location}; a committed step is never written "
                "again (nothing was changed): save under a new step, or delete that folder first")

    def _claim(self, sink: ByteSink) -> Any:
        try:
            return claim(sink, self.fingerprint, overwrite=False, sources=(), part=self.part, restart=True,
                         writer="save_rank", step=self.step)
        except StoreExistsError:
            if complete_manifest(sink) is not None:  # committed by another attempt
                raise StoreExistsError(self._committed_message()) from None
            raise

    def _write_chunks(self, sink: ByteSink, pieces: Iterable[Piece]) -> tuple[dict[str, dict[int, int]], int]:
        """Write the slices' files from ``pieces`` (and the array metadata this rank writes), all
        made durable together at the end; return each chunk's CRC-32C and the bytes written."""
        unsynced: list[str] = []
        for p in self.plan.params:
            # an incremental step is an index over ROOT's files, read by ckptstore only: no array metadata
            if p.writes_metadata and not self.incremental:
                meta = zb.array_metadata(p.shape, dtype_label(p.dtype), p.chunk_shape, None, shard_shape=p.shard_shape,
                                         separator=zb.SEPARATOR) if p.sharded else \
                    zb.raw_array_metadata(p.shape, dtype_label(p.dtype), p.chunk_shape, zb.SEPARATOR)
                sink.put(f"{p.path}/{ROOT_METADATA}", meta, durable=False)
                unsynced.append(f"{p.path}/{ROOT_METADATA}")
        crcs: dict[str, dict[int, int]] = {}
        written = 0
        rest = iter(pieces)
        for p, _, data in rest:
            # written whole and renamed (or uploaded); every file is fsynced below, all at once
            segments = functools.partial(_segments, p, self.plan.rank, data, rest)
            if self.incremental:
                segments = functools.partial(_hashed, segments, self.hashes.setdefault(p.name, {}))
            entries = write_zarr_data(sink, p.file, segments,
                                      shard_entries=p.chunks_per_shard if p.sharded else None, durable=False,
                                      fresh=not sink.seekable, pad=p.pad)
            crcs.setdefault(p.name, {}).update((e.index, e.crc) for e in entries)
            unsynced.append(p.file)
            written += p.nbytes + p.pad
            del data  # a staged copy is freed before the next one is taken
        sink.make_durable(unsynced)
        return crcs, written

    def _entries(self, crcs: Mapping[str, Mapping[int, int]]) -> dict[str, Any]:
        """What this rank holds and wrote, for its record (:mod:`ckptstore.write.records`): every
        parameter it holds, in its order, each with the rows of the chunks it wrote (in its
        slice's one file)."""
        params: dict[str, Any] = {}
        for p in self.plan.params:
            if p.is_str:
                params[p.name] = {"dtype": "str", **({"value": self.arrays[p.name]} if p.writes_value else {})}
                continue
            mine, k = crcs.get(p.name, {}), len(p.chunks)
            file = p.file if k else ""
            crc: Sequence[int | None] = [mine.get(c.index) for c in p.chunks]
            extra: dict[str, Any] = {}
            if self.incremental and k:  # files named relative to ROOT; unchanged slices referenced
                reused = self.reused.get(p.name)
                if reused is not None:
                    file, crc, hashes = reused
                    extra["referenced"] = {file: dict(self._previous_record(file))}
                else:
                    file, hashes = inc.step_prefix(self.step) + file, [self.hashes[p.name][c.index] for c in p.chunks]
            params[p.name] = {"path": p.path, "dtype": dtype_label(p.dtype), "shape": list(p.shape),
                              "chunk_shape": list(p.chunk_shape), "codec": None, "chunks": {
                                  "index": [c.index for c in p.chunks], "files": [file] if k else [], "file": [0] * k,
                                  "offset": [c.byte_start for c in p.chunks], "nbytes": [c.nbytes for c in p.chunks],
                                  "crc32c": crc, "rank": [self.plan.rank] * k, "replicas": [p.replicas] * k,
                                  **({"sha256": hashes} if self.incremental and k else {})},
                              **extra}
        return params

    def _previous_record(self, key: str) -> Any:
        """What the previous step recorded of the file ``key`` (checked again at the commit)."""
        return self._previous.files[key]

    def _header(self) -> dict[str, Any]:
        return {"world_size": self.plan.world, "step": self.step, "saved_by": "save_rank",
                "strategy": None if self.strategy is None else self.strategy.summary(),
                "fingerprint": self.fingerprint, "attempt": self.attempt, "created_by": f"ckptstore {__version__}",
                **({"incremental": True} if self.incremental else {})}


def _segments(p: SaveParam, rank: int, data: Any, rest: Iterator[Piece], done: int = 0) -> Iterator[Segment]:
    """The chunks of the file of parameter ``p``'s slice, written by ``rank``, as segments of its
    pieces (the first given, the others taken from ``rest`` as the file is written): a piece may
    end inside a chunk, or hold many. ``done`` is 0: a save's file is written whole, never resumed."""
    chunks, j, done = p.chunks, 0, 0
    left = p.nbytes
    while True:
        view = memoryview(data).cast("B")
        pos = 0
        while pos < len(view):
            take = min(chunks[j].nbytes - done, len(view) - pos)
            done += take
            last = done == chunks[j].nbytes
            yield chunks[j].index, rank, view[pos:pos + take], last
            pos += take
            if last:
                j, done = j + 1, 0
        left -= len(view)
        del view
        if left <= 0:
            return
        q, _, data = next(rest)
        if q.name != p.name:  # pieces come parameter by parameter, in the plan's order
            raise RuntimeError(f"pieces of {q.name!r} came before the last of {p.name!r}")


def _hashed(segments: Callable[[int], Iterator[Segment]], hashes: dict[int, str], done: int) -> Iterator[Segment]:
    """``segments(done)``, noting each chunk's strong hash (:func:`ckptstore.write.incremental.digest`)
    in ``hashes`` as its last segment passes (an incremental step records them for the next)."""
    open_: dict[int, Any] = {}
    for index, rank, view, last in segments(done):
        h = open_.setdefault(index, hashlib.sha256())
        h.update(view)
        if last:
            hashes[index] = open_.pop(index).hexdigest()
        yield index, rank, view, last


def _bytes_of(array: np.ndarray | LazyArray) -> memoryview:
    host = array.load() if isinstance(array, LazyArray) else np.asarray(array, order="C")
    return host.reshape(-1).view(np.uint8).data


