"""What a load costs besides its copies: no garbage collection midway, and no more reading
threads than the CPUs the process may use."""
from __future__ import annotations

import gc
import traceback

import pytest

import ckptstore
from ckptstore.io import base
from ckptstore.read.loader import rank_view


def test_usable_cpus_is_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(base.os, "sched_getaffinity", lambda pid: {3, 7}, raising=False)
    assert base.usable_cpus() == 2


@pytest.mark.mindspore
def test_read_many_runs_no_collection(load_env):
    from load_fixtures import CASES

    store = ckptstore.open(load_env.store(next(iter(CASES.values())).kind))
    view = rank_view(store, None, 0)
    names = view.names()
    runs: list[int] = []

    def callback(phase: str, info: dict) -> None:
        # a collection inside the load's loop over parameters (not one entering or leaving it)
        if phase == "start" and any(f.name == "_stream" for f in traceback.extract_stack()):
            runs.append(info["generation"])

    threshold = gc.get_threshold()
    gc.set_threshold(1)  # any allocation would collect, were the collector on
    gc.callbacks.append(callback)
    try:
        values = view.read_many(names)
    finally:
        gc.callbacks.remove(callback)
        gc.set_threshold(*threshold)
    assert len(values) == len(names)
    assert runs == []
    assert gc.isenabled()
