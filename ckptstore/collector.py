"""Pausing Python's cyclic garbage collector while the package does bulk work (a load, a save)."""
from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_collector_lock = threading.Lock()
_collector_holders = 0
_collector_was_enabled = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Keep Python's cyclic garbage collector off while a load or a save runs (nested and
    concurrent ones share one pause; the collector is switched back on, if it was on, when the
    last one ends).

    Both allocate a few objects per parameter or chunk and free none until they end, so each few
    hundred trigger a collection, and in a process holding MindSpore a full one costs about
    100 ms of CPU. Issue 36 saw one load in five pay it; a save paid it in every step, between
    writing its files and writing its record (issue 34, benchmarks/results/versions.md). The
    cycles made meanwhile, by the save or the training loop, are collected at the first
    collection after the pause.
    """
    global _collector_holders, _collector_was_enabled
    with _collector_lock:
        if _collector_holders == 0:
            _collector_was_enabled = gc.isenabled()
            gc.disable()
        _collector_holders += 1
    try:
        yield
    finally:
        with _collector_lock:
            _collector_holders -= 1
            if _collector_holders == 0 and _collector_was_enabled:
                gc.enable()
