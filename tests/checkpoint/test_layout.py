"""Layouts -> boxes, and strategy files refused before MindSpore is needed. Runs without MindSpore
(``make test-pure``); test_strategy.py checks the same layouts against MindSpore's own slicing
(``mindspore.parallel._tensor``) and reads strategy files the compiler's format wrote.
"""
from __future__ import annotations

from collections import Counter
from math import prod

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from box_checks import tiles_exactly
from ckptstore.boxes import Box
from ckptstore.checkpoint.layout import Layout
from ckptstore.checkpoint.strategy import load_strategy
from ckptstore.errors import StrategyError
from conftest import examples


def layout_of(dev, tmap, step=0, size=0) -> Layout:
    """The Layout of a compiler-style device matrix and tensor map (-1: axis not split)."""
    return Layout(tuple(dev), tuple(() if m == -1 else (m,) for m in tmap), step, size)


def compiler_step(dev: list[int], tmap: list[int]) -> int:
    """``opt_weight_shard_step`` as the compiler writes it: (g[-1]-g[0])/(len(g)-1) over rank 0's replicas."""
    n = len(dev)
    split_axes = {n - 1 - m for m in tmap if m != -1}
    replicas = [r for r in range(prod(dev)) if all(layout_of(dev, tmap).coordinates(r)[i] == 0 for i in split_axes)]
    return (replicas[-1] - replicas[0]) // (len(replicas) - 1)


@st.composite
def layouts(draw):
    """A device matrix (no 1s, as the compiler writes it), a tensor map, optimizer shard settings, a shape."""
    n = draw(st.integers(min_value=1, max_value=3))
    dev = [draw(st.sampled_from([2, 3, 4])) for _ in range(n)]
    ndim = draw(st.integers(min_value=1, max_value=3))
    free = list(range(n))
    tmap = []
    for _ in range(ndim):
        m = draw(st.sampled_from([-1] + free))
        if m != -1:
            free.remove(m)
        tmap.append(m)
    split = {n - 1 - m for m in tmap if m != -1}
    replicas = prod(d for i, d in enumerate(dev) if i not in split)
    step = size = 0
    if replicas > 1 and draw(st.booleans()):
        step = compiler_step(dev, tmap)
        size = draw(st.sampled_from([-1] + [z for z in range(2, replicas + 1) if replicas % z == 0]))
    parts0 = 1 if size == 0 else (replicas if size == -1 else size)
    shape = []
    for a, m in enumerate(tmap):
        k = 1 if m == -1 else dev[n - 1 - m]
        shape.append(k * draw(st.integers(min_value=1, max_value=2)) * (parts0 if a == 0 else 1))
    return dev, tmap, step, size, tuple(shape)


@settings(max_examples=examples(300), deadline=None)
@given(layouts())
def test_boxes_of_all_ranks_tile_the_tensor_and_are_equally_replicated(case):
    dev, tmap, step, size, shape = case
    layout = layout_of(dev, tmap, step, size)
    try:
        boxes = [layout.box(r, shape) for r in range(prod(dev))]
    except StrategyError:
        return  # covered by the MindSpore comparison in test_strategy.py
    holders = Counter(boxes)
    assert tiles_exactly(boxes, shape)
    assert len(set(holders.values())) == 1
    assert len(holders) == prod(layout.splits()) * layout.opt_shard_parts()
    assert layout.global_shape(boxes[0].shape) == shape


def test_worked_example_from_mindspore_facts():
    # G=[64,32], D=[2,4], M=[0,-1], s=4, z=-1, rank 5: c=(1,1); rows [16,32); Z=2, j=1 -> rows [24,32)
    layout = layout_of([2, 4], [0, -1], step=4, size=-1)
    assert layout.coordinates(5) == (1, 1)
    assert layout.opt_shard_parts() == 2
    assert layout.box(5, (64, 32)) == Box((24, 0), (32, 32))


def test_layout_rejects_an_uneven_split():
    with pytest.raises(StrategyError, match=r"axis 0 of shape \[6, 4\] cannot be split evenly into 4 parts"):
        layout_of([2, 4], [0, -1]).box(0, (6, 4))


@pytest.mark.parametrize(
    "text,message",
    [("{not json", "is not a valid JSON strategy"), ("{}", "holds no parameter layouts"),
     ('{"parallel_layout_item": {"w": {"tensor_map": [0]}}}', "is not a valid JSON strategy"),
     ('{"parallel_layout_item": {"w": {"dev_matrix": [2], "tensor_map": [1]}}}', "does not fit device matrix")],
    ids=["syntax", "empty-object", "no-dev-matrix", "map-out-of-range"],
)
def test_a_bad_json_strategy_is_refused_naming_it(tmp_path, text, message):
    path = tmp_path / "strategy.json"
    path.write_text(text)
    with pytest.raises(StrategyError) as info:
        load_strategy(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_no_strategy_file_is_refused():
    with pytest.raises(StrategyError, match="no strategy file given"):
        load_strategy([])


def test_a_strategy_folder_without_strategy_files_is_refused(tmp_path):
    (tmp_path / "strategy").mkdir()
    (tmp_path / "strategy" / "notes.txt").write_text("x")
    with pytest.raises(StrategyError) as info:
        load_strategy(tmp_path / "strategy")
    assert str(info.value) == f"strategy folder {tmp_path / 'strategy'} holds no .ckpt or .json strategy file"
