"""Shared fixtures: real MindSpore distributed checkpoints, written once per session.

Every fixture here is written by ``mindspore.save_checkpoint`` through
:mod:`ckptstore.testing.layouts` (strategy files in the compiler's format, local slices cut by
MindSpore's own slicing code). Tests that damage a fixture copy it first with :func:`copy_layout`.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

os.environ.setdefault("GLOG_v", "3")


class _NoMindSpore(importlib.abc.MetaPathFinder):
    """``import mindspore`` fails as it does where MindSpore is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "mindspore" or name.startswith("mindspore."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


# pytest puts tests/ on sys.path, where tests/mindspore/ (the tests of ckptstore/mindspore/) would
# be imported as a namespace package named ``mindspore`` when MindSpore is not installed (an
# installed MindSpore wins): ``pytest.importorskip("mindspore")`` would then pass and the test
# fail, and ckptstore, which asks ``"mindspore" in sys.modules`` whether a job can have started
# MindSpore's communication, would think it had. Refused here before anything imports it.
_MS = importlib.util.find_spec("mindspore")
if _MS is not None and _MS.origin is None:
    sys.meta_path.insert(0, _NoMindSpore())

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

from ckptstore.testing.layouts import SavedLayout, copy_layout, session_layouts

# The fixtures of the shared fixture modules (load_env; converted, big_layout), available to every
# test module without an import that a test's parameter of the same name would redefine (F811).
pytest_plugins = ("convert_fixtures", "load_fixtures")  # in import order: load_fixtures imports the other

# Two shared cores time examples unevenly: properties are about results, not speed.
# "ckptstore" (make test) runs each property with the examples its test asks for; "fast" (make
# test-fast passes --hypothesis-profile=fast) a tenth of them (see examples()), so the edit-run loop
# still tries every property and make test does the full search.
settings.register_profile("ckptstore", deadline=None)
settings.register_profile("fast", deadline=None, max_examples=10)
settings.load_profile("ckptstore")


def examples(n: int) -> int:
    """A property's ``max_examples``: ``n`` under the default profile (100 examples), scaled by the
    loaded profile's ``max_examples`` / 100 under another (``fast``: a tenth), never below
    ``min(n, 10)``. Read when the test module is imported, after pytest loaded the profile."""
    return max(min(n, 10), n * settings.default.max_examples // 100)


@pytest.fixture(scope="session")
def saved_layout(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., SavedLayout]:
    """``saved_layout(kind, strategy_format="protobuf")``: a session-cached saved fixture (the
    session's :func:`~ckptstore.testing.layouts.session_layouts`, shared with the conformance
    classes). Do not modify it."""
    return session_layouts(tmp_path_factory).saved_layout


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

    from ckptstore.io import s3_client

    monkeypatch.setattr(s3_client, "RETRY", {"max_retries": 2, "retry_timeout": timedelta(seconds=20), "backoff": {
        "init_backoff": timedelta(milliseconds=10), "max_backoff": timedelta(milliseconds=50), "base": 2}})
    monkeypatch.setattr(s3_client, "_CLIENTS", {})
