"""Proof that the sample writer (ckptstore.testing.sample_checkpoint) writes real MindSpore distributed checkpoints.

Real MindSpore (no mocks): fixtures are merged / resharded by ``mindspore.transform_checkpoints``
and compared bit for bit with the global tensors.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

os.environ.setdefault("GLOG_v", "3")

pytest.importorskip("mindspore")
pytestmark = pytest.mark.mindspore

import mindspore_fixtures as T

KINDS = [k for k in T.LAYOUT_KINDS]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _strategy_arg(root: Path, stages: int, ext: str = ".ckpt"):
    if stages == 1:
        return root / f"strategy{ext}"
    return [root / f"strategy_stage{s}{ext}" for s in range(stages)]


def _facts_box(spec: T.ParamSpec, r: int) -> tuple[slice, ...]:
    """MINDSPORE_FACTS.md's formula, written independently of MindSpore, for cross-checking."""
    spec = T.normalize_spec(spec)
    D, M, G = spec.dev_matrix, spec.tensor_map, spec.shape
    n = len(D)
    c = [(r // int(np.prod(D[i + 1 :]))) % D[i] for i in range(n)]
    box = []
    split_prod = 1
    for a, m in enumerate(M):
        if m == -1:
            box.append((0, G[a]))
            continue
        k, t = D[n - 1 - m], c[n - 1 - m]
        split_prod *= k
        box.append((t * G[a] // k, (t + 1) * G[a] // k))
    s, z = spec.opt_shard_step, spec.opt_shard_size
    if s != 0 and z != 0:
        Z = z if z > 0 else int(np.prod(D)) // split_prod
        j = (r // s) % Z
        lo, hi = box[0]
        part = (hi - lo) // Z
        box[0] = (lo + j * part, lo + (j + 1) * part)
    return tuple(slice(lo, hi) for lo, hi in box)


@pytest.mark.parametrize("kind", KINDS)
def test_merge_to_single_rank_is_bit_exact(kind, tmp_path):
    specs, world, stages = T.layout_specs(kind)
    tensors = T.make_global_tensors(specs, seed=1)
    root = tmp_path / "src"
    paths = T.save_distributed(root, specs, tensors, world_size=world, stages=stages, extra_scalars=True)
    assert paths == [root / f"rank_{i}" / "net-1_1.ckpt" for i in range(world)]
    assert sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) < 2 * 1024 * 1024

    out = T.transform_oracle(root, _strategy_arg(root, stages), None, tmp_path / "merged")
    merged = T.load_oracle(out / "rank_0" / "oracle_0.ckpt")
    assert set(merged) == set(tensors) | {"epoch_num", "step_num"}
    for name, g in tensors.items():
        assert _same(merged[name], g), name
    assert merged["epoch_num"].dtype == np.int64 and int(merged["epoch_num"]) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_rank_files_hold_mindspore_slices(kind, tmp_path):
    """Each rank file holds MindSpore's slice, which also agrees with MINDSPORE_FACTS.md's formula."""
    specs, world, stages = T.layout_specs(kind)
    tensors = T.make_global_tensors(specs)
    paths = T.save_distributed(tmp_path, specs, tensors, world_size=world, stages=stages)
    per_stage = world // stages
    for g, path in enumerate(paths):
        stage, r = divmod(g, per_stage)
        local = T.load_oracle(path)
        expected = {s.name for s in specs if s.stage in (-1, stage)}
        assert set(local) == expected
        for spec in specs:
            if spec.name not in expected:
                continue
            want = T.mindspore_rank_slice(spec, tensors[spec.name], r)
            assert _same(local[spec.name], want), (spec.name, g)
            if spec.in_strategy:
                facts = np.ascontiguousarray(tensors[spec.name][_facts_box(spec, r)])
                assert _same(want, facts), (spec.name, g)


def test_opt_shard_example_from_facts(tmp_path):
    # G=[64,32], D=[2,4], M=[0,-1], s=4, z=-1, rank 5 -> rows [24,32)
    spec = T.ParamSpec("w", (64, 32), dev_matrix=(2, 4), tensor_map=(0, -1), opt_shard_step=4, opt_shard_size=-1)
    g = T.make_global_tensors([spec])["w"]
    assert _same(T.mindspore_rank_slice(spec, g, 5), g[24:32].copy())


def _opt_shard_target_4() -> list[T.ParamSpec]:
    specs, _, _ = T.layout_specs("opt_shard")
    d = (2, 2)
    out = []
    for s in specs:
        if not s.in_strategy:
            out.append(s)
        elif s.name in ("layer0.w", "adam_m.layer0.w", "adam_v.layer0.w"):
            out.append(replace(s, dev_matrix=d, tensor_map=(0, -1), opt_shard_step=2, opt_shard_size=-1))
        elif s.name == "layer1.w":
            out.append(replace(s, dev_matrix=d, tensor_map=(-1, 0), opt_shard_step=2, opt_shard_size=-1))
        elif s.name == "layer2.w":
            out.append(replace(s, dev_matrix=d, tensor_map=(-1, 0), opt_shard_step=2, opt_shard_size=2))
        elif s.name == "embedding.table":
            out.append(replace(s, dev_matrix=d, tensor_map=(-1, -1), opt_shard_step=1, opt_shard_size=2))
        elif s.name in ("layernorm.gamma", "adam_m.layernorm.gamma", "adam_v.layernorm.gamma"):
            out.append(replace(s, dev_matrix=d, tensor_map=(-1,), opt_shard_step=1, opt_shard_size=-1))
        else:
            out.append(replace(s, dev_matrix=d))
    return out


@pytest.mark.parametrize(
    "src_kind,dst",
    [("dp2_mp4", "dp2_mp2"), ("opt_shard", "opt4"), ("mixed_dtypes", "mixed4")],
)
def test_reshard_to_other_layout(src_kind, dst, tmp_path):
    specs, world, stages = T.layout_specs(src_kind)
    tensors = T.make_global_tensors(specs, seed=2)
    root = tmp_path / "src"
    T.save_distributed(root, specs, tensors, world_size=world, stages=stages)
    if dst == "dp2_mp2":
        dst_specs, dst_world, _ = T.layout_specs("dp2_mp2")
    elif dst == "opt4":
        dst_specs, dst_world = _opt_shard_target_4(), 4
    else:  # mixed dtypes, dp4 -> mp4 on 4 ranks: everything that can be split on its last axis
        dst_specs, dst_world = [], 4
        for s in specs:
            if s.in_strategy and s.shape[-1] % 4 == 0:
                tmap = (-1,) * (len(s.shape) - 1) + (0,)
                s = replace(s, dev_matrix=(4,), tensor_map=tmap, opt_shard_step=0, opt_shard_size=0)
            elif s.in_strategy:
                s = replace(s, dev_matrix=(4,), tensor_map=(-1,) * len(s.shape), opt_shard_step=0, opt_shard_size=0)
            dst_specs.append(s)
    assert [s.name for s in dst_specs] == [s.name for s in specs]
    dst_strategy = T.write_strategy(tmp_path / "dst_strategy.ckpt", dst_specs)
    out = T.transform_oracle(root, root / "strategy.ckpt", dst_strategy, tmp_path / "dst")
    for j in range(dst_world):
        got = T.load_oracle(out / f"rank_{j}" / f"oracle_{j}.ckpt")
        assert set(got) == set(tensors)
        for spec in dst_specs:
            want = T.mindspore_rank_slice(spec, tensors[spec.name], j)
            assert _same(got[spec.name], want), (spec.name, j)
            if spec.in_strategy:
                facts = np.ascontiguousarray(tensors[spec.name][_facts_box(spec, j)])
                assert _same(want, facts), (spec.name, j)


@pytest.mark.parametrize("kind", ["opt_shard", "pipeline2"])
def test_json_strategy_accepted_by_mindspore(kind, tmp_path):
    specs, world, stages = T.layout_specs(kind)
    tensors = T.make_global_tensors(specs)
    root = tmp_path / "src"
    T.save_distributed(root, specs, tensors, world_size=world, stages=stages, strategy_format="json")
    strategy = _strategy_arg(root, stages, ".json")
    first = strategy if stages == 1 else strategy[0]
    doc = json.loads(Path(first).read_text())
    assert doc["current_stage"] == 1
    item = doc["parallel_layout_item"]["layer0.w"]
    assert set(item) == {"dev_matrix", "tensor_map", "tensor_shape", "field",
                         "opt_weight_shard_step", "opt_weight_shard_size"}
    assert {v["stage"] for v in doc["parallel_strategy_item"].values()} == {0}
    out = T.transform_oracle(root, strategy, None, tmp_path / "merged")
    merged = T.load_oracle(out / "rank_0" / "oracle_0.ckpt")
    for name, g in tensors.items():
        assert _same(merged[name], g), name


def test_strategy_protobuf_shape(tmp_path):
    from mindspore.train import node_strategy_pb2

    specs, _, _ = T.layout_specs("pipeline2")
    path = T.write_strategy(tmp_path / "s1.ckpt", specs, stage=1)
    smap = node_strategy_pb2.ParallelStrategyMap()
    smap.ParseFromString(path.read_bytes())
    assert smap.current_stage == 1
    assert [i.param_name for i in smap.parallel_layout_item] == [
        "layer1.w", "head.w", "adam_m.layer1.w", "adam_v.layer1.w"]
    assert {i.parallel_strategys.stage for i in smap.parallel_strategy_item} == {1}
    for item in smap.parallel_layout_item:
        lay = item.parallel_layouts
        assert len(lay.dev_matrix) == len(lay.tensor_map) == 1
        assert len(lay.param_split_shape) == len(lay.indices_offset) == 1
        assert list(lay.param_split_shape[0].dim) == [] and list(lay.indices_offset[0].dim) == []
        assert lay.field == 0
    layer1 = smap.parallel_layout_item[0].parallel_layouts
    assert (layer1.opt_weight_shard_step, layer1.opt_weight_shard_size) == (2, -1)


def test_dev_matrix_ones_removed_like_the_compiler():
    g = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    cases = [
        ((2, 1, 4), (0, -1), (2, 4), (0, -1)),
        ((2, 1, 4), (2, -1), (2, 4), (1, -1)),
        ((2, 1, 4), (1, 0), (2, 4), (-1, 0)),
        ((1, 8), (1, 0), (8,), (-1, 0)),
        ((2, 1, 1, 4), (3, 0), (2, 4), (1, 0)),
    ]
    for dev, tmap, ndev, ntmap in cases:
        spec = T.ParamSpec("w", (64, 8), dev_matrix=dev, tensor_map=tmap)
        norm = T.normalize_spec(spec)
        assert (norm.dev_matrix, norm.tensor_map) == (ndev, ntmap), (dev, tmap)
        # MindSpore slices the original and the normalized layout identically
        from mindspore.parallel._tensor import _load_tensor

        for r in range(8):
            raw = _load_tensor(T.NumpyHolder(g), list(dev), list(tmap), [64, 8], rank_id=r)
            assert _same(np.ascontiguousarray(raw), T.mindspore_rank_slice(spec, g, r))


def test_crc_and_resave_and_bf16_bits(tmp_path):
    specs, world, stages = T.layout_specs("mixed_dtypes")
    tensors = T.make_global_tensors(specs, seed=3)
    paths = T.save_distributed(tmp_path, specs, tensors, world_size=world, crc_check=True)
    raw = paths[0].read_bytes()
    assert raw[-17:-10] == b"crc_num"
    # writing again over the (read-only) files works
    T.save_distributed(tmp_path, specs, tensors, world_size=world, crc_check=True, step_suffix="-1_1")
    local = T.load_oracle(paths[3])
    want = T.mindspore_rank_slice(specs[0], tensors["bf16.w"], 3)
    assert local["bf16.w"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert np.array_equal(local["bf16.w"].view(np.uint16), want.view(np.uint16))
    # the raw bf16 payload of rank 0 is in its file as little-endian 16-bit patterns
    assert T.mindspore_rank_slice(specs[0], tensors["bf16.w"], 0).view(np.uint16).astype("<u2").tobytes() in raw


def test_pipeline_to_pipeline_and_to_flat(tmp_path):
    specs, world, stages = T.layout_specs("pipeline2")
    specs = [replace(s, stage=-1) if s.name == "embedding.table" else s for s in specs]  # shared by both stages
    tensors = T.make_global_tensors(specs, seed=4)
    root = tmp_path / "src"
    T.save_distributed(root, specs, tensors, world_size=world, stages=stages)
    src = _strategy_arg(root, stages)
    # identity pipeline -> pipeline: every target rank equals its source rank's content
    out = T.transform_oracle(root, src, src, tmp_path / "same")
    for g in range(world):
        got = T.load_oracle(out / f"rank_{g}" / f"oracle_{g}.ckpt")
        assert set(got) == set(T.load_oracle(root / f"rank_{g}" / "net-1_1.ckpt"))
        stage, r = divmod(g, world // stages)
        for spec in specs:
            if spec.stage in (-1, stage):
                assert _same(got[spec.name], T.mindspore_rank_slice(spec, tensors[spec.name], r)), (spec.name, g)
    # pipeline (2 x 4) -> flat mp4 on 4 ranks
    flat = [replace(s, stage=0, dev_matrix=(4,), tensor_map=(-1,) * (len(s.shape) - 1) + (0,),
                    opt_shard_step=0, opt_shard_size=0) if s.in_strategy else replace(s, stage=0)
            for s in specs]
    dst = T.write_strategy(tmp_path / "flat.ckpt", flat)
    out = T.transform_oracle(root, src, dst, tmp_path / "flat")
    for j in range(4):
        got = T.load_oracle(out / f"rank_{j}" / f"oracle_{j}.ckpt")
        assert set(got) == set(tensors)
        for spec in flat:
            assert _same(got[spec.name], T.mindspore_rank_slice(spec, tensors[spec.name], j)), (spec.name, j)
