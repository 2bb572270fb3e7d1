"""Checkpoints as users really have them, each made by MindSpore and compared with MindSpore's answer.

* MindSpore safetensors rank files (``save_checkpoint(..., format="safetensors")``);
* redundancy-free saves (``remove_redundancy=True``: each replicated slice on one rank, chosen by
  MindSpore's own ``get_parameter_redundancy`` / ``remove_param_redundancy``), both formats;
* strategy files as MindFormers' ``save_strategy_file`` writes them (``param_split_shape`` = the
  local shape, no ``indices_offset``), as source and as target;
* a parameter shared by two pipeline stages in different layouts (PanGu-Alpha's tied embedding);
* rank files holding whole tensors (what ``integrated_save=True`` writes in a parallel job).

The oracle is ``mindspore.transform_checkpoints`` + ``load_checkpoint`` on the same model saved as
ordinary ``.ckpt`` files with every replica (MindSpore's transform reads neither
``remove_redundancy`` sets nor, on this machine, these safetensors sets).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")
pytestmark = pytest.mark.mindspore

import ckptstore
import mindspore_fixtures as T
from ckptstore.checkpoint.rank_files import scan_rank_file
from ckptstore.errors import LayoutMismatchError, ReplicaMismatchError
from convert_fixtures import assert_same_array, run_cli
from load_fixtures import assert_same_dict, to_numpy

KINDS = ["dp2_mp4", "opt_shard", "pipeline2"]


def _strategies(root: Path, stages: int) -> list[Path]:
    return [root / "strategy.ckpt"] if stages == 1 else [root / f"strategy_stage{s}.ckpt" for s in range(stages)]


def save(tmp_path: Path, kind: str, **options) -> tuple[Path, list[Path], dict[str, np.ndarray]]:
    """``layout_specs(kind)`` saved by MindSpore with ``options`` (fmt, remove_redundancy, integrated)."""
    specs, world, stages = T.layout_specs(kind)
    if options.get("fmt") == "safetensors":
        specs = [s for s in specs if s.dtype != "bfloat16"]  # MindSpore cannot under numpy 2 (see below)
    tensors = T.make_global_tensors(specs, seed=11)
    root = tmp_path / f"{kind}_{'_'.join(f'{k}={v}' for k, v in options.items())}"
    T.save_distributed(root, specs, tensors, world_size=world, stages=stages, extra_scalars=True, **options)
    return root, _strategies(root, stages), tensors


def _global(tensors: dict, extra=("epoch_num", "step_num")) -> dict[str, np.ndarray]:
    return {**{n: np.asarray(v) for n, v in tensors.items()}, **{n: np.asarray(1, np.int64) for n in extra}}


def _assert_store_has(store_path: Path, tensors: dict[str, np.ndarray]) -> None:
    with ckptstore.open(store_path) as store:
        assert sorted(store.names()) == sorted(tensors)
        for name, value in tensors.items():
            assert_same_array(store.read(name), value, name)


# ---- MindSpore safetensors rank files ------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_safetensors_rank_files_convert_to_the_global_tensors(tmp_path, kind):
    root, strategies, tensors = save(tmp_path, kind, fmt="safetensors")
    assert sorted(p.name for p in (root / "rank_0").iterdir()) == ["net-1_1.safetensors"]
    ckptstore.convert(root, tmp_path / "s", strategy=strategies)
    _assert_store_has(tmp_path / "s", _global(tensors))
    assert ckptstore.verify(ckptstore.open(tmp_path / "s"), against=root, strategy=strategies).ok


def test_a_safetensors_rank_file_is_indexed_from_its_header_like_a_ckpt(tmp_path):
    root, _, _ = save(tmp_path, "dp2_mp4", fmt="safetensors")
    ckpt_root, _, _ = save(tmp_path, "dp2_mp4")
    st = scan_rank_file(root / "rank_5" / "net-1_1.safetensors")
    ck = scan_rank_file(ckpt_root / "rank_5" / "net-1_1.ckpt")
    assert {n: (e.tensor_type, e.shape, e.nbytes) for n, e in st.entries.items()} == \
        {n: (e.tensor_type, e.shape, e.nbytes) for n, e in ck.entries.items()}
    r = run_cli("info", root / "rank_5" / "net-1_1.safetensors", "--json")
    assert r.returncode == 0, r.stderr
    import json

    assert json.loads(r.stdout)["params"]["layer0.w"] == {"dtype": "float32", "shape": [8, 16], "nbytes": 512}


def test_a_single_safetensors_file_converts_without_a_strategy(tmp_path):
    root, _, _ = save(tmp_path, "dp2_mp4", fmt="safetensors")
    single = root / "rank_3" / "net-1_1.safetensors"
    ckptstore.convert(single, tmp_path / "s")
    with ckptstore.open(tmp_path / "s") as store:
        index = scan_rank_file(single)
        for name, entry in index.entries.items():
            assert store.info(name).shape == entry.shape


def test_load_rank_from_safetensors_rank_files_equals_mindspore(load_env, tmp_path):
    t = load_env.target("dp2_mp4->dp2_mp2")  # the same model saved as .ckpt, and MindSpore's transform of it
    specs = [s for s in t.layout.specs]
    T.save_distributed(tmp_path / "st", specs, t.layout.tensors, world_size=8, extra_scalars=True, fmt="safetensors")
    ckptstore.convert(tmp_path / "st", tmp_path / "s", strategy=[tmp_path / "st" / "strategy.ckpt"])
    for rank in range(4):
        params = ckptstore.load_rank(tmp_path / "s", t.strategy, rank)
        assert_same_dict({n: to_numpy(v) for n, v in params.items()}, t.oracle(rank), f"rank {rank}")


def test_a_step_saved_in_both_formats_is_refused_saying_how_to_choose(tmp_path):
    root, strategies, tensors = save(tmp_path, "dp2_mp4")
    other, _, _ = save(tmp_path, "dp2_mp4", fmt="safetensors")
    for r in range(8):
        shutil.copy(other / f"rank_{r}" / "net-1_1.safetensors", root / f"rank_{r}")
    said = (r"holds net-1_1.ckpt and net-1_1.safetensors for the same step; "
            r"pick the format with --src-format ckpt or --src-format safetensors")
    with pytest.raises(LayoutMismatchError, match=said):
        ckptstore.convert(root, tmp_path / "s", strategy=strategies)
    for fmt in ("ckpt", "safetensors"):
        r = run_cli("convert", root, "-s", strategies[0], "--out", tmp_path / fmt, "--src-format", fmt, "-q")
        assert r.returncode == 0, r.stderr
        with ckptstore.open(tmp_path / fmt) as store:
            assert_same_array(store.read("layer0.w"), tensors["layer0.w"], fmt)


# ---- redundancy-free saves -----------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_redundancy_free_save_converts_every_slice_from_the_rank_that_kept_it(tmp_path, kind, fmt):
    root, strategies, tensors = save(tmp_path, kind, fmt=fmt, remove_redundancy=True)
    names = [set(scan_rank_file(next((root / f"rank_{r}").iterdir())).entries) for r in range(8)]
    assert len(set(map(frozenset, names))) > 1  # ranks really hold different parameter sets
    ckptstore.convert(root, tmp_path / "s", strategy=strategies)
    _assert_store_has(tmp_path / "s", _global(tensors))


def test_a_redundancy_free_save_loads_like_the_full_save_transformed_by_mindspore(load_env, tmp_path):
    t = load_env.target("opt_shard->dp2_mp2_optshard")
    T.save_distributed(tmp_path / "rr", t.layout.specs, t.layout.tensors, world_size=8, extra_scalars=True,
                       remove_redundancy=True)
    ckptstore.convert(tmp_path / "rr", tmp_path / "s", strategy=[tmp_path / "rr" / "strategy.ckpt"])
    for rank in range(4):
        params = ckptstore.load_rank(tmp_path / "s", t.strategy, rank)
        assert_same_dict({n: to_numpy(v) for n, v in params.items()}, t.oracle(rank), f"rank {rank}")


def test_a_slice_that_no_rank_kept_names_the_parameter_and_its_ranks(tmp_path):
    root, strategies, _ = save(tmp_path, "dp2_mp4", remove_redundancy=True)
    holder = next(r for r in range(8) if "layer1.w" in scan_rank_file(root / f"rank_{r}" / "net-1_1.ckpt").entries)
    import mindspore as ms

    path = root / f"rank_{holder}" / "net-1_1.ckpt"
    kept = {n: p for n, p in ms.load_checkpoint(str(path)).items() if n != "layer1.w"}
    path.chmod(0o644)
    ms.save_checkpoint([{"name": n, "data": p} for n, p in kept.items()], str(path))
    with pytest.raises(LayoutMismatchError, match=rf"no rank holds the slice .* of parameter 'layer1.w' .*ranks "
                                                  rf".*{holder}.* should have held it"):
        ckptstore.convert(root, tmp_path / "s", strategy=strategies)


# ---- MindFormers strategy files ------------------------------------------------------------------

def test_a_mindformers_strategy_describes_the_source(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    strategy = T.write_mindformers_strategy(tmp_path / "mf.ckpt", layout.specs)
    ckptstore.convert(layout.root, tmp_path / "s", strategy=[strategy])
    _assert_store_has(tmp_path / "s", _global(layout.tensors))


def test_a_mindformers_target_strategy_loads_what_mindspore_transforms(saved_layout, tmp_path):
    from load_fixtures import relayout

    layout = saved_layout("dp2_mp4")
    target = T.write_mindformers_strategy(tmp_path / "mf_target.ckpt", relayout(layout.specs, (2, 2)))
    oracle = T.transform_oracle(layout.root, layout.strategy_arg, target, tmp_path / "oracle")
    ckptstore.convert(layout.root, tmp_path / "s", strategy=layout.strategy_files)
    for rank in range(4):
        expected = T.load_oracle(oracle / f"rank_{rank}" / f"oracle_{rank}.ckpt")
        params = ckptstore.load_rank(tmp_path / "s", target, rank)
        assert_same_dict({n: to_numpy(v) for n, v in params.items()}, expected, f"rank {rank}")


def test_a_declared_local_shape_that_contradicts_the_split_is_refused(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    good = T.write_mindformers_strategy(tmp_path / "mf.ckpt", layout.specs)
    import mindspore as ms

    smap = ms.train.node_strategy_pb2.ParallelStrategyMap()
    smap.ParseFromString(good.read_bytes())
    item = next(i for i in smap.parallel_layout_item if i.param_name == "layer0.w")
    del item.parallel_layouts.param_split_shape[:]
    item.parallel_layouts.param_split_shape.add().dim.extend([4, 16])  # the real slices are [8, 16]
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(smap.SerializeToString())
    with pytest.raises(LayoutMismatchError, match=r"parameter 'layer0.w'.*declares slices of shape \[4, 16\]"):
        ckptstore.convert(layout.root, tmp_path / "s", strategy=[bad])


# ---- a parameter shared by two pipeline stages in different layouts ------------------------------

@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    specs, world, stages = T.tied_pipeline_specs()
    tensors = T.make_global_tensors(list({s.name: s for s in specs}.values()), seed=2)
    root = tmp_path_factory.mktemp("tied")
    T.save_distributed(root, specs, tensors, world_size=world, stages=stages, extra_scalars=True)
    strategies = _strategies(root, stages)
    store = root.parent / "tied.zarr"
    ckptstore.convert(root, store, strategy=strategies)
    return root, strategies, tensors, store


def test_a_tied_embedding_is_stored_once_with_its_global_shape(tied):
    root, _, tensors, store = tied
    with ckptstore.open(store) as s:
        info = s.info("word_embedding")
        assert info.shape == (32, 8) and len(info.chunks) == 1  # the whole copy of stage 0, once
        assert_same_array(s.read("word_embedding"), tensors["word_embedding"], "word_embedding")


@pytest.mark.parametrize("target", ["source", "one_rank"])
def test_a_tied_embedding_loads_what_mindspore_transforms(tied, tmp_path, target):
    root, strategies, _, store = tied
    dst = strategies if target == "source" else None
    oracle = T.transform_oracle(root, strategies, dst, tmp_path / "oracle")
    for rank in range(4 if target == "source" else 1):
        expected = T.load_oracle(oracle / f"rank_{rank}" / f"oracle_{rank}.ckpt")
        whole = ckptstore.checkpoint.strategy.Strategy({}, 1, 1)
        params = ckptstore.load_rank(store, strategies if target == "source" else whole, rank)
        assert_same_dict({n: to_numpy(v) for n, v in params.items()}, expected, f"{target} rank {rank}")


def test_a_tied_copy_that_differs_between_stages_is_refused(tied, tmp_path):
    root, strategies, tensors, _ = tied
    copy = tmp_path / "tied"
    shutil.copytree(root, copy)
    import mindspore as ms

    path = copy / "rank_3" / "net-1_1.ckpt"  # stage 1, rows 16..32 of the embedding
    values = {n: p for n, p in ms.load_checkpoint(str(path)).items()}
    values["word_embedding"] = ms.Tensor(np.asarray(values["word_embedding"].asnumpy()) + 1)
    path.chmod(0o644)
    ms.save_checkpoint([{"name": n, "data": p} for n, p in values.items()], str(path))
    with pytest.raises(ReplicaMismatchError, match=r"'word_embedding': rank 3 .* another pipeline stage's layout"):
        ckptstore.convert(copy, tmp_path / "s", strategy=[copy / p.name for p in strategies])


# ---- whole tensors on every rank (integrated_save) -----------------------------------------------

@pytest.mark.parametrize("kind", ["dp2_mp4", "opt_shard"])
def test_rank_files_of_whole_tensors_are_recognised_and_stored_whole(tmp_path, kind):
    root, strategies, tensors = save(tmp_path, kind, integrated=True)
    assert scan_rank_file(root / "rank_5" / "net-1_1.ckpt")["layer0.w"].shape == tensors["layer0.w"].shape
    ckptstore.convert(root, tmp_path / "s", strategy=strategies)
    _assert_store_has(tmp_path / "s", _global(tensors))
    with ckptstore.open(tmp_path / "s") as store:
        assert store.source["integrated_save"] is True


def test_whole_tensor_rank_files_load_the_source_layout_like_mindspore(load_env, tmp_path):
    t = load_env.target("dp2_mp4->same-none")  # MindSpore's transform of the sliced save to its own layout
    T.save_distributed(tmp_path / "whole", t.layout.specs, t.layout.tensors, world_size=8, extra_scalars=True,
                       integrated=True)
    ckptstore.convert(tmp_path / "whole", tmp_path / "s", strategy=[tmp_path / "whole" / "strategy.ckpt"])
    for rank in (0, 5):
        params = ckptstore.load_rank(tmp_path / "s", None, rank)
        assert_same_dict({n: to_numpy(v) for n, v in params.items()}, t.oracle(rank), f"rank {rank}")
