"""The benchmarks' only call below ckptstore's public API, used only where the public route is missing.

The benchmarks drive ckptstore through its public API (``tests/benchmarks/test_benchmarks_public_api.py``
checks it and allow-lists this module alone). One route needs more:

* :func:`store_saver`: ``bench_versions`` runs this checkout's ``bench_save`` against *old*
  revisions of ckptstore; those before 7a5c952 (e.g. cc53700) have no ``ckptstore.StoreSaver``, so
  for them the same background save is made of what ``StoreSaver`` is built from,
  ``write.async_save.AsyncSaver`` + ``write.save.prepare_save``. Revisions with ``StoreSaver``
  never take that path.
"""
from __future__ import annotations

import os
from typing import Any


def store_saver(root: str | os.PathLike[str], *, memory_budget_mb: int | None, strategy: Any, rank: int) -> Any:
    """``ckptstore.StoreSaver(root, keep=None, memory_budget_mb=..., strategy=..., rank=...)``, or, for a
    revision before 7a5c952 (no ``StoreSaver``), an object with the same ``save(step, params)``,
    ``wait()``, ``summaries`` and ``peak_staged`` over ``AsyncSaver`` + ``prepare_save``."""
    import ckptstore

    if hasattr(ckptstore, "StoreSaver"):
        return ckptstore.StoreSaver(root, keep=None, memory_budget_mb=memory_budget_mb, strategy=strategy, rank=rank)
    return _OldSaver(root, memory_budget_mb, strategy, rank)


class _OldSaver:
    """``StoreSaver``'s background save for revisions before 7a5c952 (``AsyncSaver`` + ``prepare_save``)."""

    def __init__(self, root: str | os.PathLike[str], memory_budget_mb: int | None, strategy: Any, rank: int) -> None:
        # only revisions without StoreSaver get here (the module is gone since 7a5c952)
        from ckptstore.write.async_save import AsyncSaver

        self.root, self.strategy, self.rank = root, strategy, rank
        self._async = AsyncSaver(memory_budget=None if memory_budget_mb is None else memory_budget_mb << 20)
        self.summaries: list[Any] = []

    def save(self, step: int, params: Any) -> None:
        from ckptstore.write.save import prepare_save

        self._async.save(prepare_save(params, self.root, step=step, strategy=self.strategy, rank=self.rank))

    def wait(self) -> Any:
        self._async.wait()
        if self._async.last is not None and (not self.summaries or self.summaries[-1] is not self._async.last):
            self.summaries.append(self._async.last)
        return self.summaries[-1] if self.summaries else None

    @property
    def peak_staged(self) -> int:
        return int(self._async.peak_staged)

