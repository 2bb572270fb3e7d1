"""Retention deletes only what ckptstore wrote, never the step just saved (issue 24.4, 25.1/25.2)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ckptstore
from ckptstore.checkpoint.layout import Layout
from ckptstore.checkpoint.strategy import Strategy
from ckptstore.write.retention import Removed, prune_steps, remove_unfinished, saved_steps


def _save(root: Path, step: int) -> None:
    ckptstore.save_rank({"w": np.full(4, step, np.float32), "s": "text"}, root, step=step)


def _half_save(root: Path, step: int) -> None:
    """Rank 0 of 2 saves ``step``; rank 1 never does (killed)."""
    two = Strategy({"w": {0: Layout((2,), ((), (0,)))}}, stage_devices=2)
    ckptstore.save_rank({"w": np.ones((2, 2), np.float32)}, root, step=step, strategy=two, rank=0)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_pruning_leaves_a_users_file_in_an_old_step_and_lists_it(tmp_path) -> None:
    for step in (1, 2, 3):
        _save(tmp_path, step)
    (tmp_path / "step_1" / "eval_results.txt").write_text("accuracy 0.91\n")
    with pytest.warns(UserWarning, match=r"left 1 file\(s\) ckptstore did not write in step_1 \(eval_results.txt\)"):
        removed = prune_steps(tmp_path, 2)
    assert removed == Removed(steps=[1], left={1: ["eval_results.txt"]})
    assert _files(tmp_path / "step_1") == ["eval_results.txt"]
    assert saved_steps(tmp_path) == [(1, False), (2, True), (3, True)]


def test_pruning_leaves_a_step_folder_another_tool_wrote_whole(tmp_path) -> None:
    (tmp_path / "step_0").mkdir()
    (tmp_path / "step_0" / "model.ckpt").write_bytes(b"another tool's checkpoint")
    (tmp_path / "step_0" / "notes.txt").write_text("notes\n")
    for step in (1, 2):
        _save(tmp_path, step)
    with pytest.warns(UserWarning, match=r"left step folder\(s\) step_0 whole: ckptstore did not save them"):
        removed = prune_steps(tmp_path, 1)
    assert removed == Removed(steps=[1], foreign=[0])
    assert _files(tmp_path / "step_0") == ["model.ckpt", "notes.txt"]
    assert not (tmp_path / "step_1").exists()


def test_a_protected_step_is_never_pruned(tmp_path) -> None:
    for step in (5, 15, 20):
        _save(tmp_path, step)
    removed = prune_steps(tmp_path, 2, protect=(5,))  # a resumed job just saved step 5
    assert removed == Removed()
    assert saved_steps(tmp_path) == [(5, True), (15, True), (20, True)]


def test_removing_unfinished_steps_deletes_only_those_older_than_the_newest_commit(tmp_path) -> None:
    _half_save(tmp_path, 1)
    _save(tmp_path, 2)
    _half_save(tmp_path, 3)
    assert remove_unfinished(tmp_path) == Removed(steps=[1])
    assert saved_steps(tmp_path) == [(2, True), (3, False)]


def test_removing_an_unfinished_step_leaves_the_files_its_records_do_not_name(tmp_path) -> None:
    _half_save(tmp_path, 1)
    _save(tmp_path, 2)
    (tmp_path / "step_1" / "w" / "c.0.1").write_bytes(b"rank 1's chunk, no record yet")
    (tmp_path / "step_1" / "w" / "readme").write_text("mine\n")
    (tmp_path / "step_1" / "log.txt").write_text("mine\n")
    with pytest.warns(UserWarning, match=r"left 2 file\(s\) ckptstore did not write in step_1"):
        removed = remove_unfinished(tmp_path)
    assert removed == Removed(steps=[1], left={1: ["log.txt", "w/readme"]})
    assert _files(tmp_path / "step_1") == ["log.txt", "w/readme"]


def test_an_unfinished_step_a_rank_is_saving_now_is_not_removed(tmp_path) -> None:
    from ckptstore.io.local_sink import LocalSink

    _half_save(tmp_path, 1)
    _save(tmp_path, 2)
    held = LocalSink(tmp_path / "step_1").lock("lock.part-1")  # rank 1 is writing step 1 now
    try:
        assert remove_unfinished(tmp_path) == Removed(busy=[1])
    finally:
        held.release()
    assert saved_steps(tmp_path) == [(1, False), (2, True)]
