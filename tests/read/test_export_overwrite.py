"""An export into a folder that holds files: refused unless --overwrite, which replaces only the
files an earlier export wrote, never leaving old weights beside new ones."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ckptstore
from ckptstore.errors import InvalidOptionError, StoreExistsError
from ckptstore.read import hf_export
from ckptstore.read.export_folder import EXPORT_RECORD
from ckptstore.read.hf_export import export_hf
from ckptstore.testing.hf_folder import llama_config, llama_tensors, write_hf_folder
from ckptstore.write.hf_index import index_hf

CONFIG = llama_config()


@pytest.fixture
def store(tmp_path):
    write_hf_folder(tmp_path / "hf", llama_tensors(CONFIG, seed=3), shards=2, config=CONFIG)
    index_hf(tmp_path / "hf", tmp_path / "st", name_map="llama")
    return tmp_path / "st"


def _listing(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_a_second_hf_export_into_the_same_folder_is_refused(store, tmp_path):
    export_hf(store, tmp_path / "out", max_shard_size="10KB")
    before = _listing(tmp_path / "out")
    with pytest.raises(StoreExistsError, match=r"^export folder .*/out is not empty \(it holds config.json, "
                                                r"model-00001-of-00011.safetensors, .* and 8 more\); pass --overwrite"):
        export_hf(store, tmp_path / "out", max_shard_size="1GB")
    assert _listing(tmp_path / "out") == before


def test_overwrite_leaves_only_the_new_hf_export_no_stale_shard_or_index(store, tmp_path):
    export_hf(store, tmp_path / "out", max_shard_size="10KB")
    assert (tmp_path / "out" / "model.safetensors.index.json").exists()
    export_hf(store, tmp_path / "out", max_shard_size="1GB", overwrite=True)
    assert _listing(tmp_path / "out") == [EXPORT_RECORD, "config.json", "model.safetensors"]
    record = json.loads((tmp_path / "out" / EXPORT_RECORD).read_text())
    assert record == {"state": "complete", "files": ["config.json", "model.safetensors"]}


def test_overwrite_keeps_files_no_export_wrote(store, tmp_path):
    export_hf(store, tmp_path / "out", max_shard_size="10KB")
    (tmp_path / "out" / "tokenizer.json").write_text("{}")
    export_hf(store, tmp_path / "out", max_shard_size="1GB", overwrite=True)
    assert _listing(tmp_path / "out") == [EXPORT_RECORD, "config.json", "model.safetensors", "tokenizer.json"]


def test_overwrite_refuses_weights_no_export_wrote(store, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model-00001-of-00002.safetensors").write_bytes(b"someone else's")
    with pytest.raises(StoreExistsError, match=r"holds model-00001-of-00002.safetensors, which no ckptstore export "
                                               r"wrote and which a reader would take for weights"):
        export_hf(store, tmp_path / "out", overwrite=True)
    assert _listing(tmp_path / "out") == ["model-00001-of-00002.safetensors"]


def test_an_overwrite_that_fails_midway_leaves_no_model_and_the_next_one_cleans_up(store, tmp_path, monkeypatch):
    """Old entry points and shards go before a new shard appears: a reader finds the old export,
    no model, or the new one, never old shards under a new index or the reverse."""
    export_hf(store, tmp_path / "out", max_shard_size="10KB")
    real = hf_export._shard_pieces
    calls = []

    def fail_second_shard(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk gone")
        return real(*a, **kw)

    monkeypatch.setattr(hf_export, "_shard_pieces", fail_second_shard)
    with pytest.raises(OSError, match="disk gone"):
        export_hf(store, tmp_path / "out", max_shard_size="20KB", overwrite=True)
    assert _listing(tmp_path / "out") == [EXPORT_RECORD, "model-00001-of-00005.safetensors"]  # of the new set
    assert json.loads((tmp_path / "out" / EXPORT_RECORD).read_text())["state"] == "writing"
    monkeypatch.setattr(hf_export, "_shard_pieces", real)
    export_hf(store, tmp_path / "out", max_shard_size="1GB", overwrite=True)
    assert _listing(tmp_path / "out") == [EXPORT_RECORD, "config.json", "model.safetensors"]


def test_a_second_rank_file_export_is_refused_and_overwrite_removes_the_old_files(store, tmp_path):
    ckptstore.export(store, tmp_path / "out")
    with pytest.raises(StoreExistsError, match=r"is not empty \(it holds rank_0/checkpoint_0.ckpt\)"):
        ckptstore.export(store, tmp_path / "out", format="safetensors")
    ckptstore.export(store, tmp_path / "out", format="safetensors", overwrite=True)
    assert _listing(tmp_path / "out") == [EXPORT_RECORD, "rank_0/checkpoint_0.safetensors"]


@pytest.mark.slow
def test_cli_export_into_a_used_folder_is_one_line_and_exit_2(store, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}

    def run(*a: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "ckptstore", "export", *a]
        return subprocess.run(command, capture_output=True, text=True, env=env, check=False)

    assert run(str(store), str(tmp_path / "out"), "--format", "hf").returncode == 0
    bad = run(str(store), str(tmp_path / "out"), "--format", "hf", "--max-shard-size", "10KB")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "is not empty" in bad.stderr and "pass --overwrite" in bad.stderr
    ok = run(str(store), str(tmp_path / "out"), "--format", "hf", "--max-shard-size", "10KB", "--overwrite")
    assert ok.returncode == 0, ok.stderr
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_export_hf_uses_the_name_map_the_index_recorded(store, tmp_path):
    export_hf(store, tmp_path / "default")
    export_hf(store, tmp_path / "llama", name_map="llama")
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "default" / name).read_bytes() == (tmp_path / "llama" / name).read_bytes()
    assert np.frombuffer((tmp_path / "default" / "model.safetensors").read_bytes()[:8], "<u8")[0] > 0


def test_export_hf_of_a_store_that_records_no_name_map_asks_for_one(tmp_path):
    ckptstore.save_rank({"w": np.ones(4, np.float32)}, tmp_path / "run", step=1)
    with pytest.raises(InvalidOptionError, match=r"records no name map \(it was not indexed from a Hugging Face "
                                                 r"folder\): pass --name-map llama\|qwen2\|mcore\|RULES.json"):
        export_hf(tmp_path / "run", tmp_path / "out")
    assert not (tmp_path / "out").exists()
