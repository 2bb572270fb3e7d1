"""``ckptstore.convert``: real MindSpore distributed checkpoints -> a Zarr v3 store of global tensors.

Oracles: the global tensors the fixtures were cut from, MindSpore's own merge
(``mindspore.transform_checkpoints`` to one rank + ``mindspore.load_checkpoint``), and plain
zarr-python reading the store. Expected byte counts come from the specs through MindSpore's
slicing code (see ``convert_fixtures``), not from ckptstore. The tests that ask MindSpore (its
merge, its slicing, its loader, its optimizers) are marked ``mindspore``; the fixtures themselves
are MindSpore's bytes written by ckptstore's writers (tests/testing/test_pure_fixtures.py).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import zarr

import ckptstore  # registers bfloat16 with zarr
import mindspore_fixtures as T
from ckptstore.errors import ReplicaMismatchError
from ckptstore.formats.ckpt_reader import scan_checkpoint
from ckptstore.formats.ckpt_writer import CheckpointWriter
from conftest import SavedLayout
from convert_fixtures import (
    APPENDED,
    assert_same_array,
    convert_layout,
    copy_saved,
    data_files,
    expected_for,
    expected_values,
    payload_bytes,
    run_cli,
    strategy_args,
)

ms = T.LazyModule("mindspore")  # only the mindspore-marked tests touch it

KINDS = list(T.LAYOUT_KINDS)
#: Every layout kind with protobuf strategies, and the multi-file kinds again with JSON ones.
FORMATS = [pytest.param(k, "protobuf", id=k) for k in KINDS] + [
    pytest.param("dp2_mp4", "json", id="dp2_mp4-json"),
    pytest.param("pipeline2", "json", id="pipeline2-json"),
]


# ---------------------------------------------------------------------------------------------
# 1. values


@pytest.mark.mindspore
@pytest.mark.parametrize(("kind", "fmt"), FORMATS)
def test_store_holds_every_parameter_with_its_global_shape_and_dtype(converted, kind, fmt):
    c = converted(kind, fmt)
    exp = expected_for(c.layout)
    with ckptstore.open(c.store) as store:
        if c.layout.stages == 1:  # source order: rank 0's file order
            assert store.names() == [s.name for s in c.layout.specs] + list(APPENDED)
        else:
            assert sorted(store.names()) == sorted(exp.shapes)
        for name in store.names():
            info = store.info(name)
            assert (info.shape, info.np_dtype) == (exp.shapes[name], exp.dtypes[name]), name


@pytest.mark.parametrize(("kind", "fmt"), FORMATS)
def test_read_equals_the_global_tensors_bit_for_bit(converted, kind, fmt):
    c = converted(kind, fmt)
    values = expected_values(c.layout)
    with ckptstore.open(c.store) as store:
        assert sorted(store.names()) == sorted(values)
        for name, want in values.items():
            assert_same_array(store.read(name), want, name)
            assert_same_array(store.read(name, verify=True), want, f"{name} (verify=True)")


@pytest.mark.mindspore
@pytest.mark.parametrize("kind", KINDS)
def test_read_equals_mindspore_transform_checkpoints_merge(converted, kind, tmp_path):
    c = converted(kind)
    T.transform_oracle(c.layout.root, c.layout.strategy_arg, None, tmp_path / "merged")
    (merged,) = (tmp_path / "merged").rglob("*.ckpt")
    oracle = T.load_oracle(merged)
    with ckptstore.open(c.store) as store:
        assert sorted(store.names()) == sorted(oracle)
        for name, want in oracle.items():
            assert_same_array(store.read(name), want, name)


@pytest.mark.parametrize(("kind", "fmt"), FORMATS)
def test_plain_zarr_reads_the_same_values(converted, kind, fmt):
    c = converted(kind, fmt)
    group = zarr.open_group(c.store, mode="r")
    values = expected_values(c.layout)
    assert sorted(group.array_keys()) == sorted(values)
    for name, want in values.items():
        arr = group[name]
        assert arr.shape == want.shape, name
        assert_same_array(np.asarray(arr[...]), want, name)


@pytest.fixture
def one_kib_records(monkeypatch):
    """MindSpore cuts tensors into 1 KiB records (``SLICE_SIZE`` is in KiB)."""
    monkeypatch.setattr(pytest.importorskip("mindspore.train.serialization"), "SLICE_SIZE", 1)


MULTI_RECORD_SPECS = [
    # 1.2 MB, whole on every rank; 1200-byte rows: --chunk-mb 1 cuts it at 500 rows = byte 600000,
    # which is in the middle of a 1 KiB record
    T.ParamSpec("emb", (1000, 300)),
    T.ParamSpec("w", (256, 64), dev_matrix=(2, 4), tensor_map=(0, -1)),  # 16 KiB slices
    T.ParamSpec("bf", (128, 64), "bfloat16", dev_matrix=(2, 4), tensor_map=(-1, 0)),  # 4 KiB slices
    T.ParamSpec("opt", (128, 32), dev_matrix=(2, 4), tensor_map=(0, -1), opt_shard_step=4, opt_shard_size=-1),
    T.ParamSpec("i64", (48, 40), "int64", dev_matrix=(2, 4), tensor_map=(-1, 1)),
]


@pytest.fixture
def multi_record_layout(tmp_path, one_kib_records) -> SavedLayout:
    tensors = T.make_global_tensors(MULTI_RECORD_SPECS, seed=2)
    T.save_distributed(tmp_path / "src", MULTI_RECORD_SPECS, tensors, world_size=8, extra_scalars=True)
    return SavedLayout("multi_record", tmp_path / "src", MULTI_RECORD_SPECS, tensors, 8, 1)


@pytest.mark.slow
@pytest.mark.mindspore
def test_tensors_split_across_several_records_convert_exactly(multi_record_layout, tmp_path):
    layout = multi_record_layout
    index = scan_checkpoint(layout.rank_file(5))
    for spec in MULTI_RECORD_SPECS:  # the fixture really has multi-record tensors
        assert len(index[spec.name].pieces) > 1, spec.name
    convert_layout(layout, tmp_path / "s.zarr", chunk_mb=1)
    T.transform_oracle(layout.root, layout.strategy_arg, None, tmp_path / "merged")
    (merged,) = (tmp_path / "merged").rglob("*.ckpt")
    oracle = T.load_oracle(merged)
    with ckptstore.open(tmp_path / "s.zarr") as store:
        assert len(store.info("emb").chunks) == 2  # a chunk boundary inside a record
        for spec in MULTI_RECORD_SPECS:
            assert_same_array(store.read(spec.name), layout.tensors[spec.name], spec.name)
            assert_same_array(store.read(spec.name), oracle[spec.name], f"{spec.name} vs MindSpore")


SINGLE_SPECS, _, _ = T.layout_specs("mixed_dtypes")
APPEND = {"epoch_num": 7, "lr": 0.5, "note": "hello wörld ✓", "big_int": -(2**40)}


@pytest.fixture(scope="module")
def single_file(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """One ``mindspore.save_checkpoint`` file (no strategy): every dtype whole, plus append_dict
    (Python ints as Int64 scalars, floats as Float32, str as str), written by ckptstore's
    CheckpointWriter, byte-identical to it (tests/read/test_export.py)."""
    tensors = T.make_global_tensors(SINGLE_SPECS, seed=9)
    path = tmp_path_factory.mktemp("single") / "model.ckpt"
    with CheckpointWriter(path) as w:
        for n, a in tensors.items():
            w.add(n, a)
        for n, v in APPEND.items():
            w.add(n, v if isinstance(v, str) else np.array(v, np.int64 if isinstance(v, int) else np.float32))
    return path, tensors


def test_single_file_converts_every_tensor_bit_for_bit(single_file, tmp_path):
    path, tensors = single_file
    summary = ckptstore.convert(path, tmp_path / "s.zarr")
    assert summary.params == len(tensors) + len(APPEND)
    assert summary.source_bytes == summary.unique_bytes  # one file: nothing to deduplicate
    with ckptstore.open(tmp_path / "s.zarr") as store:
        assert store.names() == list(tensors) + list(APPEND)
        for name, want in tensors.items():
            assert_same_array(store.read(name), want, name)
        assert store.source["world_size"] == 1


@pytest.mark.parametrize(("name", "want"), [
    pytest.param("epoch_num", np.array(7, np.int64), id="int"),
    pytest.param("big_int", np.array(-(2**40), np.int64), id="big-int"),
    pytest.param("lr", np.array(0.5, np.float32), id="float"),
])
@pytest.mark.mindspore
def test_single_file_appended_numbers_are_mindspore_scalars(single_file, tmp_path, name, want):
    path, _ = single_file
    ckptstore.convert(path, tmp_path / "s.zarr")
    loaded = ms.load_checkpoint(str(path))[name].asnumpy()
    assert_same_array(loaded, want, f"MindSpore's view of {name}")
    with ckptstore.open(tmp_path / "s.zarr") as store:
        assert_same_array(store.read(name), want, name)


@pytest.mark.mindspore
def test_single_file_appended_string_comes_back_as_python_str(single_file, tmp_path):
    path, _ = single_file
    ckptstore.convert(path, tmp_path / "s.zarr")
    assert ms.load_checkpoint(str(path))["note"] == APPEND["note"]
    with ckptstore.open(tmp_path / "s.zarr") as store:
        value = store.read("note")
        assert type(value) is str
        assert value == APPEND["note"]
        assert store.info("note").dtype == "str"


# ---------------------------------------------------------------------------------------------
# 2. replicas are stored once


@pytest.mark.mindspore
@pytest.mark.parametrize("kind", KINDS)
def test_store_payload_is_each_distinct_slice_once(converted, kind):
    """Data files hold the global tensors (= every distinct slice once) and, for parameters of
    several chunks, the Zarr sharding index; nothing else."""
    c = converted(kind)
    exp = expected_for(c.layout)
    want = sum(exp.stored_bytes(n) for n in exp.shapes)
    assert payload_bytes(c.store) == want
    assert c.summary.unique_bytes == sum(exp.nbytes(n) for n in exp.shapes)
    assert c.summary.stored_bytes == c.summary.unique_bytes
    assert c.summary.chunks == sum(exp.chunks(n) for n in exp.shapes)


@pytest.mark.mindspore
@pytest.mark.parametrize("kind", KINDS)
def test_source_bytes_counts_every_rank_files_payload(converted, kind):
    c = converted(kind)
    scanned = sum(e.nbytes for r in range(c.layout.world)
                  for e in scan_checkpoint(c.layout.rank_file(r)).entries.values())
    exp = expected_for(c.layout)
    assert scanned == sum(exp.source_bytes(n) for n in exp.shapes)  # the fixture is what we think
    assert c.summary.source_bytes == scanned
    assert c.summary.dedup_saved_bytes == scanned - c.summary.unique_bytes


@pytest.mark.mindspore
def test_dedup_saves_the_replicas_of_dp2_mp4(converted):
    c = converted("dp2_mp4")
    exp = expected_for(c.layout)
    # embedding.table is replicated on all 8 ranks: 7 copies saved
    assert exp.source_bytes("embedding.table") == 8 * exp.nbytes("embedding.table")
    assert c.summary.dedup_saved_bytes == sum(exp.source_bytes(n) - exp.nbytes(n) for n in exp.shapes) > 0


REPLICA = "layer0.w"  # dp2_mp4: rows split 4 ways; ranks r and r + 4 hold the same slice


@pytest.fixture
def damaged_replica(saved_layout, tmp_path) -> SavedLayout:
    """dp2_mp4 with one payload byte of rank 4's copy of layer0.w flipped (rank 0 is intact)."""
    layout = copy_saved(saved_layout("dp2_mp4"), tmp_path / "src")
    entry = scan_checkpoint(layout.rank_file(4))[REPLICA]
    offset, length = entry.pieces[0]
    path = layout.rank_file(4)
    data = bytearray(path.read_bytes())
    data[offset + length // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return layout


def test_verify_replicas_names_the_parameter_and_both_ranks(damaged_replica, tmp_path):
    layout = damaged_replica
    with pytest.raises(ReplicaMismatchError) as e:
        convert_layout(layout, tmp_path / "s.zarr", verify_replicas=True, workers=1)
    msg = str(e.value)
    assert f"'{REPLICA}'" in msg
    assert re.search(r"\brank 4\b", msg) and re.search(r"\brank 0\b", msg), msg
    assert str(layout.rank_file(4)) in msg and str(layout.rank_file(0)) in msg


def test_a_damaged_replica_in_the_sampled_bytes_is_refused_without_verify_replicas(damaged_replica, tmp_path):
    with pytest.raises(ReplicaMismatchError, match=r"rank 0 .* and rank 4 .*one of the files is damaged"):
        convert_layout(damaged_replica, tmp_path / "s.zarr")


def test_without_the_layout_check_only_the_first_replica_is_read(damaged_replica, tmp_path):
    layout = damaged_replica
    convert_layout(layout, tmp_path / "s.zarr", check_layout=False)
    with ckptstore.open(tmp_path / "s.zarr") as store:
        assert_same_array(store.read(REPLICA), layout.tensors[REPLICA], REPLICA)


def test_verify_replicas_passes_on_intact_replicas(saved_layout, tmp_path):
    layout = saved_layout("opt_shard")
    summary = convert_layout(layout, tmp_path / "s.zarr", verify_replicas=True)
    assert summary.chunks_written == summary.chunks


# ---------------------------------------------------------------------------------------------
# 3. slimming


DP2_MP4_NAMES = [s.name for s in T.layout_specs("dp2_mp4")[0]] + list(APPENDED)


@pytest.mark.parametrize(("include", "exclude", "kept"), [
    pytest.param(["layer*"], [], ["layer0.w", "layer0.b", "layer1.w", "layernorm.gamma", "layernorm.beta"],
                 id="include"),
    pytest.param(["layer0.*", "moe.w"], [], ["layer0.w", "layer0.b", "moe.w"], id="two-includes"),
    pytest.param([], ["adam_*", "*_num"], [n for n in DP2_MP4_NAMES if not n.startswith("adam_")
                                          and not n.endswith("_num")], id="exclude"),
    pytest.param(["*.w"], ["adam_*"], ["layer0.w", "layer1.w", "moe.w"], id="include-and-exclude"),
    pytest.param(["layer?.w"], ["layer1.*"], ["layer0.w"], id="question-mark"),
])
@pytest.mark.mindspore  # expected_for: MindSpore's slicing
def test_include_and_exclude_globs(saved_layout, tmp_path, include, exclude, kept):
    layout = saved_layout("dp2_mp4")
    out = tmp_path / "s.zarr"
    summary = convert_layout(layout, out, include=include, exclude=exclude)
    exp = expected_for(layout)
    assert summary.params == len(kept)
    with ckptstore.open(out) as store:
        assert store.names() == kept
        for name in kept:
            assert_same_array(store.read(name), expected_values(layout)[name], name)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(kept)  # nothing else written
    assert payload_bytes(out) == sum(exp.stored_bytes(n) for n in kept)


@pytest.mark.parametrize("kind", ["dp2_mp4", "opt_shard", "pipeline2"])
def test_drop_optimizer_removes_optimizer_state_and_keeps_weights(saved_layout, tmp_path, kind):
    layout = saved_layout(kind)
    out = tmp_path / "s.zarr"
    convert_layout(layout, out, drop_optimizer=True)
    weights = [s.name for s in layout.specs
               if not s.name.startswith(("adam_m.", "adam_v.")) and s.name not in ("global_step", "learning_rate")]
    assert len(weights) < len(layout.specs)
    with ckptstore.open(out) as store:
        assert sorted(store.names()) == sorted(weights)  # epoch_num/step_num are training counters too
        for name in weights:
            assert_same_array(store.read(name), layout.tensors[name], name)


def _dense():
    class _Dense(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = ms.nn.Dense(4, 3)

        def construct(self, x):
            return self.fc(x)

    return _Dense()


#: MindSpore's optimizers, each as it names its state (``TrainOneStepCell(...).get_parameters()``).
OPTIMIZERS = [
    pytest.param(lambda p: ms.nn.Adam(p, 1e-3), id="Adam"),
    pytest.param(lambda p: ms.nn.AdamWeightDecay(p, 1e-3), id="AdamWeightDecay"),
    pytest.param(lambda p: ms.nn.LazyAdam(p), id="LazyAdam"),
    pytest.param(lambda p: ms.nn.AdaMax(p), id="AdaMax"),
    pytest.param(lambda p: ms.nn.Adagrad(p), id="Adagrad"),
    pytest.param(lambda p: ms.nn.ProximalAdagrad(p), id="ProximalAdagrad"),
    pytest.param(lambda p: ms.nn.RMSProp(p), id="RMSProp"),
    pytest.param(lambda p: ms.nn.FTRL(p), id="FTRL"),
    pytest.param(lambda p: ms.nn.Momentum(p, 0.1, 0.9), id="Momentum"),
    pytest.param(lambda p: ms.nn.SGD(p, 0.1, momentum=0.9), id="SGD"),
    pytest.param(lambda p: ms.nn.LARS(ms.nn.Momentum(p, 0.1, 0.9)), id="LARS"),
    pytest.param(lambda p: ms.nn.Lamb(p, 1e-3), id="Lamb"),
    pytest.param(lambda p: ms.nn.Adadelta(p), id="Adadelta"),
    pytest.param(lambda p: ms.nn.Rprop(p), id="Rprop"),
    pytest.param(lambda p: ms.nn.ASGD(p), id="ASGD"),
]


@pytest.mark.mindspore
@pytest.mark.parametrize("make_optimizer", OPTIMIZERS)
def test_drop_optimizer_keeps_exactly_the_network_weights_of_a_mindspore_optimizer(make_optimizer):
    from ckptstore.checkpoint.selection import select_params

    net = _dense()
    cell = ms.nn.TrainOneStepCell(ms.nn.WithLossCell(net, ms.nn.MSELoss()), make_optimizer(net.trainable_params()))
    names = [p.name for p in cell.get_parameters()]
    assert select_params(names, drop_optimizer=True) == ["fc.weight", "fc.bias"], names


def test_drop_optimizer_keeps_the_weights_of_a_module_named_like_optimizer_state():
    from ckptstore.checkpoint.selection import select_params

    names = ["linear.weight", "linear.bias", "moment1.linear.weight", "moment1.linear.bias", "global_step"]
    assert select_params(names, drop_optimizer=True) == ["linear.weight", "linear.bias"]


# ---------------------------------------------------------------------------------------------
# 4. compression


CODECS = ["zstd", "blosc"]


@pytest.mark.parametrize("kind", ["dp2_mp4", "mixed_dtypes"])
@pytest.mark.parametrize("codec", CODECS)
def test_compressed_store_reads_the_same_values(saved_layout, tmp_path, codec, kind):
    layout = saved_layout(kind)
    out = tmp_path / "s.zarr"
    convert_layout(layout, out, compress=codec)
    values = expected_values(layout)
    group = zarr.open_group(out, mode="r")
    with ckptstore.open(out) as store:
        for name, want in values.items():
            assert store.info(name).codec["id"] == codec, name
            assert_same_array(store.read(name), want, name)
            assert_same_array(np.asarray(group[name][...]), want, f"{name} via zarr")


@pytest.fixture(scope="module")
def trained_like(tmp_path_factory) -> SavedLayout:
    """Weights drawn like trained ones (normal, std 0.02) in float32 and bfloat16, dp2_mp4-split,
    32-64 KiB a slice: what a codec meets in practice (the standard fixtures' 2 KiB tensors of
    distinct values do not compress at all with blosc)."""
    d = (2, 4)
    specs = [T.ParamSpec("layer0.w", (512, 128), dev_matrix=d, tensor_map=(0, -1)),
             T.ParamSpec("layer1.w", (128, 1024), "bfloat16", dev_matrix=d, tensor_map=(-1, 0)),
             T.ParamSpec("embedding.table", (256, 64), dev_matrix=d, tensor_map=(-1, -1))]
    rng = np.random.default_rng(5)
    tensors = {s.name: rng.normal(0, 0.02, s.shape).astype(s.np_dtype) for s in specs}
    root = tmp_path_factory.mktemp("trained_like")
    T.save_distributed(root, specs, tensors, world_size=8, writer="ckptstore")
    return SavedLayout("trained_like", root, specs, tensors, 8, 1)


@pytest.mark.parametrize("codec", CODECS)
def test_a_compressed_store_of_trained_weights_is_smaller_than_the_raw_one(trained_like, tmp_path, codec):
    raw_out, out = tmp_path / "raw.zarr", tmp_path / "s.zarr"
    raw = convert_layout(trained_like, raw_out)
    summary = convert_layout(trained_like, out, compress=codec)
    assert summary.unique_bytes == raw.unique_bytes == raw.stored_bytes
    assert summary.stored_bytes < raw.stored_bytes
    assert summary.stored_bytes == sum(info.stored_bytes for info in _infos(out))
    assert sorted(data_files(raw_out)) == sorted(data_files(out))
    assert payload_bytes(out) < payload_bytes(raw_out)
    with ckptstore.open(out) as store:
        for name, value in trained_like.tensors.items():
            assert store.info(name).stored_bytes < value.nbytes, name  # every parameter went through the codec


def _infos(out: Path):
    with ckptstore.open(out) as store:
        return [store.info(n) for n in store.names()]


@pytest.mark.slow
@pytest.mark.parametrize("codec", CODECS)
def test_ckptstore_verify_passes_on_a_compressed_store(saved_layout, tmp_path, codec):
    layout = saved_layout("mixed_dtypes")
    out = tmp_path / "s.zarr"
    convert_layout(layout, out, compress=codec)
    r = run_cli("verify", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK:") and "0 problem(s)" in r.stdout
    r = run_cli("verify", out, "--against", layout.root, *strategy_args(layout))
    assert r.returncode == 0, r.stderr
    assert "0 problem(s)" in r.stdout


def test_unknown_compression_is_refused(saved_layout, tmp_path):
    with pytest.raises(ValueError, match="unknown compression 'lzma'"):
        convert_layout(saved_layout("dp2_mp4"), tmp_path / "s.zarr", compress="lzma")
    assert not (tmp_path / "s.zarr").exists()


def test_conversion_leaves_no_work_files(converted):
    c = converted("dp2_mp4")
    names = [p.name for p in c.store.rglob("*")]
    assert not [n for n in names if n.endswith((".partial", ".journal", ".tmp")) or n == ".ckptstore-work"]
    assert os.path.isfile(c.store / "zarr.json")


def test_blosc_chunks_are_shuffled_by_element_size_as_declared(saved_layout, tmp_path):
    """The Blosc header of every chunk says what the array's zarr.json says: byte shuffle with
    typesize = the element size (blosc1 header: flags at byte 2, typesize at byte 3)."""
    import json

    out = tmp_path / "s.zarr"
    convert_layout(saved_layout("mixed_dtypes"), out, compress="blosc")
    with ckptstore.open(out) as store:
        for name in store.names():
            info = store.info(name)
            meta = json.loads((out / info.path / "zarr.json").read_text())
            (blosc,) = [c for c in _codecs(meta) if c["name"] == "blosc"]
            assert blosc["configuration"]["typesize"] == info.np_dtype.itemsize, name
            assert blosc["configuration"]["shuffle"] == "shuffle", name
            t = info.chunks
            for i in range(len(t)):
                with open(out / t.files[i], "rb") as f:
                    f.seek(t.offsets[i])
                    header = f.read(4)
                assert header[3] == info.np_dtype.itemsize, (name, i)
                assert header[2] & 0x01, (name, i)  # BLOSC_DOSHUFFLE


def _codecs(meta: dict) -> list[dict]:
    """Codecs of an array's zarr.json, looking inside the sharding codec."""
    out = []
    for c in meta["codecs"]:
        out.append(c)
        out += _codecs(c["configuration"]) if c["name"] == "sharding_indexed" else []
    return out


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory) -> tuple[Path, list[T.ParamSpec], dict[int, dict[str, np.ndarray]]]:
    """mp_rows saved twice into the same rank folders: net-1_1.ckpt and net-1_2.ckpt (other values)."""
    specs, world, _ = T.layout_specs("mp_rows")
    root = tmp_path_factory.mktemp("two_steps")
    values = {}
    for step, seed in ((1, 21), (2, 22)):
        values[step] = T.make_global_tensors(specs, seed=seed)
        T.save_distributed(root, specs, values[step], world_size=world, step_suffix=f"-1_{step}", writer="ckptstore")
    return root, specs, values


@pytest.mark.parametrize(("step", "want"), [pytest.param(None, 2, id="newest"), pytest.param(1, 1, id="step-1")])
def test_each_rank_file_is_picked_by_step(two_steps, tmp_path, step, want):
    root, specs, values = two_steps
    ckptstore.convert(root, tmp_path / "s.zarr", strategy=[root / "strategy.ckpt"], step=step)
    with ckptstore.open(tmp_path / "s.zarr") as store:
        assert store.source["step"] == step
        assert store.source["files"]["0"] == str(root / "rank_0" / f"net-1_{want}.ckpt")
        for spec in specs:
            assert_same_array(store.read(spec.name), values[want][spec.name], spec.name)


def test_each_converted_array_is_one_folder_its_data_file_beside_its_zarr_json(saved_layout, tmp_path):
    # chunk key separator ".": no c/<i>/ folders to create and fsync per array
    layout = saved_layout("dp2_mp4")
    convert_layout(layout, tmp_path / "s")
    with ckptstore.open(tmp_path / "s") as store:
        info = store.info("layer0.w")
        files = sorted(p.relative_to(tmp_path / "s" / info.path).as_posix()
                       for p in (tmp_path / "s" / info.path).rglob("*"))
        assert files == ["c.0.0", "zarr.json"]
        assert set(info.chunks.files) == {f"{info.path}/c.0.0"}  # every chunk in the one shard file


def test_zarr_chunk_keys_have_one_spelling_the_dot_separator():
    from ckptstore.store import zarr as zb

    assert (zb.grid_key("w", (0, 1)), zb.chunk_key("w", 2), zb.chunk_key("b", 0)) == ("w/c.0.1", "w/c.0.0", "b/c")
    meta = json.loads(zb.array_metadata((4, 2), "float32", (2, 2), None, sharded=False))
    assert meta["chunk_key_encoding"] == {"name": "default", "configuration": {"separator": "."}}
