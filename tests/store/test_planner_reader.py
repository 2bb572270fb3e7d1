"""``Store.read`` / ``Store.plan`` / the planner and reader: any index of a global tensor, reading
only the overlapping chunks (exactly the overlap bytes for raw chunks), with coalesced ranges.

Stores are converted from the session layouts (load_fixtures.py: byte-identical to MindSpore's
save); expected values are the fixture's global tensors indexed with numpy.
"""
from __future__ import annotations

import numpy as np
import pytest

import ckptstore
from ckptstore.boxes import Box
from ckptstore.store.executor import IO_STATS
from load_fixtures import assert_same_array

# mp_rows: layer0.w (64, 32) float32 in 8 row chunks of (8, 32) = 1024 bytes, all in one shard file.
# mp_cols: layer0.w (16, 64) in 8 column chunks of (16, 8); conv.w (4, 16, 3) in chunks (4, 2, 3).
INDEXES = [
    ("full-None", "mp_rows", "layer0.w", None),
    ("full-ellipsis", "mp_rows", "layer0.w", Ellipsis),
    ("full-slice", "mp_rows", "layer0.w", slice(None)),
    ("int-row", "mp_rows", "layer0.w", 13),
    ("negative-int-row", "mp_rows", "layer0.w", -1),
    ("int-int", "mp_rows", "layer0.w", (9, 31)),
    ("negative-int-int", "mp_rows", "layer0.w", (-64, -32)),
    ("row-slice-in-one-chunk", "mp_rows", "layer0.w", slice(17, 23)),
    ("row-slice-across-chunks", "mp_rows", "layer0.w", slice(5, 20)),
    ("row-and-col-slices", "mp_rows", "layer0.w", (slice(5, 20), slice(3, 7))),
    ("negative-slices", "mp_rows", "layer0.w", (slice(-10, None), slice(None, -5))),
    ("clamped-slice", "mp_rows", "layer0.w", slice(60, 100)),
    ("empty-slice", "mp_rows", "layer0.w", slice(10, 10)),
    ("int-and-slice", "mp_rows", "layer0.w", (-3, slice(2, 30))),
    ("column", "mp_rows", "layer0.w", (slice(None), 7)),
    ("1d-slice", "mp_rows", "layer0.b", slice(7, 57)),
    ("1d-negative-int", "mp_rows", "layer0.b", -8),
    ("0d-full", "mp_rows", "learning_rate", None),
    ("cols-across-chunks", "mp_cols", "layer0.w", (slice(None), slice(6, 27))),
    ("cols-one-chunk", "mp_cols", "layer0.w", (slice(2, 9), slice(8, 16))),
    ("3d-mixed", "mp_cols", "conv.w", (slice(1, 3), slice(None), -1)),
    ("3d-ints", "mp_cols", "conv.w", (-1, 5, 0)),
    ("3d-full", "mp_cols", "conv.w", None),
]


def _global(load_env, kind: str, name: str) -> np.ndarray:
    value = load_env.saved_layout(kind).tensors[name]
    return np.asarray(value)


@pytest.mark.parametrize("kind,name,index", [i[1:] for i in INDEXES], ids=[i[0] for i in INDEXES])
def test_read_index_equals_numpy_indexing_and_reads_only_the_overlap(load_env, kind, name, index):
    store = ckptstore.open(load_env.store(kind))
    g = _global(load_env, kind, name)
    expected = g[...] if index is None else g[index]
    IO_STATS.reset()
    got = store.read(name, index=index)
    assert_same_array(got, expected, f"{name}[{index}]")
    assert IO_STATS.bytes_read == expected.size * g.dtype.itemsize


@pytest.mark.parametrize("workers", [1, 4])
def test_read_with_workers_and_out_of_another_dtype(load_env, workers):
    store = ckptstore.open(load_env.store("mp_cols"))
    g = _global(load_env, "mp_cols", "layer0.w")
    out = np.empty((16, 21), dtype=np.float64)
    got = store.read("layer0.w", index=(slice(None), slice(6, 27)), out=out, workers=workers)
    assert got is out
    assert_same_array(got, g[:, 6:27].astype(np.float64), "out=float64")


@pytest.mark.parametrize("index,message", [
    (slice(0, 10, 2), "only step-1 slices"),
    (64, "index 64 is out of bounds for axis 0"),
    (-65, "index -65 is out of bounds for axis 0"),
    ((1, 2, 3), "too many indices"),
    ([1, 2], "unsupported index"),
], ids=["step-2", "int-past-end", "negative-past-start", "too-many", "list"])
def test_read_rejects_unsupported_indexes(load_env, index, message):
    store = ckptstore.open(load_env.store("mp_rows"))
    with pytest.raises(IndexError, match=message):
        store.read("layer0.w", index=index)


@pytest.mark.parametrize("index,chunks", [(slice(5, 20), [0, 1, 2]), (slice(17, 23), [2]), (None, list(range(8))),
                                          ((-1, slice(0, 3)), [7])],
                         ids=["rows-5-20", "rows-17-23", "full", "last-row"])
def test_compressed_store_reads_whole_overlapping_chunks_only(load_env, index, chunks):
    store = ckptstore.open(load_env.store("mp_rows", compress="zstd"))
    info = store.info("layer0.w")
    assert info.codec is not None and info.codec["id"] == "zstd"
    g = _global(load_env, "mp_rows", "layer0.w")
    IO_STATS.reset()
    got = store.read("layer0.w", index=index)
    assert_same_array(got, g[...] if index is None else g[index], "zstd")
    assert IO_STATS.bytes_read == sum(info.chunks.nbytes[i] for i in chunks)
    box = None if index is None else _box(index, g.shape)
    assert store.plan("layer0.w", box).nbytes == IO_STATS.bytes_read
    assert list(store.plan("layer0.w", box).chunks) == chunks


def _box(index, shape) -> Box:
    items = index if isinstance(index, tuple) else (index,)
    start, stop = [], []
    for axis, n in enumerate(shape):
        item = items[axis] if axis < len(items) else slice(None)
        if isinstance(item, int):
            i = item % n
            start.append(i), stop.append(i + 1)
        else:
            lo, hi, _ = item.indices(n)
            start.append(lo), stop.append(hi)
    return Box(tuple(start), tuple(stop))


def test_verify_reads_whole_chunks_and_checks_them(load_env):
    store = ckptstore.open(load_env.store("mp_rows"))
    g = _global(load_env, "mp_rows", "layer0.w")
    IO_STATS.reset()
    got = store.read("layer0.w", index=(slice(5, 20), slice(3, 7)), verify=True)
    assert_same_array(got, g[5:20, 3:7], "verify")
    assert IO_STATS.bytes_read == 3 * 1024


# ---------------------------------------------------------------------------------------------
# plans and coalesced ranges


def test_full_tensor_in_eight_row_chunks_of_one_file_is_one_range(load_env):
    store = ckptstore.open(load_env.store("mp_rows"))
    info = store.info("layer0.w")
    assert info.chunk_shape == (8, 32) and len(info.chunks) == 8 and len(set(info.chunks.files)) == 1
    assert info.chunks.offsets == tuple(range(0, 8192, 1024))
    plan = store.plan("layer0.w")
    assert len(plan.chunks) == 8
    assert list(plan.ranges()) == [(info.chunks.files[0], 0, 64 * 32 * 4, 0)]
    assert plan.nbytes == 8192 and plan.files == (info.chunks.files[0],)


def test_row_range_across_chunks_is_one_range(load_env):
    store = ckptstore.open(load_env.store("mp_rows"))
    f = store.info("layer0.w").chunks.files[0]
    plan = store.plan("layer0.w", Box((5, 0), (20, 32)))
    assert list(plan.chunks) == [0, 1, 2]
    assert list(plan.ranges()) == [(f, 5 * 128, 15 * 128, 0)]
    assert plan.nbytes == 15 * 128


def test_column_slice_ranges_are_one_per_row(load_env):
    store = ckptstore.open(load_env.store("mp_rows"))
    f = store.info("layer0.w").chunks.files[0]
    plan = store.plan("layer0.w", Box((0, 3), (64, 7)))
    assert list(plan.ranges()) == [(f, r * 128 + 12, 16, r * 16) for r in range(64)]
    assert plan.nbytes == 64 * 16


def test_ranges_merge_only_when_both_file_and_destination_are_contiguous(load_env):
    store = ckptstore.open(load_env.store("mp_cols"))
    info = store.info("layer0.w")  # (16, 64) in chunks (16, 8) of 512 bytes, chunk i at offset 512*i
    f = info.chunks.files[0]
    ranges = list(store.plan("layer0.w").ranges())
    assert ranges == [(f, c * 512 + r * 32, 32, r * 256 + c * 32) for c in range(8) for r in range(16)]
    # one row across two chunks: contiguous in the destination, not in the file: two ranges
    ranges = list(store.plan("layer0.w", Box((0, 8), (1, 24))).ranges())
    assert ranges == [(f, 512, 32, 0), (f, 1024, 32, 32)]


def test_plan_lists_only_overlapping_chunks(load_env):
    store = ckptstore.open(load_env.store("mp_cols"))
    plan = store.plan("conv.w", Box((0, 3, 0), (4, 9, 3)))  # axis-1 chunks of 2: chunks 1..4
    assert list(plan.chunks) == [1, 2, 3, 4]
    assert list(plan.overlaps) == [Box((0, 3, 0), (4, 4, 3)), Box((0, 4, 0), (4, 6, 3)),
                                                Box((0, 6, 0), (4, 8, 3)), Box((0, 8, 0), (4, 9, 3))]
    assert plan.nbytes == 4 * 6 * 3 * 4


def test_plan_outside_the_tensor_raises(load_env):
    store = ckptstore.open(load_env.store("mp_rows"))
    with pytest.raises(ValueError, match="outside parameter 'layer0.w'"):
        store.plan("layer0.w", Box((0, 0), (65, 32)))


def test_open_reads_no_chunk_bytes(load_env):
    IO_STATS.reset()
    store = ckptstore.open(load_env.store("dp2_mp4"))
    assert store.names()[:2] == ["embedding.table", "layer0.w"]
    assert IO_STATS.bytes_read == 0 and IO_STATS.reads == 0


# ---------------------------------------------------------------------------------------------
# many short runs in one chunk


@pytest.fixture(scope="module")
def wide_store(tmp_path_factory):
    """One .ckpt as MindSpore saves it (by ckptstore's byte-identical CheckpointWriter; whole
    tensors: each parameter is one chunk) with tall chunks, so a column slice is hundreds of short runs."""
    import mindspore_fixtures as T
    from ckptstore.formats.ckpt_writer import CheckpointWriter

    specs = [T.ParamSpec("wide.w", (300, 40)), T.ParamSpec("wide.bf16", (130, 8), "bfloat16"),
             T.ParamSpec("cube", (100, 6, 10), "int16")]
    tensors = T.make_global_tensors(specs, seed=4)
    root = tmp_path_factory.mktemp("wide")
    with CheckpointWriter(root / "wide.ckpt") as w:
        for n, a in tensors.items():
            w.add(n, a)
    ckptstore.convert(root / "wide.ckpt", root / "wide.zarr")
    return ckptstore.open(root / "wide.zarr"), specs, tensors


@pytest.mark.parametrize("name,index", [
    ("wide.w", (slice(None), slice(3, 5))),
    ("wide.w", (slice(1, 299), 39)),
    ("wide.bf16", (slice(None), slice(2, 6))),
    ("cube", (slice(None), slice(1, 4), slice(2, 9))),
    ("wide.w", slice(10, 200)),  # few long runs: preadv
], ids=["wide-cols", "wide-col", "bf16-cols", "cube-inner", "wide-rows"])
def test_many_short_runs_read_exactly_the_overlap(wide_store, name, index):
    store, _, tensors = wide_store
    assert len(store.info(name).chunks) == 1
    IO_STATS.reset()
    got = store.read(name, index=index)
    assert_same_array(got, tensors[name][index], name)
    assert IO_STATS.bytes_read == got.nbytes
    box = _box(index, tensors[name].shape)
    assert IO_STATS.reads == len(list(store.plan(name, box).ranges()))  # the plan is what ran


@pytest.mark.parametrize("name,dev,tmap", [("wide.w", (4,), (-1, 0)), ("wide.bf16", (2, 2), (-1, 0)),
                                           ("cube", (2, 2), (-1, 1, 0))], ids=["wide-cols", "bf16-cols", "cube"])
@pytest.mark.mindspore
def test_load_rank_of_column_splits_equals_mindspore_slicing(wide_store, tmp_path, name, dev, tmap):
    """Targets that cut columns out of one tall chunk; expected slices cut by MindSpore's own
    code (mindspore.parallel._tensor, via mindspore_fixtures.mindspore_rank_slice)."""
    from dataclasses import replace

    import mindspore

    import mindspore_fixtures as T
    from load_fixtures import to_numpy

    store, specs, tensors = wide_store
    spec = replace(next(s for s in specs if s.name == name), dev_matrix=dev, tensor_map=tmap)
    target = T.write_strategy(tmp_path / "target.ckpt", [spec])
    for rank in range(int(np.prod(dev))):
        params = ckptstore.load_rank(store, target, rank, include=[name])
        IO_STATS.reset()
        got = to_numpy(params[name])
        expected = T.mindspore_rank_slice(spec, tensors[name], rank)
        assert_same_array(got, expected, f"{name} rank {rank}")
        assert IO_STATS.bytes_read == got.nbytes == params.plan.nbytes
        as64 = ckptstore.load_rank(store, target, rank, include=[name], dtype=mindspore.float64)
        # dtype= converts floating-point parameters; the int16 cube keeps its type
        want = expected if expected.dtype.kind in "iub" else expected.astype(np.float64)
        assert_same_array(to_numpy(as64[name]), want, f"{name} rank {rank} as float64")
