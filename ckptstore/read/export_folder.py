"""The output folder of an export: refused when it holds files unless ``overwrite``, and replaced
so that a reader never loads a mix of two exports.

An export records the files it wrote in ``.ckptstore-export.json`` at the top of its folder.
:func:`claim_export_folder` refuses a folder holding any file unless ``overwrite`` is given; with
it, the files a previous export recorded are the only ones removed, and a file it did not write
that a reader would take for weights (``.safetensors``, ``.ckpt``, an index) or that the new
export would replace is refused, named. The replacement runs in an order that never leaves old
and new weights side by side: the record first lists both sets (a crash at any point leaves a
folder a later ``--overwrite`` cleans), then the old entry points go (``model.safetensors.index.json``,
``model.safetensors``: a reader finds no model rather than half of one), then every old file, then
the new files are written, entry points last, and :func:`commit_export_folder` records the new
set alone. A reader that opens the folder sees the old export, no model, or the new export.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence

from ckptstore.errors import StoreCorruptError, StoreExistsError
from ckptstore.io.base import check_key
from ckptstore.io.sink import ByteSink, partial_key

#: The record of what the last export into a folder wrote.
EXPORT_RECORD = ".ckptstore-export.json"
#: Names a reader takes for weights: a file of these not written by an export is never replaced or left beside one.
_WEIGHT_SUFFIXES = (".safetensors", ".ckpt", ".index.json", ".bin")
_SHOWN = 5


def claim_export_folder(sink: ByteSink, new: Sequence[str], *, overwrite: bool,
                        entry_points: Sequence[str] = ()) -> None:
    """Make ``sink`` ready for an export of the files ``new``: refuse a folder that holds files
    unless ``overwrite``; with it, remove the files a previous export recorded (``entry_points``
    first) after recording both sets, and refuse files no export wrote that would be replaced or
    read as weights. Raises :class:`~ckptstore.errors.StoreExistsError` naming the folder and files."""
    present = [k for k in sink.keys(prefix="") if k != EXPORT_RECORD]
    if not present:  # nothing to replace (a record alone names no file that is still there)
        _record(sink, "writing", new)
        return
    if not overwrite:
        raise StoreExistsError(f"export folder {sink.url} is not empty (it holds {_some(present)}); pass --overwrite "
                               "(overwrite=True) to replace what an earlier export wrote, or choose an empty folder")
    old = previous_export(sink)
    ours = _ours(old)
    foreign = [k for k in present if not ours(k) and (k in new or k.endswith(_WEIGHT_SUFFIXES))]
    if foreign:
        raise StoreExistsError(f"export folder {sink.url} holds {_some(foreign)}, which no ckptstore export wrote "
                               "and which a reader would take for weights; --overwrite removes only what an export "
                               "wrote: move these files away, or choose another folder")
    _record(sink, "writing", sorted(set(old) | set(new)))
    stale = [k for k in present if ours(k)]
    first = [k for k in stale if k.rsplit("/", 1)[-1] in entry_points]
    sink.delete(first)
    sink.sync()
    sink.delete([k for k in stale if k not in first])
    sink.sync()


def commit_export_folder(sink: ByteSink, written: Sequence[str]) -> None:
    """Record that the export into ``sink`` is complete and wrote exactly ``written``."""
    _record(sink, "complete", written)
    sink.sync()


def previous_export(sink: ByteSink) -> list[str]:
    """The files the record of ``sink`` names (an export that completed or was interrupted), or ``[]``."""
    raw = sink.read(EXPORT_RECORD)
    if raw is None:
        return []
    try:
        doc = json.loads(raw)
        files = doc["files"]
        if not isinstance(files, list):
            raise TypeError("files is not a list")
        return [check_key(f, sink.key_url(EXPORT_RECORD)) for f in files]
    except (ValueError, KeyError, TypeError) as e:
        raise StoreCorruptError(f"{sink.key_url(EXPORT_RECORD)} is not an export record ({e}); remove it and the "
                                "files of that export by hand, or choose another folder") from None


def _record(sink: ByteSink, state: str, files: Iterable[str]) -> None:
    sink.put(EXPORT_RECORD, json.dumps({"state": state, "files": sorted(files)}, indent=1).encode())
    sink.sync()


def _ours(recorded: Sequence[str]) -> Callable[[str], bool]:
    """Whether a key is a recorded file or a temporary name of one (an interrupted write's)."""
    names = set(recorded) | {EXPORT_RECORD}
    temp = re.compile(r"(.*)\.\d+-\d+\.tmp")

    def ours(key: str) -> bool:
        m = temp.fullmatch(key)
        return key in names or any(key == partial_key(n) for n in names) or (m is not None and m.group(1) in names)
    return ours


def _some(keys: Sequence[str]) -> str:
    shown = ", ".join(keys[:_SHOWN])
    return shown + (f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else "")
