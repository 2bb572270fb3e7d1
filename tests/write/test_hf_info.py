"""``ckptstore info`` on an index over a Hugging Face folder says so: its files and name map,
not "an index of the rank files ... of 1 rank file(s)"."""
from __future__ import annotations

import json

from ckptstore.testing.hf_folder import llama_config, llama_tensors, write_hf_folder
from ckptstore.write.hf_index import index_hf
from convert_fixtures import run_cli

CONFIG = llama_config()


def _indexed(tmp_path, rules: str):
    write_hf_folder(tmp_path / "hf", llama_tensors(CONFIG, seed=5), shards=10, config=CONFIG)
    assert len(list((tmp_path / "hf").glob("*.safetensors"))) == 7  # 21 tensors, 3 a shard
    index_hf(tmp_path / "hf", tmp_path / "st", name_map=rules)
    return tmp_path / "st"


def test_info_names_the_hugging_face_folder_its_files_and_name_map(tmp_path):
    st = _indexed(tmp_path, "llama")
    r = run_cli("info", st)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"{st}: ckptstore store, an index over a Hugging Face folder (7 files, name map llama)"
    assert lines[-1].endswith(f"of the Hugging Face files in {tmp_path / 'hf'}")
    assert "rank file" not in r.stdout


def test_info_json_gives_the_format_folder_files_and_name_map(tmp_path):
    st = _indexed(tmp_path, "mcore")
    source = json.loads(run_cli("info", st, "--json").stdout)["source"]
    assert {k: source[k] for k in ("format", "folder", "files", "name_map")} == {
        "format": "huggingface", "folder": str(tmp_path / "hf"), "files": 7, "name_map": "mcore"}
