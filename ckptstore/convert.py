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

from .atomic_file import write_atomic
from .backends import MANIFEST, ROOT_METADATA, WORK_DIR, read_manifest
from .backends import safetensors_backend as sb
from .backends import zarr_backend as zb
from .codecs import CODECS
from .chunk_plan import ParamPlan, check_even_slices, plan_param, select_params
from .errors import CkptStoreError, InvalidOptionError, LayoutMismatchError, StoreCorruptError, StoreExistsError, StoreWriteError
from .manifest import ParamManifest, StoreManifest
from .progress import Progress
from .source import DistributedSource, SourceParam, resolve_source
from .sources import LocalSource
from .store_writer import ChunkCopier, load_done, str_manifest, write_dense_param, write_zarr_param
from .strategy import Strategy, load_strategy
from .version import __version__

DEFAULT_CHUNK_MB = 256
DEFAULT_COMPRESSED_CHUNK_MB = 16


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


def convert(src: str | os.PathLike[str], out: str | os.PathLike[str], *,
            strategy: Sequence[str | os.PathLike[str]] = (), step: int | None = None, prefix: str | None = None,
            include: Sequence[str] = (), exclude: Sequence[str] = (), drop_optimizer: bool = False,
            compress: str | None = None, max_chunk_mb: int | None = None, workers: int = 4,
            verify_replicas: bool = False, verify_crc: bool = False, overwrite: bool = False,
            quiet: bool = True, fmt: str = "zarr") -> ConvertSummary:
    """Convert a MindSpore checkpoint into a store of global tensors at ``out``.

    ``fmt`` is ``"zarr"`` (Zarr v3, the default) or ``"safetensors"`` (whole global tensors in
    ``model-*.safetensors`` files plus ``ckptstore.json``; no compression).

    ``src`` is a folder of ``rank_<i>/`` subfolders (each rank's newest ``.ckpt`` unless
    ``step``/``prefix`` pick another) with the ``strategy`` file(s) that laid it out, or a single
    ``.ckpt``. ``include``/``exclude`` are name globs; ``drop_optimizer`` removes optimizer state
    (:data:`~ckptstore.chunk_plan.OPTIMIZER_PATTERNS`). ``compress`` is ``None``, ``"zstd"`` or
    ``"blosc"``. Replicated slices are read and written once; ``verify_replicas`` also reads
    every replica and fails on a mismatch. An existing complete store needs ``overwrite``; an
    unfinished one from the same command is resumed. Returns a :class:`ConvertSummary`.
    """
    started = time.monotonic()
    if fmt not in ("zarr", "safetensors"):
        raise InvalidOptionError(f"unknown store format {fmt!r}; choose zarr or safetensors")
    codec = _codec(compress)
    if codec is not None and fmt == "safetensors":
        raise InvalidOptionError("safetensors stores are not compressed; use the zarr format for --compress")
    chunk_bytes = (max_chunk_mb or (DEFAULT_COMPRESSED_CHUNK_MB if codec else DEFAULT_CHUNK_MB)) << 20
    source = resolve_source(src, strategy, step=step, prefix=prefix, verify_crc=verify_crc)
    names = select_params(source.params, include=include, exclude=exclude, drop_optimizer=drop_optimizer)
    plans = [_plan(source.params[n], chunk_bytes) for n in names]
    out = Path(out)
    fingerprint = _fingerprint(source, plans, codec, fmt)
    work = _prepare_output(out, fingerprint, overwrite=overwrite)
    progress = Progress(sum(p.nbytes for p in plans), len(plans), desc="convert", quiet=quiet)
    copier = ChunkCopier(codec, verify_replicas, progress)
    writer = _ZarrWriter(out, work, copier) if fmt == "zarr" else _SafetensorsWriter(out, work, copier, plans)
    try:
        order = sorted(plans, key=lambda p: -p.nbytes)  # big first: workers finish together
        with ThreadPoolExecutor(max(1, workers)) as pool:
            done = dict(zip((p.param.name for p in order), pool.map(writer.write_param, order)))
    finally:
        progress.close()
    manifest = StoreManifest({p.param.name: done[p.param.name] for p in plans}, _source_header(source, step),
                             backend=fmt)
    writer.commit(manifest)
    return ConvertSummary(
        store=str(out), params=len(plans), chunks=sum(len(p.chunks) for p in plans),
        chunks_written=copier.chunks_written, chunks_resumed=copier.chunks_resumed,
        params_resumed=copier.params_resumed,
        source_bytes=sum(sum(s.entry.nbytes * len(s.ranks) for s in p.param.slices) for p in plans),
        # a string value has no chunks (its text is in the manifest) but is still counted once
        unique_bytes=sum(p.param.slices[0].entry.nbytes if p.param.is_str else p.nbytes for p in plans),
        stored_bytes=sum(m.stored_bytes for m in manifest.params.values()),
        seconds=round(time.monotonic() - started, 3))


def _codec(compress: str | None) -> dict[str, Any] | None:
    if compress in (None, "", "none"):
        return None
    if compress not in CODECS:
        raise InvalidOptionError(f"unknown compression {compress!r}; choose one of: none, {', '.join(CODECS)}")
    return dict(CODECS[compress])


def _plan(param: SourceParam, chunk_bytes: int) -> ParamPlan:
    reason = check_even_slices(param)
    if reason:
        raise LayoutMismatchError(f"parameter {param.name!r} of shape {list(param.shape)} cannot be stored: "
                                  f"{reason}")
    return plan_param(param, max_chunk_bytes=chunk_bytes)


def _fingerprint(source: DistributedSource, plans: Sequence[ParamPlan], codec: Mapping[str, Any] | None,
                 fmt: str) -> str:
    """What identifies this conversion, so a rerun resumes only the same one."""
    files = {r: (os.path.abspath(p), os.stat(p).st_size, os.stat(p).st_mtime_ns) for r, p in source.rank_files.items()}
    params = [(p.param.name, p.param.dtype.str if not p.param.is_str else "str", p.param.shape, p.chunk_shape)
              for p in plans]
    blob = json.dumps({"files": files, "params": params, "codec": codec, "format": fmt, "version": __version__},
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _prepare_output(out: Path, fingerprint: str, *, overwrite: bool) -> Path:
    """Make ``out`` ready: new, resumable (same fingerprint), or cleared with ``overwrite``."""
    if out.exists() and not out.is_dir():
        raise StoreExistsError(f"output path {out} is a file, not a folder; choose another --out")
    work = out / WORK_DIR
    if out.is_dir() and any(out.iterdir()):
        complete = (out / ROOT_METADATA).exists() or (out / MANIFEST).exists()
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
        write_atomic(work / "fingerprint", fingerprint.encode())
    except OSError as e:
        raise _write_error(e, out, None) from e
    return work


def _has_manifest(out: Path) -> bool:
    """Whether ``out`` holds a ckptstore manifest (an unreadable one is someone else's file)."""
    try:
        return isinstance(read_manifest(LocalSource(out)), dict)
    except (StoreCorruptError, CkptStoreError):  # not JSON, not UTF-8, not an object
        return False


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


class _StoreWriter:
    """Writes parameters (shared by the worker threads), remembering finished ones for a rerun."""

    def __init__(self, out: Path, work: Path, copier: ChunkCopier) -> None:
        self.out, self.work, self.copier = out, work, copier

    def write_param(self, plan: ParamPlan) -> ParamManifest:
        name = plan.param.name
        done = self.work / "done" / f"{zb.array_path(name)}.json"
        finished = load_done(done, name)
        if finished is not None:
            self.copier.count(resumed=len(plan.chunks), params_resumed=1)
            self.copier.progress.add(plan.nbytes, 1)
            return finished
        try:
            manifest = str_manifest(plan, zb.array_path(name)) if plan.param.is_str else self._write(plan)
            write_atomic(done, json.dumps(manifest.to_json()).encode())
        except OSError as e:
            raise _write_error(e, self.out / zb.array_path(name), name) from e
        self.copier.progress.add(0, 1)
        return manifest

    def _write(self, plan: ParamPlan) -> ParamManifest:
        raise NotImplementedError

    def commit(self, manifest: StoreManifest) -> None:
        """Make the store complete: its manifest last, then drop the work directory."""
        raise NotImplementedError


class _ZarrWriter(_StoreWriter):
    def _write(self, plan: ParamPlan) -> ParamManifest:
        return write_zarr_param(plan, self.out, zb.array_path(plan.param.name), self.copier)

    def commit(self, manifest: StoreManifest) -> None:
        _commit(self.out, self.work, self.out / ROOT_METADATA,
                zb.group_metadata({"ckptstore": manifest.to_json()}))


class _SafetensorsWriter(_StoreWriter):
    def __init__(self, out: Path, work: Path, copier: ChunkCopier, plans: Sequence[ParamPlan]) -> None:
        super().__init__(out, work, copier)
        tensors = [(p.param.name, p.param.dtype, p.param.shape) for p in plans if not p.param.is_str]
        self.files = sb.plan_files(tensors)
        self.slots = {s.name: s for f in self.files for s in f.slots}
        try:
            for f in self.files:
                sb.create_file(self._partial(f.name), f)
        except OSError as e:
            raise _write_error(e, out, None) from e

    def _partial(self, file: str) -> Path:
        return self.out / f"{file}.partial"

    def _write(self, plan: ParamPlan) -> ParamManifest:
        slot = self.slots[plan.param.name]
        return write_dense_param(plan, self.out, slot, self._partial(slot.file), self.work, self.copier)

    def commit(self, manifest: StoreManifest) -> None:
        try:
            for f in self.files:
                sb.sync_file(self._partial(f.name))
                os.replace(self._partial(f.name), self.out / f.name)
        except OSError as e:
            raise _write_error(e, self.out, None) from e
        _commit(self.out, self.work, self.out / MANIFEST, manifest.dumps().encode())


def _source_header(source: DistributedSource, step: int | None) -> dict[str, Any]:
    return {
        "world_size": source.world_size,
        "files": {str(r): os.path.abspath(p) for r, p in source.rank_files.items()},
        "step": step,
        "strategy": None if source.strategy is None else source.strategy.summary(),
        "created_by": f"ckptstore {__version__}",
    }


def _commit(out: Path, work: Path, path: Path, data: bytes) -> None:
    """Write the store's manifest file (making it complete), then drop the work directory."""
    try:
        write_atomic(path, data)
        dir_fd = os.open(out, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as e:
        raise _write_error(e, path, None) from e
    shutil.rmtree(work, ignore_errors=True)


__all__ = ["ConvertSummary", "convert"]
