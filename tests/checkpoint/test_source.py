"""Rank files + strategy -> global parameters: every disagreement is a named error.

Each test damages a private copy of a real fixture the way it happens in practice (a rank folder
not copied, one rank re-saved as ``mindspore.save_checkpoint`` would with a parameter missing or of the
wrong shape, the strategy of another job) and checks the error names the file, rank and parameter.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from ckptstore.checkpoint.source import find_rank_files, open_source
from ckptstore.checkpoint.strategy import load_strategy
from ckptstore.errors import LayoutMismatchError, MissingRankError
from ckptstore.formats.ckpt_writer import CheckpointWriter
from ckptstore.testing.sample_checkpoint import formula_rank_slice


@pytest.fixture
def dp2_mp4(private_layout):
    """A private copy of the dp2_mp4 fixture (8 ranks, dev matrix [2, 4])."""
    return private_layout("dp2_mp4")


def _resave(layout, rank: int, *, drop: str | None = None,
            override: dict[str, np.ndarray] | None = None, add: dict[str, np.ndarray] | None = None) -> Path:
    """Write ``rank``'s file again as ``mindspore.save_checkpoint`` would, changed as asked (by
    ckptstore's byte-identical CheckpointWriter, slices by the formula the session layouts are
    proven to share with MindSpore: tests/testing/test_pure_fixtures.py)."""
    override = override or {}
    per_stage = layout.world // layout.stages
    stage, local = divmod(rank, per_stage)
    items = []
    for spec in layout.specs:
        if spec.name == drop or spec.stage not in (-1, stage):
            continue
        data = override.get(spec.name)
        if data is None:
            data = formula_rank_slice(spec, layout.tensors[spec.name], local)
        items.append((spec.name, data))
    items += list((add or {}).items())
    path = layout.rank_file(rank)
    with CheckpointWriter(path) as w:
        for name, data in items:
            w.add(name, np.asarray(data))
        w.add("epoch_num", np.array(1, np.int64))  # save_layout's append_dict
        w.add("step_num", np.array(1, np.int64))
    return path


def _open(layout, strategy_files=None):
    return open_source(find_rank_files(layout.root), load_strategy(strategy_files or layout.strategy_files))


def test_the_intact_fixture_opens(dp2_mp4):
    source = _open(dp2_mp4)
    assert source.world_size == 8
    assert source.params["layer0.w"].shape == (32, 16) and source.params["layer0.w"].in_strategy
    assert not source.params["global_step"].in_strategy


# ---- missing ranks -----------------------------------------------------------------------------

def test_a_missing_rank_folder_is_named(dp2_mp4):
    shutil.rmtree(dp2_mp4.root / "rank_3")
    with pytest.raises(MissingRankError) as info:
        find_rank_files(dp2_mp4.root)
    assert str(info.value) == f"{dp2_mp4.root} has rank folders up to rank_7 but rank_3 missing"


def test_several_missing_rank_folders_are_all_named(dp2_mp4):
    shutil.rmtree(dp2_mp4.root / "rank_3")
    shutil.rmtree(dp2_mp4.root / "rank_5")
    with pytest.raises(MissingRankError, match="but rank_3, rank_5 missing$"):
        find_rank_files(dp2_mp4.root)


def test_a_missing_last_rank_is_caught_by_the_strategy(dp2_mp4):
    shutil.rmtree(dp2_mp4.root / "rank_7")
    files = find_rank_files(dp2_mp4.root)
    assert sorted(files) == list(range(7))
    with pytest.raises(MissingRankError, match="^the strategy describes 8 ranks but 7 rank files were found"):
        open_source(files, load_strategy(dp2_mp4.strategy_files))


def test_a_strategy_of_another_world_size_is_refused(dp2_mp4, saved_layout):
    with pytest.raises(MissingRankError, match="^the strategy describes 4 ranks but 8 rank files were found"):
        _open(dp2_mp4, saved_layout("dp2_mp2").strategy_files)


def test_a_rank_folder_without_checkpoint_is_named(dp2_mp4):
    for f in (dp2_mp4.root / "rank_2").iterdir():
        f.unlink()
    with pytest.raises(MissingRankError) as info:
        find_rank_files(dp2_mp4.root)
    assert str(info.value) == f"no .ckpt or .safetensors file with any name in {dp2_mp4.root / 'rank_2'}"


# ---- rank files that disagree with the strategy or each other ----------------------------------

def test_a_rank_file_missing_a_replicated_parameter_names_parameter_file_and_rank(dp2_mp4):
    path = _resave(dp2_mp4, 2, drop="layer0.w")  # rank 6 holds the same rows; every other slice is on all
    with pytest.raises(LayoutMismatchError) as info:
        _open(dp2_mp4)
    assert str(info.value) == (f"parameter 'layer0.w' is missing from {path} (rank 2), though rank(s) 6 hold the "
                               "same slice and other replicated parameters are on every rank of their group (so "
                               "this is not a redundancy-free save). The file may be truncated or from another job")


def test_a_slice_no_rank_holds_names_the_parameter_and_the_ranks_that_should(dp2_mp4):
    for rank in (2, 6):
        _resave(dp2_mp4, rank, drop="layer0.w")
    with pytest.raises(LayoutMismatchError) as info:
        _open(dp2_mp4)
    assert str(info.value) == ("no rank holds the slice [16:24) x [0:16) of parameter 'layer0.w' (global shape "
                               "[32, 16]); ranks 2, 6 should have held it. Their files may be truncated or from "
                               "another job")


@pytest.mark.parametrize(
    "name,local,words",
    [
        ("layer0.w", np.zeros((4, 16), np.float32), "has local shape [8, 16]"),
        ("embedding.table", np.zeros((40, 8), np.float32), "has local shape [40, 16]"),
        ("layer0.w", np.zeros((8, 16, 1), np.float32), "tensor map [0, -1] has 2 axes"),
        ("moe.w", np.zeros((2, 8, 3), np.float32), "has local shape [2, 8, 2]"),
    ],
    ids=["fewer-rows", "replica-narrower", "extra-axis", "split-axis-wrong"],
)
def test_a_rank_file_with_a_wrong_shape_is_named(dp2_mp4, name, local, words):
    path = _resave(dp2_mp4, 2, override={name: local})
    with pytest.raises(LayoutMismatchError) as info:
        _open(dp2_mp4)
    message = str(info.value)
    assert f"parameter {name!r}" in message and words in message
    assert f"{path} (rank 2)" in message


def test_a_rank_file_with_another_dtype_is_named(dp2_mp4):
    spec = dp2_mp4.spec("layer0.w")
    local = formula_rank_slice(spec, dp2_mp4.tensors["layer0.w"], 2).astype(np.float16)
    path = _resave(dp2_mp4, 2, override={"layer0.w": local})
    with pytest.raises(LayoutMismatchError) as info:
        _open(dp2_mp4)
    assert str(info.value) == (f"parameter 'layer0.w' is Float32 in {dp2_mp4.rank_file(0)} (rank 0) but "
                               f"Float16 in {path} (rank 2)")


def test_a_parameter_outside_the_strategy_with_different_shapes_is_refused(dp2_mp4):
    path = _resave(dp2_mp4, 1, override={"global_step": np.zeros(2, np.int32)})
    with pytest.raises(LayoutMismatchError) as info:
        _open(dp2_mp4)
    assert str(info.value) == (
        f"parameter 'global_step' is not in the strategy, so it must be whole on every rank, but it has shape "
        f"[1] in {dp2_mp4.rank_file(0)} (rank 0) and [2] in {path} (rank 1); pass the strategy file that "
        "describes it")


def test_a_parameter_on_a_rank_outside_its_stage_is_refused(private_layout):
    layout = private_layout("pipeline2")
    path = _resave(layout, 0, add={"head.w": np.zeros((8, 16), np.float32)})
    with pytest.raises(LayoutMismatchError) as info:
        _open(layout)
    assert str(info.value) == (f"parameter 'head.w' is in {path} (rank 0) but the strategy places it only on "
                               "ranks 4..7; is the strategy file from this job?")


def test_without_a_strategy_whole_parameters_are_one_slice_held_by_every_rank(saved_layout):
    layout = saved_layout("dp2_mp4")
    files = {r: layout.rank_file(r) for r in (0, 4)}  # ranks 0 and 4 hold the same slices but of moe.w
    source = open_source(files, None, check_layout=False)
    param = source.params["layer0.w"]
    assert (param.shape, param.in_strategy, [sl.ranks for sl in param.slices]) == ((8, 16), False, [(0, 4)])


def test_without_a_strategy_ranks_holding_different_bytes_are_refused(saved_layout):
    layout = saved_layout("dp2_mp4")
    files = {r: layout.rank_file(r) for r in (0, 4)}  # moe.w is split on the dp axis: 0 and 4 differ
    with pytest.raises(LayoutMismatchError, match=r"parameter 'moe.w': no strategy was given, so every rank should "
                                                  r"hold the whole tensor, but rank 0 .* and rank 4 .* hold different "
                                                  r"bytes. Pass the strategy file"):
        open_source(files, None)
