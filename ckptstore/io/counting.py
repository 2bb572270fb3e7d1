"""The base of the process's I/O counters (a module of its own, below everything that counts, so
that :mod:`ckptstore.counters`, which reads them all, imports none of them at its top)."""
from __future__ import annotations

import threading
from dataclasses import MISSING, dataclass, field, fields
from typing import Any


@dataclass
class Counters:
    """Counters that threads add to under one lock: the base of the loads' counters
    (:class:`~ckptstore.store.executor.IOStats`) and the object-store client's
    (:class:`~ckptstore.io.s3_client.RequestStats`). Subclasses declare the counters as fields
    with defaults; :meth:`add` adds to them by name, :meth:`reset` sets every one to its default."""

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: Any) -> None:
        with self._lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def reset(self) -> None:
        with self._lock:
            for f in fields(self):
                if f.name != "_lock":
                    setattr(self, f.name, f.default_factory() if f.default_factory is not MISSING else f.default)
