"""Step folders: a store root that holds one store per saved training step.

``save_rank`` and ``StoreCheckpoint`` write step ``N`` into ``ROOT/step_<N>``; the step is
*committed* once its manifest exists. Opening ``ROOT`` opens the newest committed step; a step
that some rank has not finished saving is skipped (it neither opens nor hides the previous
one). Opening ``ROOT/step_<N>`` itself opens that step, or says which ranks it still waits for.
"""
from __future__ import annotations

import re

from ckptstore.io.base import ByteSource
from ckptstore.io.locations import open_location
from ckptstore.store import work
from ckptstore.store.kinds import read_manifest

STEP_FOLDER = re.compile(r"^step_(\d+)$")


def step_name(step: int) -> str:
    """The folder name of step ``step``."""
    return f"step_{step}"


def steps(location: ByteSource) -> list[int]:
    """The steps ``location`` holds folders for, newest first."""
    try:
        folders = location.list()[0]
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [int(m.group(1)) for m in map(STEP_FOLDER.match, folders) if m]
    return sorted(found, reverse=True)


def step_source(location: ByteSource, step: int) -> ByteSource:
    return open_location(location.key_url(step_name(step)))


def newest_committed(location: ByteSource) -> tuple[ByteSource | None, list[int]]:
    """The newest committed step's folder (or ``None``) and the newer steps that are not committed."""
    pending = []
    for step in steps(location):
        sub = step_source(location, step)
        doc = read_manifest(sub)
        if isinstance(doc, dict) and doc.get("complete") is True:
            return sub, pending
        pending.append(step)
    return None, pending


def unfinished_ranks(location: ByteSource) -> tuple[list[int], int] | None:
    """For an unfinished save: the ranks that have not marked themselves done, and the world size."""
    doc = work.read_attempt(location)
    return None if doc is None else (work.unfinished_parts(location, doc["parts"]), doc["parts"])
