"""Shared fixtures: real MindSpore distributed checkpoints, written once per session.

Every fixture here is written by ``mindspore.save_checkpoint`` through :mod:`mindspore_fixtures`
(strategy files in the compiler's format, local slices cut by MindSpore's own slicing code).
Tests that damage a fixture copy it first with :func:`copy_layout`.
"""
from __future__ import annotations

import os

os.environ.setdefault("GLOG_v", "3")

import shutil  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

import mindspore_fixtures as T  # noqa: E402

# Two shared cores time examples unevenly: properties are about results, not speed.
settings.register_profile("ckptstore", deadline=None)
settings.load_profile("ckptstore")


@dataclass(frozen=True)
class SavedLayout:
    """One ``layout_specs(kind)`` fixture saved to ``root`` (``root/rank_<i>/net-1_1.ckpt``)."""

    kind: str
    root: Path
    specs: list[T.ParamSpec]
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
        """The strategy as :func:`mindspore_fixtures.transform_oracle` takes it."""
        files = self.strategy_files
        return files[0] if len(files) == 1 else files

    def rank_file(self, rank: int) -> Path:
        return self.root / f"rank_{rank}" / "net-1_1.ckpt"

    def spec(self, name: str) -> T.ParamSpec:
        return next(s for s in self.specs if s.name == name)


def save_layout(root: Path, kind: str, *, strategy_format: str = "protobuf", seed: int = 11) -> SavedLayout:
    """Save ``layout_specs(kind)`` under ``root`` with ``epoch_num``/``step_num`` scalars appended."""
    specs, world, stages = T.layout_specs(kind)
    tensors = T.make_global_tensors(specs, seed=seed)
    T.save_distributed(root, specs, tensors, world_size=world, stages=stages, extra_scalars=True,
                       strategy_format=strategy_format)
    return SavedLayout(kind, root, specs, tensors, world, stages, strategy_format)


@pytest.fixture(scope="session")
def saved_layout(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., SavedLayout]:
    """``saved_layout(kind, strategy_format="protobuf")``: a session-cached saved fixture. Do not modify it."""
    cache: dict[tuple[str, str], SavedLayout] = {}

    def get(kind: str, strategy_format: str = "protobuf") -> SavedLayout:
        key = (kind, strategy_format)
        if key not in cache:
            root = tmp_path_factory.mktemp(f"{kind}_{strategy_format}")
            cache[key] = save_layout(root, kind, strategy_format=strategy_format)
        return cache[key]

    return get


def copy_layout(layout: SavedLayout, dst: Path) -> SavedLayout:
    """A private copy of a saved fixture, safe to damage."""
    shutil.copytree(layout.root, dst)
    return SavedLayout(layout.kind, dst, layout.specs, layout.tensors, layout.world, layout.stages,
                       layout.strategy_format)


@pytest.fixture
def private_layout(saved_layout, tmp_path: Path) -> Callable[..., SavedLayout]:
    """``private_layout(kind)``: this test's own copy of a saved fixture, safe to damage."""

    def get(kind: str, strategy_format: str = "protobuf") -> SavedLayout:
        return copy_layout(saved_layout(kind, strategy_format), tmp_path / f"private_{kind}_{strategy_format}")

    return get


# ---------------------------------------------------------------------------------------------
# object storage: a real S3 server (SeaweedFS; moto where it is not installed) on loopback, and a
# counting, fault-injecting proxy in front of it for the tests that watch or disturb the traffic


@dataclass
class Bucket:
    """A fresh bucket on the test S3 server; the environment points the client at it (through
    the proxy for a ``watched_bucket``, whose ``proxy`` is then not ``None``)."""

    name: str
    env: dict[str, str]
    proxy: object
    endpoint: str = ""

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.name}/{prefix}" if prefix else f"s3://{self.name}"


@pytest.fixture(scope="session")
def s3_server():
    """``(server, proxy)``: SeaweedFS (or moto) on loopback and the proxy in front of it, for the session."""
    pytest.importorskip("obstore")
    from ckptstore.testing import s3_server as S

    if S.weed_binary() is None:
        pytest.importorskip("moto.server")
    yield from S.iter_servers()


_BUCKETS = iter(range(1 << 30))


def _new_bucket(s3_server, monkeypatch, *, watched: bool) -> Bucket:
    from ckptstore.testing import s3_server as S

    server, proxy = s3_server
    name = f"ckptstore-test-{next(_BUCKETS)}"
    server.create_bucket(name)
    endpoint = proxy.url if watched else server.url
    env = S.env_for(endpoint)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    proxy.reset()
    return Bucket(name, env, proxy if watched else None, endpoint)


@pytest.fixture
def bucket(s3_server, monkeypatch) -> Bucket:
    """A new bucket for this test, with AWS_* set (in this process) to reach the server directly."""
    return _new_bucket(s3_server, monkeypatch, watched=False)


@pytest.fixture
def watched_bucket(s3_server, monkeypatch) -> Bucket:
    """A new bucket reached through the counting proxy: ``bucket.proxy`` records every request and
    can answer with errors."""
    return _new_bucket(s3_server, monkeypatch, watched=True)


@pytest.fixture
def quick_retries(monkeypatch):
    """The object-store client retries three times within a few seconds instead of nine within
    minutes (and a fresh client is built with that)."""
    from datetime import timedelta

    from ckptstore.io import s3

    monkeypatch.setattr(s3, "RETRY", {"max_retries": 2, "retry_timeout": timedelta(seconds=20), "backoff": {
        "init_backoff": timedelta(milliseconds=10), "max_backoff": timedelta(milliseconds=50), "base": 2}})
    monkeypatch.setattr(s3, "_CLIENTS", {})
