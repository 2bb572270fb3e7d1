"""``ckptstore export``: per-rank ``.ckpt`` files for a target layout, like ``transform_checkpoints``.

For each target rank, the rank's parameters are read from the store one at a time (only the
bytes of its slice) and appended to ``OUT/rank_<j>/checkpoint_<j>.ckpt`` (or ``.safetensors``),
which MindSpore's ``load_checkpoint`` reads. Memory stays at one parameter slice; MindSpore is
not needed. Files are written through a :class:`~ckptstore.io.local_sink.LocalSink` (a planted
link is never followed) and appear whole; an output folder holding a file the store reads (an
index's rank files) is refused.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ckptstore.errors import InvalidOptionError, StoreExistsError, StrategyError, UnsupportedLocationError
from ckptstore.formats.ckpt_writer import CheckpointWriter
from ckptstore.formats.safetensors_writer import SafetensorsWriter
from ckptstore.io.atomic_file import SinkKey
from ckptstore.io.local_sink import LocalSink
from ckptstore.io.locations import is_url
from ckptstore.io.urls import redact
from ckptstore.progress import Progress
from ckptstore.read.export_folder import claim_export_folder, commit_export_folder
from ckptstore.read.loader import (
    RankView,
    StrategyLike,
    check_rank,
    float_dtype,
    include_globs,
    rank_view,
    resolve_target,
)
from ckptstore.store.store import Store, StoreLike, store_argument


@dataclass(frozen=True)
class ExportSummary:
    """Files written by :func:`export`, bytes read from the store, and the training step exported
    (:attr:`Store.step <ckptstore.store.store.Store.step>`: ``None`` for a conversion that chose none)."""

    files: tuple[str, ...]
    bytes_read: int
    step: int | None = None


def export(store: StoreLike, out: str | os.PathLike[str], *, strategy: StrategyLike = None,
           ranks: Iterable[int] | None = None, include: str | Sequence[str] | None = None,
           dtype: np.dtype | None = None, format: str | None = None, crc: bool = False,
           prefix: str = "checkpoint_", allow_whole: bool = False, quiet: bool = True,
           names: str | Sequence[str] | None = None, overwrite: bool = False) -> ExportSummary:
    """Write ``out/rank_<j>/<prefix><j>.<format>`` for each rank ``j`` of ``strategy`` (all ranks when
    ``ranks`` is ``None``; the store's source layout when ``strategy`` is ``None``).

    ``store`` is a path, an ``s3://``/``obs://`` URL or a :class:`~ckptstore.store.store.Store`;
    ``out`` is a local folder (a URL is refused). ``format`` is ``"ckpt"`` (the default: MindSpore
    protobuf, byte-compatible with ``save_checkpoint``; ``crc`` adds its ``crc_num`` trailer) or
    ``"safetensors"``. ``include`` globs choose the parameters, as ``--include`` (``names=`` is
    the same option). ``dtype`` converts while reading. A given ``strategy`` that lays out fewer
    than half of the store's parameters is refused as another model's unless ``allow_whole``
    (see :func:`~ckptstore.read.loader.check_target_describes`). ``quiet=False`` shows progress
    (a bar on a terminal, log lines otherwise), as ``ckptstore export`` does. A folder holding
    files is refused unless ``overwrite``, which replaces only what an earlier export wrote
    (:mod:`ckptstore.read.export_folder`).
    """
    include = include_globs(include, names)
    with store_argument(store) as st:
        return _export(st, out, strategy, ranks, include, dtype, format or "ckpt", crc, prefix, allow_whole, quiet,
                       overwrite)


def _export(store: Store, out: str | os.PathLike[str], strategy: StrategyLike, ranks: Iterable[int] | None,
            names: Sequence[str] | None, dtype: np.dtype | None, fmt: str, crc: bool, prefix: str,
            allow_whole: bool, quiet: bool, overwrite: bool = False) -> ExportSummary:
    if fmt not in ("ckpt", "safetensors"):
        raise InvalidOptionError(f"unknown export format {fmt!r}; choose ckpt or safetensors")
    if crc and fmt != "ckpt":  # else ignored: the user would believe the files carry a checksum
        raise InvalidOptionError("crc (--crc) appends MindSpore's crc_num trailer to .ckpt files; safetensors files "
                                 "have none: leave it out, or export with format='ckpt'")
    target = resolve_target(store, strategy)
    world = 1 if target is None else target.world_size
    chosen = list(range(world)) if ranks is None else _chosen_ranks(ranks, world)
    float_dtype(dtype)  # refuse an integer dtype before any file is written
    if is_url(out):  # else LocalSink would make a local folder named "s3:" (as 'ckptstore export' refuses it)
        raise UnsupportedLocationError(f"export writes local files: {redact(str(out))} is a URL; give a local "
                                       "folder (and copy the files to object storage afterwards)")
    sink = LocalSink(out)
    _refuse_store_files(store, sink)
    views = [rank_view(store, target, j, names=names, dtype=dtype, allow_whole=allow_whole or strategy is None)
             for j in chosen]
    keys = [f"rank_{j}/{prefix}{j}.{fmt}" for j in chosen]
    # each rank loads its own file: every old one goes before a new one appears, so no job mixes two exports
    claim_export_folder(sink, keys, overwrite=overwrite)
    progress = Progress(sum(v.nbytes for v in views), sum(len(v) for v in views), desc="export", quiet=quiet)
    written, nbytes = [], 0
    with progress:
        for key, view in zip(keys, views, strict=True):
            path = SinkKey(sink, key)
            if fmt == "ckpt":
                with CheckpointWriter(path, crc=crc) as writer:
                    for name in view.names():
                        writer.add(name, _counted(view.read(name), progress))
            else:
                _write_safetensors(view, path, progress)
            nbytes += view.plan.nbytes
            written.append(sink.key_url(path.key))
    commit_export_folder(sink, keys)
    return ExportSummary(tuple(written), nbytes, store.step)


def _counted(value: np.ndarray | str, progress: Progress) -> np.ndarray | str:
    """``value``, counted as one parameter (and its bytes) done."""
    progress.add(0 if isinstance(value, str) else value.nbytes, 1)
    return value


def _chosen_ranks(ranks: Iterable[int], world: int) -> list[int]:
    """``ranks`` as a list, each checked against the ``world`` ranks of the target as it comes.

    Checked one by one while iterating, so a huge range (``range(10**11)``) fails at its first rank
    outside the layout instead of being listed first (a MemoryError, or seconds and gigabytes).
    """
    chosen = []
    for r in ranks:
        r = check_rank(r)
        if not 0 <= r < world:
            raise StrategyError(f"rank {r} is outside the target layout's {world} ranks (0..{world - 1})")
        chosen.append(r)
    if not chosen:
        raise InvalidOptionError("no ranks to export: pass at least one rank of the target layout")
    return chosen


def _refuse_store_files(store: Store, sink: LocalSink) -> None:
    """Exporting over a file the store reads (an index's rank files, the store itself) would
    destroy the checkpoint being exported: refuse an output folder that holds any of them."""
    data = {f for p in store.manifest.params.values() for f in p.chunks.files}
    for where in (store.location.url, *(store.data.key_url(f) for f in sorted(data))):
        if sink.contains(where):
            raise StoreExistsError(f"export folder {sink.root} holds {where}, which the store {store.location.url} "
                                   "reads; choose an output folder outside the store and its rank files")


def _write_safetensors(view: RankView, path: SinkKey, progress: Progress) -> None:
    texts = {n: str(_counted(view.read(n), progress)) for n in view.names() if view.store.info(n).is_str}
    plans = {n: view.plan_for(n) for n in view.names() if n not in texts}
    declared = [(n, view.dtype_of(n), p.shape) for n, p in plans.items()]
    with SafetensorsWriter(path, declared, metadata=texts) as writer:
        for name in plans:
            writer.add(name, _counted(view.read(name), progress))  # type: ignore[arg-type]  # texts are skipped
