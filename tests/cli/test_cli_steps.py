"""``ckptstore steps ROOT [--json] [--clean]``: the steps of a training folder (issue 25.2)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import ckptstore
from ckptstore.checkpoint.layout import Layout
from ckptstore.checkpoint.strategy import Strategy
from ckptstore.cli import _fmt_bytes
from ckptstore.testing.kill_at import run_cli

TWO_RANKS = Strategy({"w": {0: Layout((2,), ((), (0,)))}}, stage_devices=2)
WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def _save(root: str | Path, step: int, ranks: tuple[int, ...]) -> None:
    for rank in ranks:  # 128 KiB of float32 a rank
        ckptstore.save_rank({"w": np.full((256, 128), step, np.float32)}, root, step=step, strategy=TWO_RANKS,
                            rank=rank)


def _bytes(folder: Path) -> int:
    """Every file's size (an unfinished step's lock files say which pid holds them: their size varies)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _files(folder: Path) -> int:
    return sum(1 for p in folder.rglob("*") if p.is_file())


@pytest.fixture
def root(tmp_path) -> Path:
    """step 10: rank 1 saved, rank 0 did not; 20: committed; 30: rank 0 saved; 0: another tool's."""
    _save(tmp_path, 10, (1,))
    _save(tmp_path, 20, (0, 1))
    _save(tmp_path, 30, (0,))
    (tmp_path / "step_0").mkdir()
    (tmp_path / "step_0" / "notes.txt").write_text("mine\n")
    return tmp_path


def _row(step: int, state_and_missing: str, root: Path) -> str:
    """The pattern of one row of the table, its size the step folder's bytes as the command prints sizes."""
    size = _fmt_bytes(_bytes(root / f"step_{step}"))
    return rf"{step:>8}  {re.escape(state_and_missing)}{size:>{len('            129.3 KiB')}}  {WHEN}"


def test_steps_lists_each_step_newest_first_with_its_state_missing_ranks_and_size(root) -> None:
    r = run_cli("steps", root)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "    step  state            ranks missing          size  last written"
    assert re.fullmatch(_row(30, "unfinished       1 of 2", root), lines[1])
    assert re.fullmatch(_row(20, "committed        -     ", root), lines[2])
    assert re.fullmatch(_row(10, "unfinished       0 of 2", root), lines[3])
    assert re.fullmatch(rf"       0  not ckptstore's  -                       5 B  {WHEN}", lines[4])
    assert lines[5:] == [f"1 unfinished step(s) older than the newest committed step 20: remove them with "
                         f"'ckptstore steps {root} --clean'"]


def test_steps_json_gives_state_world_missing_ranks_bytes_and_files(root) -> None:
    r = run_cli("steps", root, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [{k: v for k, v in s.items() if k != "mtime"} for s in doc["steps"]] == [
        {"step": 30, "state": "unfinished", "world": 2, "missing_ranks": [1], "bytes": _bytes(root / "step_30"),
         "files": _files(root / "step_30")},
        {"step": 20, "state": "committed", "world": 2, "missing_ranks": [], "bytes": _bytes(root / "step_20"),
         "files": _files(root / "step_20")},
        {"step": 10, "state": "unfinished", "world": 2, "missing_ranks": [0], "bytes": _bytes(root / "step_10"),
         "files": _files(root / "step_10")},
        {"step": 0, "state": "not ckptstore's", "world": None, "missing_ranks": [], "bytes": 5, "files": 1}]
    assert all(isinstance(s["mtime"], float) for s in doc["steps"])


def test_clean_removes_only_unfinished_steps_older_than_the_newest_committed(root) -> None:
    r = run_cli("steps", root, "--clean", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["removed"], doc["left"]) == ([10], {})
    assert [s["step"] for s in doc["steps"]] == [30, 20, 0]
    assert sorted(p.name for p in root.iterdir()) == ["step_0", "step_20", "step_30"]


def test_steps_of_a_folder_that_is_not_there_is_one_line_and_exit_2(tmp_path) -> None:
    r = run_cli("steps", tmp_path / "absent")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_steps_lists_the_steps_of_a_bucket_prefix(bucket) -> None:
    url = bucket.url("run")
    _save(url, 1, (0, 1))
    _save(url, 2, (0,))
    r = run_cli("steps", url, "--json")
    assert r.returncode == 0, r.stderr
    assert [(s["step"], s["state"], s["missing_ranks"]) for s in json.loads(r.stdout)["steps"]] == \
        [(2, "unfinished", [1]), (1, "committed", [])]


def test_a_step_folder_that_is_a_symbolic_link_is_listed_as_one(root, tmp_path_factory) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (root / "step_40").symlink_to(elsewhere, target_is_directory=True)
    r = run_cli("steps", root, "--json")
    assert json.loads(r.stdout)["steps"][0] == {"step": 40, "state": "symbolic link", "world": None,
                                                 "missing_ranks": [], "bytes": 0, "files": 0, "mtime": None}


def test_commit_of_a_training_folder_names_the_step_to_commit_and_changes_nothing(root) -> None:
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    r = run_cli("commit", root)
    assert (r.returncode, r.stderr.strip()) == (
        2, f"ckptstore: error: {root} is a folder of saved steps, not one store: commit one step folder "
           f"('ckptstore commit {root / 'step_30'}'; unfinished: step 30, 10); 'ckptstore steps {root}' says "
           "which ranks each is missing [IncompleteStoreError]")
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before


def test_opening_a_folder_with_no_committed_step_names_the_ranks_its_newest_step_waits_for(tmp_path) -> None:
    from ckptstore.errors import IncompleteStoreError

    _save(tmp_path, 10, (1,))
    _save(tmp_path, 30, (0,))
    (tmp_path / "step_40").mkdir()  # another tool's folder: not a step that waits for ranks
    with pytest.raises(IncompleteStoreError) as caught:
        ckptstore.open(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path} holds no committed step yet: step 30 at {tmp_path / 'step_30'} is not committed: rank(s) 1 of 2 "
        "have not finished saving it. Rerun the job's save of step 30: a new job starts the step over, and the ranks "
        "of the same attempt (the same job, or the same attempt= / launcher job id) complete it; "
        f"'ckptstore steps {tmp_path}' lists every step (unfinished: 30, 10)")


def test_steps_takes_a_steps_ranks_from_its_attempt_record_not_from_a_markers_name(tmp_path) -> None:
    _save(tmp_path, 10, (0,))
    parts = tmp_path / "step_10" / ".ckptstore-work" / "parts"
    (parts / "0-of-2").rename(parts / "0-of-2000000")  # a planted name (10**11 ran out of memory)
    r = run_cli("steps", tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    assert [(s["step"], s["world"], s["missing_ranks"]) for s in json.loads(r.stdout)["steps"]] == [(10, 2, [0, 1])]
