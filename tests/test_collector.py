"""Python's cyclic garbage collector is paused while a load or a save runs, once for nested and
concurrent ones, and left as the caller had it."""
from __future__ import annotations

import gc
import traceback

import numpy as np

import ckptstore
from ckptstore.collector import collector_paused


def test_nested_pauses_switch_the_collector_back_on_once():
    assert gc.isenabled()
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_pause_leaves_a_disabled_collector_off():
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_save_runs_no_collection_between_its_claim_and_its_commit(tmp_path):
    runs: list[int] = []

    def callback(phase: str, info: dict) -> None:
        # a collection inside the save's write (files, record, marker, commit), not before or after it
        if phase == "start" and any(f.name == "_write" and f.filename.endswith("save.py")
                                    for f in traceback.extract_stack()):
            runs.append(info["generation"])

    threshold = gc.get_threshold()
    gc.set_threshold(1)  # any allocation would collect, were the collector on
    gc.callbacks.append(callback)
    try:
        summary = ckptstore.save_rank({f"p{i}": np.full(8, i, np.float32) for i in range(50)}, tmp_path, step=1)
    finally:
        gc.callbacks.remove(callback)
        gc.set_threshold(*threshold)
    assert summary.committed
    assert runs == []
    assert gc.isenabled()
