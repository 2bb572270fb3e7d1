"""Name-map rule files (ckptstore.formats.hf_rules): the parser, the shipped rule sets and the
fusion index math, checked against numpy and against MindFormers' own conversion functions."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore.errors import NameMapError
from ckptstore.formats.hf_rules import fused_segments, load_name_map, parse_name_map, shipped_name_maps
from conftest import examples

# --- MindFormers' own functions (mindformers/utils/convert_utils.py, models/llama/llama.py), as oracles

def qkv_concat_hf2mg(qkv_weights, num_heads, n_kv_heads, hidden_size):
    qkv_dim = len(qkv_weights.shape)
    if qkv_dim == 2:
        w, h = qkv_weights.shape
    else:
        w = qkv_weights.shape[0]
        qkv_weights = qkv_weights.reshape(w, -1)
        h = 1
    n_rep = num_heads // n_kv_heads
    q_channel = hidden_size
    kv_channel = hidden_size // n_rep
    q_weight = qkv_weights[: q_channel, :]
    k_weight = qkv_weights[q_channel: q_channel + kv_channel, :]
    v_weight = qkv_weights[q_channel + kv_channel: q_channel + 2 * kv_channel, :]
    q_w_reshape = q_weight.reshape(n_kv_heads, hidden_size // n_kv_heads, -1)
    k_w_reshape = k_weight.reshape(n_kv_heads, hidden_size // num_heads, -1)
    v_w_reshape = v_weight.reshape(n_kv_heads, hidden_size // num_heads, -1)
    cat_qkv_weight = np.concatenate((q_w_reshape, k_w_reshape, v_w_reshape), axis=1)
    out_qkv_weight = cat_qkv_weight.reshape(w, h)
    if qkv_dim == 1:
        out_qkv_weight = out_qkv_weight.reshape(w,)
    return out_qkv_weight


def ffn_concat_hf2mg(ffn_weights, ffn_hidden_size):
    w, h = ffn_weights.shape
    gate_weight = ffn_weights[: w // 2, :]
    hidden_weight = ffn_weights[w // 2: w // 2 * 2, :]
    gate_w_reshape = gate_weight.reshape(ffn_hidden_size, 1, -1)
    hidden_w_reshape = hidden_weight.reshape(ffn_hidden_size, 1, -1)
    cat_ffn_weight = np.concatenate((gate_w_reshape, hidden_w_reshape), axis=1)
    return cat_ffn_weight.reshape(w, h)


def convert_name(weight_name):
    weight_name = weight_name.replace('embed_tokens.', 'tok_embeddings.')
    weight_name = weight_name.replace('.self_attn.q_proj.', '.attention.wq.')
    weight_name = weight_name.replace('.self_attn.k_proj.', '.attention.wk.')
    weight_name = weight_name.replace('.self_attn.v_proj.', '.attention.wv.')
    weight_name = weight_name.replace('.self_attn.o_proj.', '.attention.wo.')
    weight_name = weight_name.replace('.mlp.gate_proj.', '.feed_forward.w1.')
    weight_name = weight_name.replace('.mlp.down_proj.', '.feed_forward.w2.')
    weight_name = weight_name.replace('.mlp.up_proj.', '.feed_forward.w3.')
    weight_name = weight_name.replace('.input_layernorm.', '.attention_norm.')
    weight_name = weight_name.replace('.post_attention_layernorm.', '.ffn_norm.')
    weight_name = weight_name.replace('.norm.', '.norm_out.')
    weight_name = weight_name.replace('output.', 'lm_head.')
    weight_name = weight_name.replace('.tok_embeddings.weight', '.tok_embeddings.embedding_weight')
    return weight_name


def hf_llama_names(layers: int, bias: bool = False) -> list[str]:
    names = ["model.embed_tokens.weight"]
    for i in range(layers):
        p = f"model.layers.{i}."
        for m in ("q", "k", "v"):
            names.append(p + f"self_attn.{m}_proj.weight")
            if bias:
                names.append(p + f"self_attn.{m}_proj.bias")
        names += [p + "self_attn.o_proj.weight", p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                  p + "mlp.down_proj.weight", p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    return names + ["model.norm.weight", "lm_head.weight"]


def assemble(sources: list[np.ndarray], groups: int, axis: int = 0) -> np.ndarray:
    """A fused tensor built from fused_segments, one segment at a time."""
    parts = [np.take(sources[0], [], axis=axis)]  # an empty start: every source may be empty
    for s, start, length, _ in fused_segments([x.shape[axis] for x in sources], groups):
        parts.append(np.take(sources[s], np.arange(start, start + length), axis=axis))
    return np.concatenate(parts, axis=axis)


# --- the fusion index math ---------------------------------------------------------------------------

@settings(max_examples=examples(100))
@given(st.lists(st.integers(0, 6), min_size=1, max_size=4), st.integers(1, 5), st.integers(1, 3),
       st.integers(0, 1))
def test_fused_segments_match_numpy_group_concatenation(parts, groups, width, axis):
    rng = np.random.default_rng(0)
    sizes = [k * groups for k in parts]

    def shape(n: int) -> tuple[int, int]:
        return (n, width) if axis == 0 else (width, n)

    sources = [rng.standard_normal(shape(n)) for n in sizes]
    # numpy: cut each source into `groups` equal parts along the axis, join part g of every source, then the groups
    split = [np.split(x, groups, axis=axis) for x in sources]
    want = np.concatenate([np.concatenate([p[g] for p in split], axis=axis) for g in range(groups)], axis=axis)
    np.testing.assert_array_equal(assemble(sources, groups, axis), want)


@settings(max_examples=examples(100))
@given(st.lists(st.integers(0, 6), min_size=1, max_size=4), st.integers(1, 5))
def test_fused_segments_tile_the_target_without_gaps_and_use_every_source_row_once(parts, groups):
    sizes = [k * groups for k in parts]
    segs = fused_segments(sizes, groups)
    at = 0
    for _, _, length, dst in segs:
        assert dst == at
        at += length
    assert at == sum(sizes)
    for s, n in enumerate(sizes):
        rows = sorted(r for src, start, length, _ in segs if src == s for r in range(start, start + length))
        assert rows == list(range(n))


def test_fused_segments_refuse_lengths_that_do_not_divide_into_the_groups():
    with pytest.raises(ValueError, match="multiples of 2 groups"):
        fused_segments([4, 3], 2)


@settings(max_examples=examples(50))
@given(st.sampled_from([(4, 4), (4, 2), (4, 1), (6, 3), (8, 2)]), st.integers(1, 4), st.integers(1, 5),
       st.booleans())
def test_qkv_groups_equal_mindformers_qkv_concat_hf2mg(heads, head_dim, width, bias):
    n, kv = heads
    rng = np.random.default_rng(1)
    shape = (lambda r: (r,)) if bias else (lambda r: (r, width))
    q, k, v = (rng.standard_normal(shape(m * head_dim)) for m in (n, kv, kv))
    rules = load_name_map("mcore")
    names = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
             "model.layers.0.self_attn.v_proj.weight"]
    (t,) = rules.apply(dict(zip(names, (q.shape, k.shape, v.shape), strict=True)),
                       {"num_attention_heads": n, "num_key_value_heads": kv})
    want = qkv_concat_hf2mg(np.concatenate([q, k, v]), n, kv, n * head_dim)
    np.testing.assert_array_equal(assemble([q, k, v], t.groups), want)


@settings(max_examples=examples(50))
@given(st.integers(1, 9), st.integers(1, 5))
def test_interleaved_rows_equal_mindformers_ffn_concat_hf2mg(ffn, hidden):
    rng = np.random.default_rng(2)
    gate, up = rng.standard_normal((ffn, hidden)), rng.standard_normal((ffn, hidden))
    (t,) = load_name_map("mcore").apply({"model.layers.3.mlp.gate_proj.weight": gate.shape,
                                          "model.layers.3.mlp.up_proj.weight": up.shape})
    assert t.name == "decoder.layers.3.mlp.linear_fc1.weight"
    np.testing.assert_array_equal(assemble([gate, up], t.groups), ffn_concat_hf2mg(np.concatenate([gate, up]), ffn))


# --- the shipped rule sets ---------------------------------------------------------------------------

def test_four_rule_sets_are_shipped():
    assert shipped_name_maps() == ["llama", "llama-concat", "mcore", "qwen2"]


@pytest.mark.parametrize("rules", ["llama", "qwen2"])
def test_shipped_legacy_rules_rename_as_mindformers_convert_name_does(rules):
    names = hf_llama_names(3, bias=rules == "qwen2")
    targets = load_name_map(rules).apply({n: (4, 4) for n in names})
    assert [(t.name, t.sources) for t in targets] == [(convert_name(n), (n,)) for n in names]


def test_shipped_mcore_rules_fuse_qkv_and_gate_up_and_rename_the_rest():
    names = hf_llama_names(1)
    shapes = {n: (8, 8) for n in names}
    shapes.update({"model.layers.0.self_attn.k_proj.weight": (4, 8), "model.layers.0.self_attn.v_proj.weight": (4, 8)})
    got = {t.name: (t.sources, t.groups) for t in load_name_map("mcore").apply(
        shapes, {"num_attention_heads": 4, "num_key_value_heads": 2})}
    p = "model.layers.0."
    assert got == {
        "embedding.word_embeddings.weight": (("model.embed_tokens.weight",), 1),
        "decoder.layers.0.self_attention.linear_qkv.weight": (
            (p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"), 2),
        "decoder.layers.0.self_attention.linear_proj.weight": ((p + "self_attn.o_proj.weight",), 1),
        "decoder.layers.0.mlp.linear_fc1.weight": ((p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"), 8),
        "decoder.layers.0.mlp.linear_fc2.weight": ((p + "mlp.down_proj.weight",), 1),
        "decoder.layers.0.input_layernorm.weight": ((p + "input_layernorm.weight",), 1),
        "decoder.layers.0.pre_mlp_layernorm.weight": ((p + "post_attention_layernorm.weight",), 1),
        "decoder.final_layernorm.weight": (("model.norm.weight",), 1),
        "output_layer.weight": (("lm_head.weight",), 1),
    }


@settings(max_examples=examples(30))
@given(st.sampled_from(["llama", "llama-concat", "qwen2", "mcore"]), st.integers(1, 12))
def test_every_shipped_rule_set_reads_its_names_back(rules, layers):
    rm = load_name_map(rules)
    names = hf_llama_names(layers, bias=rules == "qwen2")
    shapes = {n: ((8 if "k_proj" not in n and "v_proj" not in n else 4), 8) for n in names}
    config = {"num_attention_heads": 4, "num_key_value_heads": 2}
    forward = rm.apply(shapes, config)
    back = rm.reverse({t.name: (sum(t.sizes), 8) for t in forward}, config)
    assert [(t.name, t.sources, t.groups, t.sizes) for t in back] == \
        [(t.name, t.sources, t.groups, t.sizes) for t in forward]


# --- the parser ------------------------------------------------------------------------------------

def rules_doc(**kw):
    return {"format": "ckptstore-name-map", "version": 1, **kw}


def test_unknown_names_are_kept_by_default_and_refused_when_the_file_says_so():
    assert [t.name for t in parse_name_map(rules_doc(), "r.json").apply({"x.y": (1,)})] == ["x.y"]
    assert parse_name_map(rules_doc(unmatched="drop"), "r.json").apply({"x.y": (1,)}) == []
    with pytest.raises(NameMapError, match=r"rule file r.json: no rule matches tensor 'x.y'"):
        parse_name_map(rules_doc(unmatched="error"), "r.json").apply({"x.y": (1,)})


@pytest.mark.parametrize("bad, message", [
    ({"renames": [{"pattern": "a(", "target": "b"}]}, r"rule renames\[0\]: 'pattern' 'a\(' is not a regular"),
    ({"renames": [{"pattern": "a(b)", "target": r"\2"}]}, r"renames\[0\]: 'target' refers to group 2, but the"),
    ({"renames": [{"pattern": "a", "target": "b", "targt": "c"}]}, r"renames\[0\]: unknown key\(s\) \['targt'\]"),
    ({"fusions": [{"pattern": "a", "sources": ["a"], "target": "b"}]}, r"fusions\[0\]: 'sources' is not a list of 2"),
    ({"fusions": [{"pattern": "a", "sources": ["a", "b"], "target": "c", "interleave": "zigzag"}]},
     r"fusions\[0\]: 'interleave' is 'zigzag'"),
    ({"fusions": [{"pattern": "a", "sources": ["a", "b", "c"], "target": "d", "interleave": "qkv-groups"}]},
     r"fusions\[0\]: qkv-groups needs three sources \(q, k, v\) and num_heads"),
    ({"fusions": [{"pattern": "a", "sources": ["a", "b"], "target": "c", "axis": -1}]}, r"'axis' is -1"),
    ({"unmatched": "ignore"}, r"'unmatched' is 'ignore'"),
    ({"format": "other"}, r"not a name map"),
])
def test_a_malformed_rule_file_is_refused_naming_the_file_and_the_rule(bad, message):
    with pytest.raises(NameMapError, match=r"rule file r\.json.*" + message):
        parse_name_map({**rules_doc(), **bad}, "r.json")


@pytest.mark.parametrize("pattern, message", [
    (r"(a+)+b", r"has a quantifier inside another quantifier's repeated part"),
    (r"(?:x*y)*z", r"has a quantifier inside another quantifier's repeated part"),
    (r"(a|aa)+b", r"has an alternation inside a quantifier's repeated part"),
    (r"(\d+)\.\1", r"has a backreference"),
    (r"(.*)\.(.*)\.(.*)\.(.*)x", r"has 4 quantifiers \(at most 3\)"),
], ids=["nested", "nested-in-group", "alternation", "backreference", "four-quantifiers"])
def test_a_pattern_that_backtracks_is_refused_when_the_rule_file_is_parsed(pattern, message):
    with pytest.raises(NameMapError, match=r"rule file r\.json.*rule renames\[0\]: 'pattern' .* " + message):
        parse_name_map(rules_doc(renames=[{"pattern": pattern, "target": "t"}]), "r.json")


def test_the_shipped_rule_sets_pass_the_cost_check():
    assert all(load_name_map(name).renames for name in shipped_name_maps())


def test_a_tensor_name_longer_than_a_name_map_matches_is_refused_before_any_rule_runs():
    rm = parse_name_map(rules_doc(renames=[{"pattern": r"(.*)\.(.*)\.(.*)x", "target": r"\1"}]), "r.json")
    name = "a." * 129  # 258 characters
    with pytest.raises(NameMapError, match=r"r\.json: tensor name 'a\.a\..*'\.\.\. is 258 characters; a name map "
                                           r"matches names of at most 256"):
        rm.apply({name: (1,)})


def test_a_fusion_whose_source_is_missing_names_the_rule_and_the_tensor():
    fusion = {"pattern": r"l(\d)\.a", "sources": [r"l\1.a", r"l\1.b"], "target": r"l\1.ab"}
    rm = parse_name_map(rules_doc(fusions=[fusion]), "r.json")
    with pytest.raises(NameMapError, match=r"rule fusions\[0\]: source 'l0.b' of 'l0.ab' is not in the folder"):
        rm.apply({"l0.a": (2, 2)})


def test_a_fusion_of_sources_that_differ_off_the_axis_is_refused():
    rm = parse_name_map(rules_doc(fusions=[{"pattern": "a", "sources": ["a", "b"], "target": "ab"}]), "r.json")
    with pytest.raises(NameMapError, match=r"differ off axis 0"):
        rm.apply({"a": (2, 3), "b": (2, 4)})


def test_qkv_groups_that_do_not_fit_the_head_counts_are_refused():
    rm = load_name_map("mcore")
    names = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
             "model.layers.0.self_attn.v_proj.weight"]
    with pytest.raises(NameMapError, match=r"fusions\[0\]: q, k, v of lengths \[8, 2, 2\] do not fit 4 heads, 2 KV"):
        rm.apply(dict(zip(names, [(8, 4), (2, 4), (2, 4)], strict=True)),
                 {"num_attention_heads": 4, "num_key_value_heads": 2})


def test_two_tensors_mapped_to_one_name_are_refused():
    rm = parse_name_map(rules_doc(renames=[{"pattern": "a|b", "target": "c"}]), "r.json")
    with pytest.raises(NameMapError, match=r"two tensors map to parameter 'c'"):
        rm.apply({"a": (1,), "b": (1,)})


def test_a_rule_that_cannot_be_read_back_needs_an_explicit_reverse_to_export():
    rm = parse_name_map(rules_doc(renames=[{"pattern": r"x\.\w+\.w", "target": "y.w"}]), "r.json")
    with pytest.raises(NameMapError, match=r"renames\[0\]: parameter 'y.w' looks like this rule's target"):
        rm.reverse({"y.w": (1,)})
    explicit = parse_name_map(rules_doc(renames=[{"pattern": r"x\.\w+\.w", "target": "y.w",
                                                   "reverse": {"pattern": "y\\.w", "target": "x.only.w"}}]), "r.json")
    assert [t.sources for t in explicit.reverse({"y.w": (1,)})] == [("x.only.w",)]


def test_a_rule_file_is_read_from_a_path(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(rules_doc(renames=[{"pattern": r"a\.(\d+)", "target": r"b.\1"}])))
    assert [t.name for t in load_name_map(str(path)).apply({"a.7": (1,)})] == ["b.7"]
    path.write_text("{")
    with pytest.raises(NameMapError, match=rf"rule file {path}: not valid JSON"):
        load_name_map(str(path))
    with pytest.raises(NameMapError, match=r"cannot read it .*llama \| llama-concat \| mcore \| qwen2 or a rule file"):
        load_name_map(str(tmp_path / "missing.json"))
