"""The work folder of an unfinished store, as a reader sees it: which writer started it, which
parts have finished, and what finishes it.

Conversion parts and save ranks are the same thing: writers of disjoint files into one store
(part ``I`` of ``N``; a save's rank ``I`` of world size ``N``). Each writer that claims the store
finds or writes :data:`ATTEMPT_FILE` (the attempt every writer of this store agrees on, the part
count, and who writes: ``convert``, ``index`` or ``save_rank``), and says it finished with a
marker ``parts/<I>-of-<N>`` holding that attempt. :func:`unfinished_parts` is the one answer to
"which parts have not finished" (the commit, ``ckptstore commit``, ``info`` and ``open`` ask it);
:func:`what_finishes` says it in words. This module reads only: the write side
(:mod:`ckptstore.write.commit`) writes these files.
"""
from __future__ import annotations

import json
import re
from typing import Any, Sequence

from ckptstore.errors import CkptStoreError
from ckptstore.io.base import ByteSource
from ckptstore.limits import MAX_WORLD
from ckptstore.store.kinds import WORK_DIR

PARTS_DIR = f"{WORK_DIR}/parts"
#: Who writes this store, in which attempt, in how many parts: written when a writer claims it.
ATTEMPT_FILE = f"{WORK_DIR}/attempt.json"
_MARKER = re.compile(r"^(\d+)-of-(\d+)$")


def marker(index: int, count: int) -> str:
    """The work-folder key that says part ``index`` of ``count`` has finished."""
    return f"{PARTS_DIR}/{index}-of-{count}"


def read_attempt(source: ByteSource) -> dict[str, Any] | None:
    """The store's attempt record (``attempt``, ``parts``, ``writer``, for a save ``step``), or
    ``None`` when there is none or it does not parse."""
    try:
        raw = source.read_bytes(ATTEMPT_FILE, limit=1 << 20)
        doc = json.loads(raw) if raw is not None else None
    except (ValueError, RecursionError, OSError, CkptStoreError):
        return None
    return doc if isinstance(doc, dict) and is_part_count(doc.get("parts")) else None


def is_part_count(value: Any) -> bool:
    """Whether ``value`` can be a store's number of parts (a job's world size at most): the
    work folder's files are untrusted, and a count is listed rank by rank."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_WORLD


def finished_parts(source: ByteSource, count: int) -> set[int]:
    """The parts of ``count`` whose marker is there (one listing, not a request per part)."""
    try:
        names = source.list(PARTS_DIR)[1]
    except (FileNotFoundError, NotADirectoryError):
        return set()
    found = (_MARKER.match(n) for n in names)
    return {int(m.group(1)) for m in found if m and int(m.group(2)) == count}


def unfinished_parts(source: ByteSource, count: int) -> list[int]:
    """The parts of ``count`` that have not said they finished, in order: the one answer every
    caller asks (a writer deciding whether it is the last, the commit, ``info``, ``open``)."""
    done = finished_parts(source, count)
    return [i for i in range(count) if i not in done]


def short(parts: Sequence[int]) -> str:
    """At most 20 part numbers, for a message."""
    return ", ".join(map(str, parts[:20])) + (" ..." if len(parts) > 20 else "")


def what_finishes(source: ByteSource, detail: str = "") -> str | None:
    """Why the unfinished store at ``source`` is not complete and what to run, in one sentence
    (``detail``, e.g. how many parameters are written, is said in brackets after the state);
    ``None`` when it holds no attempt record (nothing ckptstore can say more about)."""
    doc = read_attempt(source)
    if doc is None:
        return None
    count, url = doc["parts"], source.url
    note = f" ({detail})" if detail else ""
    missing = unfinished_parts(source, count)
    if not missing:
        return (f"every {'rank' if doc.get('writer') == 'save_rank' else 'part'} of the store at {url} has finished "
                f"but it was not committed (the last one stopped first); run 'ckptstore commit {url}'")
    if doc.get("writer") == "save_rank":
        step = doc.get("step")
        return (f"step {step} at {url} is not committed{note}: rank(s) {short(missing)} of {count} have not finished "
                f"saving it. Rerun the job's save of step {step}: a new job starts the step over, and the ranks of the "
                "same attempt (the same job, or the same attempt= / launcher job id) complete it")
    if count == 1:
        return (f"the store at {url} is incomplete{note}: its conversion was interrupted. Run the same "
                f"'ckptstore {doc.get('writer') or 'convert'}' command again to finish it")
    return (f"the conversion into {url} is not finished{note}: part(s) {short(missing)} of {count} have not finished; "
            f"run (or rerun) them ({doc.get('writer') or 'convert'} --part I/{count}), then commit")
