"""Sample layouts, saved by MindSpore, and MindSpore's answer for each target layout.

The fixtures every conformance class and the project's own tests share, reachable from the
package so a third party's store kind can be checked on the same checkpoints:

* :func:`layout_specs`: the standard parameter sets and their parallel layouts (``dp2_mp4``,
  ``opt_shard``, ``pipeline2``, ``mixed_dtypes``, ...), each under 2 MB;
* :func:`save_layout`: one of them saved as a real distributed checkpoint
  (:func:`~ckptstore.testing.sample_checkpoint.save_distributed`: strategy files in the
  compiler's format, rank files as ``mindspore.save_checkpoint`` writes them; by default written
  by ckptstore's own writers, which tests/testing/test_pure_fixtures.py proves byte-identical to
  MindSpore's for every kind here, so the layouts need no MindSpore);
* :data:`CASES`: source -> target layout pairs, and :class:`SampleLayouts`, which saves the
  layouts and runs ``mindspore.transform_checkpoints`` for each target once per session
  (:func:`session_layouts`), so every test compares against MindSpore's own answer.

MindSpore is imported only when an oracle is run (or a layout saved with ``writer="mindspore"``).
"""
from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from ckptstore.checkpoint.strategy import Strategy
from ckptstore.testing.oracle import load_oracle, transform_oracle
from ckptstore.testing.sample_checkpoint import (
    ParamSpec,
    make_global_tensors,
    normalize_spec,
    save_distributed,
    write_strategy,
    write_strategy_json,
)

#: Layout kinds known to :func:`layout_specs`.
LAYOUT_KINDS: tuple[str, ...] = (
    "mp_rows",
    "mp_cols",
    "dp2_mp4",
    "dp2_mp2",
    "opt_shard",
    "pipeline2",
    "mixed_dtypes",
)

#: The scalars every stage holds whole, absent from the strategy file (as an optimizer keeps them).
SCALARS = [
    ParamSpec("global_step", (1,), "int32", stage=-1),
    ParamSpec("learning_rate", (), "float32", stage=-1),
]


def _with_adam(specs: list[ParamSpec], names: Sequence[str]) -> list[ParamSpec]:
    """Append Adam moments (same layout as their parameter, as MindSpore's optimizer shards them)."""
    by_name = {s.name: s for s in specs}
    extra = []
    for prefix in ("adam_m", "adam_v"):
        for n in names:
            extra.append(replace(by_name[n], name=f"{prefix}.{n}"))
    return specs + extra


def layout_specs(kind: str) -> tuple[list[ParamSpec], int, int]:
    """Standard fixture layouts: ``(specs, world_size, stages)``. Every fixture is < 2 MB.

    * ``mp_rows``: 8 ranks, ``dev_matrix=(8,)``, weights and biases split on axis 0.
    * ``mp_cols``: 8 ranks, ``dev_matrix=(8,)``, weights split on axis 1 (one 3-d weight too),
      a replicated bias.
    * ``dp2_mp4``: 8 ranks, ``dev_matrix=(2, 4)``: replicated embedding and layernorm
      (``tensor_map`` all ``-1``), row- and column-split weights, one weight split on both device
      axes, Adam moments, ``global_step``/``learning_rate`` (absent from the strategy).
    * ``dp2_mp2``: the same parameters as ``dp2_mp4`` on 4 ranks (``dev_matrix=(2, 2)``), a target
      layout for resharding 8 -> 4.
    * ``opt_shard``: 8 ranks, dp2 x mp4 with optimizer sharding: size ``-1`` on split and replicated
      weights (Adam moments too), an explicit size 2 on a replicated embedding (step 1) and on a
      dp4 x mp2 weight (step 2), and an unsharded small bias.
    * ``pipeline2``: 2 stages x 4 ranks, ``dev_matrix=(2, 2)`` per stage, with an optimizer-sharded
      weight in stage 1, Adam moments, and ``global_step``/``learning_rate`` on every stage.
    * ``mixed_dtypes``: 8 ranks, dp2 x mp4, bfloat16 (split and optimizer-sharded), float16,
      float64, int8/16/32/64, uint8/16/32/64 and bool parameters.
    """
    if kind == "mp_rows":
        d: tuple[int, ...] = (8,)
        specs = [
            ParamSpec("layer0.w", (64, 32), dev_matrix=d, tensor_map=(0, -1)),
            ParamSpec("layer0.b", (64,), dev_matrix=d, tensor_map=(0,)),
            ParamSpec("layer1.w", (32, 16), dev_matrix=d, tensor_map=(0, -1)),
            ParamSpec("layer1.b", (32,), dev_matrix=d, tensor_map=(0,)),
        ]
        return specs + list(SCALARS), 8, 1
    if kind == "mp_cols":
        d = (8,)
        specs = [
            ParamSpec("layer0.w", (16, 64), dev_matrix=d, tensor_map=(-1, 0)),
            ParamSpec("layer0.b", (16,), dev_matrix=d, tensor_map=(-1,)),
            ParamSpec("conv.w", (4, 16, 3), dev_matrix=d, tensor_map=(-1, 0, -1)),
            ParamSpec("layer1.w", (8, 32), dev_matrix=d, tensor_map=(-1, 0)),
        ]
        return specs + list(SCALARS), 8, 1
    if kind in ("dp2_mp4", "dp2_mp2"):
        d = (2, 4) if kind == "dp2_mp4" else (2, 2)
        specs = [
            ParamSpec("embedding.table", (40, 16), dev_matrix=d, tensor_map=(-1, -1)),
            ParamSpec("layer0.w", (32, 16), dev_matrix=d, tensor_map=(0, -1)),
            ParamSpec("layer0.b", (32,), dev_matrix=d, tensor_map=(0,)),
            ParamSpec("layer1.w", (16, 32), dev_matrix=d, tensor_map=(-1, 0)),
            ParamSpec("moe.w", (4, 8, 8), dev_matrix=d, tensor_map=(1, -1, 0)),
            ParamSpec("layernorm.gamma", (16,), dev_matrix=d, tensor_map=(-1,)),
            ParamSpec("layernorm.beta", (16,), dev_matrix=d, tensor_map=(-1,)),
        ]
        specs = _with_adam(specs, ["layer0.w", "layer1.w"])
        return specs + list(SCALARS), (8 if kind == "dp2_mp4" else 4), 1
    if kind == "opt_shard":
        d = (2, 4)
        specs = [
            # rows split by mp4; replicas {r, r+4}: step 4, size -1 (= 2)
            ParamSpec("layer0.w", (32, 16), dev_matrix=d, tensor_map=(0, -1), opt_shard_step=4, opt_shard_size=-1),
            # cols split by mp4; the opt shard cuts axis 0
            ParamSpec("layer1.w", (16, 32), dev_matrix=d, tensor_map=(-1, 0), opt_shard_step=4, opt_shard_size=-1),
            # replicated on all 8 ranks: step 1, size -1 (= 8)
            ParamSpec("layernorm.gamma", (64,), dev_matrix=d, tensor_map=(-1,), opt_shard_step=1, opt_shard_size=-1),
            # replicated on all 8 ranks, explicit size 2: groups {0,1},{2,3},...: step 1
            ParamSpec("embedding.table", (64, 16), dev_matrix=d, tensor_map=(-1, -1), opt_shard_step=1,
                      opt_shard_size=2),
            # dp4 x mp2, cols split by 2; 4 replicas {r, r+2, r+4, r+6}, explicit size 2: step 2
            ParamSpec("layer2.w", (16, 8), dev_matrix=(4, 2), tensor_map=(-1, 0), opt_shard_step=2, opt_shard_size=2),
            # below the parallel optimizer threshold: not sharded
            ParamSpec("small.bias", (16,), dev_matrix=d, tensor_map=(-1,)),
        ]
        specs = _with_adam(specs, ["layer0.w", "layernorm.gamma"])
        return specs + list(SCALARS), 8, 1
    if kind == "pipeline2":
        d = (2, 2)
        specs = [
            ParamSpec("embedding.table", (40, 16), dev_matrix=d, tensor_map=(-1, -1), stage=0),
            ParamSpec("layer0.w", (16, 16), dev_matrix=d, tensor_map=(0, -1), stage=0),
            ParamSpec("layer0.b", (16,), dev_matrix=d, tensor_map=(0,), stage=0),
            ParamSpec("layer1.w", (16, 16), dev_matrix=d, tensor_map=(-1, 0), opt_shard_step=2, opt_shard_size=-1,
                      stage=1),
            ParamSpec("head.w", (8, 16), dev_matrix=d, tensor_map=(-1, -1), stage=1),
        ]
        specs = _with_adam(specs, ["layer0.w", "layer1.w"])
        return specs + list(SCALARS), 8, 2
    if kind == "mixed_dtypes":
        d = (2, 4)
        specs = [
            ParamSpec("bf16.w", (32, 16), "bfloat16", dev_matrix=d, tensor_map=(0, -1)),
            ParamSpec("bf16.opt", (16, 8), "bfloat16", dev_matrix=d, tensor_map=(-1, 0), opt_shard_step=4,
                      opt_shard_size=-1),
            ParamSpec("bf16.norm", (16,), "bfloat16", dev_matrix=d, tensor_map=(-1,)),
            ParamSpec("fp16.w", (16, 32), "float16", dev_matrix=d, tensor_map=(-1, 0)),
            ParamSpec("fp64.w", (8, 8), "float64", dev_matrix=d, tensor_map=(1, 0)),
            ParamSpec("i8.table", (8, 12), "int8", dev_matrix=d, tensor_map=(0, -1)),
            ParamSpec("i16.table", (8, 4), "int16", dev_matrix=d, tensor_map=(-1, 0)),
            ParamSpec("i32.index", (16, 8), "int32", dev_matrix=d, tensor_map=(0, -1)),
            ParamSpec("i64.count", (8, 4), "int64", dev_matrix=d, tensor_map=(1, -1)),
            ParamSpec("u8.quant", (64,), "uint8", dev_matrix=d, tensor_map=(0,)),
            ParamSpec("u16.quant", (8, 8), "uint16", dev_matrix=d, tensor_map=(-1, -1)),
            ParamSpec("u32.ids", (8,), "uint32", dev_matrix=d, tensor_map=(0,)),
            ParamSpec("u64.ids", (4, 4), "uint64", dev_matrix=d, tensor_map=(0, -1)),
            ParamSpec("mask", (32, 8), "bool", dev_matrix=d, tensor_map=(0, -1)),
            ParamSpec("bf16.scale", (4,), "bfloat16"),
        ]
        return specs + list(SCALARS), 8, 1
    raise ValueError(f"unknown layout kind {kind!r}; known: {', '.join(LAYOUT_KINDS)}")


# ---------------------------------------------------------------------------------------------
# a layout saved as a distributed checkpoint


@dataclass(frozen=True)
class SavedLayout:
    """One ``layout_specs(kind)`` fixture saved to ``root`` (``root/rank_<i>/net-1_1.ckpt``)."""

    kind: str
    root: Path
    specs: list[ParamSpec]
    tensors: dict[str, np.ndarray]
    world: int
    stages: int
    strategy_format: str = "protobuf"

    @property
    def ext(self) -> str:
        return ".json" if self.strategy_format == "json" else ".ckpt"

    @property
    def strategy_files(self) -> list[Path]:
        """The strategy file(s) as the compiler writes them: one, or one per pipeline stage."""
        if self.stages == 1:
            return [self.root / f"strategy{self.ext}"]
        return [self.root / f"strategy_stage{s}{self.ext}" for s in range(self.stages)]

    @property
    def strategy_arg(self) -> Path | list[Path]:
        """The strategy as :func:`~ckptstore.testing.oracle.transform_oracle` takes it."""
        files = self.strategy_files
        return files[0] if len(files) == 1 else files

    def rank_file(self, rank: int) -> Path:
        return self.root / f"rank_{rank}" / "net-1_1.ckpt"

    def spec(self, name: str) -> ParamSpec:
        return next(s for s in self.specs if s.name == name)


def save_layout(root: Path, kind: str, *, strategy_format: str = "protobuf", seed: int = 11,
                writer: str = "ckptstore") -> SavedLayout:
    """Save ``layout_specs(kind)`` under ``root`` with ``epoch_num``/``step_num`` scalars appended.

    ``writer="ckptstore"`` (the default) needs no MindSpore and writes the same bytes as
    ``writer="mindspore"`` for every kind of :func:`layout_specs` (tests/testing/test_pure_fixtures.py
    checks each kind in both strategy formats against MindSpore's own save)."""
    specs, world, stages = layout_specs(kind)
    tensors = make_global_tensors(specs, seed=seed)
    save_distributed(root, specs, tensors, world_size=world, stages=stages, extra_scalars=True,
                     strategy_format=strategy_format, writer=writer)
    return SavedLayout(kind, root, specs, tensors, world, stages, strategy_format)


def copy_layout(layout: SavedLayout, dst: Path) -> SavedLayout:
    """A private copy of a saved layout, safe to damage."""
    shutil.copytree(layout.root, dst)
    return SavedLayout(layout.kind, dst, layout.specs, layout.tensors, layout.world, layout.stages,
                       layout.strategy_format)


# ---------------------------------------------------------------------------------------------
# target layouts, as the compiler would write them

#: A target with no layouts at all: every parameter whole, on one rank.
WHOLE = Strategy({}, 1, 1, ())


def relayout(specs: Sequence[ParamSpec], dev_matrix: tuple[int, ...]) -> list[ParamSpec]:
    """The same parameters on ``prod(dev_matrix)`` ranks, one pipeline stage, no optimizer sharding."""
    return [replace(s, dev_matrix=dev_matrix, opt_shard_step=0, opt_shard_size=0, stage=0) if s.in_strategy
            else replace(s, stage=0) for s in specs]


def all_whole(specs: Sequence[ParamSpec], ranks: int) -> list[ParamSpec]:
    """Every parameter whole (tensor_map all -1) on each of ``ranks`` ranks: pure data parallel."""
    return [replace(s, tensor_map=(-1,) * len(s.shape)) if s.in_strategy else s
            for s in relayout(specs, (ranks,))]


def opt_shard_relayout(specs: Sequence[ParamSpec]) -> list[ParamSpec]:
    """``dev_matrix=(2, 2)`` with optimizer sharding (size -1) on every parameter MindSpore would shard.

    The step is what the compiler writes for D=(2, 2): split on device axis 0 (tensor_map value 0,
    replicas {r, r+2}) -> 2; split on value 1 (replicas {r, r+1}) -> 1; unsplit -> 1. Parameters
    split on both axes, or whose rows do not divide, are not sharded (step 0, size 0).
    """
    out = []
    for s in relayout(specs, (2, 2)):
        if not s.in_strategy:
            out.append(s)
            continue
        used = [m for m in s.tensor_map if m != -1]
        rows = s.shape[0] // (2 if s.tensor_map[0] != -1 else 1)
        parts = 4 // (2 ** len(used))
        if len(used) > 1 or rows % parts or s.name == "small.bias":  # small.bias: below the threshold
            out.append(s)
            continue
        step = {(): 1, (0,): 2, (1,): 1}[tuple(used)]
        out.append(replace(s, opt_shard_step=step, opt_shard_size=-1))
    return out


@dataclass(frozen=True)
class Case:
    """A source layout and a target layout.

    ``target(specs)`` gives the target's parameter specs (``None``: one rank, whole tensors).
    ``mode`` says how ckptstore is given the target: ``"file"`` (the target strategy file),
    ``"none"`` (``strategy=None``: the store's own source layout), ``"source"`` (the source's
    strategy file(s)), ``"whole"`` (a Strategy with no layouts).
    """

    id: str
    kind: str
    target: Callable[[list[ParamSpec]], list[ParamSpec] | None] | None
    mode: str = "file"
    json: bool = False  # the target strategy in MindSpore's JSON form


CASES: dict[str, Case] = {c.id: c for c in [
    Case("mp_rows->mp2", "mp_rows", lambda s: relayout(s, (2,))),
    Case("mp_rows->mp4", "mp_rows", lambda s: relayout(s, (4,))),
    Case("mp_cols->mp2", "mp_cols", lambda s: relayout(s, (2,))),
    Case("mp_cols->mp4", "mp_cols", lambda s: relayout(s, (4,))),
    Case("dp2_mp4->mp4", "dp2_mp4", lambda s: relayout(s, (1, 4))),
    Case("dp2_mp4->dp2_mp2", "dp2_mp4", lambda s: relayout(s, (2, 2))),
    Case("dp2_mp4->dp4_mp2", "dp2_mp4", lambda s: relayout(s, (4, 2))),
    Case("dp2_mp4->dp2_mp2-json", "dp2_mp4", lambda s: relayout(s, (2, 2)), json=True),
    Case("opt_shard->dp2_mp2", "opt_shard", lambda s: relayout(s, (2, 2))),
    Case("pipeline2->1stage", "pipeline2", lambda s: relayout(s, (2, 2))),
    Case("dp2_mp4->same-none", "dp2_mp4", None, "none"),
    Case("dp2_mp4->same-file", "dp2_mp4", None, "source"),
    Case("opt_shard->same-none", "opt_shard", None, "none"),
    Case("pipeline2->same-none", "pipeline2", None, "none"),
    Case("pipeline2->same-files", "pipeline2", None, "source"),
    Case("mixed_dtypes->same-none", "mixed_dtypes", None, "none"),
    Case("dp2_mp4->1rank", "dp2_mp4", lambda s: None, "whole"),
    Case("opt_shard->1rank", "opt_shard", lambda s: None, "whole"),
    Case("pipeline2->1rank", "pipeline2", lambda s: None, "whole"),
    Case("mixed_dtypes->1rank", "mixed_dtypes", lambda s: None, "whole"),
    Case("dp2_mp4->2rank-all-whole", "dp2_mp4", lambda s: all_whole(s, 2)),
    Case("pipeline2->2rank-all-whole", "pipeline2", lambda s: all_whole(s, 2)),
    Case("dp2_mp4->dp2_mp2_optshard", "dp2_mp4", opt_shard_relayout),
    Case("opt_shard->dp2_mp2_optshard", "opt_shard", opt_shard_relayout),
    Case("mixed_dtypes->dp2_mp2", "mixed_dtypes", lambda s: relayout(s, (2, 2))),
    Case("mixed_dtypes->dp2_mp2_optshard", "mixed_dtypes", opt_shard_relayout),
]}


class OracleRun:
    """``mindspore.transform_checkpoints`` of one saved layout to one target, run on first use, so
    a test that needs only the target (its strategy, the source's store) needs no MindSpore."""

    def __init__(self, src: Path, src_strategy: Path | list[Path], dst: Path | list[Path] | None,
                 out: Path) -> None:
        self._args = (src, src_strategy, dst, out)
        self._root: Path | None = None

    def root(self) -> Path:
        """The folder of MindSpore's resharded files (``rank_<j>/oracle_<j>.ckpt``)."""
        if self._root is None:
            self._root = transform_oracle(*self._args)
        return self._root


@dataclass
class Target:
    """A saved layout, a target layout and MindSpore's answer for every target rank.

    ``strategy`` is the target as ``load_rank``/``export`` take it; ``oracle(rank)`` is what
    ``mindspore.transform_checkpoints`` + ``load_checkpoint`` give that rank (MindSpore runs on
    the first call; the target strategy file is written without it, byte-identical to its own).
    """

    case: Case
    layout: SavedLayout
    strategy: Any
    world: int
    oracle_run: OracleRun
    target_file: Path | None = None
    _oracles: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)

    @property
    def oracle_root(self) -> Path:
        """MindSpore's output folder for this target (runs ``transform_checkpoints`` on first use)."""
        return self.oracle_run.root()

    def oracle_file(self, rank: int) -> Path:
        return self.oracle_root / f"rank_{rank}" / f"oracle_{rank}.ckpt"

    def oracle(self, rank: int) -> dict[str, np.ndarray]:
        """``mindspore.load_checkpoint`` of MindSpore's resharded file for ``rank``, as numpy."""
        if rank not in self._oracles:
            self._oracles[rank] = load_oracle(self.oracle_file(rank))
        return self._oracles[rank]


def _world(specs: Sequence[ParamSpec]) -> int:
    return int(prod(normalize_spec(next(s for s in specs if s.in_strategy)).dev_matrix))


class SampleLayouts:
    """Saved layouts and targets under ``base``, each made on first use and then kept.

    Do not modify what it returns; copy it (:func:`copy_layout`).
    """

    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        self._layouts: dict[tuple[str, str], SavedLayout] = {}
        self._targets: dict[str, Target] = {}

    def saved_layout(self, kind: str, strategy_format: str = "protobuf") -> SavedLayout:
        """``layout_specs(kind)`` saved (strategy files in ``strategy_format``) by ckptstore's writers,
        byte-identical to MindSpore's save (see :func:`save_layout`)."""
        key = (kind, strategy_format)
        if key not in self._layouts:
            root = self.base / f"{kind}_{strategy_format}"
            shutil.rmtree(root, ignore_errors=True)  # a save that failed half-way
            self._layouts[key] = save_layout(root, kind, strategy_format=strategy_format)
        return self._layouts[key]

    def target(self, case_id: str) -> Target:
        """The target of ``CASES[case_id]``, with MindSpore's ``transform_checkpoints`` run for it
        when its answer is first asked for (:class:`OracleRun`)."""
        if case_id in self._targets:
            return self._targets[case_id]
        case = CASES[case_id]
        layout = self.saved_layout(case.kind)
        root = self.base / f"target_{case_id.replace('>', '_')}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        target_file = None
        dst: Path | list[Path] | None
        strategy: Any
        if case.mode == "file":
            specs = case.target(layout.specs) if case.target is not None else None
            if specs is None:
                raise ValueError(f"case {case_id!r} gives its target as a file but names no target specs")
            if case.json:
                target_file = write_strategy_json(root / "target_strategy.json", specs)
            else:  # the bytes MindSpore writes (tests/testing/test_pure_fixtures.py checks every case)
                target_file = write_strategy(root / "target_strategy.ckpt", specs, writer="ckptstore")
            dst, strategy = target_file, target_file
            world = _world(specs)
        elif case.mode == "whole":
            dst, strategy, world = None, WHOLE, 1
        elif case.mode == "none":
            dst, strategy, world = layout.strategy_arg, None, layout.world
        else:  # "source"
            dst, world = layout.strategy_arg, layout.world
            strategy = layout.strategy_files[0] if len(layout.strategy_files) == 1 else layout.strategy_files
        oracle_run = OracleRun(layout.root, layout.strategy_arg, dst, root / "oracle")
        t = Target(case, layout, strategy, world, oracle_run, target_file)
        self._targets[case_id] = t
        return t


_SESSIONS: dict[Path, SampleLayouts] = {}


def session_layouts(tmp_path_factory: Any) -> SampleLayouts:
    """The pytest session's :class:`SampleLayouts` (one per session's base temporary folder), so
    every test module and conformance class shares one set of saved layouts and oracles."""
    key = Path(tmp_path_factory.getbasetemp())
    if key not in _SESSIONS:
        _SESSIONS[key] = SampleLayouts(tmp_path_factory.mktemp("sample_layouts"))
    return _SESSIONS[key]
