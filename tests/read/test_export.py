"""``ckptstore export`` / ``ckptstore.export``: per-rank files of a target layout that MindSpore
loads, equal to ``mindspore.transform_checkpoints``'s, and ``CheckpointWriter`` output that is
byte-identical to ``mindspore.save_checkpoint``.
"""
from __future__ import annotations

import json
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy

import ckptstore
import mindspore_fixtures as T
from ckptstore.errors import StrategyError, UnsupportedLocationError
from ckptstore.formats.ckpt_writer import CheckpointWriter
from load_fixtures import BF16, assert_same_array, assert_same_dict, run_cli, to_numpy

# only the mindspore-marked tests touch it
mindspore = T.LazyModule("mindspore")

EXPORT_CASES = ["dp2_mp4->dp2_mp2", "pipeline2->1stage", "opt_shard->same-none", "mixed_dtypes->dp2_mp2_optshard",
                "mixed_dtypes->1rank", "pipeline2->same-files"]


def _files(out: Path, ranks, ext: str = "ckpt") -> list[str]:
    return [str(out / f"rank_{j}" / f"checkpoint_{j}.{ext}") for j in ranks]


@pytest.mark.mindspore
@pytest.mark.parametrize("case_id", EXPORT_CASES)
def test_exported_files_load_in_mindspore_and_equal_transform_checkpoints(load_env, tmp_path, case_id):
    t = load_env.target(case_id)
    summary = ckptstore.export(t.store, tmp_path / "out", strategy=t.strategy)
    assert list(summary.files) == _files(tmp_path / "out", range(t.world))
    assert summary.bytes_read == sum(a.nbytes for j in range(t.world) for a in t.oracle(j).values())
    for j in range(t.world):
        assert_same_dict(T.load_oracle(summary.files[j]), t.oracle(j), f"{case_id} rank {j}")


@pytest.mark.mindspore
def test_crc_files_pass_mindspore_crc_check(load_env, tmp_path):
    t = load_env.target("mixed_dtypes->dp2_mp2_optshard")
    plain = ckptstore.export(t.store, tmp_path / "plain", strategy=t.strategy)
    with_crc = ckptstore.export(t.store, tmp_path / "crc", strategy=t.strategy, crc=True)
    for j in range(t.world):
        payload = Path(plain.files[j]).read_bytes()
        data = Path(with_crc.files[j]).read_bytes()
        assert data == payload + b"crc_num" + zlib.crc32(payload).to_bytes(10, "big")
        loaded = mindspore.load_checkpoint(with_crc.files[j], crc_check=True)
        assert sorted(loaded) == sorted(t.oracle(j))
        assert_same_dict(T.load_oracle(with_crc.files[j]), t.oracle(j), f"crc rank {j}")


@pytest.mark.mindspore
def test_crc_check_rejects_a_damaged_exported_file(load_env, tmp_path):
    """The control for the test above: MindSpore's crc_check does catch a flipped payload byte."""
    t = load_env.target("dp2_mp4->dp2_mp2")
    summary = ckptstore.export(t.store, tmp_path / "crc", strategy=t.strategy, crc=True, ranks=[0])
    path = Path(summary.files[0])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    # MindSpore reports a CRC mismatch as a (misleading) permission error
    with pytest.raises(ValueError, match="May not have permission to read it"):
        mindspore.load_checkpoint(str(path), crc_check=True)
    assert sorted(mindspore.load_checkpoint(str(path))) == sorted(t.oracle(0))  # without the check: loads


@pytest.mark.mindspore
def test_cli_export_writes_exactly_the_chosen_ranks(load_env, tmp_path):
    t = load_env.target("dp2_mp4->dp2_mp2")
    out = tmp_path / "out"
    r = run_cli("export", t.store_path, out, "-s", t.target_file, "--ranks", "0,2-3")
    assert r.returncode == 0, r.stderr
    assert "wrote 3 file(s)" in r.stdout
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        ".ckptstore-export.json", "rank_0", "rank_0/checkpoint_0.ckpt", "rank_2", "rank_2/checkpoint_2.ckpt",
        "rank_3", "rank_3/checkpoint_3.ckpt"]
    for j in (0, 2, 3):
        assert_same_dict(T.load_oracle(out / f"rank_{j}" / f"checkpoint_{j}.ckpt"), t.oracle(j), f"rank {j}")


@pytest.mark.mindspore
def test_cli_export_with_per_stage_strategy_files(load_env, tmp_path):
    t = load_env.target("pipeline2->same-files")
    args = [a for f in t.layout.strategy_files for a in ("-s", str(f))]
    r = run_cli("export", t.store_path, tmp_path / "out", *args, "--ranks", "1,6")
    assert r.returncode == 0, r.stderr
    for j in (1, 6):
        assert_same_dict(T.load_oracle(tmp_path / "out" / f"rank_{j}" / f"checkpoint_{j}.ckpt"), t.oracle(j),
                         f"rank {j}")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".ckptstore-export.json", "rank_1", "rank_6"]


def test_cli_export_rank_outside_the_target_is_an_error(load_env, tmp_path):
    t = load_env.target("dp2_mp4->dp2_mp2")
    r = run_cli("export", t.store_path, tmp_path / "out", "-s", t.target_file, "--ranks", "4")
    assert r.returncode == 2
    assert "rank 4 is outside the target layout's 4 ranks" in r.stderr


def test_cli_export_refuses_a_range_without_its_end(load_env, tmp_path):
    t = load_env.target("dp2_mp4->dp2_mp2")
    r = run_cli("export", t.store_path, tmp_path / "out", "-s", t.target_file, "--ranks", "0,2-")
    assert r.returncode == 2
    assert "Invalid value for --ranks: '0,2-' is not a list like 0,1,4-7" in r.stderr
    assert not (tmp_path / "out").exists()


def test_cli_export_refuses_crc_for_safetensors_and_writes_nothing(load_env, tmp_path):
    t = load_env.target("dp2_mp4->dp2_mp2")
    r = run_cli("export", t.store_path, tmp_path / "out", "-s", t.target_file, "--format", "safetensors", "--crc")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "crc (--crc) appends MindSpore's crc_num trailer to .ckpt files; safetensors files have none" in r.stderr
    assert not (tmp_path / "out").exists()


def test_export_api_rank_outside_the_target_raises(load_env, tmp_path):
    t = load_env.target("dp2_mp4->dp2_mp2")
    with pytest.raises(StrategyError, match="rank 9 is outside"):
        ckptstore.export(t.store, tmp_path / "out", strategy=t.strategy, ranks=[9])


def test_export_api_refuses_a_url_as_out_and_writes_nothing(load_env, tmp_path, monkeypatch):
    # export writes local files: an s3:// out once became a local folder named "s3:"
    t = load_env.target("dp2_mp4->dp2_mp2")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsupportedLocationError, match=r"^export writes local files: s3://bucket/out is a URL; give a "
                                                        r"local folder"):
        ckptstore.export(t.store, "s3://bucket/out", strategy=t.strategy, ranks=[0])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.mindspore
def test_cli_export_safetensors_equal_transform_checkpoints(load_env, tmp_path):
    t = load_env.target("dp2_mp4->dp2_mp2")
    out = tmp_path / "out"
    r = run_cli("export", t.store_path, out, "-s", t.target_file, "--format", "safetensors")
    assert r.returncode == 0, r.stderr
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.safetensors")) == [
        f"rank_{j}/checkpoint_{j}.safetensors" for j in range(4)]
    for j in range(t.world):
        loaded = safetensors.numpy.load_file(str(out / f"rank_{j}" / f"checkpoint_{j}.safetensors"))
        assert_same_dict(loaded, t.oracle(j), f"safetensors rank {j}")


def _read_safetensors_raw(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    """safetensors by its spec (safetensors.numpy has no BF16): u64 header length, JSON, data."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    dtypes = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "BF16": ml_dtypes.bfloat16, "I8": np.int8,
              "I16": np.int16, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "U16": np.uint16, "U32": np.uint32,
              "U64": np.uint64, "BOOL": np.bool_}
    out = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        lo, hi = d["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + lo:8 + n + hi], dtype=dtypes[d["dtype"]]).reshape(d["shape"])
    return out, header


@pytest.mark.mindspore
def test_safetensors_with_bfloat16_and_every_dtype(load_env, tmp_path):
    t = load_env.target("mixed_dtypes->dp2_mp2_optshard")
    summary = ckptstore.export(t.store, tmp_path / "out", strategy=t.strategy, format="safetensors")
    assert list(summary.files) == _files(tmp_path / "out", range(t.world), "safetensors")
    for j in range(t.world):
        path = Path(summary.files[j])
        values, header = _read_safetensors_raw(path)
        assert_same_dict(values, t.oracle(j), f"rank {j}")
        assert {header[n]["dtype"] for n in values if n.startswith("bf16.")} == {"BF16"}
        # the safetensors library parses the header and reads every tensor it has a numpy type for
        with safetensors.safe_open(str(path), framework="numpy") as f:
            assert sorted(f.keys()) == sorted(t.oracle(j))
            for name in f.keys():
                if not name.startswith("bf16."):
                    assert_same_array(f.get_tensor(name), t.oracle(j)[name], name)


@pytest.mark.mindspore
def test_export_dtype_and_names(load_env, tmp_path):
    t = load_env.target("dp2_mp4->dp2_mp2")
    summary = ckptstore.export(t.store, tmp_path / "out", strategy=t.strategy, ranks=[1], include=["layer?.w"],
                               dtype=np.dtype(np.float16))
    assert list(summary.files) == _files(tmp_path / "out", [1])
    expected = {n: t.oracle(1)[n].astype(np.float16) for n in ("layer0.w", "layer1.w")}
    assert_same_dict(T.load_oracle(summary.files[0]), expected, "float16")
    assert summary.bytes_read == sum(t.oracle(1)[n].nbytes for n in ("layer0.w", "layer1.w"))


# ---------------------------------------------------------------------------------------------
# CheckpointWriter vs mindspore.save_checkpoint, byte for byte


def _writer_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "w.f32": rng.standard_normal((3, 5)).astype(np.float32),
        "w.f16": rng.standard_normal(4).astype(np.float16),
        "w.bf16": rng.standard_normal((2, 3)).astype(np.float32).astype(BF16),
        "w.f64": rng.standard_normal((2, 2)),
        "i8": np.arange(-3, 3, dtype=np.int8),
        "i16": np.arange(5, dtype=np.int16),
        "i32": np.arange(7, dtype=np.int32).reshape(7, 1),
        "i64": np.arange(3, dtype=np.int64) - 10**12,
        "u8": np.arange(9, dtype=np.uint8),
        "u16": np.arange(2, dtype=np.uint16),
        "u32": np.arange(2, dtype=np.uint32),
        "u64": np.array([0, 2**63 + 5], dtype=np.uint64),
        "mask": rng.random((3, 3)) < 0.5,
        "scalar": np.array(1.5, np.float32),
        # bigger than 1 KiB: several records when SLICE_SIZE is 1 (KiB)
        "big.f32": rng.standard_normal(700).astype(np.float32),
        "big.bf16": rng.standard_normal((40, 30)).astype(np.float32).astype(BF16),
        "big.bool": rng.random(1500) < 0.5,
        "exactly.2KiB": np.arange(512, dtype=np.float32),
    }


def _ms_tensor(a: np.ndarray):
    if a.dtype == BF16:
        return mindspore.Tensor(a.astype(np.float32), dtype=mindspore.bfloat16)
    return mindspore.Tensor(a)


@pytest.mark.mindspore
@pytest.mark.parametrize("multi_record", [False, True], ids=["one-record-each", "slice-size-1KiB"])
@pytest.mark.parametrize("crc", [False, True], ids=["no-crc", "crc"])
def test_checkpoint_writer_is_byte_identical_to_save_checkpoint(tmp_path, monkeypatch, multi_record, crc):
    arrays = _writer_arrays()
    append = {"epoch_num": 3, "lr": 0.25, "note": "hello"}
    if multi_record:
        monkeypatch.setattr(pytest.importorskip("mindspore.train.serialization"), "SLICE_SIZE", 1)
    ms_path, ours = tmp_path / "ms.ckpt", tmp_path / "ours.ckpt"
    mindspore.save_checkpoint([{"name": n, "data": _ms_tensor(a)} for n, a in arrays.items()], str(ms_path),
                              append_dict=append, crc_check=crc)
    kwargs = {"slice_bytes": 1024} if multi_record else {}
    with CheckpointWriter(ours, crc=crc, **kwargs) as w:
        for name, a in arrays.items():
            w.add(name, a)
        w.add("epoch_num", np.array(3, np.int64))  # append_dict ints are Int64 of shape ()
        w.add("lr", np.array(0.25, np.float32))  # floats Float32 of shape ()
        w.add("note", "hello")
    assert ours.read_bytes() == ms_path.read_bytes()
    loaded = mindspore.load_checkpoint(str(ours), crc_check=crc)
    assert loaded.pop("note") == "hello"
    assert_same_dict({n: to_numpy(v) for n, v in loaded.items()},
                     {**arrays, "epoch_num": np.array(3, np.int64), "lr": np.array(0.25, np.float32)}, "reloaded")


@pytest.mark.mindspore
def test_slice_size_patch_really_makes_several_records(tmp_path, monkeypatch):
    """The control for the multi-record case: with SLICE_SIZE = 1 MindSpore's file grows by the
    repeated record headers (2800 bytes of big.f32 in three records)."""
    a = {"big.f32": np.arange(700, dtype=np.float32)}
    mindspore.save_checkpoint([{"name": "big.f32", "data": _ms_tensor(a["big.f32"])}], str(tmp_path / "one.ckpt"))
    monkeypatch.setattr(pytest.importorskip("mindspore.train.serialization"), "SLICE_SIZE", 1)
    mindspore.save_checkpoint([{"name": "big.f32", "data": _ms_tensor(a["big.f32"])}], str(tmp_path / "three.ckpt"))
    one, three = (tmp_path / "one.ckpt").read_bytes(), (tmp_path / "three.ckpt").read_bytes()
    assert three.count(b"big.f32") == 3 and one.count(b"big.f32") == 1
    with CheckpointWriter(tmp_path / "ours.ckpt", slice_bytes=1024) as w:
        w.add("big.f32", a["big.f32"])
    assert (tmp_path / "ours.ckpt").read_bytes() == three


# ---------------------------------------------------------------------------------------------
# a store converted from one .ckpt (string values included)


def _single_file_store(tmp_path: Path) -> tuple[Path, Path]:
    arrays = _writer_arrays()
    src = tmp_path / "one.ckpt"
    mindspore.save_checkpoint([{"name": n, "data": _ms_tensor(a)} for n, a in arrays.items()], str(src),
                              append_dict={"epoch_num": 2, "lr": 0.5, "note": "héllo wörld"})
    store = tmp_path / "one.zarr"
    ckptstore.convert(src, store)
    return src, store


@pytest.mark.mindspore  # the source file is MindSpore's own save
def test_export_of_a_single_file_store_is_byte_identical_to_the_file(tmp_path):
    src, store_path = _single_file_store(tmp_path)
    with ckptstore.open(store_path) as store:
        summary = ckptstore.export(store, tmp_path / "out")
    assert list(summary.files) == _files(tmp_path / "out", [0])
    assert Path(summary.files[0]).read_bytes() == src.read_bytes()


@pytest.mark.mindspore  # the source file is MindSpore's own save
def test_string_values_go_to_safetensors_metadata(tmp_path):
    _, store_path = _single_file_store(tmp_path)
    with ckptstore.open(store_path) as store:
        summary = ckptstore.export(store, tmp_path / "out", format="safetensors",
                                   include=["w.f32", "i64", "note", "lr"])
    with safetensors.safe_open(summary.files[0], framework="numpy") as f:
        assert f.metadata() == {"note": "héllo wörld"}
        assert sorted(f.keys()) == ["i64", "lr", "w.f32"]
    loaded = safetensors.numpy.load_file(summary.files[0])
    arrays = _writer_arrays()
    assert_same_dict(loaded, {"w.f32": arrays["w.f32"], "i64": arrays["i64"], "lr": np.array(0.5, np.float32)}, "st")
