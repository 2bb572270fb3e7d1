"""Which strategy describes which files, and what is done with one that does not (issues 17, 19).

* a part of a conversion with another strategy does not join a half-written store (17.16);
* MindFormers' filtered saves: parameters the strategy lists but no rank file holds (17.17);
* MindFormers' strategy folders: one strategy file per rank, several per stage (17.18);
* the wrong model's strategy as a load target (19.4);
* rank files of another layout with the same world size (19.8).

Every checkpoint here is what ``mindspore.save_checkpoint`` writes and every strategy is in the
compiler's (or MindFormers') format, through :mod:`mindspore_fixtures`: written by ckptstore's
byte-identical writers (tests/testing/test_pure_fixtures.py), except the tests marked ``mindspore``.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from functools import partial

import numpy as np
import pytest

import ckptstore
import mindspore_fixtures as T
from ckptstore.checkpoint.strategy import load_strategy
from ckptstore.errors import (
    ForeignStrategyError,
    LayoutMismatchError,
    StoreExistsError,
    StrategyError,
)
from ckptstore.read.loader import rank_view
from convert_fixtures import rewrite_rank_file, run_cli

# MindSpore's bytes, written without MindSpore (the layouts here are in test_pure_fixtures.py's proof)
write_strategy = partial(T.write_strategy, writer="ckptstore")
save_distributed = partial(T.save_distributed, writer="ckptstore")

# ---- 17.16: the conversion's fingerprint covers the strategy -----------------------------------

def _moe_permuted(specs: list[T.ParamSpec]) -> list[T.ParamSpec]:
    """dp2_mp4's specs with ``moe.w`` ([4, 8, 8], dev [2, 4], map [1, -1, 0]) on dev [4, 2], map [0, -1, 1]:
    the same slice shapes on the same ranks, but rank r holds another slice (axis 0 part r % 2
    instead of r // 4). No slice of ``moe.w`` is replicated, so the files cannot tell."""
    return [replace(s, dev_matrix=(4, 2), tensor_map=(0, -1, 1)) if s.name == "moe.w" else s for s in specs]


def test_a_part_with_another_strategy_is_refused_by_a_half_written_store(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    other = write_strategy(tmp_path / "other_strategy.ckpt", _moe_permuted(layout.specs))
    out = tmp_path / "s.zarr"
    first = ckptstore.convert(layout.root, out, strategy=layout.strategy_files, part="0/2")
    assert not first.committed
    with pytest.raises(StoreExistsError) as info:
        ckptstore.convert(layout.root, out, strategy=[other], part="1/2")
    assert str(info.value) == (f"{out} holds an unfinished conversion of other files or options; rerun that command "
                               "to finish it, or pass --overwrite to start again")


def test_the_other_strategy_alone_is_accepted_and_makes_another_tensor(saved_layout, tmp_path):
    # what the refusal above prevents: a store mixing two layouts' moe.w
    layout = saved_layout("dp2_mp4")
    other = write_strategy(tmp_path / "other_strategy.ckpt", _moe_permuted(layout.specs))
    ckptstore.convert(layout.root, tmp_path / "a.zarr", strategy=layout.strategy_files)
    ckptstore.convert(layout.root, tmp_path / "b.zarr", strategy=[other])
    with ckptstore.open(tmp_path / "a.zarr") as a, ckptstore.open(tmp_path / "b.zarr") as b:
        assert np.array_equal(a.read("moe.w"), layout.tensors["moe.w"])
        assert not np.array_equal(b.read("moe.w"), layout.tensors["moe.w"])
        assert np.array_equal(b.read("layer0.w"), layout.tensors["layer0.w"])


def test_the_same_strategy_resumes_the_other_part(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    out = tmp_path / "s.zarr"
    ckptstore.convert(layout.root, out, strategy=layout.strategy_files, part="0/2")
    second = ckptstore.convert(layout.root, out, strategy=layout.strategy_files, part="1/2")
    assert second.committed
    with ckptstore.open(out) as store:
        assert np.array_equal(store.read("moe.w"), layout.tensors["moe.w"])


# ---- 17.18: MindFormers' strategy folders --------------------------------------------------------

def _mindformers_folder(layout, folder):
    """``folder/ckpt_strategy_rank_<r>.ckpt`` for every rank, as MindFormers saves them: each rank
    writes the strategy of its own pipeline stage."""
    per_stage = layout.world // layout.stages
    for rank in range(layout.world):
        write_strategy(folder / f"ckpt_strategy_rank_{rank}.ckpt", layout.specs, stage=rank // per_stage)
    return folder


def test_a_strategy_folder_reads_as_its_files_one_per_rank_several_per_stage(saved_layout, tmp_path):
    layout = saved_layout("pipeline2")
    folder = _mindformers_folder(layout, tmp_path / "strategy")
    strategy = load_strategy(folder)
    assert strategy.layouts == load_strategy(layout.strategy_files).layouts
    assert (strategy.num_stages, strategy.stage_devices) == (2, 4)
    assert strategy.sources == tuple(str(folder / f"ckpt_strategy_rank_{r}.ckpt") for r in range(8))


def test_convert_takes_a_strategy_folder(saved_layout, tmp_path):
    layout = saved_layout("pipeline2")
    folder = _mindformers_folder(layout, tmp_path / "strategy")
    r = run_cli("convert", layout.root, "-s", folder, "--out", tmp_path / "s.zarr", "-q")
    assert r.returncode == 0, r.stderr
    with ckptstore.open(tmp_path / "s.zarr") as store:
        for name in ("layer0.w", "layer1.w", "adam_m.layer1.w", "head.w"):
            assert np.array_equal(store.read(name), layout.tensors[name]), name


def test_the_api_takes_a_strategy_folder(saved_layout, tmp_path):
    layout = saved_layout("pipeline2")
    folder = _mindformers_folder(layout, tmp_path / "strategy")
    ckptstore.convert(layout.root, tmp_path / "s.zarr", strategy=str(folder))
    with ckptstore.open(tmp_path / "s.zarr") as store:
        assert np.array_equal(store.read("layer1.w"), layout.tensors["layer1.w"])


def test_info_describes_a_strategy_folder(saved_layout, tmp_path):
    layout = saved_layout("pipeline2")
    folder = _mindformers_folder(layout, tmp_path / "strategy")
    r = run_cli("info", folder, "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert (info["kind"], info["world_size"], info["num_stages"]) == ("strategy", 8, 2)
    assert info["paths"] == [str(folder / f"ckpt_strategy_rank_{r}.ckpt") for r in range(8)]


def test_a_rank_file_of_another_job_in_the_strategy_folder_is_refused_naming_both(saved_layout, tmp_path):
    layout = saved_layout("pipeline2")
    folder = _mindformers_folder(layout, tmp_path / "strategy")
    specs = [replace(s, tensor_map=(-1, 0)) if s.name == "layer0.w" else s for s in layout.specs]
    write_strategy(folder / "ckpt_strategy_rank_2.ckpt", specs, stage=0)
    r = run_cli("convert", layout.root, "-s", folder, "--out", tmp_path / "s.zarr", "-q")
    assert r.returncode == 2
    assert r.stderr == (f"ckptstore: error: strategy files {folder / 'ckpt_strategy_rank_0.ckpt'} and "
                        f"{folder / 'ckpt_strategy_rank_2.ckpt'} are both for pipeline stage 0 but disagree on "
                        "parameter 'layer0.w': device matrix [2, 2], tensor map [0, -1] in the first, device matrix "
                        "[2, 2], tensor map [-1, 0] in the second; are they from one job? [StrategyError]\n")
    assert not (tmp_path / "s.zarr").exists()


def test_a_strategy_folder_with_both_formats_is_refused(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    folder = tmp_path / "strategy"
    write_strategy(folder / "ckpt_strategy_rank_0.ckpt", layout.specs)
    T.write_strategy_json(folder / "ckpt_strategy_rank_1.json", layout.specs)
    with pytest.raises(StrategyError) as info:
        load_strategy(folder)
    assert str(info.value) == (f"strategy folder {folder} holds both .ckpt and .json files; pass the files of one "
                               "format (MindSpore's merge_pipeline_strategys refuses the mix too)")


# ---- 17.17: MindFormers' filtered saves ----------------------------------------------------------

#: What MindFormers' CheckpointMonitor leaves out of a save (its choice_func), laid out like dp2_mp4.
FILTERED = [
    T.ParamSpec("accu_grads.layer0.w", (32, 16), dev_matrix=(2, 4), tensor_map=(0, -1)),
    T.ParamSpec("layer0.key_cache", (4, 8, 16), dev_matrix=(2, 4), tensor_map=(-1, 0, -1)),
    T.ParamSpec("expert_load", (8,), dev_matrix=(2, 4), tensor_map=(-1,)),
]


@pytest.fixture(scope="module")
def filtered_save(tmp_path_factory, saved_layout):
    """dp2_mp4 saved without FILTERED, with the strategy the compiler wrote for all of them."""
    base = saved_layout("dp2_mp4")
    root = tmp_path_factory.mktemp("filtered")
    kept = list(base.specs)
    save_distributed(root, kept, base.tensors, world_size=8, extra_scalars=True)
    write_strategy(root / "strategy.ckpt", kept + FILTERED, stage=0)
    return root, base.tensors


def test_parameters_no_rank_file_holds_are_skipped_and_named(filtered_save, tmp_path):
    root, tensors = filtered_save
    summary = ckptstore.convert(root, tmp_path / "s.zarr", strategy=[root / "strategy.ckpt"])
    assert summary.unsaved == ("accu_grads.layer0.w", "layer0.key_cache", "expert_load")
    with ckptstore.open(tmp_path / "s.zarr") as store:
        assert not {s.name for s in FILTERED} & set(store.names())
        assert np.array_equal(store.read("layer0.w"), tensors["layer0.w"])
        assert store.source["unsaved"] == ["accu_grads.layer0.w", "layer0.key_cache", "expert_load"]


def test_an_index_skips_and_names_them_too(filtered_save, tmp_path):
    root, _ = filtered_save
    summary = ckptstore.index(root, tmp_path / "s.idx", strategy=[root / "strategy.ckpt"])
    assert summary.unsaved == ("accu_grads.layer0.w", "layer0.key_cache", "expert_load")


def test_exclude_applies_before_the_list_of_unsaved_parameters(filtered_save, tmp_path):
    root, _ = filtered_save
    summary = ckptstore.convert(root, tmp_path / "s.zarr", strategy=[root / "strategy.ckpt"],
                                exclude=["accu_grads.*"])
    assert summary.unsaved == ("layer0.key_cache", "expert_load")


def test_convert_and_info_print_the_unsaved_parameters(filtered_save, tmp_path):
    root, _ = filtered_save
    r = run_cli("convert", root, "-s", root / "strategy.ckpt", "--out", tmp_path / "s.zarr", "-q")
    assert r.returncode == 0, r.stderr
    line = ("not saved (the strategy lists them, no rank file holds them), so not stored: accu_grads.layer0.w, "
            "layer0.key_cache, expert_load")
    assert r.stdout.splitlines()[-1] == line
    r = run_cli("info", tmp_path / "s.zarr")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "  " + line


def test_a_strategy_with_its_rank_files_marks_what_was_not_saved(filtered_save):
    root, _ = filtered_save
    r = run_cli("info", root / "strategy.ckpt", "--ckpt-dir", root, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["unsaved"] == ["accu_grads.layer0.w", "layer0.key_cache", "expert_load"]


def test_a_parameter_some_of_its_ranks_lack_can_be_excluded(private_layout, tmp_path):
    # layer0.w missing from ranks 2 and 6 (both holders of rows 16..24) is an error
    # (test_source.py::test_a_slice_no_rank_holds_names_the_parameter_and_the_ranks_that_should);
    # --exclude drops it before that check
    layout = private_layout("dp2_mp4")
    for rank in (2, 6):
        rewrite_rank_file(layout.rank_file(rank), lambda arrays: {n: a for n, a in arrays.items() if n != "layer0.w"})
    with pytest.raises(LayoutMismatchError, match="no rank holds the slice"):
        ckptstore.convert(layout.root, tmp_path / "a.zarr", strategy=layout.strategy_files)
    summary = ckptstore.convert(layout.root, tmp_path / "b.zarr", strategy=layout.strategy_files,
                                exclude=["layer0.w"])
    assert summary.unsaved == ()
    with ckptstore.open(tmp_path / "b.zarr") as store:
        assert "layer0.w" not in store.names()
        assert np.array_equal(store.read("layer1.w"), layout.tensors["layer1.w"])


# ---- 19.4: the wrong model's strategy as a load target -------------------------------------------

#: Another model's strategy (4 ranks): none of its names is a dp2_mp4 parameter.
OTHER_MODEL = [
    T.ParamSpec("model.layers.0.wq.weight", (16, 16), dev_matrix=(4,), tensor_map=(0, -1)),
    T.ParamSpec("model.layers.0.wk.weight", (16, 16), dev_matrix=(4,), tensor_map=(0, -1)),
    T.ParamSpec("model.norm.weight", (16,), dev_matrix=(4,), tensor_map=(-1,)),
]


@pytest.fixture(scope="module")
def dp2_mp4_store(tmp_path_factory, saved_layout):
    layout = saved_layout("dp2_mp4")
    out = tmp_path_factory.mktemp("store") / "s.zarr"
    ckptstore.convert(layout.root, out, strategy=layout.strategy_files)
    return out, layout


def test_another_models_strategy_is_refused_naming_examples_on_both_sides(dp2_mp4_store, tmp_path):
    store, _ = dp2_mp4_store
    other = write_strategy(tmp_path / "other_model.ckpt", OTHER_MODEL)
    with pytest.raises(ForeignStrategyError) as info:
        ckptstore.load_rank(store, other, 3)
    assert str(info.value) == (
        f"the target strategy ({other}) describes 0 of the 11 parameters of the store {store} that it could split "
        "(optimizer state such as 'adam_m.w' counts with its weight 'w'; not described: 'embedding.table', "
        "'layer0.w', 'layer0.b'; it lays out 'model.layers.0.wq.weight', "
        "'model.layers.0.wk.weight', 'model.norm.weight' instead): is it another model's strategy? Parameters it "
        "does not lay out would be loaded whole on every rank; pass allow_whole=True (--allow-whole) if that is "
        "what you want")


def test_allow_whole_loads_whole_tensors_with_another_models_strategy(dp2_mp4_store, tmp_path):
    store, layout = dp2_mp4_store
    other = write_strategy(tmp_path / "other_model.ckpt", OTHER_MODEL)
    view = rank_view(ckptstore.open(store), str(other), 3, allow_whole=True)
    assert all(box is None for box in view.boxes.values())
    assert np.array_equal(view.read("layer0.w"), layout.tensors["layer0.w"])


def test_a_strategy_laying_out_almost_none_of_the_store_is_refused(dp2_mp4_store, tmp_path):
    store, layout = dp2_mp4_store
    one = write_strategy(tmp_path / "one.ckpt", [replace(s, dev_matrix=(2, 2)) for s in layout.specs
                                                   if s.name == "layer0.w"])  # with its two moments: 3
    with pytest.raises(ForeignStrategyError, match="describes 3 of the 11 parameters"):
        rank_view(ckptstore.open(store), str(one), 3)


def test_an_inference_strategy_of_the_same_model_is_taken_though_it_has_no_optimizer_state(dp2_mp4_store,
                                                                                            tmp_path):
    store, layout = dp2_mp4_store
    weights = [replace(s, dev_matrix=(2, 2)) for s in layout.specs if s.in_strategy and "adam" not in s.name]
    target = write_strategy(tmp_path / "inference.ckpt", weights)  # 7 of the 11; the 4 moments count as theirs
    view = rank_view(ckptstore.open(store), str(target), 3)
    assert view.boxes["layer0.w"] is not None and view.boxes["adam_m.layer0.w"] is None


@pytest.mark.mindspore
def test_export_refuses_another_models_strategy_unless_allowed(dp2_mp4_store, tmp_path):
    store, layout = dp2_mp4_store
    other = write_strategy(tmp_path / "other_model.ckpt", OTHER_MODEL)
    r = run_cli("export", store, tmp_path / "out", "-s", other)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert r.stderr.startswith(f"ckptstore: error: the target strategy ({other}) describes 0 of the 11 parameters")
    assert r.stderr.endswith("[ForeignStrategyError]\n")
    assert not (tmp_path / "out").exists()
    r = run_cli("export", store, tmp_path / "out", "-s", other, "--allow-whole", "--ranks", "2")
    assert r.returncode == 0, r.stderr
    exported = T.load_oracle(tmp_path / "out" / "rank_2" / "checkpoint_2.ckpt")
    assert np.array_equal(exported["layer0.w"], layout.tensors["layer0.w"])


# ---- 19.8: rank files of another layout with the same world size ---------------------------------

@pytest.fixture(scope="module")
def four_of_eight(tmp_path_factory):
    """Ranks 0-3 of the demo's 8-card job (dp 2 x mp 4, optimizer sharding: each weight's rows split
    by mp, then halved across the two replicas), and the 4-card (mp 4) layout of the same model."""
    from ckptstore.testing.sample import pangu_specs, relayout

    root = tmp_path_factory.mktemp("eight")
    specs = pangu_specs(hidden=32, layers=1, vocab=64, seq=8, dp=2, mp=4)
    tensors = T.make_global_tensors(specs, seed=3)
    save_distributed(root / "ckpt", specs, tensors, world_size=8)
    four = root / "four"
    for rank in range(4):
        shutil.copytree(root / "ckpt" / f"rank_{rank}", four / f"rank_{rank}")
    return four, relayout(specs, dp=1, mp=4), tensors


WEIGHT = "backbone.blocks.0.attention.dense1.weight"  # [32, 32]; each of ranks 0-3 holds 4 of its rows


def test_a_json_strategy_of_the_other_layout_is_refused_by_its_global_shapes(four_of_eight, tmp_path):
    four, target_specs, _ = four_of_eight
    strategy = T.write_strategy_json(tmp_path / "strategy_4cards.json", target_specs)
    with pytest.raises(LayoutMismatchError) as info:
        ckptstore.convert(four, tmp_path / "m.zarr", strategy=[strategy])
    assert str(info.value) == (
        f"parameter 'backbone.blocks.0.attention.dense1.weight': its slices in the rank files (shape [4, 32] in "
        f"{four / 'rank_0' / 'net-1_1.ckpt'}, rank 0) make a tensor of shape [16, 32] under the strategy's layout, "
        "but the strategy declares the global shape [32, 32] (tensor_shape). The rank files are of another layout "
        "or job (some ranks of a larger one?)")
    assert not (tmp_path / "m.zarr").exists()


@pytest.mark.mindspore
def test_a_mindformers_strategy_of_the_other_layout_is_refused_by_its_slice_shapes(four_of_eight, tmp_path):
    four, target_specs, _ = four_of_eight
    strategy = T.write_mindformers_strategy(tmp_path / "strategy_4cards.ckpt", target_specs)
    with pytest.raises(LayoutMismatchError, match=r"declares slices of shape \[8, 32\] \(param_split_shape\) but "
                                                  r"its device matrix and tensor map give \[4, 32\]"):
        ckptstore.convert(four, tmp_path / "m.zarr", strategy=[strategy])


def test_a_compiler_strategy_of_the_other_layout_cannot_be_told_apart(four_of_eight, tmp_path):
    # The documented limit (README, Limitations): the protobuf strategy the compiler writes declares
    # no global shape, and these files agree with it in every shape and sampled byte; they are
    # stored as the tensors of a model with half the rows.
    four, target_specs, tensors = four_of_eight
    strategy = write_strategy(tmp_path / "strategy_4cards.ckpt", target_specs)
    ckptstore.convert(four, tmp_path / "m.zarr", strategy=[strategy])
    with ckptstore.open(tmp_path / "m.zarr") as store:
        assert store.info(WEIGHT).shape == (16, 32)
        assert np.array_equal(store.read(WEIGHT)[:4], tensors[WEIGHT][:4])


def test_a_json_target_strategy_for_other_global_shapes_is_refused_by_load_rank(dp2_mp4_store, tmp_path):
    store, layout = dp2_mp4_store
    bigger = [replace(s, shape=(64, 16), dev_matrix=(2, 2)) if s.name == "layer0.w" else replace(s, dev_matrix=(2, 2))
              for s in layout.specs if s.in_strategy]
    target = T.write_strategy_json(tmp_path / "bigger.json", bigger)
    with pytest.raises(LayoutMismatchError) as info:
        rank_view(ckptstore.open(store), str(target), 0)
    assert str(info.value) == ("parameter 'layer0.w' (shape [32, 16] in the store) does not fit the target layout: "
                               "the strategy declares the global shape [64, 16] (tensor_shape)")


def test_whole_tensor_rank_files_with_a_json_strategy_are_still_recognised(saved_layout, tmp_path):
    # their slices give every split parameter a multiple of the declared shape: integrated_save, not another layout
    layout = saved_layout("dp2_mp4")
    save_distributed(tmp_path / "whole", layout.specs, layout.tensors, world_size=8, integrated=True,
                       strategy_format="json")
    ckptstore.convert(tmp_path / "whole", tmp_path / "s", strategy=[tmp_path / "whole" / "strategy.json"])
    with ckptstore.open(tmp_path / "s") as store:
        assert store.source["integrated_save"] is True
        assert np.array_equal(store.read("layer0.w"), layout.tensors["layer0.w"])
