"""The real client: a tiny random LLaMA made by ``transformers`` (no download), indexed with the
shipped ``llama`` rules and loaded into MindFormers' own ``LlamaForCausalLM`` of the same
configuration by ``ckptstore.load_into_net``: its logits equal ``transformers``' within fp32
tolerance.

MindFormers pins numpy<2, so these tests run in their own venv (``make venv-mf``: ``.venv-mf``).
Outside it, one driver test runs this file inside ``.venv-mf`` as a subprocess when that venv
exists (``make test`` creates it), and skips otherwise.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from repo_paths import REPO

ROOT = REPO
MF_PYTHON = ROOT / ".venv-mf" / "bin" / "python"
MF_READY = ROOT / ".venv-mf" / ".installed"  # written by make once the venv is complete

# MindFormers logs into ./output/log unless told otherwise: keep its logs out of the repository
os.environ.setdefault("LOCAL_DEFAULT_PATH", tempfile.mkdtemp(prefix="mindformers-output-"))
try:
    import mindformers
except Exception:  # ImportError, or a MindFormers that cannot start here
    mindformers = None

in_mf_venv = pytest.mark.skipif(mindformers is None, reason="needs MindFormers: run in .venv-mf (make test-mf)")

INPUT = [[1, 5, 9, 33, 2, 60, 7, 3]]


@pytest.mark.slow
@pytest.mark.skipif(mindformers is not None, reason="inside .venv-mf the client tests run directly")
def test_the_mindformers_client_tests_pass_in_their_own_venv():
    if not MF_READY.exists():
        pytest.skip("no complete .venv-mf here (make venv-mf creates it)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    recipe = Path(__file__).with_name("test_mindformers_recipe.py")  # the README's StoreCheckpoint recipe
    r = subprocess.run([str(MF_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(Path(__file__)),
                        str(recipe)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    # the driver skips itself there
    assert r.stdout.splitlines()[-1].startswith("6 passed, 1 skipped"), r.stdout[-2000:]


def _hf_model(path: Path, kind: str):
    """A tiny random LLaMA or Qwen2 (q/k/v biases) saved sharded, and its logits on INPUT."""
    import torch
    import transformers

    torch.manual_seed(0)
    size = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False)
    if kind in ("llama", "llama-concat"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**size)).eval()
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**size, rope_theta=1e6)).eval()
        with torch.no_grad():  # random biases (transformers initialises them to zero), so they are tested
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_()
    model.save_pretrained(path, max_shard_size="20KB")
    return model, _hf_logits(model)


def _hf_logits(model) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor(INPUT)).logits.numpy()


def _mf_llama(hf_config, bias: bool, concat: bool = False):
    import mindspore as ms
    from mindformers import LlamaConfig, LlamaForCausalLM

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    config = LlamaConfig(batch_size=1, seq_length=len(INPUT[0]), hidden_size=hf_config.hidden_size,
                         num_layers=hf_config.num_hidden_layers, num_heads=hf_config.num_attention_heads,
                         n_kv_heads=hf_config.num_key_value_heads, intermediate_size=hf_config.intermediate_size,
                         vocab_size=hf_config.vocab_size, rms_norm_eps=hf_config.rms_norm_eps,
                         max_position_embedding=hf_config.max_position_embeddings,
                         theta=float(getattr(hf_config, "rope_theta", 10000.0)), qkv_has_bias=bias, qkv_concat=concat,
                         compute_dtype="float32", layernorm_compute_type="float32", softmax_compute_type="float32",
                         rotary_dtype="float32", param_init_type="float32", use_rope_slice=True,
                         use_flash_attention=False, use_past=False, fused_rms_norm=False)
    net = LlamaForCausalLM(config)
    net.set_train(False)
    return net


def _mf_logits(net) -> np.ndarray:
    import mindspore as ms

    out = net(ms.Tensor(np.asarray(INPUT, dtype=np.int32)))
    logits = out[0] if isinstance(out, tuple) else out
    return logits.asnumpy().reshape(len(INPUT), len(INPUT[0]), -1)


@in_mf_venv
@pytest.mark.parametrize("kind", ["llama", "qwen2", "llama-concat"])
def test_an_indexed_hf_model_loaded_into_mindformers_gives_transformers_logits_and_exports_back(tmp_path, kind):
    import mindspore as ms
    import transformers

    import ckptstore
    from ckptstore.read.hf_export import export_hf
    from ckptstore.write.hf_index import index_hf

    model, want = _hf_model(tmp_path / "hf", kind)
    index_hf(tmp_path / "hf", tmp_path / "st", name_map=kind)
    net = _mf_llama(model.config, bias=kind == "qwen2", concat=kind == "llama-concat")  # concat: fused views
    store = ckptstore.open(tmp_path / "st")
    assert set(store.names()) <= set(net.parameters_dict()), sorted(set(store.names()) - set(net.parameters_dict()))
    not_loaded, unused = ckptstore.load_into_net(net, store)
    assert unused == [] and not_loaded == [], (not_loaded, unused)
    np.testing.assert_allclose(_mf_logits(net), want, rtol=1e-4, atol=1e-4)

    # and back: the MindFormers weights, saved by MindSpore, converted, exported as Hugging Face shards
    ms.save_checkpoint(net, str(tmp_path / "mf.ckpt"))
    ckptstore.convert(tmp_path / "mf.ckpt", tmp_path / "mf.zarr")
    export_hf(tmp_path / "mf.zarr", tmp_path / "back", name_map=kind, max_shard_size="20KB",
              config=model.config.to_dict())
    back = type(model).from_pretrained(tmp_path / "back").eval()
    np.testing.assert_allclose(_hf_logits(back), want, rtol=1e-5, atol=1e-5)
    assert isinstance(back, transformers.PreTrainedModel)


@in_mf_venv
@pytest.mark.parametrize("kind", ["llama-concat", "qwen2"])
def test_a_two_rank_layout_of_the_indexed_model_is_what_mindspore_merges_into_the_same_logits(tmp_path, kind):
    """The parallel compiler does not run on the CPU wheel, so the tp 2 strategy is written as the
    compiler writes it (column-parallel weights split by rows, row-parallel ones by columns);
    ckptstore exports each rank's slices of the indexed Hugging Face folder, MindSpore's own
    transform_checkpoints merges them, and the merged weights in MindFormers give transformers' logits."""
    import mindspore as ms

    import ckptstore
    from ckptstore.testing.sample_checkpoint import ParamSpec, write_strategy
    from ckptstore.write.hf_index import index_hf

    model, want = _hf_model(tmp_path / "hf", kind)
    index_hf(tmp_path / "hf", tmp_path / "st", name_map=kind)
    store = ckptstore.open(tmp_path / "st")
    specs = []
    for name in store.names():
        shape = store.info(name).shape
        row_parallel = ".wo." in name or ".w2." in name
        tmap = (-1,) if len(shape) == 1 else (-1, 0) if row_parallel else (0, -1)
        specs.append(ParamSpec(name, shape, dev_matrix=(2,), tensor_map=tmap))
    strategy = write_strategy(tmp_path / "tp2.ckpt", specs)
    ckptstore.export(store, tmp_path / "ranks", strategy=strategy)
    whole = tmp_path / "whole"
    ms.transform_checkpoints(str(tmp_path / "ranks"), str(whole), "merged_", str(strategy), None)
    net = _mf_llama(model.config, bias=kind == "qwen2", concat=kind == "llama-concat")
    merged = ms.load_checkpoint(str(next((whole / "rank_0").glob("*.ckpt"))))
    not_loaded, _ = ms.load_param_into_net(net, merged)
    assert not_loaded == []
    np.testing.assert_allclose(_mf_logits(net), want, rtol=1e-4, atol=1e-4)
