"""ckptstore index HF_DIR --name-map: an index store over a Hugging Face folder, fused views as
chunk tables of byte ranges, read for any layout like any store."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptstore
from ckptstore.boxes import Box
from ckptstore.errors import (
    CorruptCheckpointError,
    InvalidOptionError,
    MissingFileError,
    NameMapError,
    SourceChangedError,
    UnsafePathError,
)
from ckptstore.formats.hf_folder import HFFolder, HFTensor
from ckptstore.formats.hf_rules import Target, load_name_map, parse_name_map
from ckptstore.formats.safetensors_header import build_header
from ckptstore.store.read_plan import plan_param
from ckptstore.testing.hf_folder import llama_config, llama_tensors, write_hf_folder
from ckptstore.write.hf_index import index_hf, view_manifest
from conftest import examples

CONFIG = llama_config()


def mcore_expected(t: dict[str, np.ndarray], layer: int) -> dict[str, np.ndarray]:
    """What MindFormers' mcore conversion makes of layer ``layer`` (qkv_concat_hf2mg, ffn_concat_hf2mg)."""
    p = f"model.layers.{layer}."
    q, k, v = (t[p + f"self_attn.{m}_proj.weight"] for m in "qkv")
    groups, hd = CONFIG["num_key_value_heads"], CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    qg, kg = q.shape[0] // groups, hd
    qkv = np.concatenate([np.concatenate([q[g * qg:(g + 1) * qg], k[g * kg:(g + 1) * kg], v[g * kg:(g + 1) * kg]])
                          for g in range(groups)])
    gate, up = t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"]
    fc1 = np.stack([gate, up], axis=1).reshape(-1, gate.shape[1])
    return {f"decoder.layers.{layer}.self_attention.linear_qkv.weight": qkv,
            f"decoder.layers.{layer}.mlp.linear_fc1.weight": fc1}


@pytest.fixture
def folder(tmp_path):
    tensors = llama_tensors(CONFIG, seed=3)
    return write_hf_folder(tmp_path / "hf", tensors, shards=3, config=CONFIG), tensors


def test_an_index_of_a_hf_folder_copies_nothing_and_reads_each_renamed_tensor(folder, tmp_path):
    hf, tensors = folder
    summary = index_hf(hf, tmp_path / "st", name_map="llama")
    assert os.listdir(tmp_path / "st") == ["ckptstore.json"]
    assert summary.params == len(tensors) and summary.stored_bytes == sum(a.nbytes for a in tensors.values())
    store = ckptstore.open(tmp_path / "st")
    np.testing.assert_array_equal(store.read("model.layers.1.attention.wk.weight"),
                                  tensors["model.layers.1.self_attn.k_proj.weight"])
    np.testing.assert_array_equal(store.read("model.tok_embeddings.embedding_weight"),
                                  tensors["model.embed_tokens.weight"])
    np.testing.assert_array_equal(store.read("model.norm_out.weight"), tensors["model.norm.weight"])


def test_fused_views_read_as_mindformers_concatenates_them(folder, tmp_path):
    hf, tensors = folder
    index_hf(hf, tmp_path / "st", name_map="mcore")
    store = ckptstore.open(tmp_path / "st")
    for layer in range(CONFIG["num_hidden_layers"]):
        for name, want in mcore_expected(tensors, layer).items():
            np.testing.assert_array_equal(store.read(name), want)


def test_a_slice_of_a_fused_view_reads_exactly_its_rows_and_columns(folder, tmp_path):
    hf, tensors = folder
    index_hf(hf, tmp_path / "st", name_map="mcore")
    store = ckptstore.open(tmp_path / "st")
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    box = Box((10, 4), (50, 20))
    plan = plan_param(store.info(name), box)
    assert plan.nbytes == 40 * 16 * 4
    np.testing.assert_array_equal(store.read(name, index=(slice(10, 50), slice(4, 20))),
                                  mcore_expected(tensors, 0)[name][10:50, 4:20])


@pytest.mark.parametrize("cost", ["local", "s3"])
def test_a_tp_rank_of_gate_up_interleaved_row_by_row_takes_a_request_per_source_tensor(folder, tmp_path, cost):
    # rank 1 of 4 of linear_fc1 is rows 12..24 of gate and of up, alternating in the destination:
    # each source's rows are one run of its file, so one request each (not one per row, 24)
    from ckptstore.io.s3_source import S3_COST
    from ckptstore.store.executor import IO_STATS

    hf, tensors = folder
    index_hf(hf, tmp_path / "st", name_map="mcore")
    store = ckptstore.open(tmp_path / "st")
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    rows, cols = store.info(name).shape
    box = Box((rows // 4, 0), (rows // 2, cols))
    plan = plan_param(store.info(name), box, cost=S3_COST if cost == "s3" else None)
    assert plan.nbytes == (rows // 4) * cols * 4 and plan.requests <= 2
    if cost == "local":  # what the store's own (local) executor sends is that plan
        IO_STATS.reset()
        got = store.read(name, index=(slice(rows // 4, rows // 2), slice(None)))
        assert (IO_STATS.requests, IO_STATS.bytes_read) == (plan.requests, plan.nbytes)
        np.testing.assert_array_equal(got, mcore_expected(tensors, 0)[name][rows // 4:rows // 2])


@settings(max_examples=examples(60))
@given(st.lists(st.integers(1, 4), min_size=2, max_size=3), st.integers(1, 3), st.integers(0, 2),
       st.lists(st.integers(1, 3), min_size=2, max_size=2), st.data())
def test_each_chunk_of_a_fused_view_is_exactly_the_source_rows_it_claims(tmp_path_factory, parts, groups, axis,
                                                                         other, data):
    """A view's chunk table, read chunk by chunk from the file, equals numpy's fusion of the sources;
    and any box of it reads exactly that box's bytes."""
    rng = np.random.default_rng(0)
    sizes = [k * groups for k in parts]
    dims = list(other)
    dims.insert(axis, 0)
    shapes = [tuple(s if a == axis else d for a, d in enumerate(dims)) for s in sizes]
    sources = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    names = [f"s{i}" for i in range(len(sources))]
    head, infos = build_header([(n, a.dtype, a.shape) for n, a in zip(names, sources, strict=True)])
    path = tmp_path_factory.mktemp("view") / "f.safetensors"
    path.write_bytes(head + b"".join(a.tobytes() for a in sources))
    folder = HFFolder(str(path.parent), {n: HFTensor(n, "f.safetensors", i) for n, i in zip(names, infos, strict=True)},
                      ("f.safetensors",))
    target = Target("fused", tuple(names), axis, groups, tuple(sizes))
    p = view_manifest(target, folder)
    p.validate()
    split = [np.split(a, groups, axis=axis) for a in sources]
    want = np.concatenate([np.concatenate([x[g] for x in split], axis=axis) for g in range(groups)], axis=axis)
    raw = path.read_bytes()
    for i in range(len(p.chunks)):
        box = p.chunk_box(i)
        f, offset, n = p.chunks.chunk_pieces(i)[0]
        got = np.frombuffer(raw[offset:offset + n], dtype=np.float32).reshape(box.shape)
        np.testing.assert_array_equal(got, want[tuple(slice(a, b) for a, b in zip(box.start, box.stop, strict=True))])
    lo = [data.draw(st.integers(0, s - 1)) for s in want.shape]
    hi = [data.draw(st.integers(a + 1, s)) for a, s in zip(lo, want.shape, strict=True)]
    plan = plan_param(p, Box(tuple(lo), tuple(hi)))
    assert plan.nbytes == int(np.prod([b - a for a, b in zip(lo, hi, strict=True)])) * 4


def test_a_rank_of_a_two_rank_layout_reads_its_slice_of_every_parameter(folder, tmp_path):
    from ckptstore.testing.sample_checkpoint import ParamSpec, write_strategy_json

    hf, tensors = folder
    index_hf(hf, tmp_path / "st", name_map="mcore")
    store = ckptstore.open(tmp_path / "st")
    specs = []
    for name in store.names():
        shape = store.info(name).shape
        if len(shape) == 2 and ("linear_proj" in name or "linear_fc2" in name):
            specs.append(ParamSpec(name, shape, dev_matrix=(2,), tensor_map=(-1, 0)))  # row-parallel: columns split
        elif len(shape) == 2:
            specs.append(ParamSpec(name, shape, dev_matrix=(2,), tensor_map=(0, -1)))  # column-parallel: rows split
        else:
            specs.append(ParamSpec(name, shape, dev_matrix=(2,), tensor_map=(-1,)))
    strategy = write_strategy_json(tmp_path / "tp2.json", specs)  # as the compiler writes it
    fused = {**mcore_expected(tensors, 0), **mcore_expected(tensors, 1)}
    whole = {t.name: fused[t.name] if t.fused else tensors[t.sources[0]]
             for t in load_name_map("mcore").apply({k: v.shape for k, v in tensors.items()}, CONFIG)}
    got = ckptstore.read_rank(store, strategy, rank=1)
    plan = ckptstore.plan_rank(store, strategy, rank=1)
    slice_bytes = 0
    for spec in specs:
        full = whole[spec.name]
        if spec.tensor_map == (0, -1):
            want = full[full.shape[0] // 2:]
        elif spec.tensor_map == (-1, 0):
            want = full[:, full.shape[1] // 2:]
        else:
            want = full
        np.testing.assert_array_equal(got[spec.name], want)
        slice_bytes += want.nbytes
    assert plan.nbytes <= 1.01 * slice_bytes


def test_a_shard_changed_after_indexing_is_refused_at_open(folder, tmp_path):
    hf, _ = folder
    index_hf(hf, tmp_path / "st", name_map="llama")
    shard = hf / "model-00001-of-00003.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(SourceChangedError, match="model-00001-of-00003.safetensors changed since the index was made"):
        ckptstore.open(tmp_path / "st")


def test_bfloat16_and_float16_are_indexed_as_stored(tmp_path):
    import ml_dtypes

    for dtype in (np.float16, ml_dtypes.bfloat16):
        tensors = llama_tensors(CONFIG, dtype=dtype, seed=5)
        hf = write_hf_folder(tmp_path / f"hf-{np.dtype(dtype).name}", tensors, shards=2, config=CONFIG)
        store = ckptstore.open(index_hf(hf, tmp_path / f"st-{np.dtype(dtype).name}", name_map="mcore").store)
        got = store.read("decoder.layers.1.self_attention.linear_qkv.weight")
        assert got.dtype == np.dtype(dtype)
        qkv = "decoder.layers.1.self_attention.linear_qkv.weight"
        np.testing.assert_array_equal(got, mcore_expected(tensors, 1)[qkv])


def test_a_second_index_of_the_same_folder_is_a_no_op(folder, tmp_path):
    hf, _ = folder
    index_hf(hf, tmp_path / "st", name_map="llama")
    assert index_hf(hf, tmp_path / "st", name_map="llama").already_complete


# --- untrusted folders -------------------------------------------------------------------------

def _put_in_index(hf, tensor: str, shard: str) -> None:
    """Make the folder's ``model.safetensors.index.json`` say ``tensor`` is in ``shard``."""
    doc = json.loads((hf / "model.safetensors.index.json").read_text())
    doc["weight_map"][tensor] = shard
    (hf / "model.safetensors.index.json").write_text(json.dumps(doc))


def test_an_index_json_naming_a_shard_outside_the_folder_is_refused(folder, tmp_path):
    hf, _ = folder
    _put_in_index(hf, "lm_head.weight", "../elsewhere.safetensors")
    with pytest.raises(UnsafePathError, match=r"'\.\.' component.*tensor 'lm_head.weight'"):
        index_hf(hf, tmp_path / "st", name_map="llama")


def test_a_shard_whose_header_names_a_tensor_twice_is_refused_naming_it(tmp_path):
    hf = write_hf_folder(tmp_path / "hf", {"model.norm.weight": np.ones(4, np.float32),
                                           "model.norm.wxyzab": np.zeros(4, np.float32)}, shards=1)
    shard = hf / "model.safetensors"
    shard.write_bytes(shard.read_bytes().replace(b'"model.norm.wxyzab"', b'"model.norm.weight"'))
    with pytest.raises(CorruptCheckpointError, match="^the safetensors header is not valid JSON: the key "
                                                     "'model.norm.weight' appears twice .*model.safetensors"):
        index_hf(hf, tmp_path / "st", name_map="llama")


def test_a_0_d_tensor_is_indexed_and_read_as_0_d(tmp_path):
    hf = write_hf_folder(tmp_path / "hf", {"logit_scale": np.array(2.5, np.float32)}, shards=1)
    index_hf(hf, tmp_path / "st", name_map="llama")
    with ckptstore.open(tmp_path / "st") as store:
        assert store.info("logit_scale").shape == ()
        assert store.read("logit_scale").tobytes() == np.float32(2.5).tobytes()


def test_a_cache_snapshot_of_symbolic_links_is_refused_saying_how_to_copy_it(folder, tmp_path):
    hf, _ = folder
    (tmp_path / "blobs").mkdir()
    shard = hf / "model-00001-of-00003.safetensors"
    shard.rename(tmp_path / "blobs" / "a1b2")
    shard.symlink_to(os.path.relpath(tmp_path / "blobs" / "a1b2", hf))  # as huggingface_hub's cache links them
    with pytest.raises(UnsafePathError, match=f"^{shard} is a symbolic link.*index a copy with real files "
                                              r"\(cp -rL SNAPSHOT DIR, or huggingface-cli download --local-dir DIR\)"):
        index_hf(hf, tmp_path / "st", name_map="llama")


def test_an_index_json_naming_a_tensor_its_shard_lacks_is_refused(folder, tmp_path):
    hf, _ = folder
    _put_in_index(hf, "lm_head.weight", "model-00001-of-00003.safetensors")
    with pytest.raises(CorruptCheckpointError, match=r"puts tensor 'lm_head.weight' in model-00001-of-00003"):
        index_hf(hf, tmp_path / "st", name_map="llama")


def test_a_folder_without_safetensors_is_refused(tmp_path):
    (tmp_path / "hf").mkdir()
    with pytest.raises(MissingFileError, match="neither model.safetensors.index.json nor model.safetensors"):
        index_hf(tmp_path / "hf", tmp_path / "st", name_map="llama")


def test_a_single_file_folder_is_indexed(tmp_path):
    tensors = llama_tensors(CONFIG, seed=1)
    hf = write_hf_folder(tmp_path / "hf", tensors, shards=1, config=CONFIG)
    store = ckptstore.open(index_hf(hf, tmp_path / "st", name_map="qwen2").store)
    np.testing.assert_array_equal(store.read("lm_head.weight"), tensors["lm_head.weight"])


def test_a_fusion_that_does_not_fit_the_config_names_the_rule(folder, tmp_path):
    hf, _ = folder
    (hf / "config.json").write_text(json.dumps({**CONFIG, "num_key_value_heads": 4}))
    with pytest.raises(NameMapError, match=r"rule file mcore \(shipped\), rule fusions\[0\]: q, k, v of lengths"):
        index_hf(hf, tmp_path / "st", name_map="mcore")


@pytest.mark.slow
def test_cli_index_with_a_name_map_and_its_errors(folder, tmp_path):
    hf, _ = folder
    env = {**os.environ, "PYTHONPATH": os.getcwd()}

    def run(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ckptstore.cli", "index", *a], capture_output=True, text=True,
                              env=env)

    ok = run(str(hf), "--out", str(tmp_path / "st"), "--name-map", "mcore", "-q")
    assert ok.returncode == 0, ok.stderr
    assert "an index of 15 parameters of a Hugging Face folder" in ok.stdout
    bad = run(str(hf), "--out", str(tmp_path / "st2"), "--name-map", str(tmp_path / "none.json"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "NameMapError" in bad.stderr
    mixed = run(str(hf), "--out", str(tmp_path / "st3"), "--name-map", "llama", "--step", "3")
    assert mixed.returncode == 2 and "--step do(es) not apply to a Hugging Face folder" in mixed.stderr


def test_the_public_index_with_a_name_map_makes_the_store_the_command_makes(folder, tmp_path):
    hf, _ = folder
    summary = ckptstore.index(hf, tmp_path / "api", name_map="mcore")
    index_hf(hf, tmp_path / "direct", name_map="mcore")
    assert summary.params == 15
    assert (tmp_path / "api" / "ckptstore.json").read_bytes() == (tmp_path / "direct" / "ckptstore.json").read_bytes()


def test_the_public_index_with_a_name_map_refuses_rank_file_options(folder, tmp_path):
    hf, _ = folder
    with pytest.raises(InvalidOptionError, match=r"^step, checksum do\(es\) not apply to a Hugging Face folder "
                                                 r"\(name_map\)$"):
        ckptstore.index(hf, tmp_path / "st", name_map="llama", step=3, checksum=True)
    assert not (tmp_path / "st").exists()


def test_cli_index_with_a_name_map_refuses_epoch_like_every_rank_file_option(folder, tmp_path):
    hf, _ = folder
    r = subprocess.run([sys.executable, "-m", "ckptstore", "index", str(hf), "--out", str(tmp_path / "st"),
                        "--name-map", "llama", "--epoch", "2", "--prefix", "net"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert r.returncode == 2
    assert "--epoch, --prefix do(es) not apply to a Hugging Face folder (--name-map)" in r.stderr
    assert not (tmp_path / "st").exists()


def test_parse_name_map_is_what_index_hf_takes(folder, tmp_path):
    hf, tensors = folder
    rules = parse_name_map({"format": "ckptstore-name-map", "version": 1, "unmatched": "drop",
                            "renames": [{"pattern": r"lm_head\.weight", "target": "head"}]}, "inline")
    store = ckptstore.open(index_hf(hf, tmp_path / "st", name_map=rules).store)
    assert store.names() == ["head"]


@pytest.mark.slow
def test_a_hf_folder_in_a_bucket_is_indexed_read_and_exported_back_into_a_bucket(folder, tmp_path, bucket):
    from ckptstore.formats.hf_folder import read_hf_folder
    from ckptstore.io import open_location
    from ckptstore.read.hf_export import export_hf
    from ckptstore.testing import s3_server as S

    hf, tensors = folder
    S.upload(hf, bucket.url("hf"))
    index_hf(bucket.url("hf"), tmp_path / "st", name_map="mcore")
    store = ckptstore.open(tmp_path / "st")
    name = "decoder.layers.1.mlp.linear_fc1.weight"
    np.testing.assert_array_equal(store.read(name), mcore_expected(tensors, 1)[name])
    export_hf(store, bucket.url("out"), name_map="mcore", max_shard_size="20KB")
    back = open_location(bucket.url("out"))
    exported = read_hf_folder(back)
    assert sorted(exported.tensors) == sorted(tensors)
    t = exported.tensors["model.layers.1.mlp.up_proj.weight"]
    raw = back.open(t.file).pread(t.info.start, t.info.nbytes)
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(t.info.shape),
                                  tensors["model.layers.1.mlp.up_proj.weight"])


def test_include_and_exclude_choose_among_the_mapped_names(folder, tmp_path):
    hf, _ = folder
    store = ckptstore.open(index_hf(hf, tmp_path / "st", name_map="mcore", include=["decoder.layers.1.*"],
                                    exclude=["*norm*"]).store)
    assert sorted(store.names()) == ["decoder.layers.1.mlp.linear_fc1.weight", "decoder.layers.1.mlp.linear_fc2.weight",
                                     "decoder.layers.1.self_attention.linear_proj.weight",
                                     "decoder.layers.1.self_attention.linear_qkv.weight"]
    with pytest.raises(InvalidOptionError,
                       match="matches none of the 15 mapped parameters"):
        index_hf(hf, tmp_path / "st2", name_map="mcore", include=["model.layers.*"])


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2, 2) | st.text(max_size=12),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=3), max_leaves=6)


@settings(max_examples=examples(40))
@given(st.sampled_from(["weight_map", "value", "key", "doc"]), json_values)
def test_a_mutated_index_json_gives_a_typed_error_or_a_correct_store(tmp_path_factory, where, junk):
    """Untrusted index.json: whatever it says, indexing raises a CkptStoreError or makes a store
    whose every tensor reads what the shards hold."""
    tensors = llama_tensors(llama_config(layers=1), seed=2)
    root = tmp_path_factory.mktemp("fuzz")
    hf = write_hf_folder(root / "hf", tensors, shards=2)
    path = hf / "model.safetensors.index.json"
    doc = json.loads(path.read_text())
    if where == "weight_map":
        doc["weight_map"] = junk
    elif where == "value":
        doc["weight_map"]["lm_head.weight"] = junk
    elif where == "key":
        doc["weight_map"][str(junk)] = doc["weight_map"].pop("lm_head.weight")
    else:
        doc = junk
    path.write_text(json.dumps(doc))
    try:
        store = ckptstore.open(index_hf(hf, root / "st", name_map="llama").store)
    except ckptstore.CkptStoreError:
        return
    for name in store.names():
        source = {"model.tok_embeddings.embedding_weight": "model.embed_tokens.weight"}.get(name, name)
        if source in tensors:
            np.testing.assert_array_equal(store.read(name), tensors[source])


def test_an_index_interrupted_before_its_manifest_is_completed_by_ckptstore_commit(folder, tmp_path, monkeypatch):
    # index --name-map follows the commit protocol of every writer (issue 34): commit plan, marker,
    # then the manifest; an index stopped before its manifest is finished by 'ckptstore commit'
    from ckptstore.write.kinds.index import IndexWriter

    hf, tensors = folder

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(IndexWriter, "manifest_file", classmethod(stop))
    with pytest.raises(KeyboardInterrupt):
        index_hf(hf, tmp_path / "st", name_map="llama")
    monkeypatch.undo()
    assert not (tmp_path / "st" / "ckptstore.json").exists()
    ckptstore.commit(tmp_path / "st")
    np.testing.assert_array_equal(ckptstore.open(tmp_path / "st").read("model.norm_out.weight"),
                                  tensors["model.norm.weight"])


@pytest.mark.parametrize("option", [{"step": 0}, {"epoch": 0}, {"prefix": ""}],
                         ids=["step-0", "epoch-0", "empty-prefix"])
def test_a_rank_file_option_given_a_falsy_value_is_still_refused_with_a_name_map(folder, tmp_path, option):
    hf, _ = folder
    (name,) = option
    with pytest.raises(InvalidOptionError, match=f"^{name} do\\(es\\) not apply to a Hugging Face folder"):
        ckptstore.index(hf, tmp_path / "st", name_map="llama", **option)
    assert not (tmp_path / "st").exists()


def test_a_plan_that_reads_gaps_says_what_the_wanted_bytes_alone_would_cost(folder, tmp_path, monkeypatch):
    """Priced like a bucket (20 ms a request), a column slice of a row-parallel weight is read as
    whole rows: the plan names the parameters over-read and the requests reading exactly would take."""
    from ckptstore.testing.sample_checkpoint import ParamSpec, write_strategy_json

    hf, _ = folder
    index_hf(hf, tmp_path / "st", name_map="mcore")
    store = ckptstore.open(tmp_path / "st")
    specs = [ParamSpec(n, store.info(n).shape, dev_matrix=(2,),
                       tensor_map=(-1, 0) if "linear_fc2" in n else (-1,) * len(store.info(n).shape))
             for n in store.names()]
    strategy = write_strategy_json(tmp_path / "tp2.json", specs)
    monkeypatch.setenv("CKPTSTORE_REQUEST_LATENCY_MS", "20")
    plan = ckptstore.plan_rank(store, strategy, rank=1)
    fc2 = [n for n in store.names() if "linear_fc2" in n]
    assert plan.over_read_params == len(fc2) and {n for n, _, _ in plan.over_read_top} <= set(fc2)
    name, wanted, fetched = plan.over_read_top[0]
    assert wanted == store.info(name).nbytes // 2 and fetched > wanted
    assert plan.exact_requests == plan.requests - len(fc2) + sum(store.info(n).shape[0] for n in fc2)
    assert plan.exact_seconds > plan.modelled_seconds
