"""``ckptstore steps ROOT --keep K [--dry-run]``: committed steps pruned by the rules of StoreSaver's
keep-K (prune_steps), only the files ckptstore wrote, and a dry run that deletes nothing."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ckptstore
from ckptstore.write.retention import Removed, prune_steps, saved_steps
from convert_fixtures import run_cli


@pytest.fixture
def root(tmp_path) -> Path:
    """Committed steps 1, 2 and 3, and a step_0 another tool wrote."""
    (tmp_path / "step_0").mkdir()
    (tmp_path / "step_0" / "model.ckpt").write_bytes(b"another tool's")
    for step in (1, 2, 3):
        ckptstore.save_rank({"w": np.full(4, step, np.float32)}, tmp_path, step=step)
    return tmp_path


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_keep_removes_the_steps_older_than_the_newest_k_committed(root):
    r = run_cli("steps", root, "--keep", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == ("ckptstore: deleted step(s) 1; left step folder(s) step_0 whole: "
                                        "ckptstore did not save them")
    assert saved_steps(root) == [(0, False), (2, True), (3, True)]
    assert _files(root / "step_0") == ["model.ckpt"]


def test_keep_with_dry_run_says_what_would_go_and_deletes_nothing(root):
    before = _files(root)
    r = run_cli("steps", root, "--keep", "1", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == ("ckptstore: would delete step(s) 1, 2; would leave step folder(s) step_0 "
                                        "whole: ckptstore did not save them")
    assert _files(root) == before


def test_a_dry_run_lists_what_prune_steps_then_deletes(root):
    dry = prune_steps(root, 1, dry_run=True)
    assert dry == Removed(steps=[1, 2], foreign=[0], dry_run=True)
    with pytest.warns(UserWarning, match="left step folder"):
        assert prune_steps(root, 1) == Removed(steps=[1, 2], foreign=[0])


def test_keep_json_names_the_removed_steps(root):
    r = run_cli("steps", root, "--keep", "2", "--json")
    doc = json.loads(r.stdout)
    assert (doc["dry_run"], doc["removed"], [s["step"] for s in doc["steps"]]) == (False, [1], [3, 2, 0])


@pytest.mark.parametrize("args, said", [(["--keep", "0"], "Invalid value for '--keep'"),
                                        (["--dry-run"], "--dry-run goes with --clean or --keep K")],
                         ids=["keep-0", "dry-run-alone"])
def test_bad_options_are_one_line_and_exit_2(root, args, said):
    r = run_cli("steps", root, *args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and said in r.stderr, r.stderr
    assert saved_steps(root) == [(0, False), (1, True), (2, True), (3, True)]
