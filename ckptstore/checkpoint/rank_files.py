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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ckptstore.errors import InvalidOptionError, LayoutMismatchError, MissingRankError, UnsafePathError, check_int
from ckptstore.formats.ckpt_cipher import DecryptedFile, Decryption
from ckptstore.formats.ckpt_reader import CkptIndex, open_file, scan_checkpoint
from ckptstore.formats.ms_safetensors import is_safetensors, scan_safetensors
from ckptstore.io.base import ReadableFile
from ckptstore.io.locations import is_url, open_location
from ckptstore.limits import MAX_WORLD
from ckptstore.progress import rank_list

FORMATS = ("ckpt", "safetensors")
_RANK_DIR = re.compile(r"^rank_(\d+)$")
_STEP_SUFFIX = re.compile(r"-(\d+)_(\d+)(?:_breakpoint)?\.(?:ckpt|safetensors)$")


def _check_format(fmt: str | None) -> None:
    if fmt is not None and fmt not in FORMATS:
        raise InvalidOptionError(f"unknown checkpoint format {fmt!r}; choose ckpt or safetensors")


def _step_of(name: str) -> tuple[int, int] | None:
    m = _STEP_SUFFIX.search(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _stem(name: str) -> str:
    """What precedes ``-<epoch>_<step>``: the prefix a run saved with."""
    m = _STEP_SUFFIX.search(name)
    return name[:m.start()] if m else name


def _rerun_of(stem: str, stems: Iterable[str]) -> tuple[str, int]:
    """``(first run's prefix, run number)``: ModelCheckpoint names a rerun in the same folder
    ``<prefix>_<n>`` (``_chg_ckpt_file_name_if_same_exist``: n = 1, 2, ... after the first run's
    ``<prefix>``, always of the first run's prefix); the first run is run 0."""
    base, sep, n = stem.rpartition("_")
    if sep and n.isdigit() and base in stems:
        return base, int(n)
    return stem, 0


@dataclass(frozen=True)
class RankFolderFiles:
    """The checkpoint files of one rank folder that the options allow, and their modification times
    (``None`` in object storage, whose listing carries none)."""

    folder: str
    names: tuple[str, ...]
    mtimes: Mapping[str, float] | None = None
    #: what a file's name is appended to (with "/") to make its URL; ``None`` for a local folder
    url: str | None = None


@dataclass(frozen=True)
class RankFileChoice:
    """Each rank's checkpoint file and, when a choice was made among several, what was taken and why."""

    files: dict[int, Path | str]
    #: one line for the summary when rank folders held more than one checkpoint (``None`` otherwise)
    note: str | None = None


def _filtered(folder: str, names: Sequence[str], *, step: int | None, epoch: int | None, prefix: str | None,
              fmt: str | None) -> list[str]:
    _check_format(fmt)
    for what, v in (("step", step), ("epoch", epoch)):
        # MindSpore names files -<epoch>_<step> with neither below 0: a negative one names no file
        check_int(v, what, least=0, none_ok=True)
    exts = (f".{fmt}",) if fmt else (".ckpt", ".safetensors")
    files = sorted(n for n in names if n.endswith(exts))
    if prefix is not None:
        files = [n for n in files if n.startswith(prefix)]
    if step is not None:
        files = [n for n in files if (_step_of(n) or (None, None))[1] == step]
    if epoch is not None:
        files = [n for n in files if (_step_of(n) or (None, None))[0] == epoch]
    if not files:
        what = " and ".join(x for x in [f"prefix {prefix!r}" if prefix else "",
                                         f"epoch {epoch}" if epoch is not None else "",
                                         f"step {step}" if step is not None else ""] if x) or "any name"
        kinds = " or ".join(exts)
        raise MissingRankError(f"no {kinds} file with {what} in {folder}")
    if len(files) > 1 and any(_step_of(n) is None for n in files):
        raise LayoutMismatchError(f"{folder} holds several checkpoints ({', '.join(files)}) "
                                  "and not all are named <prefix>-<epoch>_<step>.ckpt; pick one with --prefix")
    return files


def _newest_run(folder: RankFolderFiles, files: list[str]) -> tuple[list[str], tuple[str, int] | None]:
    """The files of the newest run when the folder holds reruns of one job (``net-1_50.ckpt`` beside
    ``net_1-1_50.ckpt``), and which run that is; the newest is the one with the newest file, as
    MindFormers' by-rank transform picks (by modification time), else the highest rerun number."""
    stems = {_stem(n) for n in files}
    runs: dict[tuple[str, int], list[str]] = {}
    for n in files:
        runs.setdefault(_rerun_of(_stem(n), stems), []).append(n)
    families = {base for base, _ in runs}
    if len(runs) == len(families):
        return files, None  # no reruns

    def newest(run: tuple[str, int]) -> tuple[float, int]:
        mtime = max(folder.mtimes[n] for n in runs[run]) if folder.mtimes is not None else 0.0
        return mtime, run[1]

    kept: list[str] = []
    chosen = None
    for base in sorted(families):
        mine = [r for r in runs if r[0] == base]
        best = max(mine, key=newest)
        kept += runs[best]
        if len(mine) > 1:
            chosen = best
    return sorted(kept), chosen


def _pick_one(folder: str, files: Sequence[str]) -> str:
    if len(files) == 1:
        return files[0]
    keyed = sorted((_step_of(n), n) for n in files)
    newest = [n for k, n in keyed if k == keyed[-1][0]]
    if len(newest) > 1:
        suffixes = {os.path.splitext(n)[1] for n in newest}
        how = ("pick the format with --src-format ckpt or --src-format safetensors" if len(suffixes) > 1
               else "pick one with --prefix")
        raise LayoutMismatchError(f"{folder} holds {' and '.join(newest)} for the same step; {how}")
    return newest[0]


def choose_rank_file(folder: str, names: Sequence[str], *, step: int | None = None, prefix: str | None = None,
                     fmt: str | None = None, epoch: int | None = None) -> str:
    """The file name to take among ``names`` (the files of rank folder ``folder``); see :func:`pick_rank_file`."""
    files = _filtered(folder, names, step=step, epoch=epoch, prefix=prefix, fmt=fmt)
    return _pick_one(folder, _newest_run(RankFolderFiles(folder, tuple(names)), files)[0])


def pick_rank_file(rank_dir: Path, *, step: int | None = None, prefix: str | None = None,
                   fmt: str | None = None, epoch: int | None = None) -> Path:
    """Choose the checkpoint of one rank folder: the newest by its ``-<epoch>_<step>`` suffix.

    ``prefix`` keeps only files whose name starts with it; ``step``/``epoch`` keep only files of
    that step/epoch; ``fmt`` (``"ckpt"`` or ``"safetensors"``) keeps only that format. Of a job
    rerun in the same folder (``net_1-1_50.ckpt`` beside ``net-1_100.ckpt``) the newest run is
    taken. Raises :class:`~ckptstore.errors.MissingRankError` when nothing matches and
    :class:`~ckptstore.errors.LayoutMismatchError` when the choice is ambiguous (several files
    not named by step, or one step saved in both formats).
    """
    folder = _local_folder(rank_dir)
    files = _filtered(folder.folder, folder.names, step=step, epoch=epoch, prefix=prefix, fmt=fmt)
    return rank_dir / _pick_one(folder.folder, _newest_run(folder, files)[0])


def _local_folder(rank_dir: Path) -> RankFolderFiles:
    entries = [(e.name, e.stat().st_mtime) for e in os.scandir(rank_dir) if e.is_file()]
    return RankFolderFiles(str(rank_dir), tuple(n for n, _ in entries), dict(entries))


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


def rank_folders(src: str | os.PathLike[str]) -> dict[int, RankFolderFiles]:
    """Every ``rank_<i>/`` folder under ``src`` (a folder or an object-store URL) and the files in it.

    Raises :class:`~ckptstore.errors.MissingRankError` when ``src`` has no rank folders or the
    rank numbers have a gap (a rank folder was not copied).
    """
    if is_url(src):
        source = open_location(src)
        folders = {int(m.group(1)): f for f in source.list()[0] if (m := _RANK_DIR.match(f))}
        _check_ranks(source.url, sorted(folders))
        return {r: RankFolderFiles(source.key_url(folders[r]), tuple(source.list(folders[r])[1]),
                                   url=f"{source.url}/{folders[r]}") for r in sorted(folders)}
    root = Path(src)
    if not root.is_dir():
        raise MissingRankError(f"{root} is not a directory of rank_<i>/ folders")
    ranks = {int(m.group(1)): p for p in root.iterdir() if p.is_dir() and (m := _RANK_DIR.match(p.name))}
    _check_ranks(str(root), sorted(ranks))
    return {r: _local_folder(ranks[r]) for r in sorted(ranks)}


def _ranks_text(ranks: Sequence[int]) -> str:
    """``rank_0..2, rank_4..7``: runs of three or more consecutive ranks shortened."""
    return rank_list(sorted(ranks), most=None, prefix="rank_")


def _key_text(key: tuple[int, int]) -> str:
    return f"epoch {key[0]} step {key[1]}"


def choose_rank_files(src: str | os.PathLike[str], *, step: int | None = None, prefix: str | None = None,
                      fmt: str | None = None, epoch: int | None = None) -> RankFileChoice:
    """Each rank's checkpoint file under ``src/rank_<i>/``, one checkpoint for the whole job.

    Each folder's files are narrowed by the options as in :func:`pick_rank_file` (``{rank}`` in
    ``prefix`` standing for the folder's rank number; the newest run
    of a job rerun in the same folder; every rank must then be of the same run). When a rank
    folder still holds several checkpoints, the newest ``(epoch, step)`` that *every* rank holds is
    taken: a pipeline job killed while saving leaves the newest epoch in some rank folders only,
    and mixing epochs would make a store of two different models. The choice is described in
    :attr:`RankFileChoice.note`. Raises :class:`~ckptstore.errors.LayoutMismatchError` naming
    each rank's candidates when no checkpoint is held by every rank or when ranks are of different
    runs, and :class:`~ckptstore.errors.MissingRankError` as :func:`rank_folders` does.
    """
    folders = rank_folders(src)
    candidates: dict[int, list[str]] = {}
    runs: dict[int, tuple[str, int] | None] = {}
    for r, folder in folders.items():
        # "{rank}" in a prefix is each folder's rank: MindFormers names files <p>_rank_<r>-..., so
        # one run of a rerun is chosen with "<p>_rank_{rank}-" (the first) or "<p>_rank_{rank}_1-"
        mine = prefix.replace("{rank}", str(r)) if prefix is not None else None
        names = _filtered(folder.folder, folder.names, step=step, epoch=epoch, prefix=mine, fmt=fmt)
        candidates[r], runs[r] = _newest_run(folder, names)
    notes = []
    chosen_runs = {run[1] for run in runs.values() if run is not None}
    if chosen_runs:
        numbers = {r: (run[1] if run is not None else None) for r, run in runs.items()}
        if len(set(numbers.values())) > 1:
            by_run: dict[object, list[int]] = {}
            for r, n in numbers.items():
                by_run.setdefault(n, []).append(r)
            shown = "; ".join(f"{_ranks_text(rs)}: {_example(candidates[rs[0]])}" for rs in by_run.values())
            raise LayoutMismatchError(f"the rank folders of {src} hold reruns of a job and their newest files are of "
                                      f"different runs ({shown}); choose the files with --prefix (per-rank prefixes "
                                      "with {rank}: '<p>_rank_{rank}-')")
        notes.append(f"the rank folders hold {max(chosen_runs) + 1} or more runs of the job (a rerun in the same "
                     f"folder); took the newest run's files, e.g. {_example(candidates[min(candidates)])} (newest "
                     "modification time, as MindFormers' transform picks)")
    files: dict[int, str] = {}
    if all(len(c) == 1 for c in candidates.values()):
        files = {r: c[0] for r, c in candidates.items()}
    else:
        newest = {r: _step_of(_pick_one(folders[r].folder, c)) for r, c in candidates.items()}
        # only named steps compare: a file with no -<epoch>_<step> is never "the newest every rank holds"
        common = set.intersection(*({k for n in c if (k := _step_of(n)) is not None} for c in candidates.values()))
        if len(set(newest.values())) == 1:
            files = {r: _pick_one(folders[r].folder, c) for r, c in candidates.items()}
        elif not common:
            shown = "; ".join(f"rank_{r}: {', '.join(c)}" for r, c in list(candidates.items())[:8])
            raise LayoutMismatchError(f"no checkpoint of {src} is held by every rank ({shown}"
                                      f"{'; ...' if len(candidates) > 8 else ''}); choose one with --epoch and "
                                      "--step, or --prefix")
        else:
            key = max(common)
            files = {r: _pick_one(folders[r].folder, [n for n in c if _step_of(n) == key])
                     for r, c in candidates.items()}
            ahead: dict[tuple[int, int], list[int]] = {}
            for r, k in newest.items():
                if k is not None and k != key:
                    ahead.setdefault(k, []).append(r)
            newer = "; ".join(f"{_ranks_text(rs)} also hold {_key_text(k)}" for k, rs in sorted(ahead.items()))
            notes.append(f"took {_key_text(key)}, the newest checkpoint every rank holds ({newer}, which the other "
                         "ranks lack: a save cut short?); choose another with --epoch and --step")
    out: dict[int, Path | str] = {r: Path(folders[r].folder) / n if folders[r].url is None else f"{folders[r].url}/{n}"
                                  for r, n in files.items()}
    return RankFileChoice(out, "; ".join(notes) or None)


def _example(names: Sequence[str]) -> str:
    """The file a folder's candidates would give on their own (the newest by epoch and step)."""
    return max(names, key=lambda n: (_step_of(n) or (-1, -1), n))


def find_rank_files(src: str | os.PathLike[str], *, step: int | None = None, prefix: str | None = None,
                    fmt: str | None = None, epoch: int | None = None) -> dict[int, Path | str]:
    """Map each rank to its checkpoint file under ``src/rank_<i>/`` (see :func:`choose_rank_files`).

    ``src`` may be a folder or an object-store URL (``s3://bucket/prefix``; files are then URLs).
    """
    return choose_rank_files(src, step=step, prefix=prefix, fmt=fmt, epoch=epoch).files


def scan_rank_file(path: str | os.PathLike[str] | ReadableFile, *, verify_crc: bool = False,
                   decryption: Decryption | None = None) -> CkptIndex:
    """Index one rank file, ``.ckpt`` or MindSpore ``.safetensors`` (told apart by their first bytes);
    with ``decryption`` (key, mode), a ``.ckpt`` saved with ``enc_key``, as its plaintext."""
    f, own = open_file(path)
    if decryption is not None:
        try:
            f, own = DecryptedFile(f, *decryption), True
        except BaseException:
            if own:
                f.close()
            raise
    try:
        if f.url.endswith(".safetensors") or (not f.url.endswith(".ckpt") and is_safetensors(f)):
            return scan_safetensors(f, verify_crc=verify_crc)
        return scan_checkpoint(f, verify_crc=verify_crc)
    finally:
        if own:
            f.close()


def holds_rank_folders(path: str | os.PathLike[str]) -> bool:
    """Whether local folder ``path`` is a checkpoint folder (holds ``rank_<i>/`` folders)."""
    p = Path(path)
    # the name first: only a rank_<i> entry is followed, so a loop of other links (step folders) is never
    # stat'ed here; a rank folder that loops is a typed error naming it
    return not is_url(path) and p.is_dir() and any(_RANK_DIR.match(e.name) and _is_folder(e) for e in os.scandir(p))


def _is_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError as e:
        raise UnsafePathError(f"{entry.path} is a symbolic link that cannot be followed ({e.strerror or e}): a "
                              "loop of links, or too deep; remove or fix it") from None


def describe_rank_folders(src: str | os.PathLike[str], *, step: int | None = None, prefix: str | None = None,
                          fmt: str | None = None, epoch: int | None = None) -> dict[str, object]:
    """The checkpoints each rank folder of ``src`` holds and which ones a conversion would take.

    ``{"kind": "rank folders", "path", "ranks": {rank: [{"name", "epoch", "step"}, ...]},
    "chosen": {rank: name} or None, "note": str or None, "error": str or None}``; ``error`` is
    the message a conversion would refuse with.
    """
    folders = rank_folders(src)
    ranks = {str(r): [{"name": n, "epoch": (_step_of(n) or (None, None))[0], "step": (_step_of(n) or (None, None))[1]}
                      for n in sorted(f.names, key=lambda n: (_step_of(n) or (-1, -1), n))
                      if n.endswith((".ckpt", ".safetensors"))]
             for r, f in folders.items()}
    out: dict[str, object] = {"kind": "rank folders", "path": str(src), "ranks": ranks, "chosen": None,
                              "note": None, "error": None}
    try:
        choice = choose_rank_files(src, step=step, prefix=prefix, fmt=fmt, epoch=epoch)
    except (LayoutMismatchError, MissingRankError) as e:
        out["error"] = str(e)
        return out
    out["chosen"] = {str(r): os.path.basename(str(p)) for r, p in choice.files.items()}
    out["note"] = choice.note
    return out
