"""Step folders: a store root that holds one store per saved training step.

``save_rank`` and ``StoreCheckpoint`` write step ``N`` into ``ROOT/step_<N>``; the step is
*committed* once its manifest exists. Opening ``ROOT`` opens the newest committed step; a step
that some rank has not finished saving is skipped (it neither opens nor hides the previous
one). Opening ``ROOT/step_<N>`` itself opens that step, or says which ranks it still waits for.
A ``step_<N>`` that is a symbolic link is no step: saving refuses to write through it
(:func:`step_sink`), and opening ``ROOT`` skips it with a warning naming it (refusing would let
anyone who can write ``ROOT`` stop every resume).
"""
from __future__ import annotations

import os
import re
import warnings

from ckptstore.io.base import ByteSource
from ckptstore.io.locations import is_url, open_location
from ckptstore.io.sink import ByteSink, open_sink
from ckptstore.store import work
from ckptstore.store.kinds import read_manifest

#: A step folder's name as ckptstore writes it (:func:`step_name`): ``step_`` and the step in ASCII
#: digits with no leading zero. ``\d`` took Unicode digits and leading zeros (``step_٣``, ``step_03``),
#: which ``int()`` reads as 3, so another folder's name led to ``step_3``; and ``$`` took a final newline.
STEP_FOLDER = re.compile(r"^step_(0|[1-9][0-9]*)\Z")
#: Any name that starts like a step folder: those :data:`STEP_FOLDER` refuses are not ckptstore's.
STEP_LIKE = re.compile(r"^step_", re.DOTALL)


def step_name(step: int) -> str:
    """The folder name of step ``step``."""
    return f"step_{step}"


def step_sink(location: str) -> ByteSink:
    """The sink of the step folder ``location`` (``ROOT/step_<N>``), reached from its root's: the
    root may be a link (the user's choice), but a step folder planted as a symbolic link to another
    folder is refused (:class:`~ckptstore.errors.UnsafePathError` naming it) before anything is
    written through it."""
    if is_url(location):
        parent, _, name = location.rstrip("/").rpartition("/")
    else:
        parent, name = os.path.split(os.path.normpath(location))
    return open_sink(parent or ".").folder(name)


def steps(location: ByteSource) -> list[int]:
    """The steps ``location`` holds folders for, newest first."""
    try:
        folders = location.list()[0]
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [int(m.group(1)) for m in map(STEP_FOLDER.match, folders) if m]
    return sorted(found, reverse=True)


def foreign_step_names(names: list[str]) -> list[str]:
    """The names among ``names`` that start like a step folder (``step_``) but are not one
    ckptstore writes (``step_03``, ``step_٣``, ``step_final``): left alone, and listed as not ckptstore's."""
    return sorted(n for n in names if STEP_LIKE.match(n) and not STEP_FOLDER.match(n))


def step_source(location: ByteSource, step: int) -> ByteSource:
    return open_location(location.key_url(step_name(step)))


def linked_steps(location: str) -> list[str]:
    """The names of ``location`` that look like step folders but are symbolic links: ckptstore
    neither writes through nor reads them (a step ckptstore saved is a folder of the root)."""
    return [name for name in open_sink(location).links() if STEP_FOLDER.match(name)]


def newest_committed(location: ByteSource) -> tuple[ByteSource | None, list[int]]:
    """The newest committed step's folder (or ``None``) and the newer steps that are not committed.

    Step names that are symbolic links are not steps: they are skipped with a warning naming them
    (``save_rank`` refuses to write through one, so no step of ckptstore's is there)."""
    linked = linked_steps(location.url)
    if linked:
        warnings.warn(f"ckptstore: {location.url}: {', '.join(linked)} skipped: a symbolic link, not a step folder "
                      "ckptstore saved (it writes and reads no step through a link)", stacklevel=3)
    pending: list[int] = []
    for step in steps(location):
        sub = step_source(location, step)
        if is_committed(sub):
            return sub, pending
        pending.append(step)
    return None, pending


def is_committed(step: ByteSource) -> bool:
    """Whether the step folder ``step`` holds a committed store (its manifest says it is complete)."""
    doc = read_manifest(step)
    return isinstance(doc, dict) and doc.get("complete") is True


def unfinished_ranks(location: ByteSource) -> tuple[list[int], int] | None:
    """For an unfinished save: the ranks that have not marked themselves done, and the world size."""
    doc = work.read_attempt(location)
    return None if doc is None else (work.unfinished_parts(location, doc["parts"]), doc["parts"])
