"""Shared fixtures of the loader tests (test_load*.py, test_export.py, test_planner_reader.py).

Everything is real MindSpore: source checkpoints are the ``conftest.saved_layout`` fixtures
(written by ``mindspore.save_checkpoint``), and targets are :data:`ckptstore.testing.layouts.CASES`:
target strategy files written in the compiler's format, the expected values of every target rank
from ``mindspore.transform_checkpoints`` + ``mindspore.load_checkpoint``
(:class:`ckptstore.testing.layouts.SampleLayouts`), never from ckptstore's layout math.

Stores and oracles are cached for the whole session (the oracles with the conformance classes,
the stores in a module-level dictionary, so test modules that import these fixtures share
them). Do not modify the cached files; copy them.
"""
from __future__ import annotations

import os

os.environ.setdefault("GLOG_v", "3")

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import ckptstore
from ckptstore.testing import layouts
from ckptstore.testing.compare import BF16, assert_same_dict, to_numpy  # noqa: F401  (re-exported for the test modules)
from ckptstore.testing.layouts import (  # noqa: F401  (re-exported for the test modules)
    CASES,
    WHOLE,
    Case,
    SampleLayouts,
    all_whole,
    opt_shard_relayout,
    relayout,
    session_layouts,
)
from convert_fixtures import assert_same_array, flip_byte, run_cli  # noqa: F401  (re-exported for the test modules)


@dataclass
class Target(layouts.Target):
    """A target of :mod:`ckptstore.testing.layouts` and the Zarr store of its source layout."""

    store_path: Path | None = None
    _store: ckptstore.Store | None = None

    @property
    def store(self) -> ckptstore.Store:
        if self._store is None:
            self._store = ckptstore.open(self.store_path)
        return self._store


class LoadEnv:
    """Session-wide cache of stores and targets (module-level, so shared by every test module)."""

    def __init__(self, layouts: SampleLayouts, base: Path) -> None:
        self.layouts = layouts
        self.saved_layout = layouts.saved_layout
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
        """The session's target ``case_id`` (MindSpore's answer for it) and its source's Zarr store."""
        if case_id not in self._targets:
            t = self.layouts.target(case_id)
            # shares the oracle cache with the conformance classes' view of the same target
            self._targets[case_id] = Target(t.case, t.layout, t.strategy, t.world, t.oracle_run, t.target_file,
                                            t._oracles, store_path=self.store(t.case.kind))
        return self._targets[case_id]


_ENV: dict[str, LoadEnv] = {}


@pytest.fixture(scope="session")
def load_env(saved_layout, tmp_path_factory: pytest.TempPathFactory) -> LoadEnv:
    """The session's :class:`LoadEnv` (stores and targets built on first use, then cached)."""
    if "env" not in _ENV:
        _ENV["env"] = LoadEnv(session_layouts(tmp_path_factory), tmp_path_factory.mktemp("load_env"))
    return _ENV["env"]


def copy_store(src: Path, dst: Path) -> Path:
    """A private, writable copy of a store."""
    shutil.copytree(src, dst)
    for p in dst.rglob("*"):
        if p.is_file():
            os.chmod(p, 0o644)
    return dst
