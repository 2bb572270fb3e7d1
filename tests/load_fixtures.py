"""Shared fixtures of the loader tests (test_load*.py, test_export.py, test_planner_reader.py).

Everything is real MindSpore: source checkpoints are the ``conftest.saved_layout`` fixtures
(written by ``mindspore.save_checkpoint``), target strategy files are written with
``mindspore_fixtures.write_strategy`` (the compiler's protobuf format), and the expected values
of every target rank come from ``mindspore.transform_checkpoints`` + ``mindspore.load_checkpoint``
(``mindspore_fixtures.transform_oracle`` / ``load_oracle``), never from ckptstore's layout math.

Stores and oracles are cached for the whole session in module-level dictionaries (so test
modules that import these fixtures share them). Do not modify the cached files; copy them.
"""
from __future__ import annotations

import os

os.environ.setdefault("GLOG_v", "3")

import shutil  # noqa: E402
from dataclasses import dataclass, field, replace  # noqa: E402
from math import prod  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Sequence  # noqa: E402

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import ckptstore  # noqa: E402
import mindspore_fixtures as T  # noqa: E402
from ckptstore.checkpoint.strategy import Strategy  # noqa: E402
from conftest import SavedLayout  # noqa: E402
from convert_fixtures import assert_same_array, flip_byte, run_cli  # noqa: E402,F401

BF16 = np.dtype(ml_dtypes.bfloat16)

#: A target with no layouts at all: every parameter whole, on one rank.
WHOLE = Strategy({}, 1, 1, ())


# ---------------------------------------------------------------------------------------------
# target layouts, as the compiler would write them


def relayout(specs: Sequence[T.ParamSpec], dev_matrix: tuple[int, ...]) -> list[T.ParamSpec]:
    """The same parameters on ``prod(dev_matrix)`` ranks, one pipeline stage, no optimizer sharding."""
    return [replace(s, dev_matrix=dev_matrix, opt_shard_step=0, opt_shard_size=0, stage=0) if s.in_strategy
            else replace(s, stage=0) for s in specs]


def all_whole(specs: Sequence[T.ParamSpec], ranks: int) -> list[T.ParamSpec]:
    """Every parameter whole (tensor_map all -1) on each of ``ranks`` ranks: pure data parallel."""
    return [replace(s, tensor_map=(-1,) * len(s.shape)) if s.in_strategy else s
            for s in relayout(specs, (ranks,))]


def opt_shard_relayout(specs: Sequence[T.ParamSpec]) -> list[T.ParamSpec]:
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
    target: Callable[[list[T.ParamSpec]], list[T.ParamSpec] | None] | None
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


@dataclass
class Target:
    """A converted store, a target layout and MindSpore's answer for every target rank."""

    case: Case
    layout: SavedLayout
    store_path: Path
    strategy: Any  # what load_rank / rank_view / export take
    world: int
    oracle_root: Path
    target_file: Path | None = None
    _oracles: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    _store: ckptstore.Store | None = None

    @property
    def store(self) -> ckptstore.Store:
        if self._store is None:
            self._store = ckptstore.open(self.store_path)
        return self._store

    def oracle_file(self, rank: int) -> Path:
        return self.oracle_root / f"rank_{rank}" / f"oracle_{rank}.ckpt"

    def oracle(self, rank: int) -> dict[str, np.ndarray]:
        """``mindspore.load_checkpoint`` of MindSpore's resharded file for ``rank``, as numpy."""
        if rank not in self._oracles:
            self._oracles[rank] = T.load_oracle(self.oracle_file(rank))
        return self._oracles[rank]


class LoadEnv:
    """Session-wide cache of stores and targets (module-level, so shared by every test module)."""

    def __init__(self, saved_layout: Callable[..., SavedLayout], base: Path) -> None:
        self.saved_layout = saved_layout
        self.base = base
        self._stores: dict[tuple, Path] = {}
        self._targets: dict[str, Target] = {}

    def store(self, kind: str, **convert_kwargs: Any) -> Path:
        """The default conversion of ``saved_layout(kind)`` (or with ``convert_kwargs``). Read only."""
        key = (kind, tuple(sorted(convert_kwargs.items())))
        if key not in self._stores:
            layout = self.saved_layout(kind)
            tag = "_".join(f"{k}-{v}" for k, v in sorted(convert_kwargs.items()))
            out = self.base / f"store_{kind}{'_' + tag if tag else ''}.zarr"
            ckptstore.convert(layout.root, out, strategy=layout.strategy_files, **convert_kwargs)
            self._stores[key] = out
        return self._stores[key]

    def target(self, case_id: str) -> Target:
        if case_id in self._targets:
            return self._targets[case_id]
        case = CASES[case_id]
        layout = self.saved_layout(case.kind)
        store = self.store(case.kind)
        root = self.base / f"target_{case_id.replace('>', '_')}"
        root.mkdir()
        target_file = None
        if case.mode == "file":
            specs = case.target(layout.specs)
            if case.json:
                target_file = T.write_strategy_json(root / "target_strategy.json", specs)
            else:
                target_file = T.write_strategy(root / "target_strategy.ckpt", specs)
            dst, strategy = target_file, target_file
            world = _world(specs)
        elif case.mode == "whole":
            dst, strategy, world = None, WHOLE, 1
        elif case.mode == "none":
            dst, strategy, world = layout.strategy_arg, None, layout.world
        else:  # "source"
            dst, world = layout.strategy_arg, layout.world
            strategy = layout.strategy_files[0] if len(layout.strategy_files) == 1 else layout.strategy_files
        oracle_root = T.transform_oracle(layout.root, layout.strategy_arg, dst, root / "oracle")
        t = Target(case, layout, store, strategy, world, oracle_root, target_file)
        self._targets[case_id] = t
        return t


def _world(specs: Sequence[T.ParamSpec]) -> int:
    return int(prod(T.normalize_spec(next(s for s in specs if s.in_strategy)).dev_matrix))


_ENV: dict[str, LoadEnv] = {}


@pytest.fixture(scope="session")
def load_env(saved_layout, tmp_path_factory: pytest.TempPathFactory) -> LoadEnv:
    """The session's :class:`LoadEnv` (stores and targets built on first use, then cached)."""
    if "env" not in _ENV:
        _ENV["env"] = LoadEnv(saved_layout, tmp_path_factory.mktemp("load_env"))
    return _ENV["env"]


# ---------------------------------------------------------------------------------------------
# comparing MindSpore Parameters


def to_numpy(value: Any) -> Any:
    """A MindSpore Parameter/Tensor as a numpy array of its own dtype (bfloat16 exactly, as
    ``ml_dtypes.bfloat16``: ``asnumpy`` cannot return bfloat16 under numpy 2). ``str`` as is."""
    if isinstance(value, str):
        return value
    import mindspore as ms

    if value.dtype == ms.bfloat16:
        return value.astype(ms.float32).asnumpy().astype(BF16)
    return np.array(value.asnumpy(), copy=True)


def assert_same_dict(actual: dict[str, Any], expected: dict[str, np.ndarray], what: str) -> None:
    """Same key set, and every value bit for bit (dtype, shape, bytes)."""
    assert sorted(actual) == sorted(expected), f"{what}: keys differ: {sorted(set(actual) ^ set(expected))}"
    for name in expected:
        assert_same_array(actual[name], expected[name], f"{what} {name}")


def copy_store(src: Path, dst: Path) -> Path:
    """A private, writable copy of a store."""
    shutil.copytree(src, dst)
    for p in dst.rglob("*"):
        if p.is_file():
            os.chmod(p, 0o644)
    return dst
