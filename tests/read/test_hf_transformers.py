"""The Hugging Face route against the real client: a tiny random LLaMA made by ``transformers``
(config -> model -> save_pretrained, sharded; nothing downloaded), indexed with the shipped rules,
read for a 2-rank layout, and exported back into a folder ``transformers`` loads."""
from __future__ import annotations

import numpy as np
import pytest

import ckptstore
from ckptstore.formats.hf_rules import load_name_map
from ckptstore.read.hf_export import export_hf
from ckptstore.testing.sample_checkpoint import ParamSpec, write_strategy_json
from ckptstore.write.hf_index import index_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def tiny_llama(path, dtype):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    model.save_pretrained(path, max_shard_size="20KB")  # several shards and an index.json
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return tiny_llama(root / "f32", torch.float32), tiny_llama(root / "bf16", torch.bfloat16), root


def hf_numpy(model) -> dict[str, np.ndarray]:
    import ml_dtypes

    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().contiguous()
        out[name] = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()
    return out


@pytest.mark.parametrize("rules", ["llama", "mcore"])
def test_a_rank_of_a_two_rank_layout_reads_numpys_slice_of_the_mapped_tensors(saved, tmp_path, rules):
    _, model, root = saved
    assert (root / "bf16" / "model.safetensors.index.json").exists()
    index_hf(root / "bf16", tmp_path / "st", name_map=rules)
    store = ckptstore.open(tmp_path / "st")
    hf = hf_numpy(model)
    targets = load_name_map(rules).apply({n: a.shape for n, a in hf.items()}, model.config.to_dict())
    whole = {}
    for t in targets:
        parts = [np.split(hf[s], t.groups) for s in t.sources]
        whole[t.name] = np.concatenate([p[g] for g in range(t.groups) for p in parts])
    specs = [ParamSpec(n, a.shape, "bfloat16", dev_matrix=(2,),
                       tensor_map=(0, -1) if a.ndim == 2 and a.shape[0] % 2 == 0 and "wo" not in n
                       and "linear_proj" not in n else (-1,) * a.ndim) for n, a in whole.items()]
    strategy = write_strategy_json(tmp_path / "tp2.json", specs)
    got = ckptstore.read_rank(store, strategy, rank=1)
    want = {s.name: (whole[s.name][whole[s.name].shape[0] // 2:] if s.tensor_map[0] == 0 else whole[s.name])
            for s in specs}
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype
        np.testing.assert_array_equal(got[name], want[name])
    plan = ckptstore.plan_rank(store, strategy, rank=1)
    assert plan.nbytes <= 1.01 * sum(a.nbytes for a in want.values())


def test_an_exported_folder_loads_in_transformers_with_the_same_tensors_and_logits(saved, tmp_path):
    model, _, root = saved
    index_hf(root / "f32", tmp_path / "st", name_map="mcore")  # fused views in the store
    export_hf(tmp_path / "st", tmp_path / "out", name_map="mcore", max_shard_size="20KB")
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    for name, t in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], t), name
    ids = torch.tensor([[1, 5, 9, 33, 2, 60]])
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)
