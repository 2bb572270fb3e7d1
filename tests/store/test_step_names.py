"""Only ``step_<N>`` in ASCII digits without a leading zero (or ``step_0``) is a step folder:
other names that start so (``step_03``, ``step_٣``) are a user's, left alone and listed as not
ckptstore's, never read as the step ``int()`` makes of them."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ckptstore
from ckptstore.store.steps import STEP_FOLDER
from ckptstore.write.retention import foreign_names, prune_steps, remove_unfinished, saved_steps
from convert_fixtures import run_cli


@pytest.mark.parametrize("name, step", [("step_0", 0), ("step_7", 7), ("step_120", 120)])
def test_a_step_folder_is_step_and_ascii_digits(name, step):
    m = STEP_FOLDER.match(name)
    assert m is not None and int(m.group(1)) == step


@pytest.mark.parametrize("name", ["step_03", "step_00", "step_\u0663", "step_\uff13", "step_3\n", "step_", "step_-1",
                                  "step_3a", "Step_3"], ids=["leading-zero", "zeros", "arabic-indic", "fullwidth",
                                                             "newline", "empty", "negative", "suffix", "case"])
def test_other_names_are_no_step_folder(name):
    assert STEP_FOLDER.match(name) is None


def _save(root: Path, step: int) -> None:
    ckptstore.save_rank({"w": np.full(4, step, np.float32)}, root, step=step)


@pytest.fixture
def users_root(tmp_path) -> Path:
    """Steps 1, 2 and 4 saved, beside a user's folders step_03 and step_\u0663 and a user's file step_3."""
    for step in (1, 2, 4):
        _save(tmp_path, step)
    for name in ("step_03", "step_\u0663"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text("mine\n")
    (tmp_path / "step_3").write_text("a user's file\n")
    return tmp_path


def test_pruning_leaves_names_that_are_no_step_alone(users_root):
    removed = prune_steps(users_root, 1)
    assert removed.steps == [1, 2]
    assert saved_steps(users_root) == [(4, True)]
    assert (users_root / "step_03" / "notes.txt").read_text() == "mine\n"
    assert (users_root / "step_\u0663" / "notes.txt").read_text() == "mine\n"
    assert (users_root / "step_3").read_text() == "a user's file\n"


def test_removing_unfinished_steps_and_opening_the_root_skip_names_that_are_no_step(users_root):
    assert remove_unfinished(users_root).steps == []
    assert ckptstore.open(users_root).step == 4


def test_names_that_are_no_step_are_listed_as_not_ckptstores(users_root):
    assert foreign_names(users_root) == ["step_03", "step_3", "step_\u0663"]  # step_3 is a file: no step either


def test_cli_steps_lists_names_that_are_no_step_as_not_ckptstores(users_root):
    r = run_cli("steps", users_root, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [s["step"] for s in doc["steps"]] == [4, 2, 1]
    assert doc["not_ckptstores"] == ["step_03", "step_3", "step_\u0663"]
    table = run_cli("steps", users_root)
    assert "not ckptstore's, left alone: step_03, step_3, step_\u0663" in table.stdout
