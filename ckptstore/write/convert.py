"""Convert a MindSpore distributed checkpoint into a store of global tensors.

Flow: pick the rank files and read the strategy -> scan every file's headers, resolve each
parameter's global shape and distinct slices and check a sample of their bytes against the
strategy (:mod:`ckptstore.checkpoint.source`) -> plan chunks aligned to the slices
(:mod:`ckptstore.write.chunk_plan`) -> claim the output folder (:mod:`ckptstore.write.output_folder`) ->
stream each chunk's bytes from the one rank file that supplies it into the parameter's data
file, a bounded block at a time through the load's read plan and executor
(:mod:`ckptstore.checkpoint.rank_bytes`), checksumming on the way (:mod:`ckptstore.write.chunk_writer`)
-> commit.

Safety: one conversion owns an output folder at a time (a lock its holder's death releases).
Each data file is written under ``.partial`` with a journal of finished chunks and published
(fsynced, renamed) when complete; the manifest that makes the store readable is written last,
after every data file is final and the folders that name them are synced. Everything is
written through the output's :class:`~ckptstore.io.sink.ByteSink`. An interrupted run leaves a store that
:func:`ckptstore.open` refuses; running the same conversion again resumes, skipping finished
parameters and chunks, and running it once more on the complete store does nothing. Memory
stays at one copy buffer per worker (plus one chunk when compressing), whatever the size.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ckptstore.checkpoint.selection import select_params
from ckptstore.checkpoint.source import DistributedSource, SourceParam, resolve_source
from ckptstore.checkpoint.strategy import StrategyPaths
from ckptstore.errors import (
    ConversionInProgressError,
    IncompleteStoreError,
    InvalidOptionError,
    LayoutMismatchError,
    check_int,
)
from ckptstore.formats.ckpt_cipher import check_key
from ckptstore.io import is_url, open_location
from ckptstore.io.sink import ByteSink, open_sink
from ckptstore.limits import MAX_TENSOR_BYTES
from ckptstore.progress import Progress
from ckptstore.store.codecs import CODECS
from ckptstore.store.kinds import store_kind, store_kinds
from ckptstore.store.manifest import StoreManifest
from ckptstore.store.work import CommitPlan, read_attempt, short, write_commit_plan
from ckptstore.version import __version__
from ckptstore.write.chunk_plan import ParamPlan, check_even_slices, plan_chunks
from ckptstore.write.chunk_writer import ChunkCopier
from ckptstore.write.commit import commit, commit_if_last, mark_done, my_share, writer_for
from ckptstore.write.output_folder import claim, complete_manifest, drop_idle_work, lock_output, running_parts
from ckptstore.write.parts import SCHEDULER_NO_PART, Part, parse_part
from ckptstore.write.records import whole_entry
from ckptstore.write.summary import ConvertSummary

if TYPE_CHECKING:
    from ckptstore.store.store import Store

DEFAULT_CHUNK_MB = 256
DEFAULT_COMPRESSED_CHUNK_MB = 16


def convert(src: str | os.PathLike[str], out: str | os.PathLike[str], *,
            strategy: StrategyPaths = (), step: int | None = None, prefix: str | None = None,
            include: Sequence[str] = (), exclude: Sequence[str] = (), drop_optimizer: bool = False,
            compress: str | None = None, chunk_mb: int | None = None, workers: int = 4,
            verify_replicas: bool = False, verify_crc: bool = False, overwrite: bool = False,
            quiet: bool = True, format: str | None = None, check_layout: bool = True,
            src_format: str | None = None, on_wait: Callable[[str], None] | None = None,
            part: str | Part | None = None, epoch: int | None = None, dec_key: bytes | None = None,
            dec_mode: str | None = None) -> ConvertSummary:
    """Convert a MindSpore checkpoint into a store of global tensors at ``out``.

    ``format`` is ``"zarr"`` (Zarr v3, the default) or ``"safetensors"`` (whole global tensors in
    ``model-*.safetensors`` files plus ``ckptstore.json``; no compression). ``chunk_mb`` is the
    largest chunk in MiB, like ``--chunk-mb`` (default 256, or 16 when compressed).

    ``src`` is a folder of ``rank_<i>/`` subfolders of ``.ckpt`` or MindSpore ``.safetensors``
    files (the newest checkpoint every rank holds unless ``step``/``epoch``/``prefix``/``src_format``
    pick another; the summary's ``chosen`` says what was taken when rank folders held several)
    with the ``strategy`` file(s) (or a folder of them) that laid it out, or a single checkpoint
    file. ``include``/``exclude`` are name globs; ``drop_optimizer`` removes optimizer state
    (:func:`~ckptstore.checkpoint.selection.optimizer_state`); they apply before the checks of the
    files against the strategy. Parameters the strategy lays out but no rank file holds were not
    saved (MindFormers filters its saves): they are skipped and named in the summary's
    ``unsaved``. ``compress`` is ``None``, ``"zstd"`` or ``"blosc"``. Replicated slices are read
    and written once; ``verify_replicas`` also reads every replica and fails on a mismatch;
    ``check_layout=False`` skips the sampled check that the strategy describes the files. If
    another conversion holds ``out``, this one waits for it (``on_wait`` is told who holds it).
    A complete store of the same conversion is left as is; an unfinished one is resumed;
    anything else in ``out`` needs ``overwrite``. ``src``, ``strategy`` and ``out`` may be
    ``s3://``/``obs://`` URLs. ``part`` (``"I/N"`` or ``"auto"``) converts only this process's
    share; the last part to finish commits the store (:mod:`ckptstore.write.parts`). ``dec_key``
    (bytes) reads rank files saved with ``enc_key``, decrypting them block by block as
    ``load_checkpoint(dec_key=, dec_mode=)`` does (``dec_mode``: ``"AES-GCM"``, ``"AES-CBC"`` or
    ``"SM4-CBC"``; by default the one the files name); the store is plain. Returns a
    :class:`ConvertSummary`.
    """
    decryption = None
    if dec_key is not None:
        check_key(dec_key, dec_mode)
        decryption = (bytes(dec_key), dec_mode)
    elif dec_mode is not None:
        raise InvalidOptionError("dec_mode is given without dec_key (--dec-key-file or CKPTSTORE_DEC_KEY)")
    fmt = "zarr" if format is None else format
    codec, chunk_bytes = _options(fmt, compress, chunk_mb, workers)
    chosen = parse_part(part)
    if chosen is None:
        return _no_part(out)
    return _run(src, out, fmt, part=chosen, codec=codec, chunk_bytes=chunk_bytes, checksum=True, workers=workers,
                verify_replicas=verify_replicas, overwrite=overwrite, quiet=quiet, on_wait=on_wait,
                select={"include": include, "exclude": exclude, "drop_optimizer": drop_optimizer},
                choose={"step": step, "epoch": epoch, "prefix": prefix, "verify_crc": verify_crc,
                        "check_layout": check_layout, "src_format": src_format, "strategy": strategy,
                        "decryption": decryption})


#: The options of :func:`index` that choose or check rank files: a Hugging Face folder has none.
RANK_FILE_OPTIONS = ("strategy", "step", "epoch", "prefix", "src_format", "part", "checksum", "drop_optimizer",
                     "verify_crc")


def rank_file_options_given(values: Mapping[str, Any]) -> list[str]:
    """Which of :data:`RANK_FILE_OPTIONS` ``values`` (option name -> value) sets, in that order;
    ``index(name_map=...)`` and ``ckptstore index --name-map`` refuse them."""
    return [o for o in RANK_FILE_OPTIONS if _given(values.get(o))]


def _given(value: Any) -> bool:
    """Whether an option holds other than its default (``None``, ``False``, no files): by kind,
    not truthiness, so ``step=0`` counts (MindSpore numbers steps from 0)."""
    return not (value is None or value is False or (isinstance(value, (tuple, list)) and not value))


def index(src: str | os.PathLike[str], out: str | os.PathLike[str], *,
          strategy: StrategyPaths = (), step: int | None = None, prefix: str | None = None,
          include: Sequence[str] = (), exclude: Sequence[str] = (), drop_optimizer: bool = False,
          checksum: bool = False, workers: int = 4, verify_crc: bool = False, overwrite: bool = False,
          quiet: bool = True, check_layout: bool = True, src_format: str | None = None,
          on_wait: Callable[[str], None] | None = None, part: str | Part | None = None,
          epoch: int | None = None, name_map: str | os.PathLike[str] | None = None) -> ConvertSummary:
    """Make a store at ``out`` that copies no payload: an index into the original rank files.

    Takes the same source options as :func:`convert`. Each distinct slice of each parameter
    becomes one chunk whose bytes are read, later, from the rank file that holds it (from its
    records, or its safetensors tensor); the store folder holds only ``ckptstore.json``, which
    records each rank file's size and modification time (a file that changes afterwards is
    refused when the store is opened or read). ``checksum=True`` reads every slice once to
    record its CRC-32C, so :func:`ckptstore.verify` can check the bytes later; without it the
    index holds no checksums. Returns a :class:`ConvertSummary` (``stored_bytes`` counts the
    rank-file bytes the index refers to). With ``name_map`` (``"llama"``, ``"qwen2"``, ``"mcore"``,
    ``"llama-concat"`` or a rule file), ``src`` is a Hugging Face model folder instead, its tensors
    named by those rules (:func:`ckptstore.write.hf_index.index_hf`, as ``ckptstore index
    --name-map``); only ``include``, ``exclude``, ``overwrite``, ``on_wait`` and ``quiet`` apply then.
    """
    if name_map is not None:
        given = rank_file_options_given(locals())  # the arguments, as nothing else is bound yet
        if given:
            raise InvalidOptionError(f"{', '.join(given)} do(es) not apply to a Hugging Face folder (name_map)")
        from ckptstore.write.hf_index import index_hf

        return index_hf(src, out, name_map=name_map, include=include, exclude=exclude, overwrite=overwrite,
                        on_wait=on_wait, quiet=quiet)
    _options("index", None, None, workers, converting=False)
    chosen = parse_part(part)
    if chosen is None:
        return _no_part(out)
    return _run(src, out, "index", part=chosen, codec=None, chunk_bytes=MAX_TENSOR_BYTES, checksum=checksum,
                workers=workers, verify_replicas=False, overwrite=overwrite, quiet=quiet, on_wait=on_wait,
                select={"include": include, "exclude": exclude, "drop_optimizer": drop_optimizer},
                choose={"step": step, "epoch": epoch, "prefix": prefix, "verify_crc": verify_crc,
                        "check_layout": check_layout, "src_format": src_format, "strategy": strategy})


def _run(src: str | os.PathLike[str], out: str | os.PathLike[str], fmt: str, *, part: Part, codec: dict | None,
         chunk_bytes: int, checksum: bool, workers: int, verify_replicas: bool, overwrite: bool, quiet: bool,
         on_wait: Callable[[str], None] | None, select: Mapping[str, Any], choose: Mapping[str, Any]) -> ConvertSummary:
    """Source -> plans -> claim the output -> write this part's share (or skip, if complete) -> commit -> summary."""
    started = time.monotonic()
    sink = open_sink(out)
    source = resolve_source(src, **choose, keep=lambda names: _selected(names, select))
    try:
        plans = [_plan(p, chunk_bytes) for p in source.params.values()]
        fingerprint = _fingerprint(source, plans, codec, fmt, checksum)
        hold = claim(sink, fingerprint, overwrite=overwrite, on_wait=on_wait, part=part,
                     writer="index" if fmt == "index" else "convert", sources=[*map(str, source.rank_files.values()),
                              *(source.strategy.sources if source.strategy else ())])
        try:
            if hold.complete:
                return replace(_summary(sink, plans, None, started, part, source.unsaved, already_complete=True),
                               chosen=source.chosen)
            header = {**_source_header(source, choose.get("step")), "fingerprint": fingerprint}
            # an index without checksums reads no slice: a byte rate would be meaningless
            progress = Progress(sum(p.nbytes for p in plans), len(plans), desc=fmt if fmt == "index" else "convert",
                                quiet=quiet, count_bytes=fmt != "index" or checksum)
            copier = ChunkCopier(codec, verify_replicas, progress, source.files)
            writer = writer_for(fmt, hold, copier, plans, checksum)
            planned = tuple(p.param.name for p in plans)
            write_commit_plan(sink, CommitPlan(fmt, planned, header, writer.extra(), part.count))
            mine = my_share(writer, plans, part)
            progress.resize(sum(p.nbytes for p in mine), len(mine))
            with progress:
                writer.prepare(mine)
                order = sorted(mine, key=lambda p: -p.nbytes)  # big first: workers finish together
                with ThreadPoolExecutor(workers) as pool:
                    try:
                        names = [p.param.name for p in order]
                        done = dict(zip(names, pool.map(writer.write_param, order), strict=True))
                    except BaseException:  # Ctrl-C or a failed parameter: stop now, not after the queue
                        pool.shutdown(wait=True, cancel_futures=True)
                        raise
                writer.finish_part(mine, done)
            mark_done(sink, part, fingerprint, header, {n: whole_entry(m) for n, m in done.items()})
            manifest = commit_if_last(hold, fingerprint, done, on_wait=on_wait)
            return replace(_summary(sink, mine, copier, started, part, source.unsaved, manifest=manifest),
                           chosen=source.chosen)
        finally:
            hold.release()
    finally:
        source.close()


def _selected(names: list[str], select: Mapping[str, Any]) -> list[str]:
    """The parameters ``select`` keeps; include globs that match none of ``names`` are refused
    (a glob is matched against whole names, so ``--include layer0`` would make an empty store)."""
    kept = select_params(names, **select)
    include = select.get("include") or ()
    if include and not select_params(names, include=include):
        unique = list(dict.fromkeys(names))
        shown = ", ".join(unique[:3]) + (", ..." if len(unique) > 3 else "")
        raise InvalidOptionError(f"--include {' '.join(repr(g) for g in include)} matches none of the checkpoint's "
                                 f"{len(unique)} parameters ({shown}); a glob matches whole names: 'layer0.*', "
                                 "not 'layer0'")
    return kept


def commit_store(out: str | os.PathLike[str] | Store, *, on_wait: Callable[[str], None] | None = None) -> bool:
    """Commit a conversion done in parts whose last part did not (``ckptstore commit``;
    ``ckptstore.commit`` in the API), or a saved training step whose ranks have all finished
    (:mod:`ckptstore.write.save`).

    ``out`` is the store's path or ``s3://``/``obs://`` URL (a :class:`~ckptstore.store.store.Store`
    is complete already). Returns ``False`` when the store was already complete. Raises
    :class:`~ckptstore.errors.ConversionInProgressError` naming the parts (ranks) still running
    (the last of them commits), and :class:`~ckptstore.errors.IncompleteStoreError` naming the
    parts that have not finished and what to run.
    """
    from ckptstore.store.store import Store

    if isinstance(out, Store):
        return False  # only a complete store opens
    sink = open_sink(out)
    lock = lock_output(sink, on_wait)
    try:
        if complete_manifest(sink) is not None:
            drop_idle_work(sink)  # the lock file this process waited on
            return False
        running = running_parts(sink)
        if running:
            raise ConversionInProgressError(_still_running(sink, running))
        try:
            commit(sink)
        except IncompleteStoreError:
            # a folder with nothing to commit (a checkpoint folder, say) must not keep the lock
            # file taken here: its work folder would make it look like an interrupted store
            drop_idle_work(sink)
            raise
        return True
    finally:
        lock.release()


def _still_running(sink: ByteSink, running: list[int]) -> str:
    """Why ``ckptstore commit`` refuses while parts run: which, and that the last commits itself."""
    doc = read_attempt(sink.source) or {}
    noun = "rank" if doc.get("writer") == "save_rank" else "part"
    count = f" of {doc['parts']}" if "parts" in doc else ""
    return (f"{sink.url} is still being written: {noun}(s) {short(running)}{count} still running (their lock is "
            f"held); wait for {'it' if len(running) == 1 else 'them'}: the last {noun} to finish commits")


def _options(fmt: str, compress: str | None, chunk_mb: int | None, workers: int, *,
             converting: bool = True) -> tuple[dict | None, int]:
    kind = store_kind(fmt) if isinstance(fmt, str) else None
    if kind is None or (converting and not kind.convert):
        choices = ", ".join(k.name for k in store_kinds(convert=True))
        others = "".join(f"; {k.name} is not made by convert: it is {k.help}" for k in store_kinds(convert=False))
        raise InvalidOptionError(f"unknown store format {fmt!r}; choose one of: {choices}{others}")
    codec = _codec(compress)
    if codec is not None and not kind.compressible:
        compressible = " or ".join(k.name for k in store_kinds(convert=True) if k.compressible)
        raise InvalidOptionError(f"{fmt} stores are not compressed; use the {compressible} format for --compress")
    check_int(workers, "workers")
    check_int(chunk_mb, "chunk_mb", none_ok=True)
    return codec, (chunk_mb or (DEFAULT_COMPRESSED_CHUNK_MB if codec else DEFAULT_CHUNK_MB)) << 20


def _summary(sink: ByteSink, plans: Sequence[ParamPlan], copier: ChunkCopier | None, started: float,
             part: Part, unsaved: Sequence[str], *, manifest: StoreManifest | None = None,
             already_complete: bool = False) -> ConvertSummary:
    chunks = sum(len(p.chunks) for p in plans)
    return ConvertSummary(
        store=sink.url, params=len(plans), chunks=chunks,
        chunks_written=copier.chunks_written if copier else 0,
        chunks_resumed=copier.chunks_resumed if copier else chunks,
        params_resumed=copier.params_resumed if copier else len(plans),
        source_bytes=sum(sum(s.entry.nbytes * len(s.ranks) for s in p.param.slices) for p in plans),
        # a string value has no chunks (its text is in the manifest) but is still counted once
        unique_bytes=sum(p.param.slices[0].entry.nbytes if p.param.is_str else p.nbytes for p in plans),
        stored_bytes=(sum(manifest.params[p.param.name].stored_bytes for p in plans) if manifest
                      else sum(p.nbytes for p in plans)),
        seconds=round(time.monotonic() - started, 3), already_complete=already_complete,
        part=str(part), committed=already_complete or manifest is not None, unsaved=tuple(unsaved),
        store_params=len(manifest.params) if manifest else (len(plans) if already_complete else None))


def _no_part(out: str | os.PathLike[str]) -> ConvertSummary:
    """The summary of a process that takes no part (msrun's scheduler): nothing read or written."""
    return ConvertSummary(store=str(out), params=0, chunks=0, chunks_written=0, chunks_resumed=0, params_resumed=0,
                          source_bytes=0, unique_bytes=0, stored_bytes=0, seconds=0.0, part="none", committed=False,
                          skipped=SCHEDULER_NO_PART)


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
    return plan_chunks(param, max_chunk_bytes=chunk_bytes)


def _fingerprint(source: DistributedSource, plans: Sequence[ParamPlan], codec: Mapping[str, Any] | None,
                 fmt: str, checksum: bool = True) -> str:
    """What identifies this conversion, so a rerun resumes (or skips) only the same one.

    Each rank file counts with its size, modification time and *version* (inode and status-change
    time of a local file; an object's ETag): an edit in place changes the status-change time even
    when it restores the modification time, so a rerun never mixes bytes of two versions of a
    file. The device number does not count: a shared filesystem (NFS) has another one on each
    host that mounts it, and parts of one conversion run on several hosts. It does not depend on
    the number of parts: every part computes the same one, and the store is the same, byte for
    byte, however it was split.
    The strategy counts with its parsed layouts (in name order, so the order of its files does
    not matter): a strategy that gives the same files' slices to other ranks makes other global
    tensors, so its part must not join this conversion's store.
    """
    files = {r: _identity(str(p)) for r, p in source.rank_files.items()}
    params = [(p.param.name, p.param.dtype.str if not p.param.is_str else "str", p.param.shape, p.chunk_shape)
              for p in plans]
    strategy = None if source.strategy is None else json.dumps(source.strategy.summary(), sort_keys=True)
    blob = json.dumps({"files": files, "params": params, "codec": codec, "format": fmt, "version": __version__,
                       "integrated_save": source.integrated_save, "checksum": checksum, "strategy": strategy},
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _identity(path: str) -> tuple[Any, ...]:
    if is_url(path):
        source = open_location(path.rsplit("/", 1)[0])
        st = source.stat(path.rsplit("/", 1)[1])
        return (path, st.size, st.mtime_ns, st.version) if st else (path,)
    local = os.stat(path)
    return (os.path.abspath(path), local.st_size, local.st_mtime_ns, local.st_ino, local.st_ctime_ns)


def _source_header(source: DistributedSource, step: int | None) -> dict[str, Any]:
    return {
        "world_size": source.world_size,
        "files": {str(r): str(p) if is_url(str(p)) else os.path.abspath(p) for r, p in source.rank_files.items()},
        "step": step,
        "strategy": None if source.strategy is None else source.strategy.summary(),
        "integrated_save": source.integrated_save,
        "unsaved": list(source.unsaved),
        "created_by": f"ckptstore {__version__}",
    }


__all__ = ["ConvertSummary", "commit_store", "convert", "index"]
