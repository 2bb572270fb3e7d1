"""Step and rank folders that are symbolic links in a loop: ``info ROOT`` describes the newest
committed step, skipping the links with a warning naming them (as opening ROOT does); naming a
looping link itself, or a folder of rank links in a loop, is one line naming the link, exit 2,
never an untyped ``OSError: Too many levels of symbolic links``."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import ckptstore
from ckptstore.checkpoint.rank_files import holds_rank_folders
from ckptstore.errors import UnsafePathError
from convert_fixtures import run_cli


@pytest.fixture
def looped(tmp_path) -> Path:
    """Step 1 saved, and step_5 -> step_6 -> step_5."""
    ckptstore.save_rank({"w": np.ones(4, np.float32)}, tmp_path, step=1)
    os.symlink("step_6", tmp_path / "step_5")
    os.symlink("step_5", tmp_path / "step_6")
    return tmp_path


def test_info_of_a_root_with_a_loop_of_step_links_describes_the_newest_step_and_names_the_links(looped):
    with pytest.warns(UserWarning, match="step_5, step_6 skipped: a symbolic link, not a step folder"):
        r = run_cli("info", looped)
    assert r.returncode == 0, r.stderr
    assert f"{looped}/step_1: ckptstore store (Zarr v3) of step 1" in r.stdout


def test_info_of_a_looping_step_link_names_it_in_one_line(looped):
    r = run_cli("info", looped / "step_5")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{looped}/step_5 is a symbolic link that cannot be followed: a loop of links" in r.stderr


def test_a_loop_of_rank_folder_links_is_a_typed_error_naming_the_link(tmp_path):
    os.symlink("rank_1", tmp_path / "rank_0")
    os.symlink("rank_0", tmp_path / "rank_1")
    with pytest.raises(UnsafePathError, match=rf"^{tmp_path}/rank_\d is a symbolic link that cannot be followed "
                                              r"\(Too many levels of symbolic links\)"):
        holds_rank_folders(tmp_path)
    r = run_cli("info", tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "[UnsafePathError]" in r.stderr, r.stderr
