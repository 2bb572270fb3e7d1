"""The write seam writes through no link: a step folder planted as a symbolic link, files shared by
hard links (a ``cp -al`` snapshot of an unfinished store), and a parent folder swapped for a link
during a run (issue 24.5, 24.6, 24.7)."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ckptstore
from ckptstore.errors import UnsafePathError


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_save_rank_refuses_a_step_folder_planted_as_a_symbolic_link(tmp_path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir(), elsewhere.mkdir()
    (root / "step_9").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(UnsafePathError, match=f"^{root / 'step_9'} is a symbolic link; "):
        ckptstore.save_rank({"w": np.arange(4, dtype=np.float32)}, root, step=9)
    assert list(elsewhere.iterdir()) == []


def test_opening_a_root_warns_naming_a_step_folder_that_is_a_link_and_opens_the_newest_real_step(tmp_path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    ckptstore.save_rank({"w": np.arange(4, dtype=np.float32)}, root, step=1)
    ckptstore.save_rank({"w": np.ones(4, dtype=np.float32)}, elsewhere, step=9)
    (root / "step_9").symlink_to(elsewhere / "step_9", target_is_directory=True)
    with pytest.warns(UserWarning, match=r": step_9 skipped: a symbolic link, not a step folder ckptstore saved"):
        store = ckptstore.open(root)
    with store:
        np.testing.assert_array_equal(store.read("w"), np.arange(4, dtype=np.float32))


def test_a_save_leaves_the_lock_files_a_snapshot_shares_by_hard_links_unchanged(tmp_path) -> None:
    root, snapshot = tmp_path / "root", tmp_path / "snapshot"
    work = root / "step_1" / ".ckptstore-work"
    work.mkdir(parents=True), snapshot.mkdir()
    for name in ("lock", "lock.part-0", "lock.part-1"):
        (snapshot / name).write_bytes(b"pid 1 on host snap since then")
        os.link(snapshot / name, work / name)
    ckptstore.save_rank({"w": np.arange(4, dtype=np.float32)}, root, step=1)
    assert {n: (snapshot / n).read_bytes() for n in ("lock", "lock.part-0", "lock.part-1")} == \
        dict.fromkeys(("lock", "lock.part-0", "lock.part-1"), b"pid 1 on host snap since then")


@pytest.mark.slow
@pytest.mark.parametrize("fmt,reopened", [
    ("zarr", {".ckptstore-work/lock", "big.rows/c.0.0.journal", "big.rows/c.0.0.partial"}),
    ("safetensors", {".ckptstore-work/lock", ".ckptstore-work/journal/big.rows.journal",
                     "model-00001-of-00001.safetensors.partial"})])
def test_a_resumed_conversion_leaves_a_hard_linked_snapshot_of_the_unfinished_store_unchanged(
        big_layout, tmp_path, fmt, reopened) -> None:
    from convert_fixtures import run_cli, strategy_args

    out, snapshot = tmp_path / "out", tmp_path / "snapshot"
    args = ["convert", big_layout.root, *strategy_args(big_layout), "--out", out, "--chunk-mb", "1",
            "--workers", "1", "-q", "--format", fmt]
    r = run_cli(*args, kill_at="chunks:3")
    assert r.returncode == -signal.SIGKILL, r.stderr
    for p in sorted(out.rglob("*")):  # `cp -al out snapshot`
        q = snapshot / p.relative_to(out)
        q.mkdir(parents=True) if p.is_dir() else os.link(p, q)
    before = _tree(snapshot)
    assert reopened <= set(before)  # the files the rerun reopens are among those the snapshot shares
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert _tree(snapshot) == before


def test_a_parent_folder_swapped_for_a_link_during_a_conversion_gets_nothing_written_into_the_other_folder(
        saved_layout, tmp_path) -> None:
    from ckptstore.io.local_sink import LocalSink

    layout = saved_layout("dp2_mp4")
    parent, moved, other = tmp_path / "parent", tmp_path / "parent.real", tmp_path / "other"
    (other / "out").mkdir(parents=True)
    sink = LocalSink(parent / "out")
    sink.make_root()  # the root's descriptor is taken here, and held for the run
    stop, swaps = threading.Event(), [0]

    def swap() -> None:
        while not stop.is_set():
            os.rename(parent, moved)
            os.symlink(other, parent)
            time.sleep(0.003)
            os.unlink(parent)
            os.rename(moved, parent)
            swaps[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=swap)
    t.start()
    try:
        ckptstore.convert(layout.root, sink, strategy=layout.strategy_files, workers=1)
    finally:
        stop.set()
        t.join()
        sink.close()
    assert swaps[0] > 3
    assert sorted(p.name for p in other.rglob("*")) == ["out"]
