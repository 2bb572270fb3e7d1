"""Hugging Face model folders for tests, without torch: shards as ``save_pretrained`` lays them out.

:func:`write_hf_folder` writes ``model-0000i-of-0000n.safetensors`` shards (safetensors headers
built by :func:`~ckptstore.formats.safetensors_header.build_header`, tensors in the order given,
split into ``shards`` files) with ``model.safetensors.index.json`` and ``config.json``, or a
single ``model.safetensors``. :func:`llama_tensors` makes a random LLaMA-shaped state dict under
Hugging Face names. The real ``transformers`` folders are made in the tests that need them.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ckptstore.formats.safetensors_header import build_header


def write_hf_folder(path: str | Path, tensors: Mapping[str, np.ndarray], *, shards: int = 2,
                    config: Mapping[str, Any] | None = None) -> Path:
    """Write ``tensors`` as a Hugging Face folder at ``path`` (``shards`` files; 1: ``model.safetensors``
    without an index) and ``config`` as its ``config.json``. Returns the folder."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    per = -(-len(names) // max(1, shards))
    groups = [names[i:i + per] for i in range(0, len(names), per)] or [[]]
    weight_map: dict[str, str] = {}
    for i, group in enumerate(groups):
        file = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        arrays = [np.require(tensors[n], requirements="C") for n in group]  # ascontiguousarray makes 0-d 1-d
        head, _ = build_header([(n, a.dtype, a.shape) for n, a in zip(group, arrays, strict=True)], {"format": "pt"})
        with open(root / file, "wb") as f:
            f.write(head)
            for a in arrays:
                f.write(a.tobytes())
        weight_map.update({n: file for n in group})
    if shards != 1:
        total = sum(a.nbytes for a in tensors.values())
        (root / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))
    if config is not None:
        (root / "config.json").write_text(json.dumps(dict(config), indent=2))
    return root


def llama_config(*, layers: int = 2, hidden: int = 32, heads: int = 4, kv_heads: int = 2, ffn: int = 48,
                 vocab: int = 64) -> dict[str, Any]:
    """A LLaMA ``config.json`` of this size (the keys the rule sets and ``transformers`` read)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "vocab_size": vocab, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 64, "tie_word_embeddings": False}


def llama_tensors(config: Mapping[str, Any], *, dtype: Any = np.float32, seed: int = 0,
                  bias: bool = False) -> dict[str, np.ndarray]:
    """Random tensors of a LLaMA (Qwen2 with ``bias``) of ``config`` under Hugging Face names."""
    rng = np.random.default_rng(seed)
    h, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    hd = h // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * hd

    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)

    out = {"model.embed_tokens.weight": r(v, h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "self_attn.q_proj.weight": r(h, h), p + "self_attn.k_proj.weight": r(kv, h),
                    p + "self_attn.v_proj.weight": r(kv, h)})
        if bias:
            out.update({p + "self_attn.q_proj.bias": r(h), p + "self_attn.k_proj.bias": r(kv),
                        p + "self_attn.v_proj.bias": r(kv)})
        out.update({p + "self_attn.o_proj.weight": r(h, h), p + "mlp.gate_proj.weight": r(f, h),
                    p + "mlp.up_proj.weight": r(f, h), p + "mlp.down_proj.weight": r(h, f),
                    p + "input_layernorm.weight": r(h), p + "post_attention_layernorm.weight": r(h)})
    out.update({"model.norm.weight": r(h), "lm_head.weight": r(v, h)})
    return out
