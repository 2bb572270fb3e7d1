"""``ckptstore.load_rank`` / ``rank_view``: one rank of a target layout, bit for bit what
``mindspore.transform_checkpoints`` + ``mindspore.load_checkpoint`` give that rank, reading only
that rank's bytes, lazily.

Real MindSpore files: sources and targets as ``mindspore.save_checkpoint`` and the compiler write
them (by ckptstore's byte-identical writers), expected values from MindSpore's own resharding
(load_fixtures.py): those tests are marked ``mindspore``.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ckptstore
import mindspore_fixtures as T
from ckptstore.errors import (
    IncompleteStoreError,
    LayoutMismatchError,
    StoreCorruptError,
    StoreNotFoundError,
    StrategyError,
)
from ckptstore.read.loader import rank_view
from ckptstore.store.executor import IO_STATS
from load_fixtures import (
    BF16,
    CASES,
    assert_same_array,
    assert_same_dict,
    copy_store,
    flip_byte,
    to_numpy,
)

mindspore = T.LazyModule("mindspore")  # only the mindspore-marked tests touch it

CASE_IDS = list(CASES)


def _materialize(params) -> dict[str, object]:
    return {name: to_numpy(params[name]) for name in params}


# ---------------------------------------------------------------------------------------------
# 1. values: every target rank equals MindSpore's resharding


@pytest.mark.mindspore
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_every_target_rank_equals_transform_checkpoints(load_env, case_id):
    t = load_env.target(case_id)
    assert sorted(p.name for p in t.oracle_root.iterdir()) == sorted(f"rank_{j}" for j in range(t.world))
    for j in range(t.world):
        params = ckptstore.load_rank(t.store, t.strategy, j)
        got = {}
        for name in params:
            p = params[name]
            assert isinstance(p, mindspore.Parameter), name
            assert p.name == name
            got[name] = to_numpy(p)
        assert_same_dict(got, t.oracle(j), f"{case_id} rank {j}")


@pytest.mark.mindspore
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_copy_false_equals_transform_checkpoints(load_env, case_id):
    t = load_env.target(case_id)
    for j in range(t.world):
        params = ckptstore.load_rank(t.store, t.strategy, j, copy=False)
        assert_same_dict(_materialize(params), t.oracle(j), f"{case_id} rank {j} copy=False")


@pytest.mark.mindspore
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_rank_view_read_equals_transform_checkpoints(load_env, case_id):
    t = load_env.target(case_id)
    for j in range(t.world):
        view = rank_view(t.store, t.strategy, j)
        assert_same_dict({n: view.read(n) for n in view}, t.oracle(j), f"{case_id} rank {j}")


@pytest.mark.mindspore
def test_load_rank_accepts_a_store_path(load_env):
    t = load_env.target("dp2_mp4->dp2_mp2")
    params = ckptstore.load_rank(str(t.store_path), str(t.target_file), 3)
    assert_same_dict(_materialize(params), t.oracle(3), "rank 3 from a path")


@pytest.mark.mindspore
def test_names_globs_select_parameters(load_env):
    t = load_env.target("dp2_mp4->dp2_mp2")
    params = ckptstore.load_rank(t.store, t.strategy, 1, include=["layer?.*", "global_step"])
    assert list(params) == ["layer0.w", "layer0.b", "layer1.w", "global_step"]
    expected = {n: v for n, v in t.oracle(1).items() if n in ("layer0.w", "layer0.b", "layer1.w", "global_step")}
    assert_same_dict(_materialize(params), expected, "names=")


@pytest.mark.parametrize("rank", [-1, 4], ids=["negative", "past-the-end"])
def test_rank_outside_the_target_raises_strategy_error(load_env, rank):
    t = load_env.target("dp2_mp4->dp2_mp2")
    with pytest.raises(StrategyError, match=f"rank {rank} is outside the target layout's 4 ranks"):
        ckptstore.load_rank(t.store, t.strategy, rank)


# ---------------------------------------------------------------------------------------------
# 2. bytes: the plan is the rank's slice, and exactly that is read


@pytest.mark.mindspore
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_plan_nbytes_is_the_slice_bytes_and_exactly_what_is_read(load_env, case_id):
    t = load_env.target(case_id)
    for j in range(t.world):
        oracle = t.oracle(j)
        expected = sum(a.nbytes for a in oracle.values())
        params = ckptstore.load_rank(t.store, t.strategy, j)
        assert params.plan.nbytes == expected, f"rank {j}"
        assert {n: p.nbytes for n, p in params.plan.params.items()} == {n: a.nbytes for n, a in oracle.items()}
        IO_STATS.reset()
        for name in params:
            params[name]
        assert IO_STATS.bytes_read == expected, f"rank {j}"


_RCHAR_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["GLOG_v"] = "3"
    import ckptstore, mindspore
    from ckptstore.store.executor import IO_STATS

    warm, store, strategy, rank = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

    def rchar():
        with open("/proc/self/io", "rb") as f:
            text = f.read().decode()
        return int(text.split("rchar:")[1].split()[0])

    def run(path):
        params = ckptstore.load_rank(path, strategy, rank)
        for name in params:
            params[name]
        return params.plan.nbytes

    run(warm)  # every lazy import and MindSpore's first-use work happens here, on another copy
    IO_STATS.reset()
    before = rchar()
    nbytes = run(store)
    after = rchar()
    print(json.dumps({"rchar": after - before, "nbytes": nbytes, "io_stats": IO_STATS.bytes_read,
                      "fetched": IO_STATS.bytes_fetched}))
""")


@pytest.mark.mindspore
@pytest.mark.slow
@pytest.mark.parametrize("case_id,rank", [("dp2_mp4->dp2_mp2", 1), ("pipeline2->1stage", 3),
                                          ("mixed_dtypes->dp2_mp2_optshard", 2)])
def test_process_reads_only_the_plan_and_the_metadata(load_env, tmp_path, case_id, rank):
    """/proc/self/io rchar counts every byte the process read through read()/pread() syscalls.

    (The fixture's chunks are read with preadv, so rchar sees them; a memory-mapped read would
    not show up and the lower bound would then fail, which is why it is asserted.)"""
    t = load_env.target(case_id)
    warm = copy_store(t.store_path, tmp_path / "warm.zarr")
    out = subprocess.run([sys.executable, "-c", _RCHAR_SCRIPT, str(warm), str(t.store_path), str(t.target_file),
                          str(rank)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "GLOG_v": "3"})
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    expected = sum(a.nbytes for a in t.oracle(rank).values())
    assert r["nbytes"] == r["io_stats"] == expected
    # besides the slices and the gaps the planner chose to read with them (r["fetched"]): the
    # store's root zarr.json, the target strategy file, /proc/self/io itself
    metadata = (t.store_path / "zarr.json").stat().st_size + t.target_file.stat().st_size + 512
    assert r["fetched"] + metadata - 512 <= r["rchar"] <= r["fetched"] + metadata, r


@pytest.mark.mindspore
def test_plan_files_are_only_those_of_parameters_the_rank_holds(load_env):
    t = load_env.target("pipeline2->same-none")
    store = t.store
    stage1_only = {"layer1.w", "head.w", "adam_m.layer1.w", "adam_v.layer1.w"}
    for rank in (0, 5):  # stage 0, stage 1
        view = rank_view(store, None, rank)
        held = set(t.oracle(rank))
        expected = {f for n in held for f in store.info(n).chunks.files}
        assert set(view.plan.files) == expected
        assert len(view.plan.files) == len(expected)
        other = stage1_only if rank == 0 else {"embedding.table", "layer0.w", "layer0.b"}
        assert not expected & {f for n in other for f in store.info(n).chunks.files}
    view = rank_view(store, None, 0, names=["layer0.*"])
    assert view.plan.files == (store.info("layer0.w").chunks.files[0], store.info("layer0.b").chunks.files[0])


# ---------------------------------------------------------------------------------------------
# 3. laziness


@pytest.mark.mindspore
def test_nothing_is_read_until_a_parameter_is_accessed(load_env):
    t = load_env.target("dp2_mp4->dp2_mp2")
    expected = t.oracle(2)
    IO_STATS.reset()
    params = ckptstore.load_rank(t.store_path, t.strategy, 2)
    assert IO_STATS.bytes_read == 0 and IO_STATS.reads == 0
    # the keys are known up front, without reading
    assert len(params) == len(expected)
    assert sorted(params) == sorted(expected)
    assert list(params.keys()) == t.store.names()
    assert "layer0.w" in params and "nope" not in params
    assert params.plan.nbytes == sum(a.nbytes for a in expected.values())
    assert IO_STATS.bytes_read == 0 and IO_STATS.reads == 0
    # one access reads that parameter's plan, and only it
    p = params["layer1.w"]
    assert IO_STATS.bytes_read == params.view.plan_for("layer1.w").nbytes == expected["layer1.w"].nbytes
    read = IO_STATS.bytes_read
    assert params["layer1.w"] is p
    assert IO_STATS.bytes_read == read
    q = params["embedding.table"]
    assert IO_STATS.bytes_read == read + expected["embedding.table"].nbytes
    assert params["embedding.table"] is q


def test_unknown_key_raises_key_error_without_reading(load_env):
    t = load_env.target("pipeline2->same-none")
    params = ckptstore.load_rank(t.store, None, 0)
    IO_STATS.reset()
    with pytest.raises(KeyError):
        params["head.w"]  # held by stage 1 only
    assert params.get("head.w") is None
    assert IO_STATS.bytes_read == 0


# ---------------------------------------------------------------------------------------------
# 4. dtype conversion


FLOAT32_PARAMS = ["embedding.*", "layer*", "moe.*", "adam_*", "learning_rate"]  # every float32 one of dp2_mp4


@pytest.mark.mindspore
@pytest.mark.parametrize("ms_dtype,np_dtype", [("float16", np.dtype(np.float16)), ("bfloat16", BF16),
                                               ("float64", np.dtype(np.float64))],
                         ids=["float16", "bfloat16", "float64"])
def test_dtype_converts_a_float32_store(load_env, ms_dtype, np_dtype):
    ms_dtype = getattr(mindspore, ms_dtype)
    t = load_env.target("dp2_mp4->dp2_mp2")
    for j in (0, 3):
        params = ckptstore.load_rank(t.store, t.strategy, j, dtype=ms_dtype, include=FLOAT32_PARAMS)
        assert len(params) == 12
        got = {}
        for name in params:
            assert params[name].dtype == ms_dtype, name
            got[name] = to_numpy(params[name])
        assert_same_dict(got, {n: a.astype(np_dtype) for n, a in t.oracle(j).items() if n in params}, f"rank {j}")


@pytest.mark.mindspore
def test_dtype_float32_converts_bfloat16_parameters(load_env):
    t = load_env.target("mixed_dtypes->dp2_mp2_optshard")
    params = ckptstore.load_rank(t.store, t.strategy, 1, include=["bf16.*"], dtype=mindspore.float32)
    assert sorted(params) == ["bf16.norm", "bf16.opt", "bf16.scale", "bf16.w"]
    assert_same_dict(_materialize(params),
                     {n: a.astype(np.float32) for n, a in t.oracle(1).items() if n.startswith("bf16.")}, "bf16->f32")


# ---------------------------------------------------------------------------------------------
# 5. copy=False


def _is_file_mapping(array: np.ndarray) -> bool:
    import mmap

    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base.obj if isinstance(base, memoryview) else base, mmap.mmap)


@pytest.mark.mindspore
def test_copy_false_maps_a_slice_that_is_one_whole_chunk(load_env):
    t = load_env.target("dp2_mp4->same-none")
    view = rank_view(t.store, None, 5)
    for name in ("layer0.w", "layer1.w", "moe.w", "embedding.table"):
        assert len(view.plan_for(name).chunks) == 1, name
        mapped = view.mapped(name)
        assert _is_file_mapping(mapped), name
        assert_same_array(mapped, t.oracle(5)[name], name)
    IO_STATS.reset()
    params = ckptstore.load_rank(t.store, None, 5, copy=False)
    assert_same_dict(_materialize(params), t.oracle(5), "copy=False")
    assert IO_STATS.bytes_read == 0  # every slice here is one chunk: mapped, not read


@pytest.mark.mindspore
def test_copy_false_falls_back_to_reading_a_slice_of_several_chunks(load_env):
    t = load_env.target("mp_rows->mp2")
    view = rank_view(t.store, t.strategy, 1)
    assert len(view.plan_for("layer0.w").chunks) == 4
    assert view.mapped("layer0.w") is None
    params = ckptstore.load_rank(t.store, t.strategy, 1, copy=False)
    IO_STATS.reset()
    p = params["layer0.w"]
    assert IO_STATS.bytes_read == t.oracle(1)["layer0.w"].nbytes
    assert_same_array(to_numpy(p), t.oracle(1)["layer0.w"], "layer0.w")
    assert_same_dict(_materialize(params), t.oracle(1), "copy=False")


@pytest.mark.mindspore
def test_copy_false_with_dtype_conversion_reads_instead_of_mapping(load_env):
    t = load_env.target("dp2_mp4->same-none")
    view = rank_view(t.store, None, 0, dtype=np.float16)
    assert view.mapped("layer0.w") is None
    params = ckptstore.load_rank(t.store, None, 0, copy=False, dtype=mindspore.float16)
    assert_same_array(to_numpy(params["layer0.w"]), t.oracle(0)["layer0.w"].astype(np.float16), "layer0.w")


@pytest.mark.mindspore
def test_copy_false_parameters_are_copy_on_write_and_outlive_their_mapping(load_env, tmp_path):
    store_path = copy_store(load_env.store("dp2_mp4"), tmp_path / "store.zarr")
    t = load_env.target("dp2_mp4->same-none")
    before = {p.name: p.read_bytes() for p in store_path.rglob("*") if p.is_file()}
    params = ckptstore.load_rank(store_path, None, 5, copy=False)
    p = params["layer0.w"]
    del params
    gc.collect()
    assert_same_array(to_numpy(p), t.oracle(5)["layer0.w"], "after the RankParameters is gone")
    p.asnumpy()[...] = 7.0  # the Parameter's memory: a private (copy-on-write) page of the store file
    assert (p.asnumpy() == 7.0).all()
    assert {q.name: q.read_bytes() for q in store_path.rglob("*") if q.is_file()} == before
    again = ckptstore.load_rank(store_path, None, 5, copy=False)["layer0.w"]
    assert_same_array(to_numpy(again), t.oracle(5)["layer0.w"], "a fresh load")


# ---------------------------------------------------------------------------------------------
# 6. verify=True


def _damaged_store(load_env, tmp_path, name: str, chunk: int) -> ckptstore.Store:
    src = load_env.store("mp_rows")
    dst = copy_store(src, tmp_path / "damaged.zarr")
    store = ckptstore.open(dst)
    t = store.info(name).chunks
    flip_byte(dst / t.files[chunk], t.offsets[chunk] + 5)
    return store


@pytest.mark.mindspore
def test_verify_names_the_parameter_and_chunk_of_a_flipped_byte(load_env, tmp_path):
    store = _damaged_store(load_env, tmp_path, "layer0.w", 3)
    params = ckptstore.load_rank(store, None, 3, verify=True)
    with pytest.raises(StoreCorruptError, match=r"checksum mismatch in chunk 3 of parameter 'layer0.w'"):
        params["layer0.w"]
    with pytest.raises(StoreCorruptError, match=r"chunk 3 of parameter 'layer0.w'"):
        store.read("layer0.w", verify=True)
    t = load_env.target("mp_rows->mp2")  # its oracle of rank 0 holds rows [0, 32) of layer0.w: chunks 0-3
    layout = load_env.saved_layout("mp_rows")
    assert_same_array(to_numpy(params["layer0.b"]), layout.tensors["layer0.b"][24:32], "layer0.b")
    clean = ckptstore.load_rank(store, t.strategy, 1, verify=True)  # rows [32, 64): chunks 4-7, undamaged
    assert_same_array(to_numpy(clean["layer0.w"]), t.oracle(1)["layer0.w"], "undamaged chunks")


@pytest.mark.mindspore  # load_rank builds mindspore.Parameters
def test_without_verify_a_flipped_byte_is_returned_silently(load_env, tmp_path):
    store = _damaged_store(load_env, tmp_path, "layer0.w", 3)
    layout = load_env.saved_layout("mp_rows")
    params = ckptstore.load_rank(store, None, 3)
    got = to_numpy(params["layer0.w"])
    want = layout.tensors["layer0.w"][24:32]
    diff = np.flatnonzero(got.view(np.uint8).ravel() != want.view(np.uint8).ravel())
    assert diff.tolist() == [5]


# ---------------------------------------------------------------------------------------------
# targets that do not describe, or cannot split, a parameter


@pytest.mark.mindspore
def test_a_parameter_missing_from_the_target_strategy_comes_whole(load_env, tmp_path):
    """README: MindSpore would copy such a parameter with its *source shard* shape; ckptstore gives
    the whole tensor. Parameters in neither strategy (counters) come whole in both."""
    layout = load_env.saved_layout("dp2_mp4")
    target = T.write_strategy(tmp_path / "partial.ckpt",
                              [dataclasses.replace(s, dev_matrix=(2, 2)) for s in layout.specs if s.name == "layer0.w"])
    store = ckptstore.open(load_env.store("dp2_mp4"))
    params = ckptstore.load_rank(store, target, 3, allow_whole=True)  # (else refused: test_strategy_use.py)
    assert list(params) == store.names()
    assert_same_array(to_numpy(params["layer0.w"]), layout.tensors["layer0.w"][16:32], "layer0.w")
    for name in ("layer1.w", "moe.w", "embedding.table", "global_step"):
        assert_same_array(to_numpy(params[name]), layout.tensors[name], name)


@pytest.mark.mindspore
def test_a_target_that_cannot_split_a_parameter_raises_layout_mismatch(load_env, tmp_path):
    layout = load_env.saved_layout("mp_rows")
    target = T.write_strategy(tmp_path / "three.ckpt", [dataclasses.replace(s, dev_matrix=(3,))
                                                          for s in layout.specs if s.name == "layer1.w"])
    with pytest.raises(LayoutMismatchError,
                       match=r"parameter 'layer1\.w' \(shape \[32, 16\] in the store\) does not fit"):
        ckptstore.load_rank(load_env.store("mp_rows"), target, 0)


@pytest.mark.mindspore
def test_string_values_come_back_as_str_without_reading(tmp_path):
    src = tmp_path / "one.ckpt"
    mindspore.save_checkpoint([{"name": "w", "data": mindspore.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))}],
                              str(src), append_dict={"note": "héllo wörld", "epoch_num": 2})
    ckptstore.convert(src, tmp_path / "one.zarr")
    params = ckptstore.load_rank(tmp_path / "one.zarr")
    assert list(params) == ["w", "note", "epoch_num"]
    assert params.plan.nbytes == 6 * 4 + 8
    IO_STATS.reset()
    assert params["note"] == "héllo wörld"
    assert IO_STATS.bytes_read == 0
    assert_same_array(to_numpy(params["w"]), np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    assert_same_array(to_numpy(params["epoch_num"]), np.array(2, np.int64), "epoch_num")


# ---------------------------------------------------------------------------------------------
# 11. incomplete stores


def test_open_refuses_an_interrupted_conversion(tmp_path):
    store = tmp_path / "half.zarr"
    (store / ".ckptstore-work").mkdir(parents=True)
    (store / "layer0.w").mkdir()
    with pytest.raises(IncompleteStoreError, match="incomplete"):
        ckptstore.open(store)
    with pytest.raises(IncompleteStoreError, match="incomplete"):
        ckptstore.load_rank(store, None, 0)
    with pytest.raises(IncompleteStoreError, match="incomplete"):
        ckptstore.load_rank(str(store), None, 0)


def test_open_refuses_a_converted_store_whose_root_metadata_is_gone(load_env, tmp_path):
    store = copy_store(load_env.store("dp2_mp4"), tmp_path / "store.zarr")
    (store / "zarr.json").unlink()
    (store / ".ckptstore-work").mkdir()
    with pytest.raises(IncompleteStoreError):
        ckptstore.open(store)
    with pytest.raises(IncompleteStoreError):
        ckptstore.load_rank(store)


def test_load_rank_on_a_missing_path_raises_store_not_found(tmp_path):
    with pytest.raises(StoreNotFoundError):
        ckptstore.load_rank(tmp_path / "nothing.zarr")


@pytest.mark.mindspore
def test_dtype_converts_only_floating_point_parameters(load_env):
    t = load_env.target("mixed_dtypes->dp2_mp2_optshard")
    params = ckptstore.load_rank(t.store, t.strategy, 1, dtype=mindspore.float16)
    oracle = t.oracle(1)
    for name in ("i8.table", "i32.index", "u8.quant", "mask", "global_step"):
        assert params[name].dtype != mindspore.float16, name
        assert_same_array(to_numpy(params[name]), oracle[name], name)
    assert params["fp64.w"].dtype == mindspore.float16


def test_load_ranks_mapping_prints_as_one_line_without_reading(load_env):
    t = load_env.target("dp2_mp4->dp2_mp2")
    params = ckptstore.load_rank(t.store_path, t.strategy, 1)
    assert repr(params) == f"<RankParameters {params.view.summary()}; 0 built>"
    assert params.view.summary().startswith(f"rank 1 of 4 from {t.store_path}: {len(params)} parameters, ")


@pytest.mark.mindspore  # load_rank builds mindspore.Parameters
def test_load_rank_shows_progress_when_it_builds_everything_and_is_not_quiet(load_env, capsys):
    t = load_env.target("dp2_mp4->dp2_mp2")
    ckptstore.load_rank(t.store_path, t.strategy, 1, quiet=False).materialize()
    last = [line for line in capsys.readouterr().err.splitlines() if line][-1]
    assert last.startswith("load rank 1: ") and last.endswith(" MiB/s (100%)"), last
