"""The work folder of an unfinished store: every name under ``.ckptstore-work/``, and what a
reader can tell from it (which writer started it, which parts have finished, what finishes it).

Conversion parts and save ranks are the same thing: writers of disjoint files into one store
(part ``I`` of ``N``; a save's rank ``I`` of world size ``N``). Each writer that claims the store
takes the folder's lock (:data:`LOCK`; a part's own :func:`part_lock` for its run), finds or
writes :data:`FINGERPRINT_FILE` (what the conversion or save is: its fingerprint) and
:data:`ATTEMPT_FILE` (that fingerprint as the attempt every writer of this store agrees on, the
part count, and who writes: ``convert``, ``index`` or ``save_rank``), writes the same
:class:`CommitPlan` (:data:`COMMIT_PLAN_FILE`), its data (a conversion part notes each finished
parameter at :func:`done_key` to resume), its record (:func:`record_key`), and says it finished with a
marker ``parts/<I>-of-<N>`` holding the attempt's fingerprint. :func:`unfinished_parts` is the
one answer to "which parts have not finished" (the commit, ``ckptstore commit``, ``info`` and
``open`` ask it); :func:`what_finishes` says it in words. The write side
(:mod:`ckptstore.write.commit`, :mod:`ckptstore.write.output_folder`) writes these files, by the
names defined here and nowhere else.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptstore.errors import CkptStoreError
from ckptstore.io.base import ByteSource
from ckptstore.io.sink import ByteSink
from ckptstore.limits import MAX_WORLD
from ckptstore.progress import rank_list
from ckptstore.store.kinds import WORK_DIR, store_kind
from ckptstore.store.zarr import array_path

#: The markers of finished parts (:func:`marker`).
PARTS_DIR = f"{WORK_DIR}/parts"
#: Who writes this store, in which attempt, in how many parts: written when a writer claims it.
ATTEMPT_FILE = f"{WORK_DIR}/attempt.json"
#: The fingerprint of the conversion or save that owns the folder (another one is refused or starts over).
FINGERPRINT_FILE = f"{WORK_DIR}/fingerprint"
#: The :class:`CommitPlan`, written by every part before its data.
COMMIT_PLAN_FILE = f"{WORK_DIR}/plan.json"
#: A finished parameter's manifest, one file each (:func:`done_key`): a running conversion part's
#: resume state (a rerun skips what it names), not read by the commit.
DONE_DIR = f"{WORK_DIR}/done"
#: What each part (a conversion's part, a save's rank) wrote, one record per part (:func:`record_key`).
RECORDS_DIR = f"{WORK_DIR}/records"
#: The resume journals of a dense (safetensors) parameter (:func:`dense_journal_key`).
JOURNAL_DIR = f"{WORK_DIR}/journal"
#: The lock of the whole folder, by its name inside the work folder (what ``ByteSink.lock`` takes).
LOCK = "lock"
_PART_LOCK = "lock.part-"
_MARKER = re.compile(r"^(\d+)-of-(\d+)$")


def part_lock(index: int) -> str:
    """The name of part ``index``'s own lock (held for its run), inside the work folder."""
    return f"{_PART_LOCK}{index}"


def locked_part(key: str) -> int | None:
    """The part whose lock ``key`` (a work-folder key or a bare name) is, else ``None``."""
    name = key.rsplit("/", 1)[-1]
    digits = name[len(_PART_LOCK):]
    return int(digits) if name.startswith(_PART_LOCK) and digits.isdigit() else None


def is_lock(key: str) -> bool:
    """Whether ``key`` (a store key) is one of the work folder's lock files: :data:`LOCK` or a
    :func:`part_lock`, directly in the work folder."""
    folder, _, name = key.rpartition("/")
    return folder == WORK_DIR and (name == LOCK or locked_part(name) is not None)


def done_key(name: str) -> str:
    """Where the manifest of finished parameter ``name`` is recorded until the commit."""
    return f"{DONE_DIR}/{array_path(name)}.json"


def record_key(index: int, count: int) -> str:
    """Where part ``index`` of ``count`` (a save's rank of its world size) records what it wrote,
    in the one record form of :mod:`ckptstore.write.records`."""
    return f"{RECORDS_DIR}/{index}-of-{count}.json"


def dense_journal_key(name: str) -> str:
    """The resume journal of parameter ``name`` in a pre-sized safetensors file."""
    return f"{JOURNAL_DIR}/{array_path(name)}.journal"


@dataclass(frozen=True)
class CommitPlan:
    """What every part of a store needs to commit it, written once per attempt
    (:data:`COMMIT_PLAN_FILE`): the store ``kind``, the parameter ``names`` in manifest order,
    the manifest header (``source``), the kind's ``extra`` fields, the number of ``parts``, and
    ``records="ranks"`` when the parts are save ranks whose records the commit merges (``names``
    is then empty: the records give the parameters and their order)."""

    kind: str
    names: tuple[str, ...]
    source: Mapping[str, Any]
    extra: Mapping[str, Any] = field(default_factory=dict)
    parts: int = 1
    records: str | None = None

    def to_bytes(self) -> bytes:
        """The plan as the JSON document :data:`COMMIT_PLAN_FILE` holds."""
        return json.dumps({"format": self.kind, "names": list(self.names), "source": dict(self.source),
                           "extra": dict(self.extra), "parts": self.parts,
                           **({"records": self.records} if self.records else {})}).encode()

    @classmethod
    def from_bytes(cls, raw: bytes | None) -> CommitPlan | None:
        """The plan in ``raw``, or ``None`` when there is none or it does not parse (a torn write:
        the work folder is untrusted)."""
        try:
            doc: Any = json.loads(raw) if raw is not None else None
        except (ValueError, RecursionError):
            return None
        ok = (isinstance(doc, dict) and isinstance(doc.get("format"), str) and store_kind(doc["format"]) is not None
              and isinstance(doc.get("names"), list)
              and all(isinstance(n, str) for n in doc["names"]) and isinstance(doc.get("source"), dict)
              and isinstance(doc.get("extra"), dict) and is_part_count(doc.get("parts", 1))
              and doc.get("records") in (None, "ranks"))
        if not ok:
            return None
        return cls(doc["format"], tuple(doc["names"]), doc["source"], doc["extra"], doc.get("parts", 1),
                   doc.get("records"))


def write_commit_plan(sink: ByteSink, plan: CommitPlan) -> None:
    """Write ``plan`` unless an earlier part did; every part writes the same document, and one an
    earlier run left torn (a power loss before it reached the disk) is written again."""
    doc = plan.to_bytes()
    if not sink.put_if_absent(COMMIT_PLAN_FILE, doc) and read_commit_plan(sink) is None:
        sink.put(COMMIT_PLAN_FILE, doc)


def read_commit_plan(sink: ByteSink) -> CommitPlan | None:
    """The store's commit plan, or ``None`` when there is none or it does not parse."""
    return CommitPlan.from_bytes(sink.read(COMMIT_PLAN_FILE))


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
    """At most 20 part numbers, for a message (:func:`~ckptstore.progress.rank_list`)."""
    return rank_list(parts)


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
