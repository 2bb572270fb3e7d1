"""ckptstore export STORE OUT --format hf --name-map RULES: Hugging Face shards from any store,
fused tensors split back, memory bounded by one window."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ckptstore
from ckptstore.errors import InvalidOptionError, NameMapError
from ckptstore.formats.hf_folder import read_hf_folder
from ckptstore.io import open_location
from ckptstore.read.hf_export import export_hf, parse_size
from ckptstore.testing.hf_folder import llama_config, llama_tensors, write_hf_folder
from ckptstore.write.hf_index import index_hf

CONFIG = llama_config()


def read_folder(path) -> dict[str, np.ndarray]:
    folder = read_hf_folder(open_location(str(path)))
    out = {}
    for name, t in folder.tensors.items():
        raw = (path / t.file).read_bytes()[t.info.start:t.info.end]
        out[name] = np.frombuffer(raw, dtype=t.info.dtype).reshape(t.info.shape)
    return out


@pytest.fixture
def indexed(tmp_path):
    tensors = llama_tensors(CONFIG, seed=7)
    write_hf_folder(tmp_path / "hf", tensors, shards=2, config=CONFIG)
    return tensors, tmp_path


@pytest.mark.parametrize("rules", ["llama", "mcore"])
def test_an_exported_folder_holds_the_indexed_tensors_under_their_names(indexed, rules):
    tensors, tmp = indexed
    index_hf(tmp / "hf", tmp / "st", name_map=rules)
    summary = export_hf(tmp / "st", tmp / "out", name_map=rules, max_shard_size="20KB")
    back = read_folder(tmp / "out")
    assert sorted(back) == sorted(tensors)
    for name, want in tensors.items():
        np.testing.assert_array_equal(back[name], want)
    assert json.loads((tmp / "out" / "config.json").read_text()) == CONFIG
    assert summary.tensors == len(tensors)


def test_shards_respect_the_max_size_and_the_index_lists_every_tensor(indexed):
    tensors, tmp = indexed
    index_hf(tmp / "hf", tmp / "st", name_map="llama")
    export_hf(tmp / "st", tmp / "out", name_map="llama", max_shard_size="10KB")
    index = json.loads((tmp / "out" / "model.safetensors.index.json").read_text())
    assert sorted(index["weight_map"]) == sorted(tensors)
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in tensors.values())
    shards = sorted(f for f in os.listdir(tmp / "out") if f.endswith(".safetensors"))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    for f in shards:  # a shard over the limit holds one tensor (as save_pretrained does)
        names = [n for n, s in index["weight_map"].items() if s == f]
        assert sum(tensors[n].nbytes for n in names) <= 10_000 or len(names) == 1


def test_one_shard_is_written_as_model_safetensors_without_an_index(indexed):
    _, tmp = indexed
    index_hf(tmp / "hf", tmp / "st", name_map="qwen2")
    export_hf(tmp / "st", tmp / "out", name_map="qwen2")
    assert sorted(os.listdir(tmp / "out")) == [".ckptstore-export.json", "config.json", "model.safetensors"]


def test_a_fused_tensor_is_split_back_in_windows_smaller_than_a_tensor(indexed):
    """Gate/up interleaved row by row: read a window of whole groups at a time, never the fused tensor."""
    tensors, tmp = indexed
    index_hf(tmp / "hf", tmp / "st", name_map="mcore")
    export_hf(tmp / "st", tmp / "out", name_map="mcore", window_bytes=1024)  # 8 rows of 128 bytes
    back = read_folder(tmp / "out")
    up = "model.layers.1.mlp.up_proj.weight"
    np.testing.assert_array_equal(back[up], tensors[up])


def test_no_read_of_an_export_is_larger_than_its_window(indexed, monkeypatch):
    """Memory is bounded by one window: every read the export makes returns at most window_bytes
    (or one group of rows), for renamed and fused tensors alike."""
    tensors, tmp = indexed
    index_hf(tmp / "hf", tmp / "st", name_map="mcore")
    sizes = []
    real = ckptstore.Store.read

    def read(self, name, index=None, **kw):
        got = real(self, name, index, **kw)
        sizes.append(got.nbytes)
        return got

    monkeypatch.setattr(ckptstore.Store, "read", read)
    export_hf(tmp / "st", tmp / "out", name_map="mcore", window_bytes=4096)  # one KV group of linear_qkv is 4 KiB
    biggest = max(a.nbytes for a in tensors.values())
    assert sizes and max(sizes) <= 4096 < biggest
    assert sorted(read_folder(tmp / "out")) == sorted(tensors)


def test_a_parameter_that_does_not_split_by_its_rule_is_refused(indexed):
    tensors, tmp = indexed
    index_hf(tmp / "hf", tmp / "st", name_map="mcore")
    with pytest.raises(NameMapError, match=r"not a multiple of num_heads \+ 2\*num_kv_heads = 12"):
        export_hf(tmp / "st", tmp / "out", name_map="mcore",
                  config={**CONFIG, "num_attention_heads": 8, "num_key_value_heads": 2})


@pytest.mark.parametrize("text, n", [("5GB", 5 * 10 ** 9), ("500MiB", 500 << 20), ("2000", 2000), ("1.5KB", 1500)])
def test_shard_sizes_are_read_as_save_pretrained_reads_them(text, n):
    assert parse_size(text) == n


def test_a_shard_size_that_is_not_one_is_refused():
    with pytest.raises(InvalidOptionError, match="'five' is not a size like 5GB"):
        parse_size("five")


@pytest.mark.slow
def test_cli_export_format_hf(indexed):
    _, tmp = indexed
    index_hf(tmp / "hf", tmp / "st", name_map="mcore")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}

    def run(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ckptstore.cli", "export", *a], capture_output=True, text=True,
                              env=env)

    ok = run(str(tmp / "st"), str(tmp / "out"), "--format", "hf", "--name-map", "mcore", "--max-shard-size", "20KB")
    assert ok.returncode == 0, ok.stderr
    assert "wrote 21 tensors in 7 file(s)" in ok.stdout  # 5 shards of fp32, the index, config.json
    bad = run(str(tmp / "st"), str(tmp / "out2"), "--name-map", "mcore")
    assert bad.returncode == 2 and "--name-map applies to --format hf only" in bad.stderr


def test_a_saved_training_step_under_mindformers_names_exports_as_a_hf_folder(indexed):
    """Any store: a Zarr step saved by save_rank (no index, no recorded config) with the legacy
    fused names exports under Hugging Face names, the config given by the caller."""
    tensors, tmp = indexed
    index_hf(tmp / "hf", tmp / "st", name_map="llama-concat")
    src = ckptstore.open(tmp / "st")
    ckptstore.save_rank({n: src.read(n) for n in src.names()}, tmp / "run", step=3)
    summary = export_hf(tmp / "run" / "step_3", tmp / "out", name_map="llama-concat", config=CONFIG)
    back = read_folder(tmp / "out")
    assert sorted(back) == sorted(tensors) and summary.tensors == len(tensors)
    for name, want in tensors.items():
        np.testing.assert_array_equal(back[name], want)


def test_read_rank_converts_a_fused_bf16_view_on_request(tmp_path):
    import ml_dtypes

    tensors = llama_tensors(CONFIG, dtype=ml_dtypes.bfloat16, seed=9)
    hf = write_hf_folder(tmp_path / "hf", tensors, shards=2, config=CONFIG)
    index_hf(hf, tmp_path / "st", name_map="mcore")
    got = ckptstore.read_rank(tmp_path / "st", include="*linear_fc1*", dtype=np.float32)
    gate, up = (tensors[f"model.layers.0.mlp.{m}_proj.weight"] for m in ("gate", "up"))
    want = np.stack([gate, up], axis=1).reshape(-1, gate.shape[1]).astype(np.float32)
    assert got["decoder.layers.0.mlp.linear_fc1.weight"].dtype == np.float32
    np.testing.assert_array_equal(got["decoder.layers.0.mlp.linear_fc1.weight"], want)


@pytest.mark.parametrize("rules", ["mcore", "llama-concat"])
def test_a_fused_view_is_read_once_not_once_per_exported_tensor(indexed, rules):
    """Splitting a fused view (QKV per KV group, gate/up interleaved or blocked) back into its
    tensors fetches each stored byte once: the bytes fetched are the store's, within 1%."""
    _, tmp = indexed
    index_hf(tmp / "hf", tmp / "st", name_map=rules)
    store = ckptstore.open(tmp / "st")
    before = ckptstore.io_counts()
    export_hf(store, tmp / "out", name_map=rules)
    fetched = (ckptstore.io_counts() - before).bytes_fetched
    assert store.nbytes <= fetched <= 1.01 * store.nbytes
