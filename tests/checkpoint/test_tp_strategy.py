"""``ckptstore strategy``: a tensor-parallel (and pipeline) strategy file for an index of a Hugging
Face folder, from the rule set's ``tensor_parallel`` section (issue 37 item 18). MindSpore is
the oracle: its ``transform_checkpoints`` cuts the same store's values, saved whole, by the
written file, and each rank's tensors must equal ``read_rank``'s bit for bit."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

pytest.importorskip("mindspore")
pytestmark = pytest.mark.mindspore

import ckptstore
from ckptstore.testing.hf_folder import llama_config, llama_tensors, write_hf_folder
from ckptstore.write.hf_index import index_hf
from convert_fixtures import run_cli

CONFIG = llama_config()  # 2 layers, hidden 32, 4 heads, 2 KV heads, ffn 48, vocab 64


@pytest.fixture(scope="module")
def hf_import(tmp_path_factory):
    """An index of a LLaMA folder under the llama rule set, and its values saved whole by MindSpore."""
    import mindspore as ms

    root = tmp_path_factory.mktemp("hf_import")
    hf = write_hf_folder(root / "hf", llama_tensors(CONFIG, seed=3), shards=2, config=CONFIG)
    index_hf(hf, root / "st", name_map="llama")
    (root / "whole" / "rank_0").mkdir(parents=True)
    with ckptstore.open(root / "st") as store:
        ms.save_checkpoint([{"name": n, "data": ms.Tensor(store.read(n))} for n in store.names()],
                           str(root / "whole" / "rank_0" / "net.ckpt"))
    return root


def _mindspore_ranks(hf_import, strategy, out) -> list[dict[str, np.ndarray]]:
    import mindspore as ms

    ms.transform_checkpoints(str(hf_import / "whole"), str(out), "net", None, str(strategy))
    ranks = sorted(os.listdir(out), key=lambda d: int(d.split("_")[1]))
    return [{n: p.asnumpy() for n, p in ms.load_checkpoint(str(out / d / f"net{d.split('_')[1]}.ckpt")).items()}
            for d in ranks]


def test_a_tp_strategy_cuts_each_rank_as_mindspore_transform_does(hf_import, tmp_path):
    r = run_cli("strategy", hf_import / "st", "--name-map", "llama", "--tp", "2", "--out", tmp_path / "tp2.json")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"wrote {tmp_path / 'tp2.json'}: 21 parameters for 2 card(s) (tp 2 x pp 1) by the " \
                       "tensor_parallel rules of llama\n"
    oracle = _mindspore_ranks(hf_import, tmp_path / "tp2.json", tmp_path / "ms")
    assert len(oracle) == 2
    for rank, want in enumerate(oracle):
        got = ckptstore.read_rank(hf_import / "st", tmp_path / "tp2.json", rank=rank)
        assert sorted(got) == sorted(want)
        for name in got:
            assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), name
        assert got["model.layers.0.attention.wq.weight"].shape == (16, 32)  # column-parallel: rows cut
        assert got["model.layers.0.attention.wo.weight"].shape == (32, 16)  # row-parallel: columns cut
        assert got["model.layers.0.feed_forward.w2.weight"].shape == (32, 24)
        assert got["model.tok_embeddings.embedding_weight"].shape == (64, 32)  # vocab_emb_dp: whole


def test_a_pipeline_strategy_puts_each_layer_on_its_stage_as_mindspore_reads_it(hf_import, tmp_path):
    import mindspore as ms

    r = run_cli("strategy", hf_import / "st", "--name-map", "llama", "--tp", "2", "--pp", "2",
                "--out", tmp_path / "pp")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "pp")) == ["stage_0.json", "stage_1.json"]
    ms.merge_pipeline_strategys(str(tmp_path / "pp"), str(tmp_path / "merged" / "strategy.json"))
    oracle = _mindspore_ranks(hf_import, tmp_path / "merged" / "strategy.json", tmp_path / "ms")
    assert len(oracle) == 4
    for rank, want in enumerate(oracle):
        got = ckptstore.read_rank(hf_import / "st", tmp_path / "pp", rank=rank)
        assert sorted(got) == sorted(want)
        assert all(np.array_equal(got[n], want[n]) for n in got)
    stage1 = json.loads((tmp_path / "pp" / "stage_1.json").read_text())["parallel_layout_item"]
    assert "lm_head.weight" in stage1 and not any(n.startswith("model.layers.0.") for n in stage1)


def test_a_tp_that_does_not_divide_a_cut_axis_is_refused_naming_the_parameter(hf_import, tmp_path):
    r = run_cli("strategy", hf_import / "st", "--name-map", "llama", "--tp", "5", "--out", tmp_path / "tp5.json")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert re.search(r"parameter 'model\.layers\.\d\.\S+' of shape \[\d+, \d+\] cannot be cut into 5 along axis [01], "
                     r"as rule file llama \(shipped\) says it is for tensor parallelism", r.stderr), r.stderr
    assert not (tmp_path / "tp5.json").exists()


def test_a_rule_file_without_tensor_parallel_rules_is_refused(hf_import, tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"format": "ckptstore-name-map", "version": 1}))
    r = run_cli("strategy", hf_import / "st", "--name-map", rules, "--tp", "2", "--out", tmp_path / "tp2.json")
    assert r.returncode == 2 and f"rule file {rules}: it has no 'tensor_parallel' section" in r.stderr, r.stderr
