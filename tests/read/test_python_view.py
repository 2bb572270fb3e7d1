"""What a Python user sees (issue 25 item 7): ``Store.step``, one-line summaries of a store and of
what a rank loads, progress for reading, exporting and committing, and the step an export wrote.

The stores are saved by ``save_rank`` from numpy arrays (no MindSpore needed); the one-line form of
``load_rank``'s mapping is tested with MindSpore in tests/read/test_load_rank.py.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ckptstore
from ckptstore.read.loader import rank_view
from convert_fixtures import run_cli

WEIGHT = np.arange(512 * 512, dtype=np.float32).reshape(512, 512)  # 1 MiB


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A training folder whose newest committed step is 20: a 1 MiB weight and a step counter."""
    ckptstore.save_rank({"w": WEIGHT, "global_step": np.array([20], np.int32)}, tmp_path / "run", step=20)
    return tmp_path / "run"


def _last_line(text: str) -> str:
    return [line for line in text.splitlines() if line][-1]


def test_a_saved_store_knows_its_step(saved):
    assert ckptstore.open(saved).step == 20


def test_a_store_summary_is_one_line_with_kind_place_step_size_and_world(saved):
    store = ckptstore.open(saved)
    assert store.summary() == f"ckptstore zarr store {saved}/step_20 (step 20): 2 parameters, 1.0 MiB, world 1"
    assert repr(store) == f"<{store.summary()}>"


def test_a_rank_view_summary_says_rank_store_step_and_bytes(saved):
    view = rank_view(ckptstore.open(saved), None, 0)
    assert view.summary() == f"rank 0 of 1 from {saved}/step_20 (step 20): 2 parameters, 1.0 MiB"
    assert repr(view) == f"<RankView {view.summary()}>"


def test_read_rank_is_quiet_by_default(saved, capsys):
    ckptstore.read_rank(saved, None, 0)
    assert capsys.readouterr().err == ""


def test_read_rank_shows_progress_when_not_quiet(saved, capsys):
    ckptstore.read_rank(saved, None, 0, quiet=False)
    last = _last_line(capsys.readouterr().err)  # not a terminal: a closing log line
    assert last.startswith("load rank 0: 2/2 params, 1.0/1.0 MiB, ") and last.endswith(" MiB/s (100%)"), last


def test_export_shows_progress_when_not_quiet(saved, tmp_path, capsys):
    ckptstore.export(saved, tmp_path / "out", quiet=False)
    last = _last_line(capsys.readouterr().err)
    assert last.startswith("export: 2/2 params, 1.0/1.0 MiB, ") and last.endswith(" MiB/s (100%)"), last


def test_export_returns_the_step_it_exported(saved, tmp_path):
    assert ckptstore.export(saved, tmp_path / "out").step == 20


def test_the_export_command_says_which_step_it_exported(saved, tmp_path):
    result = run_cli("export", saved, tmp_path / "out", "--quiet")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (f"wrote 1 file(s) under {tmp_path / 'out'} from {saved}/step_20, step 20, "
                                     "reading 1.0 MiB from the store")


def test_the_export_command_shows_progress_unless_quiet(saved, tmp_path):
    shown = run_cli("export", saved, tmp_path / "a")
    assert _last_line(shown.stderr).startswith("export: 2/2 params, 1.0/1.0 MiB, "), shown.stderr
    assert run_cli("export", saved, tmp_path / "b", "--quiet").stderr == ""


def test_the_commit_command_ends_with_what_the_store_holds(saved):
    result = run_cli("commit", saved / "step_20")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (f"{saved}/step_20 is already complete; nothing to do; ckptstore zarr store "
                                     f"{saved}/step_20 (step 20): 2 parameters, 1.0 MiB, world 1")


def test_the_commit_command_says_what_it_committed(tmp_path):
    from ckptstore.write.save import prepare_save

    job = prepare_save({"w": WEIGHT}, tmp_path / "run", step=5)
    assert job.write(commit=False).committed is False  # the rank finished its share, the commit did not run
    result = run_cli("commit", tmp_path / "run" / "step_5")
    assert result.returncode == 0, result.stderr
    step = tmp_path / "run" / "step_5"
    assert result.stdout.strip() == (f"committed {step}: the store is complete; ckptstore zarr store {step} (step 5): "
                                     "1 parameter, 1.0 MiB, world 1")
