"""Finding each rank's checkpoint file in a checkpoint folder: which file of a rank folder is
used (newest step, --step, --prefix) and which folders are refused. Runs without MindSpore
(``make test-pure``); the rank files are written by ckptstore's CheckpointWriter, whose output
is byte-identical to ``mindspore.save_checkpoint``'s (test_export.py checks it)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ckptstore.checkpoint.rank_files import find_rank_files, pick_rank_file
from ckptstore.checkpoint.source import open_source
from ckptstore.errors import LayoutMismatchError, MissingRankError
from ckptstore.formats.ckpt_reader import read_entry
from ckptstore.formats.ckpt_writer import CheckpointWriter


def test_a_folder_without_rank_folders_is_refused(tmp_path):
    with pytest.raises(MissingRankError, match="has no rank_<i>/ folders"):
        find_rank_files(tmp_path)


def _ckpt(path: Path, marker: float) -> Path:
    """A one-parameter rank file, in the bytes ``mindspore.save_checkpoint`` writes (test_export.py)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with CheckpointWriter(path) as w:
        w.add("marker", np.array([marker], np.float32))
    return path


@pytest.mark.parametrize(
    "names,kwargs,chosen",
    [
        (["net-1_10.ckpt", "net-2_5.ckpt"], {}, "net-2_5.ckpt"),
        (["net-1_9.ckpt", "net-1_10.ckpt"], {}, "net-1_10.ckpt"),
        (["my-net-2_1.ckpt", "my-net-1_10.ckpt"], {}, "my-net-2_1.ckpt"),
        (["net-1_1.ckpt", "net-3_1_breakpoint.ckpt"], {}, "net-3_1_breakpoint.ckpt"),
        (["anything.ckpt"], {}, "anything.ckpt"),
        (["net-1_5.ckpt", "net-2_10.ckpt"], {"step": 5}, "net-1_5.ckpt"),
        (["a-1_1.ckpt", "b-1_1.ckpt"], {"prefix": "b"}, "b-1_1.ckpt"),
        (["a-1_1.ckpt", "a-1_2.ckpt", "b-1_3.ckpt"], {"prefix": "a"}, "a-1_2.ckpt"),
        (["a-1_1.ckpt", "b-1_2.ckpt", "a-2_2.ckpt"], {"prefix": "a", "step": 1}, "a-1_1.ckpt"),
    ],
    ids=["newer-epoch", "numeric-not-lexicographic", "dash-in-prefix", "breakpoint", "single-file",
         "step", "prefix", "newest-of-prefix", "prefix-and-step"],
)
def test_pick_rank_file_chooses(tmp_path, names, kwargs, chosen):
    for i, n in enumerate(names):
        _ckpt(tmp_path / n, float(i))
    assert pick_rank_file(tmp_path, **kwargs) == tmp_path / chosen


@pytest.mark.parametrize(
    "names,kwargs,error,message",
    [
        (["a-1_1.ckpt", "b-1_1.ckpt"], {}, LayoutMismatchError,
         "holds a-1_1.ckpt and b-1_1.ckpt for the same step; pick one with --prefix"),
        (["net-1_5.ckpt", "net-1_5_breakpoint.ckpt"], {}, LayoutMismatchError, "for the same step"),
        (["best.ckpt", "net-1_1.ckpt"], {}, LayoutMismatchError, "not all are named <prefix>-<epoch>_<step>.ckpt"),
        (["net-1_5.ckpt"], {"step": 7}, MissingRankError, "no .ckpt or .safetensors file with step 7 in"),
        (["net-1_5.ckpt"], {"prefix": "other"}, MissingRankError,
         "no .ckpt or .safetensors file with prefix 'other' in"),
    ],
    ids=["two-prefixes", "breakpoint-twin", "unnamed-file", "no-such-step", "no-such-prefix"],
)
def test_pick_rank_file_refuses(tmp_path, names, kwargs, error, message):
    for i, n in enumerate(names):
        _ckpt(tmp_path / n, float(i))
    with pytest.raises(error) as info:
        pick_rank_file(tmp_path, **kwargs)
    assert message in str(info.value) and str(tmp_path) in str(info.value)


def test_find_rank_files_applies_the_choice_to_every_rank(tmp_path):
    for r in range(2):
        _ckpt(tmp_path / f"rank_{r}" / "net-1_10.ckpt", 10.0 + r)
        _ckpt(tmp_path / f"rank_{r}" / "net-2_5.ckpt", 25.0 + r)
    files = find_rank_files(tmp_path)
    assert files == {r: tmp_path / f"rank_{r}" / "net-2_5.ckpt" for r in range(2)}
    older = find_rank_files(tmp_path, step=10)
    source = open_source(older, None, check_layout=False)  # each rank's marker differs
    entries = source.params["marker"].slices[0]
    pairs = zip(entries.ranks, entries.entries, strict=True)
    assert [float(read_entry(older[r], e)[0]) for r, e in pairs] == [10.0, 11.0]
