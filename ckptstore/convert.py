"""Convert a MindSpore distributed checkpoint into a store of global tensors.

Flow: pick the rank files and read the strategy -> scan every file's headers and resolve each
parameter's global shape and distinct slices (:mod:`ckptstore.source`) -> plan chunks aligned to
the slices (:mod:`ckptstore.chunk_plan`) -> stream each chunk's bytes from the one rank file
that supplies it into the parameter's data file, checksumming on the way -> commit.

Safety: each parameter's file is written under ``.partial`` with a journal of finished chunks
and renamed when complete; the root ``zarr.json`` that makes the store readable is written
last, after every parameter is committed. An interrupted run leaves a store that
:func:`ckptstore.open` refuses; running the same conversion again resumes, skipping finished
parameters and chunks. Memory stays at one copy buffer per worker (plus one chunk when
compressing), whatever the checkpoint size.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import crc32c
import numcodecs
import numpy as np

from .version import __version__
from .backends import zarr_backend as zb
from .chunk_plan import ChunkSource, ParamPlan, check_even_slices, plan_param, select_params
from .ckpt_reader import CkptEntry, read_entry, read_into
from .errors import (
    CkptStoreError,
    LayoutMismatchError,
    ReplicaMismatchError,
    StoreExistsError,
    StoreWriteError,
)
from .journal import JournalEntry, JournalWriter, good_prefix, read_journal
from .manifest import ChunkTable, ParamManifest, StoreManifest, dtype_label
from .progress import Progress
from .source import DistributedSource, SourceParam, find_rank_files, open_source
from .strategy import Strategy, load_strategy

WORK_DIR = ".ckptstore-work"
_BLOCK = 16 << 20  # copy buffer per worker
DEFAULT_CHUNK_MB = 256
DEFAULT_COMPRESSED_CHUNK_MB = 16
CODECS: dict[str, dict[str, Any]] = {
    "zstd": {"id": "zstd", "level": 3},
    "blosc": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": "shuffle"},
}
#: Test hook: abort with SIGKILL after this many chunks (proves resumability; see tests).
_KILL_AFTER_ENV = "CKPTSTORE_KILL_AFTER_CHUNKS"


@dataclass(frozen=True)
class ConvertSummary:
    """What a conversion did (``ckptstore convert --json`` prints this)."""

    store: str
    params: int
    chunks: int
    chunks_written: int
    chunks_resumed: int
    params_resumed: int
    source_bytes: int
    unique_bytes: int
    stored_bytes: int
    seconds: float

    @property
    def dedup_saved_bytes(self) -> int:
        return self.source_bytes - self.unique_bytes

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "dedup_saved_bytes": self.dedup_saved_bytes}


def resolve_source(src: str | os.PathLike[str], strategy: Sequence[str | os.PathLike[str]] = (), *,
                   step: int | None = None, prefix: str | None = None,
                   verify_crc: bool = False) -> DistributedSource:
    """Open ``src`` (a folder of ``rank_<i>/`` or one ``.ckpt`` file) with its strategy files."""
    strat: Strategy | None = load_strategy(list(strategy)) if strategy else None
    p = Path(src)
    if p.is_file():
        if strat is not None and strat.world_size != 1:
            raise LayoutMismatchError(f"{p} is a single checkpoint file but the strategy describes "
                                      f"{strat.world_size} ranks; pass the folder of rank_<i>/ instead")
        return open_source({0: p}, strat, verify_crc=verify_crc)
    if not p.exists():
        raise FileNotFoundError(errno.ENOENT, "no such checkpoint file or folder", str(p))
    return open_source(find_rank_files(p, step=step, prefix=prefix), strat, verify_crc=verify_crc)


def convert(src: str | os.PathLike[str], out: str | os.PathLike[str], *,
            strategy: Sequence[str | os.PathLike[str]] = (), step: int | None = None, prefix: str | None = None,
            include: Sequence[str] = (), exclude: Sequence[str] = (), drop_optimizer: bool = False,
            compress: str | None = None, max_chunk_mb: int | None = None, workers: int = 4,
            verify_replicas: bool = False, verify_crc: bool = False, overwrite: bool = False,
            quiet: bool = True) -> ConvertSummary:
    """Convert a MindSpore checkpoint into a Zarr v3 store of global tensors at ``out``.

    ``src`` is a folder of ``rank_<i>/`` subfolders (each rank's newest ``.ckpt`` unless
    ``step``/``prefix`` pick another) with the ``strategy`` file(s) that laid it out, or a single
    ``.ckpt``. ``include``/``exclude`` are name globs; ``drop_optimizer`` removes optimizer state
    (:data:`~ckptstore.chunk_plan.OPTIMIZER_PATTERNS`). ``compress`` is ``None``, ``"zstd"`` or
    ``"blosc"``. Replicated slices are read and written once; ``verify_replicas`` also reads
    every replica and fails on a mismatch. An existing complete store needs ``overwrite``; an
    unfinished one from the same command is resumed. Returns a :class:`ConvertSummary`.
    """
    started = time.monotonic()
    codec = _codec(compress)
    chunk_bytes = (max_chunk_mb or (DEFAULT_COMPRESSED_CHUNK_MB if codec else DEFAULT_CHUNK_MB)) << 20
    source = resolve_source(src, strategy, step=step, prefix=prefix, verify_crc=verify_crc)
    names = select_params(source.params, include=include, exclude=exclude, drop_optimizer=drop_optimizer)
    plans = [_plan(source.params[n], chunk_bytes) for n in names]
    out = Path(out)
    fingerprint = _fingerprint(source, plans, codec)
    work = _prepare_output(out, fingerprint, overwrite=overwrite)
    progress = Progress(sum(p.nbytes for p in plans), len(plans), desc="convert", quiet=quiet)
    writer = _Writer(out, work, codec, verify_replicas, progress)
    try:
        order = sorted(plans, key=lambda p: -p.nbytes)  # big first: workers finish together
        with ThreadPoolExecutor(max(1, workers)) as pool:
            done = dict(zip((p.param.name for p in order), pool.map(writer.write_param, order)))
    finally:
        progress.close()
    manifest = StoreManifest({p.param.name: done[p.param.name] for p in plans}, _source_header(source, step))
    _commit(out, work, manifest)
    return ConvertSummary(
        store=str(out), params=len(plans), chunks=sum(len(p.chunks) for p in plans),
        chunks_written=writer.chunks_written, chunks_resumed=writer.chunks_resumed,
        params_resumed=writer.params_resumed,
        source_bytes=sum(sum(s.entry.nbytes * len(s.ranks) for s in p.param.slices) for p in plans),
        # a string value has no chunks (its text is in the manifest) but is still counted once
        unique_bytes=sum(p.param.slices[0].entry.nbytes if p.param.is_str else p.nbytes for p in plans),
        stored_bytes=sum(m.stored_bytes for m in manifest.params.values()),
        seconds=round(time.monotonic() - started, 3))


def _codec(compress: str | None) -> dict[str, Any] | None:
    if compress in (None, "", "none"):
        return None
    if compress not in CODECS:
        raise ValueError(f"unknown compression {compress!r}; choose one of: none, {', '.join(CODECS)}")
    return dict(CODECS[compress])


def _plan(param: SourceParam, chunk_bytes: int) -> ParamPlan:
    reason = check_even_slices(param)
    if reason:
        raise LayoutMismatchError(f"parameter {param.name!r} of shape {list(param.shape)} cannot be stored: "
                                  f"{reason}")
    return plan_param(param, max_chunk_bytes=chunk_bytes)


def _fingerprint(source: DistributedSource, plans: Sequence[ParamPlan], codec: Mapping[str, Any] | None) -> str:
    """What identifies this conversion, so a rerun resumes only the same one."""
    files = {r: (os.path.abspath(p), os.stat(p).st_size, os.stat(p).st_mtime_ns) for r, p in source.rank_files.items()}
    params = [(p.param.name, p.param.dtype.str if not p.param.is_str else "str", p.param.shape, p.chunk_shape)
              for p in plans]
    blob = json.dumps({"files": files, "params": params, "codec": codec, "version": __version__}, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _prepare_output(out: Path, fingerprint: str, *, overwrite: bool) -> Path:
    """Make ``out`` ready: new, resumable (same fingerprint), or cleared with ``overwrite``."""
    if out.exists() and not out.is_dir():
        raise StoreExistsError(f"output path {out} is a file, not a folder; choose another --out")
    work = out / WORK_DIR
    if out.is_dir() and any(out.iterdir()):
        complete = (out / zb.ROOT_METADATA).exists()
        ours = complete and _has_manifest(out) or work.is_dir()
        if not ours:
            raise StoreExistsError(f"output folder {out} is not empty and is not a ckptstore store; "
                                   "choose an empty or new folder")
        previous = (work / "fingerprint").read_text() if (work / "fingerprint").exists() else None
        if overwrite:
            _clear(out)
        elif complete:
            raise StoreExistsError(f"{out} already holds a complete store; pass --overwrite to replace it")
        elif previous != fingerprint:
            raise StoreExistsError(f"{out} holds an unfinished conversion of other files or options; rerun "
                                   "that command to finish it, or pass --overwrite to start again")
    try:
        (work / "done").mkdir(parents=True, exist_ok=True)
        zb.write_atomic(work / "fingerprint", fingerprint.encode())
    except OSError as e:
        raise _write_error(e, out, None) from e
    return work


def _has_manifest(out: Path) -> bool:
    """Whether ``out/zarr.json`` is a ckptstore root (an unreadable one is someone else's file)."""
    try:
        attrs = zb.read_root_attributes(out)
    except (ValueError, AttributeError):  # not JSON, not UTF-8, not an object
        return False
    return isinstance(attrs, dict) and attrs.get("ckptstore") is not None


def _clear(out: Path) -> None:
    for child in out.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _write_error(e: OSError, path: Path | str, param: str | None) -> StoreWriteError:
    what = "no space left on the device" if e.errno == errno.ENOSPC else e.strerror or str(e)
    where = f" (parameter {param!r})" if param else ""
    return StoreWriteError(e.errno or 0, f"{what} while writing {path}{where}; free space or fix the "
                           "problem, then rerun the same command to resume")


class _Writer:
    """Writes parameters' data files; shared by the worker threads."""

    def __init__(self, out: Path, work: Path, codec: dict[str, Any] | None, verify_replicas: bool,
                 progress: Progress) -> None:
        self.out, self.work, self.codec = out, work, codec
        self.verify_replicas, self.progress = verify_replicas, progress
        self._compressor = _encoder(codec)
        self.chunks_written = self.chunks_resumed = self.params_resumed = 0
        kill = os.environ.get(_KILL_AFTER_ENV)
        self._kill_after = int(kill) if kill else None

    def write_param(self, plan: ParamPlan) -> ParamManifest:
        name = plan.param.name
        path = zb.array_path(name)
        done = self.work / "done" / f"{path}.json"
        if done.exists():
            self.params_resumed += 1
            self.chunks_resumed += len(plan.chunks)
            self.progress.add(plan.nbytes, 1)
            return ParamManifest.from_json(name, json.loads(done.read_text()))
        try:
            manifest = self._write(plan, path)
            zb.write_atomic(done, json.dumps(manifest.to_json()).encode())
        except OSError as e:
            raise _write_error(e, self.out / path, name) from e
        self.progress.add(0, 1)
        return manifest

    def _write(self, plan: ParamPlan, path: str) -> ParamManifest:
        p = plan.param
        if p.is_str:
            value = _read_str(p)
            return ParamManifest(p.name, path, "str", (), (), ChunkTable((), (), (), (), (), ()), None, value)
        array_dir = self.out / path
        array_dir.mkdir(parents=True, exist_ok=True)
        zb.write_atomic(array_dir / zb.ROOT_METADATA,
                        zb.array_metadata(p.shape, dtype_label(p.dtype), plan.chunk_shape, self.codec))
        key = zb.chunk_key(path, len(p.shape))
        final = self.out / key
        final.parent.mkdir(parents=True, exist_ok=True)
        partial = final.with_name(final.name + ".partial")
        journal = final.with_name(final.name + ".journal")
        entries = good_prefix(partial, read_journal(journal)) if partial.exists() else []
        self.chunks_resumed += len(entries)
        self.progress.add(sum(c.nbytes for c in plan.chunks[:len(entries)]))
        fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
        log = JournalWriter(journal, entries)
        try:
            offset = entries[-1].offset + entries[-1].nbytes if entries else 0
            os.ftruncate(fd, offset)
            for chunk in plan.chunks[len(entries):]:
                crc, nbytes = self._copy_chunk(chunk, fd, offset)
                entry = JournalEntry(chunk.index, offset, nbytes, crc, chunk.rank)
                log.append(entry)
                entries.append(entry)
                offset += nbytes
                self._count_chunk()
            if zb.is_sharded(len(plan.chunks)):
                os.pwrite(fd, zb.shard_index([e.offset for e in entries], [e.nbytes for e in entries]), offset)
            os.fsync(fd)
        finally:
            os.close(fd)
            log.close()
        os.replace(partial, final)
        journal.unlink()
        table = ChunkTable(tuple(key for _ in entries), tuple(e.offset for e in entries),
                           tuple(e.nbytes for e in entries), tuple(e.crc for e in entries),
                           tuple(e.rank for e in entries), tuple(len(c.slice.ranks) for c in plan.chunks))
        return ParamManifest(p.name, path, dtype_label(p.dtype), p.shape, plan.chunk_shape, table, self.codec)

    def _count_chunk(self) -> None:
        self.chunks_written += 1
        if self._kill_after is not None and self.chunks_written >= self._kill_after:
            os.kill(os.getpid(), 9)

    def _copy_chunk(self, chunk: ChunkSource, out_fd: int, offset: int) -> tuple[int, int]:
        """Stream one chunk from its rank file to ``out_fd`` at ``offset``; return (crc32c, stored bytes)."""
        if self._compressor is not None:
            raw = bytearray(chunk.nbytes)
            self._read(chunk.path, chunk.entry, chunk.byte_start, memoryview(raw))
            self._check_replicas(chunk, crc32c.crc32c(raw))
            # typed view: Blosc shuffles by the element size, as the array's zarr.json declares
            data = self._compressor.encode(np.frombuffer(raw, dtype=f"u{chunk.entry.dtype.itemsize}"))
            os.pwrite(out_fd, data, offset)
            self.progress.add(chunk.nbytes)
            return crc32c.crc32c(data), len(data)
        buf = bytearray(min(_BLOCK, chunk.nbytes))
        crc, done = 0, 0
        while done < chunk.nbytes:
            n = min(len(buf), chunk.nbytes - done)
            view = memoryview(buf)[:n]
            self._read(chunk.path, chunk.entry, chunk.byte_start + done, view)
            crc = crc32c.crc32c(view, crc)
            written = 0
            while written < n:
                written += os.pwrite(out_fd, view[written:], offset + done + written)
            done += n
            self.progress.add(n)
        self._check_replicas(chunk, crc)
        return crc, chunk.nbytes

    @staticmethod
    def _read(path: str, entry: CkptEntry, start: int, view: memoryview) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            read_into(fd, entry.pieces, start, view, path=path, param=entry.name)
        finally:
            os.close(fd)

    def _check_replicas(self, chunk: ChunkSource, crc: int) -> None:
        if not self.verify_replicas:
            return
        sl = chunk.slice
        for rank, entry, path in zip(sl.ranks[1:], sl.entries[1:], sl.paths[1:]):
            other, done = 0, 0
            buf = bytearray(min(_BLOCK, chunk.nbytes))
            while done < chunk.nbytes:
                n = min(len(buf), chunk.nbytes - done)
                view = memoryview(buf)[:n]
                self._read(path, entry, chunk.byte_start + done, view)
                other = crc32c.crc32c(view, other)
                done += n
            if other != crc:
                raise ReplicaMismatchError(
                    f"parameter {entry.name!r}: rank {rank} ({path}) holds different bytes "
                    f"from rank {chunk.rank} ({chunk.path}) for the replicated slice "
                    f"{list(chunk.slice.box.start)}..{list(chunk.slice.box.stop)}, chunk {chunk.index}")


_BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


def _encoder(codec: Mapping[str, Any] | None) -> Any:
    """The numcodecs codec writing ``codec`` (numcodecs' Blosc takes ``shuffle`` as an int, Zarr as a name)."""
    if codec is None:
        return None
    cfg = dict(codec)
    if cfg["id"] == "blosc":
        cfg["shuffle"] = _BLOSC_SHUFFLE[cfg["shuffle"]]
    return numcodecs.get_codec(cfg)


def _read_str(p: SourceParam) -> str:
    value = read_entry(p.slices[0].paths[0], p.slices[0].entry)
    assert isinstance(value, str)
    return value


def _source_header(source: DistributedSource, step: int | None) -> dict[str, Any]:
    return {
        "world_size": source.world_size,
        "files": {str(r): os.path.abspath(p) for r, p in source.rank_files.items()},
        "step": step,
        "strategy": None if source.strategy is None else source.strategy.summary(),
        "created_by": f"ckptstore {__version__}",
    }


def _commit(out: Path, work: Path, manifest: StoreManifest) -> None:
    """Write the root metadata (making the store complete), then drop the work directory."""
    try:
        zb.write_atomic(out / zb.ROOT_METADATA, zb.group_metadata({"ckptstore": manifest.to_json()}))
        dir_fd = os.open(out, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as e:
        raise _write_error(e, out / zb.ROOT_METADATA, None) from e
    shutil.rmtree(work, ignore_errors=True)


__all__ = ["ConvertSummary", "CkptStoreError", "convert", "resolve_source"]
