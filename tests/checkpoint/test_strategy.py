"""Strategy files -> layouts -> boxes, checked against MindSpore's own slicing and merging.

The oracles are ``mindspore.parallel._tensor`` (the functions ``transform_checkpoints`` slices
with) for the layout math, and ``mindspore.transform_checkpoints`` merging to one rank for the
end-to-end assembly: those tests are marked ``mindspore``. The rest read the session layouts
(byte-identical to MindSpore's save) and compare with their specs or hand-worked boxes.
"""
from __future__ import annotations

import shutil
from dataclasses import replace
from math import prod
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from test_layout import layout_of, layouts

import mindspore_fixtures as T
from box_checks import tiles_exactly
from ckptstore.boxes import Box
from ckptstore.checkpoint.layout import Layout
from ckptstore.checkpoint.source import find_rank_files, open_source
from ckptstore.checkpoint.strategy import Strategy, load_strategy
from ckptstore.errors import StrategyError
from ckptstore.formats.ckpt_reader import read_entry
from conftest import examples


def _mindspore_slice(dev, tmap, step, size, g: np.ndarray, rank: int) -> np.ndarray:
    """Rank ``rank``'s slice of ``g`` by MindSpore's functions (may be of an expanded shape)."""
    pytest.importorskip("mindspore")
    from mindspore.parallel._tensor import (
        _chunk_tensor_by_strategy,
        _construct_tensor_layout_for_opt_shard,
        _extract_layout_item,
        _get_tensor_slice_index,
        _get_tensor_strategy,
    )

    _, _, step, size = _extract_layout_item((list(dev), list(tmap), None, None, step, size))
    nd, nm, nshape = _construct_tensor_layout_for_opt_shard(list(dev), list(tmap), step, int(size), list(g.shape))
    strat = _get_tensor_strategy(nd, nm)
    idx = _get_tensor_slice_index(nd, strat, nm, rank)
    return _chunk_tensor_by_strategy(g.reshape(nshape), strat)[int(idx)]


@pytest.mark.mindspore
@settings(max_examples=examples(400), deadline=None)
@given(layouts())
def test_layout_box_selects_what_mindspore_slices_for_every_rank(case):
    dev, tmap, step, size, shape = case
    g = np.arange(prod(shape), dtype=np.int64).reshape(shape)
    layout = layout_of(dev, tmap, step, size)
    try:
        _mindspore_slice(dev, tmap, step, size, g, 0)
    except ValueError:
        # MindSpore cannot place this optimizer shard size on the repeated device axes; nor can we
        with pytest.raises(StrategyError, match="optimizer shard size"):
            layout.box(0, shape)
        return
    for rank in range(prod(dev)):
        want = _mindspore_slice(dev, tmap, step, size, g, rank)
        box = layout.box(rank, shape)
        assert np.array_equal(g[box.slices()].ravel(), np.ravel(want)), (rank, box)


# ---- reading strategy files --------------------------------------------------------------------

def _expected_strategy(kind: str, fmt: str = "protobuf") -> tuple[dict, int, int]:
    """The layouts ``layout_specs(kind)`` asks for (dev matrices without 1s), by stage; the JSON
    form also declares each parameter's global shape (``tensor_shape``)."""
    specs, world, stages = T.layout_specs(kind)
    layouts: dict[str, dict[int, Layout]] = {}
    for s in map(T.normalize_spec, specs):
        if s.in_strategy:
            on = range(stages) if s.stage == -1 else [s.stage]
            layout = replace(layout_of(s.dev_matrix, s.tensor_map, s.opt_shard_step, s.opt_shard_size),
                             tensor_shape=tuple(s.shape) if fmt == "json" else ())
            layouts[s.name] = {st_: layout for st_ in on}
    return layouts, world // stages, stages


def _essence(strategy: Strategy) -> tuple[dict, int, int]:
    return ({n: dict(st_) for n, st_ in strategy.layouts.items()}, strategy.stage_devices, strategy.num_stages)


@pytest.mark.parametrize("fmt", ["protobuf", "json"])
@pytest.mark.parametrize("kind", T.LAYOUT_KINDS)
def test_load_strategy_reads_the_layouts_the_compiler_wrote(saved_layout, kind, fmt):
    layout = saved_layout(kind, fmt)
    strategy = load_strategy(layout.strategy_files)
    assert _essence(strategy) == _expected_strategy(kind, fmt)
    assert strategy.world_size == layout.world
    assert strategy.sources == tuple(str(p) for p in layout.strategy_files)


def _merged(files: list[Path], workdir: Path) -> Path:
    """``mindspore.parallel.merge_pipeline_strategys`` of per-stage files (it globs a folder)."""
    ms = pytest.importorskip("mindspore")
    ext = files[0].suffix
    src = workdir / "stages"
    src.mkdir()
    for i, f in enumerate(files):
        shutil.copyfile(f, src / f"stage{i}{ext}")
    merged = workdir / f"merged{ext}"
    ms.parallel.merge_pipeline_strategys(str(src), str(merged))
    return merged


@pytest.mark.mindspore
@pytest.mark.parametrize("fmt", ["protobuf", "json"])
def test_merged_pipeline_strategy_equals_the_per_stage_files(saved_layout, tmp_path, fmt):
    layout = saved_layout("pipeline2", fmt)
    merged = _merged(layout.strategy_files, tmp_path)
    from_merged = load_strategy(merged)
    assert (_essence(from_merged) == _essence(load_strategy(layout.strategy_files))
            == _expected_strategy("pipeline2", fmt))
    assert (from_merged.world_size, from_merged.num_stages) == (8, 2)


def test_per_stage_files_can_be_given_in_any_order(saved_layout):
    files = saved_layout("pipeline2").strategy_files
    assert _essence(load_strategy(files[::-1])) == _essence(load_strategy(files))


def test_pipeline_strategy_places_each_parameter_on_its_stage_ranks(saved_layout):
    strategy = load_strategy(saved_layout("pipeline2").strategy_files)
    assert strategy.ranks_holding("embedding.table") == [0, 1, 2, 3]
    assert strategy.ranks_holding("head.w") == [4, 5, 6, 7]
    assert strategy.box("head.w", 2, (8, 16)) is None
    # layer1.w on stage 1: cols by 2, optimizer shard of 2 on rows; global rank 6 is stage rank 2
    assert strategy.box("layer1.w", 6, (16, 16)) == Box((8, 0), (16, 8))


@pytest.mark.parametrize(
    "content,message",
    [
        (b"this is not a strategy file", "is not a MindSpore strategy file"),
        (b"", "holds no parameter layouts"),
        (None, "holds no parameter layouts"),  # a checkpoint file given as the strategy
    ],
    ids=["text", "empty", "checkpoint"],
)
def test_a_file_that_is_not_a_strategy_is_refused_naming_it(saved_layout, tmp_path, content, message):
    path = tmp_path / "strategy.ckpt"
    path.write_bytes(saved_layout("dp2_mp4").rank_file(0).read_bytes() if content is None else content)
    with pytest.raises(StrategyError) as info:
        load_strategy(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_two_files_of_one_stage_that_agree_are_one_stage(saved_layout, tmp_path):
    # MindFormers saves one strategy file per rank: every rank of a stage writes the same layouts
    stage0, stage1 = saved_layout("pipeline2").strategy_files
    copy = tmp_path / "copy_of_stage0.ckpt"
    shutil.copyfile(stage0, copy)
    assert load_strategy([stage0, copy, stage1]).layouts == load_strategy([stage0, stage1]).layouts


def test_two_files_of_one_stage_that_disagree_are_refused_naming_both_and_the_parameter(saved_layout, tmp_path):
    layout = saved_layout("pipeline2")
    stage0 = layout.strategy_files[0]
    specs = [replace(s, tensor_map=(-1, 0)) if s.name == "layer0.w" else s for s in layout.specs]
    other = T.write_strategy(tmp_path / "other_stage0.ckpt", specs, stage=0, writer="ckptstore")
    with pytest.raises(StrategyError) as info:
        load_strategy([stage0, other])
    assert str(info.value) == (f"strategy files {stage0} and {other} are both for pipeline stage 0 but disagree on "
                               "parameter 'layer0.w': device matrix [2, 2], tensor map [0, -1] in the first, device "
                               "matrix [2, 2], tensor map [-1, 0] in the second; are they from one job?")


def test_a_missing_pipeline_stage_is_refused_naming_the_files(saved_layout):
    stage1 = saved_layout("pipeline2").strategy_files[1]
    with pytest.raises(StrategyError) as info:
        load_strategy([stage1])
    assert str(info.value) == (f"the strategy ({stage1}) has pipeline stages [1]; every stage from 0 to 1 is "
                               "needed (pass each stage's strategy file)")


# ---- end to end: ckptstore assembles what MindSpore merges -------------------------------------

def _assemble(source, name: str) -> np.ndarray:
    """A parameter's global tensor from the rank files, by ckptstore alone."""
    param = source.params[name]
    out = np.empty(param.shape, dtype=param.dtype)
    for sl in param.slices:
        out[sl.box.slices()] = read_entry(source.rank_files[sl.rank], sl.entry)
    return out


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.mindspore
@pytest.mark.parametrize("kind", T.LAYOUT_KINDS)
def test_assembled_tensors_equal_mindspore_merge_bit_for_bit(saved_layout, tmp_path, kind):
    layout = saved_layout(kind)
    source = open_source(find_rank_files(layout.root), load_strategy(layout.strategy_files))
    merged_dir = T.transform_oracle(layout.root, layout.strategy_arg, None, tmp_path / "merged")
    merged = T.load_oracle(merged_dir / "rank_0" / "oracle_0.ckpt")
    assert set(source.params) == set(merged) == set(layout.tensors) | {"epoch_num", "step_num"}
    for name in source.params:
        got = _assemble(source, name)
        assert _same(got, merged[name]), name
        if name in layout.tensors:
            assert _same(got, layout.tensors[name]), name


@pytest.mark.parametrize("kind", T.LAYOUT_KINDS)
def test_slices_tile_each_parameter_and_replicas_hold_identical_bytes(saved_layout, kind):
    layout = saved_layout(kind)
    source = open_source(find_rank_files(layout.root), load_strategy(layout.strategy_files))
    for name, param in source.params.items():
        assert tiles_exactly([sl.box for sl in param.slices], param.shape), name
        assert len({sl.box for sl in param.slices}) == len(param.slices), name
        for sl in param.slices:
            first = read_entry(source.rank_files[sl.ranks[0]], sl.entries[0])
            for rank, entry in zip(sl.ranks[1:], sl.entries[1:], strict=True):
                assert _same(read_entry(source.rank_files[rank], entry), first), (name, rank)


ALL8 = tuple(range(8))
#: (kind, parameter, its distinct slices as (start, stop, ranks)), worked out by hand with the
#: MINDSPORE_FACTS.md formula.
REPLICA_GROUPS = [
    ("dp2_mp4", "embedding.table", [((0, 0), (40, 16), ALL8)]),
    ("dp2_mp4", "layer0.w", [((0, 0), (8, 16), (0, 4)), ((8, 0), (16, 16), (1, 5)),
                             ((16, 0), (24, 16), (2, 6)), ((24, 0), (32, 16), (3, 7))]),
    ("dp2_mp4", "moe.w", [((2 * (r // 4), 0, 2 * (r % 4)), (2 * (r // 4) + 2, 8, 2 * (r % 4) + 2), (r,))
                          for r in range(8)]),
    ("dp2_mp4", "global_step", [((0,), (1,), ALL8)]),
    ("dp2_mp4", "learning_rate", [((), (), ALL8)]),
    ("opt_shard", "layer0.w", sorted(((8 * (r % 4) + 4 * (r // 4), 0), (8 * (r % 4) + 4 * (r // 4) + 4, 16), (r,))
                                     for r in range(8))),
    ("opt_shard", "embedding.table", [((0, 0), (32, 16), (0, 2, 4, 6)), ((32, 0), (64, 16), (1, 3, 5, 7))]),
    ("opt_shard", "layer2.w", [((0, 0), (8, 4), (0, 4)), ((0, 4), (8, 8), (1, 5)),
                               ((8, 0), (16, 4), (2, 6)), ((8, 4), (16, 8), (3, 7))]),
    ("opt_shard", "small.bias", [((0,), (16,), ALL8)]),
    ("pipeline2", "embedding.table", [((0, 0), (40, 16), (0, 1, 2, 3))]),
    ("pipeline2", "head.w", [((0, 0), (8, 16), (4, 5, 6, 7))]),
    ("pipeline2", "layer1.w", [((0, 0), (8, 8), (4,)), ((0, 8), (8, 16), (5,)),
                               ((8, 0), (16, 8), (6,)), ((8, 8), (16, 16), (7,))]),
    ("pipeline2", "global_step", [((0,), (1,), ALL8)]),
]


@pytest.mark.parametrize("kind,name,slices", REPLICA_GROUPS, ids=[f"{k}-{n}" for k, n, _ in REPLICA_GROUPS])
def test_replica_groups_are_each_distinct_box_and_the_ranks_holding_it(saved_layout, kind, name, slices):
    layout = saved_layout(kind)
    source = open_source(find_rank_files(layout.root), load_strategy(layout.strategy_files))
    got = [(sl.box.start, sl.box.stop, sl.ranks) for sl in source.params[name].slices]
    assert got == slices


def _strategy_with(tmp_path: Path, *, split_shape: list[int], field: int) -> Path:
    pb2 = T.strategy_pb2()
    smap = pb2.ParallelStrategyMap()
    smap.current_stage = 1
    item = smap.parallel_layout_item.add()
    item.param_name = "embedding.table"
    lay = item.parallel_layouts
    lay.dev_matrix.add().dim.extend([4])
    lay.tensor_map.add().dim.extend([0, -1])
    lay.param_split_shape.add().dim.extend(split_shape)
    lay.indices_offset.add().dim.extend([0] * len(split_shape))
    lay.field = field
    lay.opt_weight_shard_step = 0
    lay.opt_weight_shard_size = 0
    path = tmp_path / "strategy.ckpt"
    path.write_bytes(smap.SerializeToString())
    return path


@pytest.mark.mindspore
def test_an_uneven_split_is_refused_naming_file_and_parameter(tmp_path):
    path = _strategy_with(tmp_path, split_shape=[3, 3, 2, 2], field=0)
    with pytest.raises(StrategyError, match=r"'embedding.table' is split manually into uneven slices "
                                            r"\(param_split_shape \[3, 3, 2, 2\]") as e:
        load_strategy(path)
    assert str(path) in str(e.value)


@pytest.mark.mindspore
def test_a_field_split_embedding_is_refused(tmp_path):
    with pytest.raises(StrategyError, match="field split"):
        load_strategy(_strategy_with(tmp_path, split_shape=[], field=2))
