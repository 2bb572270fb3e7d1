"""Which file holds each rank's checkpoint, and how to index it (``.ckpt`` or ``.safetensors``).

MindSpore saves ``SRC/rank_<i>/<prefix>-<epoch>_<step>.ckpt`` per rank (``.safetensors`` with
``format="safetensors"``; MindFormers names them ``<prefix>_rank_<i>-<epoch>_<step>.safetensors``).
:func:`find_rank_files` picks one file per rank folder (the newest step unless ``step`` or
``prefix`` say otherwise) and refuses a gap in the rank numbers; :func:`scan_rank_file` indexes a
file of either format from its headers alone.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

from ckptstore.formats.ckpt_reader import CkptIndex, open_file, scan_checkpoint
from ckptstore.errors import InvalidOptionError, LayoutMismatchError, MissingRankError
from ckptstore.limits import MAX_WORLD
from ckptstore.formats.ms_safetensors import is_safetensors, scan_safetensors
from ckptstore.io.base import ReadableFile
from ckptstore.io.locations import is_url, open_location

FORMATS = ("ckpt", "safetensors")
_RANK_DIR = re.compile(r"^rank_(\d+)$")
_STEP_SUFFIX = re.compile(r"-(\d+)_(\d+)(?:_breakpoint)?\.(?:ckpt|safetensors)$")


def _check_format(fmt: str | None) -> None:
    if fmt is not None and fmt not in FORMATS:
        raise InvalidOptionError(f"unknown checkpoint format {fmt!r}; choose ckpt or safetensors")


def _step_of(name: str) -> tuple[int, int] | None:
    m = _STEP_SUFFIX.search(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def choose_rank_file(folder: str, names: Sequence[str], *, step: int | None = None, prefix: str | None = None,
                     fmt: str | None = None) -> str:
    """The file name to take among ``names`` (the files of rank folder ``folder``); see :func:`pick_rank_file`."""
    _check_format(fmt)
    exts = (f".{fmt}",) if fmt else (".ckpt", ".safetensors")
    files = sorted(n for n in names if n.endswith(exts))
    if prefix is not None:
        files = [n for n in files if n.startswith(prefix)]
    if step is not None:
        files = [n for n in files if (_step_of(n) or (None, None))[1] == step]
    if not files:
        what = " and ".join(x for x in [f"prefix {prefix!r}" if prefix else "", f"step {step}" if step is not None
                                         else ""] if x) or "any name"
        kinds = " or ".join(exts)
        raise MissingRankError(f"no {kinds} file with {what} in {folder}")
    if len(files) == 1:
        return files[0]
    keyed = [(k, n) for n in files if (k := _step_of(n)) is not None]
    if len(keyed) != len(files):
        raise LayoutMismatchError(f"{folder} holds several checkpoints ({', '.join(files)}) "
                                  "and not all are named <prefix>-<epoch>_<step>.ckpt; pick one with --prefix")
    keyed.sort()
    newest = [n for k, n in keyed if k == keyed[-1][0]]
    if len(newest) > 1:
        suffixes = {os.path.splitext(n)[1] for n in newest}
        how = ("pick the format with --src-format ckpt or --src-format safetensors" if len(suffixes) > 1
               else "pick one with --prefix")
        raise LayoutMismatchError(f"{folder} holds {' and '.join(newest)} for the same step; {how}")
    return newest[0]


def pick_rank_file(rank_dir: Path, *, step: int | None = None, prefix: str | None = None,
                   fmt: str | None = None) -> Path:
    """Choose the checkpoint of one rank folder: the newest by its ``-<epoch>_<step>`` suffix.

    ``prefix`` keeps only files whose name starts with it; ``step`` keeps only files of that
    step; ``fmt`` (``"ckpt"`` or ``"safetensors"``) keeps only that format. Raises
    :class:`~ckptstore.errors.MissingRankError` when nothing matches and
    :class:`~ckptstore.errors.LayoutMismatchError` when the choice is ambiguous (several files
    not named by step, or one step saved in both formats).
    """
    names = [p.name for p in rank_dir.iterdir() if p.is_file()]
    return rank_dir / choose_rank_file(str(rank_dir), names, step=step, prefix=prefix, fmt=fmt)


def _check_ranks(root: str, ranks: Sequence[int]) -> None:
    if not ranks:
        raise MissingRankError(f"{root} has no rank_<i>/ folders (MindSpore saves each rank's checkpoint in "
                               "rank_<i>/); pass the folder that contains them")
    if max(ranks) >= MAX_WORLD:
        raise MissingRankError(f"{root} has a folder rank_{max(ranks)}, beyond the {MAX_WORLD} ranks ckptstore "
                               "supports")
    missing = sorted(set(range(max(ranks) + 1)) - set(ranks))
    if missing:
        shown = ", rank_".join(map(str, missing[:16])) + (", ..." if len(missing) > 16 else "")
        raise MissingRankError(f"{root} has rank folders up to rank_{max(ranks)} but rank_{shown} missing")


def find_rank_files(src: str | os.PathLike[str], *, step: int | None = None, prefix: str | None = None,
                    fmt: str | None = None) -> dict[int, Path | str]:
    """Map each rank to its checkpoint file under ``src/rank_<i>/`` (see :func:`pick_rank_file`).

    ``src`` may be a folder or an object-store URL (``s3://bucket/prefix``; files are then URLs).
    Raises :class:`~ckptstore.errors.MissingRankError` when ``src`` has no rank folders or the
    rank numbers have a gap (a rank folder was not copied).
    """
    if is_url(src):
        source = open_location(src)
        folders = {int(m.group(1)): f for f in source.list()[0] if (m := _RANK_DIR.match(f))}
        _check_ranks(source.url, sorted(folders))
        return {r: f"{source.url}/{folders[r]}/" + choose_rank_file(source.key_url(folders[r]),
                                                                     source.list(folders[r])[1], step=step,
                                                                     prefix=prefix, fmt=fmt)
                for r in sorted(folders)}
    root = Path(src)
    if not root.is_dir():
        raise MissingRankError(f"{root} is not a directory of rank_<i>/ folders")
    ranks = {int(m.group(1)): p for p in root.iterdir() if p.is_dir() and (m := _RANK_DIR.match(p.name))}
    _check_ranks(str(root), sorted(ranks))
    return {r: pick_rank_file(ranks[r], step=step, prefix=prefix, fmt=fmt) for r in sorted(ranks)}


def scan_rank_file(path: str | os.PathLike[str] | ReadableFile, *, verify_crc: bool = False) -> CkptIndex:
    """Index one rank file, ``.ckpt`` or MindSpore ``.safetensors`` (told apart by their first bytes)."""
    f, own = open_file(path)
    try:
        if f.url.endswith(".safetensors") or (not f.url.endswith(".ckpt") and is_safetensors(f)):
            return scan_safetensors(f, verify_crc=verify_crc)
        return scan_checkpoint(f, verify_crc=verify_crc)
    finally:
        if own:
            f.close()
