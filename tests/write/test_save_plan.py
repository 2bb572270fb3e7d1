"""Which rank writes which chunk of a save (``ckptstore.write.save_plan``): properties over
layouts of one parameter, every rank's plan worked out as each rank of a job works out its own.

A layout here is MindSpore's: a device matrix ``(dp, mp)`` and a tensor map that splits the
rows, the columns or nothing by ``mp`` (``dp`` copies are replicas; without a split all
``dp * mp`` ranks hold the whole tensor).
"""
from __future__ import annotations

from math import prod

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore.checkpoint.layout import Layout
from ckptstore.checkpoint.strategy import Strategy
from ckptstore.store.zarr import array_path
from ckptstore.write.save_plan import SavePlan, plan_save
from conftest import examples

MAPS = {"rows": ((0,), ()), "cols": ((), (0,)), "none": ((), ())}


def plans(rows: int, cols: int, dp: int, mp: int, split: str, chunk_rows: int) -> tuple[list[SavePlan], Strategy]:
    layout = Layout((dp, mp), MAPS[split])
    strategy = Strategy({"w": {0: layout}}, dp * mp, 1)
    shape = (rows, cols)
    out = []
    for r in range(dp * mp):
        box = layout.box(r, shape)
        local = {"w": np.zeros(box.shape, np.float32)}
        out.append(plan_save(local, rank=r, world=dp * mp, strategy=strategy,
                             max_chunk_bytes=chunk_rows * box.shape[1] * 4))
    return out, strategy


layouts = st.tuples(st.integers(1, 47), st.integers(1, 6), st.integers(1, 4), st.integers(1, 3),
                    st.sampled_from(sorted(MAPS)), st.integers(1, 47)).filter(
    lambda t: (t[0] % t[3] == 0 if t[4] == "rows" else True) and (t[1] % t[3] == 0 if t[4] == "cols" else True))


@settings(max_examples=examples(200))
@given(layouts)
def test_every_chunk_is_written_by_exactly_one_rank(case):
    ranks, _ = plans(*case)
    p = ranks[0].params[0]
    written = sorted(c.index for plan in ranks for c in plan.params[0].chunks)
    assert written == list(range(prod(s // c for s, c in zip(p.shape, p.chunk_shape, strict=True))))


@settings(max_examples=examples(200))
@given(layouts)
def test_a_rank_writes_one_file_a_parameter_of_its_own_bytes_in_order(case):
    ranks, strategy = plans(*case)
    layout = strategy.layouts["w"][0]
    for r, plan in enumerate(ranks):
        p = plan.params[0]
        box = layout.box(r, p.shape)
        assert len({c.key for c in p.chunks}) <= 1
        at = 0
        for c in p.chunks:  # the file is the chunks in order, each the local bytes of its box
            assert c.byte_start == at
            within = tuple(a - b for a, b in zip(c.box.start, box.start, strict=True))
            assert all(0 <= w and w + n <= s for w, n, s in zip(within, c.box.shape, box.shape, strict=True))
            assert p.local_start + c.byte_start == (within[0] * box.shape[1] + within[1]) * 4
            at += c.nbytes


@settings(max_examples=examples(200))
@given(layouts)
def test_each_file_holds_the_chunks_of_its_shard_of_the_grid(case):
    ranks, _ = plans(*case)
    for plan in ranks:
        p = plan.params[0]
        cut = p.shard_shape or p.chunk_shape
        for c in p.chunks:
            shard = tuple(s // k for s, k in zip(c.box.start, cut, strict=True))
            assert c.key == f"{array_path('w')}/c." + ".".join(map(str, shard))
            assert all(s * k <= a and b <= min((s + 1) * k, n)
                       for s, k, a, b, n in zip(shard, cut, c.box.start, c.box.stop, p.shape, strict=True))


@settings(max_examples=examples(200))
@given(layouts)
def test_a_replicated_slice_of_several_chunks_is_split_among_its_replicas(case):
    rows, cols, dp, mp, split, _ = case
    ranks, _ = plans(*case)
    p = ranks[0].params[0]
    down = (rows // mp if split == "rows" else rows) // p.chunk_shape[0]  # chunks down one slice
    per_rank = [len({c.box.start[0] for c in plan.params[0].chunks}) for plan in ranks]  # rows of chunks
    if p.replicas >= 2 and down >= 2:
        # an inner slice: equal pieces, as many as its chunks give (one a replica at most)
        if split == "rows" and mp > 1:
            pieces = max(d for d in range(1, p.replicas + 1) if down % d == 0)
            assert max(per_rank) == down // pieces
        else:  # the slice spans the rows: the last piece may be shorter (the array's edge)
            assert max(per_rank) == -(-down // p.replicas)


def test_a_prime_row_count_replicated_on_four_ranks_goes_to_all_four():
    ranks, _ = plans(47, 2, 4, 1, "none", 1)
    assert [len(plan.params[0].chunks) for plan in ranks] == [12, 12, 12, 11]
    assert [plan.params[0].local_start for plan in ranks] == [0, 12 * 8, 24 * 8, 36 * 8]
    assert ranks[0].params[0].shard_shape == (12, 2) and ranks[0].params[0].chunks_per_shard == 12


def test_a_replicated_single_chunk_slice_of_prime_rows_is_split_with_a_padded_edge_chunk():
    layout = Layout((4,), ((), ()))
    strategy = Strategy({"w": {0: layout}}, 4, 1)
    local = {"w": np.zeros((401, 16), np.float32)}  # 401 rows, a prime: no divisor gives 4 pieces
    ranks = [plan_save(local, rank=r, world=4, strategy=strategy, max_chunk_bytes=1 << 20, min_piece_bytes=1)
             for r in range(4)]
    ps = [plan.params[0] for plan in ranks]
    assert [(p.chunk_shape, p.shard_shape) for p in ps] == [((101, 16), None)] * 4
    assert [[(c.index, c.box.start[0], c.box.stop[0], c.nbytes) for c in p.chunks] for p in ps] == [
        [(0, 0, 101, 101 * 64)], [(1, 101, 202, 101 * 64)], [(2, 202, 303, 101 * 64)], [(3, 303, 401, 98 * 64)]]
    assert [(p.local_start, p.pad) for p in ps] == [(0, 0), (101 * 64, 0), (202 * 64, 0), (303 * 64, 3 * 64)]


def test_a_replicated_slice_smaller_than_two_pieces_stays_one_chunk():
    layout = Layout((4,), ((), ()))
    strategy = Strategy({"w": {0: layout}}, 4, 1)
    local = {"w": np.zeros((401, 16), np.float32)}
    ranks = [plan_save(local, rank=r, world=4, strategy=strategy, max_chunk_bytes=1 << 20,
                       min_piece_bytes=401 * 64 // 2 + 1) for r in range(4)]
    assert [len(plan.params[0].chunks) for plan in ranks] == [1, 0, 0, 0]
    assert ranks[0].params[0].chunk_shape == (401, 16) and ranks[0].params[0].pad == 0
