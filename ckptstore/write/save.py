"""Saving from training straight into a store: ``save_rank`` on every rank of the job.

Each step goes to its own store, ``ROOT/step_<N>`` (a Zarr store like a converted one). Every
rank passes its local slices; :mod:`ckptstore.write.save_plan` says which chunks it writes
(each distinct slice once, by one rank of its replica group, balanced by bytes). Ranks write
disjoint files as the parts of one conversion (:mod:`ckptstore.write.parts`: part index = rank,
count = world size): each claims the step folder for its part, writes one file per slice it
was given (the slice's chunk, or a Zarr shard of its chunks, so ranks never share a file,
locally or in a bucket), makes them durable together (concurrent fsyncs, which a journaling
file system commits in a few batches, not one after another), records what it wrote in
``.ckptstore-work/saved/<rank>-of-<world>.json``, marks its part done, and the last rank to
finish merges the records into the manifest and commits. Until then the step is
incomplete: :func:`ckptstore.open` on ``ROOT`` takes the newest *committed* step, and a rank
that died mid-save completes the step when it saves it again.

:class:`SaveJob` separates *what* is written (a plan and the local arrays) from writing it,
so :mod:`ckptstore.write.async_save` can copy the bytes to host memory and write them later.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from math import prod
from typing import Any, Iterable, Iterator, Mapping, Sequence

import crc32c
import numpy as np

from ckptstore.checkpoint.strategy import Strategy, load_strategy
from ckptstore.dtypes import lookup
from ckptstore.errors import (
    ConversionInProgressError,
    IncompleteStoreError,
    InvalidOptionError,
    LayoutMismatchError,
    StoreExistsError,
)
from ckptstore.io.locations import join, open_location
from ckptstore.io.sink import ByteSink, open_sink
from ckptstore.launcher import is_scheduler, process_rank
from ckptstore.store import zarr as zb
from ckptstore.store.chunking import select_params
from ckptstore.store.kinds import ROOT_METADATA, WORK_DIR, read_manifest
from ckptstore.store.manifest import ChunkTable, ParamManifest, StoreManifest, dtype_label
from ckptstore.store.steps import STEP_FOLDER, step_name
from ckptstore.store.versions import record_versions
from ckptstore.version import __version__
from ckptstore.write.output_folder import claim, complete_manifest, drop_idle_work, drop_work, lock_output
from ckptstore.write.parts import LAUNCHERS, PARTS_DIR, Part
from ckptstore.write.save_plan import SaveParam, SavePlan, plan_save
from ckptstore.write.commit import mark_done

#: Largest chunk a save writes (a slice bigger than this is cut along its leading axes), as
#: ``ckptstore convert``'s default.
DEFAULT_SAVE_CHUNK_MB = 256
#: Largest piece of a file handed to the writer at once (what a background save copies to host
#: memory in one go, within its budget), whatever the chunk size.
PIECE_BYTES = 64 << 20
RECORDS_DIR = f"{WORK_DIR}/saved"

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
              rank: int | None = None, format: str = "zarr", include: Sequence[str] = (),  # noqa: A002
              exclude: Sequence[str] = (), chunk_mb: int | None = None) -> SaveSummary:
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
    rank must pass the same). Returns a :class:`SaveSummary` of this rank's share.
    """
    return prepare_save(params, root, step=step, strategy=strategy, rank=rank, format=format, include=include,
                        exclude=exclude, chunk_mb=chunk_mb).write()


def prepare_save(params: Any, root: str | os.PathLike[str], *, step: int, strategy: Any = None,
                 rank: int | None = None, format: str = "zarr", include: Sequence[str] = (),  # noqa: A002
                 exclude: Sequence[str] = (), chunk_mb: int | None = None) -> "SaveJob":
    """Work out what :func:`save_rank` writes (nothing is copied or written yet)."""
    if format != "zarr":
        raise InvalidOptionError(f"save_rank writes zarr stores only, not {format!r}; convert a saved step with "
                                 "'ckptstore convert' for another format")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise InvalidOptionError(f"step must be a non-negative integer, not {step!r}")
    chunk_bytes = _chunk_bytes(chunk_mb)
    arrays, cell_strategy = host_values(params)
    keep = select_params(list(arrays), include=include, exclude=exclude)
    arrays = {n: arrays[n] for n in keep}
    st = _strategy(strategy if strategy is not None else cell_strategy)
    world = st.world_size if st is not None else _env_world()
    me = _this_rank(rank, world)
    plan = plan_save(arrays, rank=me, world=world, strategy=st, max_chunk_bytes=chunk_bytes)
    return SaveJob(step_location(root, step), step, plan, arrays, st, chunk_bytes)


def _chunk_bytes(chunk_mb: int | None) -> int:
    mb = DEFAULT_SAVE_CHUNK_MB if chunk_mb is None else chunk_mb
    if isinstance(mb, bool) or not isinstance(mb, int) or mb < 1:
        raise InvalidOptionError(f"chunk_mb must be a positive integer, not {chunk_mb!r}")
    return mb << 20


def host_values(params: Any) -> tuple[dict[str, np.ndarray | str], Strategy | None]:
    """``params`` as numpy arrays (C-contiguous) and strings, and a Cell's own layouts if it has them.

    MindSpore values and Cells are converted by :mod:`ckptstore.mindspore` (imported only when
    one is passed, so numpy callers never import MindSpore).
    """
    if not isinstance(params, Mapping) or any(not _plain(v) for v in params.values()):
        from ckptstore import mindspore as ms_adapter

        return ms_adapter.host_values(params)
    return {str(n): plain_value(n, v) for n, v in params.items()}, None


def _plain(value: Any) -> bool:
    return isinstance(value, (np.ndarray, np.generic, str, bool, int, float, LazyArray))


def plain_value(name: str, value: Any) -> Any:
    """A numpy-side value as a ``.ckpt`` holds it: Python ``int`` -> int64 and ``float`` ->
    float32 scalars (as ``append_dict`` saves them), strings as text, arrays C-contiguous."""
    if isinstance(value, (str, LazyArray)):
        return value
    if isinstance(value, bool):
        return np.array(value, dtype=np.bool_)
    if isinstance(value, int):
        return np.array(value, dtype=np.int64)
    if isinstance(value, float):
        return np.array(value, dtype=np.float32)
    array = np.asarray(value, order="C")
    try:
        lookup(array.dtype)
    except (ValueError, KeyError):
        raise InvalidOptionError(f"parameter {name!r} has dtype {array.dtype}, which a MindSpore checkpoint cannot "
                                 "hold") from None
    return array


def _strategy(strategy: Any) -> Strategy | None:
    if strategy is None or isinstance(strategy, Strategy):
        return strategy
    files = [strategy] if isinstance(strategy, (str, os.PathLike)) else list(strategy)
    return load_strategy(files)


def _env_world() -> int:
    """The job's size without a strategy: from MindSpore when initialised, else the launcher's environment."""
    if "mindspore" in sys.modules:
        from ckptstore import mindspore as ms_adapter

        size = ms_adapter.group_size()
        if size is not None:
            return size
    for _, size_var in LAUNCHERS:
        if os.environ.get(size_var, "").isdigit():
            return max(int(os.environ[size_var]), 1)
    return 1


def _this_rank(rank: int | None, world: int) -> int:
    if rank is None:
        rank = _env_rank(world)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise InvalidOptionError(f"rank must be an integer in 0..{world - 1} (the job has {world} ranks), "
                                 f"not {rank!r}")
    return rank


def _env_rank(world: int) -> int:
    """This process's rank as the job says it (:func:`~ckptstore.launcher.process_rank`)."""
    if is_scheduler():  # said here in a saver's words; process_rank would say it in a loader's
        raise InvalidOptionError("this is msrun's scheduler process (MS_ROLE=MS_SCHED), which holds no rank: "
                                 "save from the worker processes only")
    rank = process_rank()
    if rank is not None:
        return rank
    if world == 1:
        return 0
    raise InvalidOptionError(f"which rank is this process? The job has {world} ranks but neither MindSpore's "
                             "communication nor RANK_ID says; pass rank=")


class SaveJob:
    """One rank's save of one step: the plan and the local arrays it reads chunks from."""

    def __init__(self, location: str, step: int, plan: SavePlan, arrays: Mapping[str, np.ndarray | str],
                 strategy: Strategy | None, chunk_bytes: int) -> None:
        self.location, self.step, self.plan, self.arrays = location, step, plan, arrays
        self.strategy, self.chunk_bytes = strategy, chunk_bytes
        #: Bytes of one piece at most (a background saver lowers it to fit its budget).
        self.piece_bytes = min(chunk_bytes, PIECE_BYTES)
        self.part = Part(plan.rank, plan.world)
        blob = json.dumps({"step": step, "world": plan.world, "chunk_bytes": chunk_bytes, "version": __version__,
                           "strategy": None if strategy is None else strategy.summary()}, sort_keys=True)
        self.fingerprint = hashlib.sha256(blob.encode()).hexdigest()

    def pieces(self) -> Iterator[Piece]:
        """What this rank writes, in order: each slice it writes (the bytes of its one file, which
        are the local array's) in pieces of at most :attr:`piece_bytes`, as views of the local
        array (no copy; a MindSpore tensor is brought to host memory when its first piece comes)."""
        step = max(self.piece_bytes, 1)
        for p in self.plan.params:
            if p.chunks:
                flat = _bytes_of(self.arrays[p.name])  # type: ignore[arg-type]
                for offset in range(0, p.nbytes, step):
                    yield p, offset, flat[offset:min(offset + step, p.nbytes)]

    def write(self, pieces: Iterable[Piece] | None = None, *, commit: bool = True) -> SaveSummary:
        """Write ``pieces`` (by default straight from the arrays), record them, and commit if this
        rank is the last to finish (unless ``commit=False``: ``ckptstore commit`` does it later)."""
        started = time.monotonic()
        sink = open_sink(self.location)
        hold = self._claim(sink)
        try:
            if hold.complete:
                raise StoreExistsError(f"step {self.step} is already committed in {self.location}; a step is saved "
                                       "once: save under a new step, or delete that folder first")
            crcs, written = self._write_chunks(sink, self.pieces() if pieces is None else pieces)
            record = self._record(crcs)
            sink.put(f"{RECORDS_DIR}/{self.part.index}-of-{self.part.count}.json", json.dumps(record).encode(),
                     durable=False)
            mark_done(sink, self.part, self.fingerprint)
            committed = self._commit_if_last(hold, sink) if commit else False
        finally:
            hold.release()
        return SaveSummary(self.location, self.step, self.plan.rank, self.plan.world, len(self.plan.params),
                           len(crcs), written, committed, round(time.monotonic() - started, 3))

    def _claim(self, sink: ByteSink) -> Any:
        try:
            return claim(sink, self.fingerprint, overwrite=False, sources=(), part=self.part)
        except StoreExistsError:
            raise StoreExistsError(f"{self.location} holds another save of step {self.step} (another job, world size, "
                                   "strategy or chunk size) or other files; delete it, or save into another "
                                   "folder") from None
        except ConversionInProgressError:
            raise ConversionInProgressError(f"rank {self.plan.rank} of step {self.step} is already being saved into "
                                            f"{self.location} by another process") from None

    def _write_chunks(self, sink: ByteSink, pieces: Iterable[Piece]) -> tuple[dict[str, dict[int, int]], int]:
        """Write the slices' files from ``pieces`` (and the array metadata this rank writes), all
        made durable together at the end; return each chunk's CRC-32C and the bytes written."""
        unsynced: list[str] = []
        for p in self.plan.params:
            if p.writes_metadata:
                meta = zb.array_metadata(p.shape, dtype_label(p.dtype), p.chunk_shape, None, shard_shape=p.shard_shape,
                                         separator=zb.SEPARATOR) if p.sharded else \
                    zb.raw_array_metadata(p.shape, dtype_label(p.dtype), p.chunk_shape, zb.SEPARATOR)
                sink.put(f"{p.path}/{ROOT_METADATA}", meta, durable=False)
                unsynced.append(f"{p.path}/{ROOT_METADATA}")
        crcs: dict[str, dict[int, int]] = {}
        written = 0
        rest = iter(pieces)
        for p, _, data in rest:
            mine = crcs.setdefault(p.name, {})
            # written whole and renamed (or uploaded); every file is fsynced below, all at once
            if len(data) == p.nbytes and not p.sharded:
                sink.put(p.file, data, durable=False)
                mine[p.chunks[0].index] = crc32c.crc32c(data)
            else:
                sink.put_stream(p.file, _file_bytes(p, data, rest, mine, fresh=not sink.seekable), durable=False)
            unsynced.append(p.file)
            written += p.nbytes
            del data  # a staged copy is freed before the next one is taken
        sink.make_durable(unsynced)
        return crcs, written

    def _record(self, crcs: Mapping[str, Mapping[int, int]]) -> dict[str, Any]:
        """What this rank holds and wrote, for the commit: every parameter it holds, in its order."""
        params: dict[str, Any] = {}
        for p in self.plan.params:
            if p.is_str:
                params[p.name] = {"dtype": "str", **({"value": self.arrays[p.name]} if p.writes_value else {})}
                continue
            mine = crcs.get(p.name, {})
            params[p.name] = {"dtype": dtype_label(p.dtype), "shape": list(p.shape), "path": p.path,
                              "chunk_shape": list(p.chunk_shape), "replicas": p.replicas,
                              **({"file": p.file} if p.chunks else {}),
                              "chunks": [[c.index, c.byte_start, c.nbytes, mine[c.index]] for c in p.chunks]}
        return {"rank": self.plan.rank, "world": self.plan.world, "header": self._header(), "params": params}

    def _commit_if_last(self, hold: Any, sink: ByteSink) -> bool:
        """Commit the step if every rank has finished (this process holds the folder's lock alone
        when the job has one rank; otherwise it takes it, as a converting part does)."""
        if self.part.count == 1:
            commit_step(sink)
            return True
        lock = lock_output(sink)
        try:
            if _committed(sink, self.fingerprint):
                drop_idle_work(sink)
                return False
            if _unfinished(sink, self.part.count):
                return False  # another rank is still writing: the last one commits
            try:
                commit_step(sink)
            except IncompleteStoreError:
                if _committed(sink, self.fingerprint):  # another rank committed meanwhile (object storage)
                    return False
                raise
            return True
        finally:
            lock.release()

    def _header(self) -> dict[str, Any]:
        return {"world_size": self.plan.world, "step": self.step, "saved_by": "save_rank",
                "strategy": None if self.strategy is None else self.strategy.summary(),
                "fingerprint": self.fingerprint, "created_by": f"ckptstore {__version__}"}


def _file_bytes(p: SaveParam, data: Any, rest: Iterator[Piece], crcs: dict[int, int], *,
                fresh: bool) -> Iterator[Any]:
    """The bytes of the file of parameter ``p``'s slice: its pieces (the first given, the others
    taken from ``rest`` as the file is written), then, for a shard, its index. Each chunk's
    CRC-32C goes to ``crcs``. ``fresh``: hand over copies (a streamed upload may keep a buffer
    until it is sent, and a staged buffer is reused once the next piece is taken)."""
    chunks, j, crc, done = p.chunks, 0, 0, 0
    left = p.nbytes
    while True:
        view = memoryview(data).cast("B")
        pos = 0
        while pos < len(view):  # a piece may end inside a chunk, or hold many
            take = min(chunks[j].nbytes - done, len(view) - pos)
            crc = crc32c.crc32c(view[pos:pos + take], crc)
            pos, done = pos + take, done + take
            if done == chunks[j].nbytes:
                crcs[chunks[j].index], j, crc, done = crc, j + 1, 0, 0
        yield bytes(view) if fresh else view
        left -= len(view)
        del view
        if left <= 0:
            break
        q, _, data = next(rest)
        if q.name != p.name:  # pieces come parameter by parameter, in the plan's order
            raise RuntimeError(f"pieces of {q.name!r} came before the last of {p.name!r}")
    if p.sharded:
        yield zb.shard_index([c.byte_start for c in chunks], [c.nbytes for c in chunks])


class LazyArray:
    """A value known by shape and dtype, fetched into host memory only when its bytes are needed
    (a MindSpore tensor: planning a save needs no data, and a background save copies one
    parameter at a time)."""

    def __init__(self, shape: Sequence[int], dtype: np.dtype, fetch: Any) -> None:
        self.shape, self.dtype, self._fetch = tuple(int(s) for s in shape), np.dtype(dtype), fetch

    def load(self) -> np.ndarray:
        return np.asarray(self._fetch(), order="C")


def _bytes_of(array: np.ndarray | LazyArray) -> memoryview:
    host = array.load() if isinstance(array, LazyArray) else np.asarray(array, order="C")
    return memoryview(host.reshape(-1).view(np.uint8))


def _committed(sink: ByteSink, fingerprint: str) -> bool:
    manifest = complete_manifest(sink)
    return manifest is not None and manifest.get("source", {}).get("fingerprint") == fingerprint


def is_saved_step(sink: ByteSink) -> bool:
    """Whether ``sink`` holds an unfinished save (ranks' records) rather than a conversion."""
    return bool(sink.keys(RECORDS_DIR))


def commit_step(sink: ByteSink) -> StoreManifest:
    """Merge every rank's record into the step's manifest and write it (the commit).

    Everything it needs is in the records, so any process can run it (``ckptstore commit``).
    Raises :class:`~ckptstore.errors.IncompleteStoreError` naming the ranks that have not
    finished, or a parameter no rank wrote.
    """
    keys = sink.keys(RECORDS_DIR)
    if not keys:
        raise IncompleteStoreError(f"{sink.url} holds no finished rank of a save; save the step first")
    raw = sink.read(keys[0])
    if raw is None:  # another rank committed and removed the records meanwhile (object storage)
        raise IncompleteStoreError(f"{sink.url}: the ranks' records went away while committing")
    first = json.loads(raw)
    header, world = first["header"], int(first["world"])
    missing = _unfinished(sink, world)
    if missing:
        raise IncompleteStoreError(f"step {header['step']} in {sink.url} is not complete: rank(s) "
                                   f"{_short(missing)} of {world} have not finished saving it; save them")
    records = []
    for i in range(world):
        raw = sink.read(f"{RECORDS_DIR}/{i}-of-{world}.json")
        record = json.loads(raw) if raw is not None else None
        if record is None or record.get("header") != header:
            raise IncompleteStoreError(f"step {header['step']} in {sink.url}: rank {i} finished but its record is "
                                       "missing or from another save; save that rank again")
        records.append(record)
    manifest = StoreManifest(merge_records(records, sink.url), dict(header), kind="zarr")
    # every rank synced its chunk files' folders before its marker (mark_done): the manifest is last
    manifest = record_versions(sink, manifest)  # objects' ETags, so readers pin them without a request
    sink.put(ROOT_METADATA, zb.group_metadata({"ckptstore": manifest.to_json()}))
    sink.sync()
    drop_work(sink)
    return manifest


def merge_records(records: Sequence[Mapping[str, Any]], where: str) -> dict[str, ParamManifest]:
    """Every parameter's manifest from the ranks' records (in rank 0's order, then the others')."""
    merged: dict[str, dict[str, Any]] = {}
    for rec in records:
        rank = int(rec["rank"])
        for name, d in rec["params"].items():
            m = merged.setdefault(name, {"dtype": d["dtype"], "shape": d.get("shape"), "rank": rank, "chunks": {},
                                         "chunk_shape": None, "path": d.get("path"), "value": None})
            if (m["dtype"], m["shape"]) != (d["dtype"], d.get("shape")):
                raise LayoutMismatchError(
                    f"parameter {name!r} is {m['dtype']} {m['shape']} on rank {m['rank']} but {d['dtype']} "
                    f"{d.get('shape')} on rank {rank} (global shapes from each rank's slice and layout); the ranks "
                    "must save the same model with the same strategy")
            if "value" in d:
                m["value"] = d["value"]
            for row in d.get("chunks", []):
                if m["chunk_shape"] not in (None, d["chunk_shape"]):
                    raise LayoutMismatchError(f"parameter {name!r}: ranks cut it into chunks of different shapes")
                m["chunk_shape"] = d["chunk_shape"]
                if "file" in d:  # [index, offset, nbytes, crc] in the slice's one file
                    index, offset, nbytes, crc = row
                    key = d["file"]
                else:  # a record of an earlier release, one file per chunk: [index, key, nbytes, crc]
                    (index, key, nbytes, crc), offset = row, 0
                m["chunks"][index] = (key, offset, nbytes, crc, rank, d["replicas"])
    return {name: _param_manifest(name, m, where) for name, m in merged.items()}


def _param_manifest(name: str, m: Mapping[str, Any], where: str) -> ParamManifest:
    if m["dtype"] == "str":
        if m["value"] is None:
            raise IncompleteStoreError(f"{where}: no rank saved the value of {name!r}")
        return ParamManifest(name, zb.array_path(name), "str", (), (), ChunkTable((), (), (), (), (), ()), None,
                             m["value"])
    shape = tuple(m["shape"])
    if m["chunk_shape"] is None:
        if prod(shape) == 0:
            return ParamManifest(name, m["path"], m["dtype"], shape, tuple(max(s, 1) for s in shape),
                                 ChunkTable((), (), (), (), (), ()))
        raise IncompleteStoreError(f"{where}: no rank wrote parameter {name!r}; every rank of the stage that holds "
                                   "it (stage 0 for values outside the strategy) must pass it to save_rank")
    chunk_shape = tuple(m["chunk_shape"])
    n = prod(-(-s // c) for s, c in zip(shape, chunk_shape))
    chunks = m["chunks"]
    if sorted(chunks) != list(range(n)):
        lost = next(i for i in range(n) if i not in chunks)
        raise IncompleteStoreError(f"{where}: chunk {lost} of parameter {name!r} was written by no rank; every rank "
                                   "must save its slices of the same parameters")
    rows = [chunks[i] for i in range(n)]
    table = ChunkTable(*(tuple(r[k] for r in rows) for k in range(6)))
    manifest = ParamManifest(name, m["path"], m["dtype"], shape, chunk_shape, table)
    manifest.validate()
    return manifest


def _unfinished(sink: ByteSink, world: int) -> list[int]:
    """The ranks whose marker is missing (one listing, not a request per rank)."""
    done = set(sink.keys(PARTS_DIR))
    return [i for i in range(world) if Part(i, world).marker not in done]


def _short(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks[:20])) + (" ..." if len(ranks) > 20 else "")


# ---- steps of a root: which are committed, retention ------------------------------------------


def saved_steps(root: str | os.PathLike[str]) -> list[tuple[int, bool]]:
    """Every ``step_<N>`` folder of ``root`` as ``(N, committed)``, oldest first."""
    source = open_location(root)
    try:
        folders = source.list()[0]
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in folders:
        m = STEP_FOLDER.match(name)
        if m:
            doc = read_manifest(open_location(step_location(root, int(m.group(1)))))
            out.append((int(m.group(1)), isinstance(doc, dict) and doc.get("complete") is True))
    return sorted(out)


def prune_steps(root: str | os.PathLike[str], keep: int) -> list[int]:
    """Delete the steps older than the newest ``keep`` committed ones; return the steps deleted.

    Only steps older than the oldest kept committed step go (committed or not), so a step
    being saved now, and every step newer than the last commit, stays.
    """
    committed = [s for s, done in saved_steps(root) if done]
    if keep < 1 or len(committed) <= keep:
        return []
    oldest_kept = committed[-keep]
    doomed = [s for s, _ in saved_steps(root) if s < oldest_kept]
    for s in doomed:
        _remove_step(step_location(root, s))
    return doomed


def _remove_step(location: str) -> None:
    """Delete one step folder: what ckptstore wrote there (the manifest goes first, so a reader
    never finds a committed step with chunks missing)."""
    sink = open_sink(location)
    sink.delete([ROOT_METADATA])
    sink.delete(sink.keys())
    sink.remove_root()
