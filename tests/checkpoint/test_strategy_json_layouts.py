"""Issue 26.1 and 24.14: the compiler's JSON strategy files, as sources and as targets.

With ``mindspore.parallel.Layout`` tuples the compiler's JSON form writes a tensor axis split over
several device axes flattened (one tensor-map entry per device axis, ``tensor_shape`` reshaped);
the protobuf form nests them. Rank files are MindSpore's: ``save_checkpoint`` of whole tensors,
then ``transform_checkpoints`` into the nested protobuf layout. Both strategy forms must give the
same store, and as targets the same slices as MindSpore's transform.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")
pytestmark = pytest.mark.mindspore

import ckptstore
from ckptstore.checkpoint.layout import Layout
from ckptstore.checkpoint.strategy import load_strategy
from ckptstore.errors import StrategyError
from ckptstore.testing.layout_tuples import (
    flatten_layout,
    save_layout_tuple_checkpoint,
    write_layout_tuple_strategies,
)
from ckptstore.testing.oracle import load_oracle
from convert_fixtures import run_cli

DEV = (2, 4)
LAYOUTS = {
    "cols_dp_mp": ((16, 16), [-1, [1, 0]]),   # JSON: map [-1, 1, 0], shape [16, 2, 8]
    "rows_dp_mp": ((16, 16), [[1, 0], -1]),   # JSON: map [1, 0, -1], shape [2, 8, 16]
    "rows_mp_dp": ((16, 8), [[0, 1], -1]),    # the tuple in the other order
    "rows_8x8": ((8, 8), [[1, 0], -1]),      # slice [1, 8]: also reads as ("dp", ("mp", "None")) of [2, 32]
    "three_d": ((8, 6, 4), [[0, 1], -1, -1]),
    "three_d_axis1": ((4, 16, 6), [-1, [1, 0], -1]),
    "plain": ((16, 8), [1, 0]),
    "bias": ((8,), [-1]),
}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout_tuples")
    rng = np.random.default_rng(26)
    values = {n: rng.standard_normal(shape).astype(np.float32) for n, (shape, _) in LAYOUTS.items()}
    nested, flat = write_layout_tuple_strategies(root / "strategy", DEV, LAYOUTS)
    dist = save_layout_tuple_checkpoint(root, values, nested)
    return {"root": root, "values": values, "nested": nested, "flat": flat, "dist": dist}


def _contents(store_path) -> dict[str, np.ndarray]:
    with ckptstore.open(store_path) as store:
        return {n: store.read(n) for n in store.names()}


def test_the_json_form_is_what_the_compiler_writes():
    assert flatten_layout(DEV, [[1, 0]], [8]) == ([1, 0], [2, 4])
    assert flatten_layout(DEV, [-1, [1, 0]], [16, 16]) == ([-1, 1, 0], [16, 2, 8])


def test_a_flattened_1d_weight_folds_into_its_nested_layout():
    flat = Layout(DEV, ((1,), (0,)), tensor_shape=(2, 4))
    assert flat.fit((8,)) == Layout(DEV, ((1, 0),), tensor_shape=(8,))
    assert [flat.box(r, (8,)).start for r in range(8)] == [(r,) for r in range(8)]
    assert flat.global_shape((1,)) == (8,)


@pytest.mark.parametrize("kind", ["convert", "index"])
def test_a_json_source_gives_the_store_the_protobuf_one_gives(job, tmp_path, kind):
    run = getattr(ckptstore, kind)
    run(job["dist"], tmp_path / "from_json", strategy=job["flat"])
    run(job["dist"], tmp_path / "from_proto", strategy=job["nested"])
    from_json, from_proto = _contents(tmp_path / "from_json"), _contents(tmp_path / "from_proto")
    assert from_json.keys() == from_proto.keys() == job["values"].keys()
    for name, value in job["values"].items():
        assert from_json[name].tobytes() == from_proto[name].tobytes() == value.tobytes(), name
    with ckptstore.open(tmp_path / "from_json") as a, ckptstore.open(tmp_path / "from_proto") as b:
        assert a.source["strategy"] == b.source["strategy"]


def test_a_json_target_reads_what_transform_checkpoints_wrote_for_every_rank(job, tmp_path):
    ckptstore.convert(job["dist"], tmp_path / "store", strategy=job["nested"])
    for rank in range(8):
        expected = load_oracle(job["dist"] / f"rank_{rank}" / f"net-1_{rank}.ckpt")
        got = ckptstore.read_rank(tmp_path / "store", job["flat"], rank)
        assert got.keys() == expected.keys()
        for name in expected:
            assert got[name].tobytes() == expected[name].tobytes(), (rank, name)


def test_plan_takes_a_json_target(job, tmp_path):
    ckptstore.convert(job["dist"], tmp_path / "store", strategy=job["nested"])
    r = run_cli("plan", tmp_path / "store", "-s", job["flat"], "--rank", "5")
    assert r.returncode == 0, r.stderr


# ---- optimizer sharding with Layout tuples --------------------------------------------------

OPT_DEV = (2, 2, 2)  # device axis 1 is left to the optimizer shard
OPT_LAYOUTS = {
    "rows": ((16, 8), [[2, 0], -1]),
    "cols": ((8, 16), [-1, [0, 2]]),
    "rows_8x8": ((8, 8), [[2, 0], -1]),
    "three_d": ((16, 8, 4), [-1, [2, 0], -1]),
}
OPT_SHARD = {"rows": (4, 2), "cols": (4, 2), "rows_8x8": (4, -1), "three_d": (1, -1)}


@pytest.fixture(scope="module")
def opt_job(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout_tuples_opt")
    rng = np.random.default_rng(27)
    values = {n: rng.standard_normal(shape).astype(np.float32) for n, (shape, _) in OPT_LAYOUTS.items()}
    nested, flat = write_layout_tuple_strategies(root / "strategy", OPT_DEV, OPT_LAYOUTS, OPT_SHARD)
    return {"values": values, "nested": nested, "flat": flat,
            "dist": save_layout_tuple_checkpoint(root, values, nested)}


def test_optimizer_sharded_tuples_read_from_json_as_transform_checkpoints_wrote_them(opt_job, tmp_path):
    ckptstore.convert(opt_job["dist"], tmp_path / "store", strategy=opt_job["flat"])
    assert _contents(tmp_path / "store").keys() == opt_job["values"].keys()
    for name, value in _contents(tmp_path / "store").items():
        assert value.tobytes() == opt_job["values"][name].tobytes(), name
    for rank in range(8):
        expected = load_oracle(opt_job["dist"] / f"rank_{rank}" / f"net-1_{rank}.ckpt")
        got = ckptstore.read_rank(tmp_path / "store", opt_job["flat"], rank)
        assert {n: (a.shape, a.tobytes()) for n, a in got.items()} == \
            {n: (a.shape, a.tobytes()) for n, a in expected.items()}, rank


# ---- 24.14: numbers that are not integers ----------------------------------------------------

@pytest.mark.parametrize("key", ["dev_matrix", "tensor_map", "opt_weight_shard_step", "tensor_shape"])
def test_a_json_strategy_with_1e999_is_a_strategy_error_naming_the_file(job, tmp_path, key):
    doc = json.loads(Path(job["flat"]).read_text())
    item = doc["parallel_layout_item"]["plain"]
    item[key] = [1e999, 0] if isinstance(item[key], list) else 1e999
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))  # Python writes Infinity; 1e999 is what the file holds
    bad.write_text(bad.read_text().replace("Infinity", "1e999"))
    with pytest.raises(StrategyError, match=f"strategy file {bad} is not a valid JSON strategy.*{key}"):
        load_strategy(bad)
    ckptstore.convert(job["dist"], tmp_path / "store", strategy=job["nested"])
    r = run_cli("plan", tmp_path / "store", "-s", bad, "--rank", "0")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "[StrategyError]" in r.stderr, r.stderr


def test_load_rank_takes_a_json_target(job, tmp_path):
    ckptstore.index(job["dist"], tmp_path / "index", strategy=job["flat"])
    params = ckptstore.load_rank(tmp_path / "index", job["flat"], 6)
    expected = load_oracle(job["dist"] / "rank_6" / "net-1_6.ckpt")
    assert {n: p.asnumpy().tobytes() for n, p in params.items()} == {n: v.tobytes() for n, v in expected.items()}


def test_a_json_layout_no_reading_of_which_fits_is_a_strategy_error_naming_the_file(job, tmp_path):
    doc = json.loads(Path(job["flat"]).read_text())
    doc["parallel_layout_item"]["cols_dp_mp"]["tensor_shape"] = [16, 4, 4]  # 4 is not the size of device axis 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(StrategyError, match=f"^strategy file {bad}: parameter 'cols_dp_mp': tensor map \\[-1, 1, 0\\] "
                                            "has 3 axes but the local tensor has shape \\[16, 2\\]"):
        ckptstore.convert(job["dist"], tmp_path / "s", strategy=bad)
