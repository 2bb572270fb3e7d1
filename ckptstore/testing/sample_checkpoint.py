"""Write a real MindSpore distributed checkpoint of a given parameter list: the demo's sample.

On a CPU-only machine the parallel compiler cannot run, so this module writes what MindSpore
itself would write for a parallel job:

* strategy files (``ParallelStrategyMap`` protobuf) laid out the way the compiler's
  ``StrategyCheckpoint::Save`` writes them;
* one ``.ckpt`` per rank, written with ``mindspore.save_checkpoint``, whose local tensors are cut
  from the global ones by **MindSpore's own slicing code**
  (``mindspore.parallel._tensor._extract_layout_item``, ``_construct_tensor_layout_for_opt_shard``
  and ``_load_tensor``, the functions ``transform_checkpoints`` uses), never by ckptstore's formula.

``save_distributed(..., writer="ckptstore")`` writes the same files without MindSpore: rank files
with ckptstore's own :class:`~ckptstore.formats.ckpt_writer.CheckpointWriter`, strategy files with
the protobuf encoder below (:func:`strategy_proto_bytes`), local tensors cut by
:func:`formula_rank_slice` (the slicing rule written out in numpy, not MindSpore's code). A test
marked ``mindspore`` (tests/testing/test_pure_fixtures.py) proves both writers give byte-identical
files for every standard layout (and the few other spec sets listed there); for other layouts the
formula's slices are unproven, so a test of the slicing math itself must use ``writer="mindspore"``.

``make demo`` and the benchmarks use it; so can a user who wants a test checkpoint of their own
layout. MindSpore is imported inside functions only.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import ml_dtypes
import numpy as np

from ckptstore.dtypes import numpy_dtype
from ckptstore.formats.ckpt_writer import CheckpointWriter
from ckptstore.formats.protowire import encode_varint

#: Who writes a fixture's files: MindSpore itself, or ckptstore's own writers (no MindSpore needed).
WRITERS: tuple[str, ...] = ("mindspore", "ckptstore")


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of a fixture and its parallel layout.

    ``dev_matrix``/``tensor_map`` use MindSpore's conventions: ``tensor_map[a] = m`` splits tensor
    axis ``a`` along device axis ``len(dev_matrix) - 1 - m`` (counted from the right); ``-1``
    keeps the axis whole. ``dev_matrix == ()`` means the parameter is absent from the strategy
    file and saved whole on every rank of its stage (like ``global_step``).

    ``opt_shard_step``/``opt_shard_size`` are what the compiler writes as
    ``opt_weight_shard_step``/``opt_weight_shard_size`` (size ``-1`` = all replicas, ``0`` = no
    optimizer sharding).

    ``stage`` is the pipeline stage owning the parameter; ``-1`` (an extension of this module)
    means every stage holds it (e.g. ``global_step``, which each stage's optimizer has).
    """

    name: str
    shape: tuple[int, ...]  # GLOBAL shape
    dtype: str = "float32"
    dev_matrix: tuple[int, ...] = ()
    tensor_map: tuple[int, ...] = ()
    opt_shard_step: int = 0
    opt_shard_size: int = 0
    stage: int = 0

    @property
    def in_strategy(self) -> bool:
        """Whether the parameter is written to the strategy file."""
        return len(self.dev_matrix) > 0

    @property
    def np_dtype(self) -> np.dtype:
        """The numpy dtype (``ml_dtypes.bfloat16`` for bfloat16)."""
        return numpy_dtype(self.dtype)


# --------------------------------------------------------------------------------------------
# MindSpore, lazily


def _ms():
    """Import mindspore (quietly) and return the module."""
    os.environ.setdefault("GLOG_v", "3")
    import mindspore

    return mindspore


def strategy_pb2():
    """MindSpore's generated protobuf module of strategy files (``node_strategy_pb2``)."""
    _ms()
    from mindspore.train import node_strategy_pb2

    return node_strategy_pb2


# --------------------------------------------------------------------------------------------
# validation and normalization


def _check_name(name: str) -> None:
    if not name or "-" in name:
        raise ValueError(
            f"parameter name {name!r}: must be non-empty and contain no '-' "
            "(MindSpore's strategy reader splits pipeline-merged names on '-')"
        )


def normalize_spec(spec: ParamSpec) -> ParamSpec:
    """Return ``spec`` with the entries equal to 1 removed from its ``dev_matrix``.

    Mirrors the compiler's ``TensorLayout::RemoveElementEqualToOneInDeviceArrangement`` (which
    runs before ``StrategyCheckpoint::Save``): a tensor axis mapped to a removed device axis
    becomes ``-1``, and map values pointing left of a removed axis are decremented. The
    layout (which rank holds which slice) is unchanged.
    """
    _check_name(spec.name)
    if not spec.in_strategy:
        if spec.tensor_map or spec.opt_shard_step or spec.opt_shard_size:
            raise ValueError(f"{spec.name}: tensor_map/opt shard given without a dev_matrix")
        return spec
    dev = list(spec.dev_matrix)
    tmap = list(spec.tensor_map)
    if len(tmap) != len(spec.shape):
        raise ValueError(f"{spec.name}: tensor_map {tmap} does not match shape {spec.shape}")
    if not spec.shape:
        raise ValueError(f"{spec.name}: a 0-d parameter cannot be in the strategy")
    n = len(dev)
    for m in tmap:
        if m < -1 or m >= n:
            raise ValueError(f"{spec.name}: tensor_map {tmap} out of range for dev_matrix {dev}")
    if any(d < 1 for d in dev):
        raise ValueError(f"{spec.name}: dev_matrix {dev} must be positive")
    new_dev = []
    new_map = list(tmap)
    for i, d in enumerate(dev):
        if d == 1:
            q = n - 1 - i
            # tensor axes mapped to this device axis become whole (looked up in the original map)
            for a, m in enumerate(tmap):
                if m == q:
                    new_map[a] = -1
            new_map = [v - 1 if v >= q else v for v in new_map]
            continue
        new_dev.append(d)
    if not new_dev:
        raise ValueError(f"{spec.name}: dev_matrix {dev} has no entry > 1")
    return replace(spec, dev_matrix=tuple(new_dev), tensor_map=tuple(new_map))


def _stage_ranks(specs: Sequence[ParamSpec]) -> int | None:
    prods = {int(np.prod(s.dev_matrix)) for s in specs if s.in_strategy}
    if len(prods) > 1:
        raise ValueError(f"all strategy parameters must span the same device count, got {prods}")
    return prods.pop() if prods else None


def _on_stage(spec: ParamSpec, stage: int | None) -> bool:
    return stage is None or spec.stage == -1 or spec.stage == stage


# --------------------------------------------------------------------------------------------
# global values


def _float_bit_patterns(dtype: np.dtype, rng: np.random.Generator, n: int) -> np.ndarray:
    """n (distinct when possible) finite normal values of a 16-bit float type, |x| in [2^-8, 2^8)."""
    if dtype == np.dtype(np.float16):
        mant_bits, bias = 10, 15
    else:  # bfloat16
        mant_bits, bias = 7, 127
    exps = np.arange(bias - 8, bias + 8, dtype=np.uint32)
    mants = np.arange(1 << mant_bits, dtype=np.uint32)
    pos = (exps[:, None] << mant_bits | mants[None, :]).ravel()
    pats = np.concatenate([pos, pos | 0x8000]).astype(np.uint16)
    out = np.empty(n, dtype=np.uint16)
    done = 0
    while done < n:
        perm = rng.permutation(pats)[: n - done]
        out[done : done + len(perm)] = perm
        done += len(perm)
    return out.view(dtype)


def _make_values(spec: ParamSpec, rng: np.random.Generator) -> np.ndarray:
    n = int(np.prod(spec.shape, dtype=np.int64)) if spec.shape else 1
    dt = spec.np_dtype
    if spec.dtype in ("float32", "float64"):
        base = np.arange(n, dtype=np.float64) - n // 2
        vals = (base + rng.uniform(0.05, 0.95, n)) * 0.125
        arr = vals.astype(dt)
    elif spec.dtype in ("float16", "bfloat16"):
        arr = _float_bit_patterns(dt, rng, n)
    elif spec.dtype == "bool":
        arr = rng.random(n) < 0.5
    else:
        info = np.iinfo(dt)
        span = int(info.max) - int(info.min) + 1
        if span >= 2 * n:
            lo = max(int(info.min), -(1 << 40))
            start = int(rng.integers(0, min(span - n, 1 << 40))) + lo
            arr = (rng.permutation(n) + start).astype(dt)
        else:
            arr = rng.integers(int(info.min), int(info.max), n, endpoint=True, dtype=dt)
    return arr.reshape(spec.shape).copy(order="C")


def make_global_tensors(specs: Sequence[ParamSpec], seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic global values; bfloat16 as ml_dtypes.bfloat16 arrays; bool as np.bool_.

    Floats: float32/float64 are an ``arange`` plus noise (all distinct); float16/bfloat16 are a
    random permutation of finite normal bit patterns with ``|x|`` in ``[2^-8, 2^8)`` (distinct up to
    32768 resp. 4096 elements). Integers are a shuffled range when the type is wide enough, else
    random. Each parameter has its own stream (seeded by ``seed`` and the CRC-32 of its name), so a
    mis-sliced box is detected. No NaN, infinity or subnormal values.
    """
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        _check_name(spec.name)
        if spec.name in out:
            raise ValueError(f"duplicate parameter name {spec.name!r}")
        numpy_dtype(spec.dtype)  # ValueError for unknown names
        rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
        out[spec.name] = _make_values(spec, rng)
    return out


# --------------------------------------------------------------------------------------------
# slicing, by MindSpore's own code


class NumpyHolder:
    """What ``mindspore.parallel._tensor._load_tensor`` needs from a Tensor: ``asnumpy()``.

    Lets MindSpore's slicing run on any numpy dtype (including ml_dtypes.bfloat16, which
    MindSpore's own ``asnumpy`` cannot produce under numpy 2) without copies through Tensors.
    """

    def __init__(self, array: np.ndarray):
        self._array = array

    def asnumpy(self) -> np.ndarray:
        return self._array


def _slicing_input(spec: ParamSpec, global_array: np.ndarray) -> tuple[ParamSpec, np.ndarray]:
    """``spec`` normalised and ``global_array`` as an array of its shape (a ``ValueError`` naming
    both shapes otherwise): what both rank slicers start from."""
    global_array = np.asarray(global_array)
    if tuple(global_array.shape) != tuple(spec.shape):
        raise ValueError(f"{spec.name}: array shape {global_array.shape} != spec shape {spec.shape}")
    return normalize_spec(spec), global_array


def mindspore_rank_slice(spec: ParamSpec, global_array: np.ndarray, rank: int) -> np.ndarray:
    """The local tensor of ``rank`` (rank *within its pipeline stage*), cut by MindSpore's code.

    Uses the functions ``transform_checkpoints`` relies on:
    ``mindspore.parallel._tensor._extract_layout_item`` (resolves ``opt_shard_size == -1``),
    ``_construct_tensor_layout_for_opt_shard`` (turns the optimizer shard into an extra
    device/tensor axis) and ``_load_tensor`` (rank -> slice index -> ``np.split`` chunk). The
    result is reshaped to the local shape the same way ``_insert_opt_shard_reshape`` does.
    Specs without a dev_matrix return the whole tensor. Always a contiguous copy.
    """
    spec, global_array = _slicing_input(spec, global_array)
    if not spec.in_strategy:
        return np.array(global_array, copy=True)
    _ms()
    from mindspore.parallel._tensor import (
        _construct_tensor_layout_for_opt_shard,
        _extract_layout_item,
        _get_tensor_strategy,
        _load_tensor,
    )

    # the list _convert_to_list builds from a strategy layout
    layout_item = [
        list(spec.dev_matrix),
        list(spec.tensor_map),
        [],
        0,
        spec.opt_shard_step,
        spec.opt_shard_size,
        [max(spec.stage, 0)],
    ]
    dev, tmap, step, size = _extract_layout_item(layout_item)
    dev_num = int(np.prod(dev))
    if not 0 <= rank < dev_num:
        raise ValueError(f"{spec.name}: rank {rank} outside the stage's {dev_num} devices")
    exp_dev, exp_map, exp_shape = _construct_tensor_layout_for_opt_shard(
        dev, tmap, step, size, list(spec.shape)
    )
    chunk = _load_tensor(
        NumpyHolder(global_array), list(exp_dev), list(exp_map), list(exp_shape), rank_id=rank
    )
    strategy = _get_tensor_strategy(dev, tmap)
    local = [int(g) // int(k) for g, k in zip(spec.shape, strategy, strict=True)]
    if step != 0 and size != 0:
        local[0] //= int(size)
    return np.array(chunk, copy=True, order="C").reshape(local)


def formula_rank_slice(spec: ParamSpec, global_array: np.ndarray, rank: int) -> np.ndarray:
    """The local tensor of ``rank`` (within its stage), cut by the slicing rule written out in numpy.

    The rule of MINDSPORE_FACTS.md ("Which slice a rank holds"): device coordinates with the last
    axis fastest; ``tensor_map[a] = m`` cuts axis ``a`` evenly along device axis ``n-1-m``; an
    optimizer shard (step and size non-zero; size ``-1`` = every replica) then cuts axis 0 of that
    box into equal parts and keeps part ``(rank // step) % parts``. It does not use MindSpore's
    code, so it proves nothing about slicing: tests/testing/test_pure_fixtures.py checks it equals
    :func:`mindspore_rank_slice` on the standard layouts (and the spec sets listed there) only.
    Always a contiguous copy.
    """
    spec, global_array = _slicing_input(spec, global_array)
    if not spec.in_strategy:
        return np.array(global_array, copy=True)
    dev, n = spec.dev_matrix, len(spec.dev_matrix)
    dev_num = int(np.prod(dev))
    if not 0 <= rank < dev_num:
        raise ValueError(f"{spec.name}: rank {rank} outside the stage's {dev_num} devices")
    coords = [(rank // int(np.prod(dev[i + 1:], dtype=np.int64))) % dev[i] for i in range(n)]
    box = []
    for g, m in zip(spec.shape, spec.tensor_map, strict=True):
        if m == -1:
            box.append((0, g))
        else:
            k, t = dev[n - 1 - m], coords[n - 1 - m]
            box.append((t * g // k, (t + 1) * g // k))
    if spec.opt_shard_step and spec.opt_shard_size:
        split = int(np.prod([dev[n - 1 - m] for m in spec.tensor_map if m != -1], dtype=np.int64))
        parts = spec.opt_shard_size if spec.opt_shard_size > 0 else dev_num // split
        j = (rank // spec.opt_shard_step) % parts
        lo, hi = box[0]
        rows = (hi - lo) // parts
        box[0] = (lo + j * rows, lo + (j + 1) * rows)
    return np.array(global_array[tuple(slice(lo, hi) for lo, hi in box)], copy=True, order="C")


def rank_slice(spec: ParamSpec, global_array: np.ndarray, rank: int, writer: str = "mindspore") -> np.ndarray:
    """The local tensor of ``rank``: :func:`mindspore_rank_slice` for ``writer="mindspore"``, else
    :func:`formula_rank_slice`."""
    if writer == "mindspore":
        return mindspore_rank_slice(spec, global_array, rank)
    return formula_rank_slice(spec, global_array, rank)


# --------------------------------------------------------------------------------------------
# strategy files


def split_counts(spec: ParamSpec) -> list[int]:
    """How many parts each tensor axis is split into (the strategy file's ``parallel_strategy``)."""
    n = len(spec.dev_matrix)
    return [1 if m == -1 else int(spec.dev_matrix[n - 1 - m]) for m in spec.tensor_map]


def _strategy_entries(specs: Sequence[ParamSpec], stage: int | None) -> list[tuple[str, ParamSpec, int]]:
    """(operator node name, normalized spec, stage) for every spec written to the file."""
    chosen = [normalize_spec(s) for s in specs if _on_stage(s, stage) and s.in_strategy]
    names = [s.name for s in chosen]
    if len(set(names)) != len(names):
        raise ValueError("duplicate parameter names in strategy")
    if not chosen:
        raise ValueError(
            "no parameter with a dev_matrix for this strategy file (MindSpore rejects empty ones)"
        )
    _stage_ranks(chosen)
    out = []
    for i, s in enumerate(chosen):
        st = stage if stage is not None else max(s.stage, 0)
        node = f"Default/network-WithLossCell/_backbone-Net/MatMul-op{i}"
        out.append((node, s, st))
    return out


def _len_field(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload


def _int_field(number: int, value: int) -> bytes:
    return encode_varint(number << 3) + encode_varint(int(value))  # int32 -1: 10 bytes, as protobuf writes it


def _dims(values: Sequence[int]) -> bytes:
    """A ``{repeated dim = 1}`` message; MindSpore's proto2 schema writes repeated ints unpacked."""
    return b"".join(_int_field(1, v) for v in values)


def strategy_proto_bytes(specs: Sequence[ParamSpec], *, stage: int | None = None) -> bytes:
    """The ``ParallelStrategyMap`` bytes :func:`write_strategy` writes, encoded without MindSpore.

    Field numbers from MindSpore's ``node_strategy.proto`` (proto2): map ``{current_stage=1,
    parallel_strategy_item=2, parallel_layout_item=3}``; strategy item ``{node_name=1,
    parallel_strategys=2 {stage=1, parallel_strategy=2 {dim=1}}}``; layout item ``{param_name=1,
    parallel_layouts=2 {dev_matrix=1, tensor_map=2, param_split_shape=3, indices_offset=4, field=5,
    opt_weight_shard_step=6, opt_weight_shard_size=7}}``. Fields in number order, required scalars
    written even when 0, as protobuf serializes them.
    """
    entries = _strategy_entries(specs, stage)
    out = [_int_field(1, 1)]
    for node, s, st in entries:
        strategys = _int_field(1, st) + _len_field(2, _dims(split_counts(s)))
        out.append(_len_field(2, _len_field(1, node.encode()) + _len_field(2, strategys)))
    for _node, s, _st in entries:
        layouts = (_len_field(1, _dims(s.dev_matrix)) + _len_field(2, _dims(s.tensor_map)) + _len_field(3, b"")
                   + _len_field(4, b"") + _int_field(5, 0) + _int_field(6, s.opt_shard_step)
                   + _int_field(7, s.opt_shard_size))
        out.append(_len_field(3, _len_field(1, s.name.encode()) + _len_field(2, layouts)))
    return b"".join(out)


def write_strategy(path, specs: Sequence[ParamSpec], *, stage: int | None = None, writer: str = "mindspore") -> Path:
    """Write a ``ParallelStrategyMap`` protobuf the way the compiler's ``StrategyCheckpoint::Save`` does.

    ``current_stage = 1``; one ``parallel_strategy_item`` per parameter (a stand-in operator node
    ``.../MatMul-op<i>`` carrying the pipeline ``stage`` and the parameter's split counts: MindSpore
    reads the stage of a file from its first strategy item, e.g. in ``merge_pipeline_strategys``);
    one ``parallel_layout_item`` per parameter with exactly one ``dev_matrix`` (entries equal to 1
    removed, ``tensor_map`` renumbered, see :func:`normalize_spec`), one ``tensor_map``, one empty
    ``param_split_shape`` and one empty ``indices_offset``, ``field = 0``,
    ``opt_weight_shard_step``/``opt_weight_shard_size``.

    With ``stage=s`` only the specs whose stage is ``s`` (or ``-1``) are written, and every
    strategy item carries stage ``s``. Specs with ``dev_matrix == ()`` are not written.
    ``writer="ckptstore"`` encodes the same bytes without MindSpore (:func:`strategy_proto_bytes`).
    """
    path = Path(path)
    if writer != "mindspore":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(strategy_proto_bytes(specs, stage=stage))
        return path
    pb2 = strategy_pb2()
    entries = _strategy_entries(specs, stage)
    smap = pb2.ParallelStrategyMap()
    smap.current_stage = 1
    for node, s, st in entries:
        item = smap.parallel_strategy_item.add()
        item.node_name = node
        item.parallel_strategys.stage = st
        item.parallel_strategys.parallel_strategy.add().dim.extend(split_counts(s))
    for _node, s, _st in entries:
        item = smap.parallel_layout_item.add()
        item.param_name = s.name
        lay = item.parallel_layouts
        lay.dev_matrix.add().dim.extend(int(d) for d in s.dev_matrix)
        lay.tensor_map.add().dim.extend(int(m) for m in s.tensor_map)
        lay.param_split_shape.add()
        lay.indices_offset.add()
        lay.field = 0
        lay.opt_weight_shard_step = int(s.opt_shard_step)
        lay.opt_weight_shard_size = int(s.opt_shard_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(smap.SerializeToString())
    return path


def write_strategy_json(path, specs: Sequence[ParamSpec], *, stage: int | None = None,
                        writer: str = "mindspore") -> Path:
    """Same as :func:`write_strategy`, in the JSON form (``StrategyCheckpointInfo::to_json``).

    Schema, as the compiler writes it (``strategy_ckpt_save_file`` ending in ``.json``) and as
    MindSpore's readers (``_build_json_strategy``, ``_merge_json_strategy``,
    ``_extract_src_dst_layout_map_by_src``, C++ ``from_json``) parse it::

        {"current_stage": 1,
         "parallel_layout_item": {NAME: {"dev_matrix": [...], "field": 0,
                                         "opt_weight_shard_size": Z, "opt_weight_shard_step": S,
                                         "tensor_map": [...], "tensor_shape": [GLOBAL SHAPE]}},
         "parallel_strategy_item": {NODE: {"parallel_strategy": [[...]], "stage": s}}}

    ``param_split_shape``/``indices_offset`` are only written for field-split (manual) layouts,
    which this module does not produce. Keys sorted, compact separators (nlohmann's std::map dump).
    MindSpore treats a strategy file as JSON only when its name ends in ``.json``. ``writer`` is
    accepted for symmetry with :func:`write_strategy`; this form never needed MindSpore.
    """
    path = Path(path)
    entries = _strategy_entries(specs, stage)
    doc = {
        "current_stage": 1,
        "parallel_strategy_item": {
            node: {"stage": st, "parallel_strategy": [split_counts(s)]} for node, s, st in entries
        },
        "parallel_layout_item": {
            s.name: {
                "dev_matrix": [int(d) for d in s.dev_matrix],
                "tensor_map": [int(m) for m in s.tensor_map],
                "tensor_shape": [int(g) for g in s.shape],
                "field": 0,
                "opt_weight_shard_step": int(s.opt_shard_step),
                "opt_weight_shard_size": int(s.opt_shard_size),
            }
            for _node, s, _st in entries
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# checkpoints


def to_ms_tensor(array: np.ndarray):
    """A ``mindspore.Tensor`` of a numpy array, bfloat16 included (via an exact float32 cast)."""
    ms = _ms()
    array = np.asarray(array).copy(order="C")  # ascontiguousarray would make 0-d arrays 1-d
    if array.dtype == np.dtype(ml_dtypes.bfloat16):
        # exact: every bfloat16 value is a float32 value, and MindSpore's cast back is exact
        return ms.Tensor(array.astype(np.float32), dtype=ms.bfloat16)
    return ms.Tensor(array)


def save_distributed(
    root,
    specs: Sequence[ParamSpec],
    tensors: Mapping[str, np.ndarray],
    *,
    world_size: int,
    stages: int = 1,
    prefix: str = "net",
    step_suffix: str = "-1_1",
    crc_check: bool = False,
    extra_scalars: bool = False,
    strategy_format: str = "protobuf",
    fmt: str = "ckpt",
    remove_redundancy: bool = False,
    integrated: bool = False,
    writer: str = "mindspore",
) -> list[Path]:
    """Write ``root/rank_<i>/<prefix><step_suffix>.<fmt>`` for every rank with ``mindspore.save_checkpoint``.

    Each file is a list of ``{"name": ..., "data": mindspore.Tensor}`` in spec order. With
    pipeline stages, global ranks ``[s*W/stages, (s+1)*W/stages)`` hold only the parameters of stage
    ``s`` (and those of stage ``-1``); the rank within the stage is ``global_rank % (W/stages)``.
    The local tensors are cut by :func:`mindspore_rank_slice` (MindSpore's own slicing). Specs
    without a dev_matrix are saved whole on every rank of their stage.

    Also writes the strategy: ``root/strategy.ckpt`` when ``stages == 1``, else one
    ``root/strategy_stage<s>.ckpt`` per stage (the compiler writes one file per stage;
    ``.json`` instead of ``.ckpt`` with ``strategy_format="json"``). ``extra_scalars`` adds
    ``append_dict={"epoch_num": 1, "step_num": 1}`` to every rank, as ``Model.train``'s callback
    does. Returns the rank file paths, in rank order.

    ``fmt="safetensors"`` saves with ``save_checkpoint(..., format="safetensors")``.
    ``remove_redundancy=True`` saves each replicated slice on one rank of its group only, the
    rank MindSpore's own ``ModelCheckpoint`` would choose (``mindspore.train.utils.
    get_parameter_redundancy`` on the strategy file, then ``remove_param_redundancy``), and
    passes ``remove_redundancy=True`` to ``save_checkpoint``. ``integrated=True`` saves every
    parameter whole on every rank, as ``integrated_save=True`` does in a parallel job.

    ``writer="ckptstore"`` writes the same bytes without importing MindSpore: rank files with
    :class:`~ckptstore.formats.ckpt_writer.CheckpointWriter`, local tensors by
    :func:`formula_rank_slice` (see the module docstring for what that proves); it supports
    ``fmt="ckpt"`` without ``remove_redundancy`` only (those need MindSpore's own decisions).
    """
    root = Path(root)
    if writer not in WRITERS:
        raise ValueError(f"writer must be one of {WRITERS}, not {writer!r}")
    if writer != "mindspore" and (fmt != "ckpt" or remove_redundancy):
        raise ValueError("writer='ckptstore' writes fmt='ckpt' without remove_redundancy only")
    if fmt not in ("ckpt", "safetensors"):
        raise ValueError(f"fmt must be 'ckpt' or 'safetensors', not {fmt!r}")
    if strategy_format not in ("protobuf", "json"):
        raise ValueError(f"strategy_format must be 'protobuf' or 'json', not {strategy_format!r}")
    if stages < 1 or world_size < 1 or world_size % stages:
        raise ValueError(f"world_size {world_size} is not a multiple of stages {stages}")
    per_stage = world_size // stages
    norm = [normalize_spec(s) for s in specs]
    for s in norm:
        if s.name not in tensors:
            raise ValueError(f"no tensor for {s.name!r}")
        if tuple(np.shape(tensors[s.name])) != tuple(s.shape):
            raise ValueError(f"{s.name}: tensor shape {np.shape(tensors[s.name])} != spec {s.shape}")
        if not (-1 <= s.stage < stages):
            raise ValueError(f"{s.name}: stage {s.stage} outside [0, {stages})")
    dev_num = _stage_ranks(norm)
    if dev_num is not None and dev_num != per_stage:
        raise ValueError(f"dev_matrix spans {dev_num} devices but a stage has {per_stage} ranks")

    root.mkdir(parents=True, exist_ok=True)
    ext = ".json" if strategy_format == "json" else ".ckpt"
    write = write_strategy_json if strategy_format == "json" else write_strategy
    if stages == 1:
        write(root / f"strategy{ext}", norm, stage=0, writer=writer)
    else:
        for st in range(stages):
            write(root / f"strategy_stage{st}{ext}", norm, stage=st, writer=writer)

    if writer != "mindspore":
        return _save_ranks_pure(root, norm, tensors, world_size, per_stage, f"{prefix}{step_suffix}.ckpt",
                                crc_check=crc_check, extra_scalars=extra_scalars, integrated=integrated)
    ms = _ms()
    kept = _kept_by_rank(root, ext, norm, stages, per_stage) if remove_redundancy else None
    paths: list[Path] = []
    for g in range(world_size):
        st, r = divmod(g, per_stage)
        items = []
        for s in norm:
            if not _on_stage(s, st) or (kept is not None and s.in_strategy and s.name not in kept.get(g, ())):
                continue
            local = np.asarray(tensors[s.name]) if integrated else mindspore_rank_slice(s, tensors[s.name], r)
            items.append({"name": s.name, "data": to_ms_tensor(local)})
        rank_dir = root / f"rank_{g}"
        rank_dir.mkdir(parents=True, exist_ok=True)
        path = rank_dir / f"{prefix}{step_suffix}.{fmt}"
        kwargs: dict = {"format": fmt} if fmt == "safetensors" else {}
        if remove_redundancy:
            kwargs["remove_redundancy"] = True
        if extra_scalars:
            kwargs["append_dict"] = {"epoch_num": 1, "step_num": 1}
        ms.save_checkpoint(items, str(path), crc_check=crc_check, **kwargs)
        paths.append(path)
    return paths


def _save_ranks_pure(root: Path, norm: Sequence[ParamSpec], tensors: Mapping[str, np.ndarray], world_size: int,
                     per_stage: int, filename: str, *, crc_check: bool, extra_scalars: bool,
                     integrated: bool) -> list[Path]:
    """:func:`save_distributed`'s rank files, written by ckptstore's CheckpointWriter (what
    ``save_checkpoint`` writes: the parameters in spec order, then ``append_dict``'s Python ints
    as 0-d Int64 values; mode 0400 like MindSpore's files)."""
    paths: list[Path] = []
    for g in range(world_size):
        st, r = divmod(g, per_stage)
        rank_dir = root / f"rank_{g}"
        rank_dir.mkdir(parents=True, exist_ok=True)
        path = rank_dir / filename
        with CheckpointWriter(path, crc=crc_check) as w:
            for s in norm:
                if _on_stage(s, st):
                    whole = np.asarray(tensors[s.name])
                    w.add(s.name, whole if integrated else formula_rank_slice(s, whole, r))
            if extra_scalars:
                w.add("epoch_num", np.array(1, dtype=np.int64))
                w.add("step_num", np.array(1, dtype=np.int64))
        os.chmod(path, 0o400)
        paths.append(path)
    return paths


def _kept_by_rank(root: Path, ext: str, specs: Sequence[ParamSpec], stages: int,
                  per_stage: int) -> dict[int, set[str]]:
    """Which parameters each global rank keeps under ``remove_redundancy``, decided by MindSpore."""
    from mindspore.train._utils import get_parameter_redundancy, remove_param_redundancy

    kept: dict[int, set[str]] = {}
    for st in range(stages):
        strategy = root / (f"strategy{ext}" if stages == 1 else f"strategy_stage{st}{ext}")
        redundancy = get_parameter_redundancy(str(strategy), initial_rank=st * per_stage)
        for rank, names in remove_param_redundancy(redundancy).items():
            kept.setdefault(rank, set()).update(n.split("-", 1)[-1] for n in names)
    return kept
