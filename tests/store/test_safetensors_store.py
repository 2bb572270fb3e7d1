"""The safetensors store format (``convert --format safetensors``): whole global tensors in
``model-*.safetensors`` files readable by the safetensors library, same manifest and guarantees
as the Zarr store."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import ckptstore
import mindspore_fixtures as T
from ckptstore.errors import IncompleteStoreError
from ckptstore.read.loader import rank_view
from ckptstore.read.verify import verify_store
from convert_fixtures import assert_same_array, convert_layout, run_cli, strategy_args

KINDS = list(T.LAYOUT_KINDS)


def _safetensors_tensors(store: Path) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for f in sorted(store.glob("model-*.safetensors")):
        tensors.update(load_file(f))
    return tensors


@pytest.mark.parametrize("kind", KINDS)
def test_every_global_tensor_reads_back_bit_for_bit(saved_layout, tmp_path, kind):
    layout = saved_layout(kind)
    convert_layout(layout, tmp_path / "st", format="safetensors", chunk_mb=1)
    store = ckptstore.open(tmp_path / "st")
    assert store.manifest.kind == "safetensors"
    for name, expected in layout.tensors.items():
        assert_same_array(np.asarray(store.read(name)), expected, name)


@pytest.mark.parametrize("kind", ["dp2_mp4", "mixed_dtypes"])
def test_the_safetensors_library_reads_the_same_global_tensors(saved_layout, tmp_path, kind):
    layout = saved_layout(kind)
    convert_layout(layout, tmp_path / "st", format="safetensors")
    tensors = _safetensors_tensors(tmp_path / "st")
    for name, expected in layout.tensors.items():
        assert_same_array(tensors[name], expected, name)


def test_store_folder_holds_only_the_manifest_and_safetensors_files(saved_layout, tmp_path):
    convert_layout(saved_layout("dp2_mp4"), tmp_path / "st", format="safetensors")
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == ["ckptstore.json", "model-00001-of-00001.safetensors"]


def test_payload_is_each_tensor_once(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    convert_layout(layout, tmp_path / "st", format="safetensors")
    data = (tmp_path / "st" / "model-00001-of-00001.safetensors").read_bytes()
    payload = len(data) - 8 - int.from_bytes(data[:8], "little")
    store = ckptstore.open(tmp_path / "st")
    assert set(layout.tensors) <= set(store.names())
    assert payload == sum(store.info(n).nbytes for n in store.names())


@pytest.mark.parametrize("kind", ["mp_cols", "opt_shard", "pipeline2"])
def test_verify_against_the_source_passes(saved_layout, tmp_path, kind):
    layout = saved_layout(kind)
    convert_layout(layout, tmp_path / "st", format="safetensors", chunk_mb=1)
    report = verify_store(ckptstore.open(tmp_path / "st"), against=layout.root, strategy=layout.strategy_files)
    assert report.ok, report.problems
    assert report.compared_with_source == report.chunks


def test_verify_finds_a_flipped_byte_in_a_column_chunk(saved_layout, tmp_path):
    layout = saved_layout("mp_cols")
    convert_layout(layout, tmp_path / "st", format="safetensors")
    store = ckptstore.open(tmp_path / "st")
    info = store.info("layer0.w")
    _, offset, _ = info.chunk_pieces(3)[1]  # second row of chunk 3 (columns 24..32)
    path = tmp_path / "st" / info.chunks.files[3]
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    problems = verify_store(ckptstore.open(tmp_path / "st")).problems
    assert len(problems) == 1 and "'layer0.w': chunk 3: checksum mismatch" in problems[0]


def test_compression_is_refused_for_safetensors(saved_layout, tmp_path):
    with pytest.raises(ValueError, match="safetensors stores are not compressed"):
        convert_layout(saved_layout("mp_rows"), tmp_path / "st", format="safetensors", compress="zstd")


@pytest.mark.slow
def test_killed_conversion_resumes_to_an_identical_store(saved_layout, tmp_path):
    layout = saved_layout("mixed_dtypes")
    args = ["convert", layout.root, *strategy_args(layout), "--format", "safetensors", "-j", "1", "-q"]
    killed = run_cli(*args, "-o", tmp_path / "a", kill_at="chunks:7")
    assert killed.returncode == -9
    with pytest.raises(IncompleteStoreError):
        ckptstore.open(tmp_path / "a")
    rerun = run_cli(*args, "-o", tmp_path / "a", "--json")
    summary = json.loads(rerun.stdout)
    assert (summary["chunks_resumed"], summary["chunks_written"]) == (7, summary["chunks"] - 7)
    run_cli(*args, "-o", tmp_path / "b")
    name = "model-00001-of-00001.safetensors"
    assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_load_rank_from_a_safetensors_store_equals_the_zarr_store(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    convert_layout(layout, tmp_path / "st", format="safetensors")
    convert_layout(layout, tmp_path / "zarr")
    target = T.write_strategy(tmp_path / "dst.ckpt", [
        s.__class__(**{**s.__dict__, "dev_matrix": (2, 2)}) for s in layout.specs if s.dev_matrix], writer="ckptstore")
    for rank in range(4):
        a = rank_view(ckptstore.open(tmp_path / "st"), str(target), rank)
        b = rank_view(ckptstore.open(tmp_path / "zarr"), str(target), rank)
        assert a.names() == b.names()
        for name in a.names():
            assert_same_array(np.asarray(a.read(name)), np.asarray(b.read(name)), name)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["zarr", "safetensors"])
def test_reading_a_store_imports_neither_zarr_nor_the_codecs_nor_mindspore(saved_layout, tmp_path, fmt):
    import subprocess
    import sys

    layout = saved_layout("mixed_dtypes")
    ckptstore.convert(layout.root, tmp_path / "s", strategy=layout.strategy_files, format=fmt)
    code = ("import sys, ckptstore\n"
            f"s = ckptstore.open({str(tmp_path / 's')!r})\n"
            "[s.read(n) for n in s.names()]\n"
            "print(sorted(m for m in ('zarr', 'numcodecs', 'mindspore') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
