"""The work folder's vocabulary (ckptstore.store.work): one module names every file under
``.ckptstore-work/``, tells a lock file from the rest, and writes and reads the commit plan."""
from __future__ import annotations

import json

import pytest

from ckptstore.io.memory_sink import MemorySink
from ckptstore.store.work import (
    COMMIT_PLAN_FILE,
    CommitPlan,
    is_lock,
    locked_part,
    part_lock,
    read_commit_plan,
    write_commit_plan,
)


@pytest.mark.parametrize(("key", "lock"), [
    (".ckptstore-work/lock", True),
    (".ckptstore-work/lock.part-3", True),
    (".ckptstore-work/lock.part-x", False),
    (".ckptstore-work/lockfile", False),
    (".ckptstore-work/parts/lock", False),
    ("lock", False),
    (".ckptstore-work/plan.json", False),
], ids=["folder", "part", "part-not-a-number", "other-name", "deeper", "outside", "plan"])
def test_is_lock_knows_the_folder_lock_and_the_part_locks_only(key, lock):
    assert is_lock(key) is lock


def test_a_part_lock_names_its_part():
    assert locked_part(f".ckptstore-work/{part_lock(12)}") == 12


PLAN = CommitPlan("zarr", ("w", "b"), {"world_size": 2, "fingerprint": "f"}, {"x": 1}, 2)


def test_the_commit_plan_is_written_as_the_json_document_4ed4004_wrote():
    assert json.loads(PLAN.to_bytes()) == {"format": "zarr", "names": ["w", "b"], "source": {"world_size": 2,
                                           "fingerprint": "f"}, "extra": {"x": 1}, "parts": 2}


def test_a_save_plan_says_its_records_are_the_ranks():
    doc = json.loads(CommitPlan("zarr", (), {}, {}, 8, records="ranks").to_bytes())
    assert doc["records"] == "ranks" and doc["names"] == []


def test_the_commit_plan_reads_back_as_written():
    sink = MemorySink()
    write_commit_plan(sink, PLAN)
    assert read_commit_plan(sink) == PLAN


@pytest.mark.parametrize("raw", [b"", b'{"format": "zarr"',
                                 b'{"format": "nope", "names": [], "source": {}, "extra": {}}',
                                 b'{"format": "zarr", "names": [1], "source": {}, "extra": {}}',
                                 b'{"format": "zarr", "names": [], "source": {}, "extra": {}, "parts": 0}'],
                         ids=["empty", "torn", "unknown-kind", "name-not-a-string", "no-parts"])
def test_a_torn_or_foreign_commit_plan_reads_as_none(raw):
    sink = MemorySink()
    sink.put(COMMIT_PLAN_FILE, raw)
    assert read_commit_plan(sink) is None


def test_a_torn_commit_plan_is_written_again():
    sink = MemorySink()
    sink.put(COMMIT_PLAN_FILE, b'{"format"')
    write_commit_plan(sink, PLAN)
    assert read_commit_plan(sink) == PLAN
