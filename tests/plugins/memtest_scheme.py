"""A byte source and a byte sink that ckptstore does not know, in one file: ``memtest://NAME``,
files held in this process's memory (a :class:`~ckptstore.io.memory_sink.MemorySink` per URL,
kept for the life of the process, so what a sink wrote a source reads back).

Registered only by the entry points ``memtest = memtest_scheme:BYTE_SOURCE`` in the group
``ckptstore.byte_sources`` and ``memtest = memtest_scheme:BYTE_SINK`` in ``ckptstore.byte_sinks``
(tests/store/test_plugins.py installs them).
"""
from __future__ import annotations

import threading

from ckptstore.io.base import ByteSource
from ckptstore.io.memory_sink import MemorySink
from ckptstore.io.schemes import Scheme

_HELD: dict[str, MemorySink] = {}
_LOCK = threading.Lock()


def sink(url: str) -> MemorySink:
    """The files of ``url`` (created empty on first use)."""
    url = url.rstrip("/")
    with _LOCK:
        return _HELD.setdefault(url, MemorySink(url))


def source(url: str) -> ByteSource:
    """The files of ``url``, read back."""
    return sink(url).source


BYTE_SOURCE = Scheme(("memtest",), source, "memtest://NAME (a test plugin)")
BYTE_SINK = Scheme(("memtest",), sink, "memtest://NAME (a test plugin)")
