"""Saving in the background: the training loop waits only while a rank's slices are copied.

:meth:`AsyncSaver.save` copies each piece this rank writes (a byte range of a slice's file, at
most 64 MiB and at most the budget) into a host buffer and hands it to a writer thread, which
writes, records and commits the step (:class:`SaveJob.write`) while training goes on. The
writer starts once the copying is done, so the two do not share the CPU while training waits.
The copies stay under ``memory_budget`` bytes: when the budget is smaller than the rank's
share, the writer starts as soon as the budget is full and the copying waits for it to free
buffers, so the loop is held until the last pieces are copied (and the rest written). One save
at a time: the next one first waits for the previous. An error of the writer is kept and
raised by the next call (:meth:`check`, :meth:`save` or :meth:`wait`), never lost; the step it
was saving stays uncommitted.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ckptstore.errors import check_int
from ckptstore.store.executor import ByteBudget
from ckptstore.write.save import Piece, SaveJob, SaveSummary

_END = object()


class _Budget(ByteBudget):
    """The budget of staged copies, with the moment the writer may start: :attr:`release` is set
    when the copying is done, or waits for the writer to free memory. Until then the writer keeps
    off the CPU and the GIL the copying needs (on a busy host, writing alongside made the
    copying, and so the training stall, 2.5x longer)."""

    def __init__(self, limit: int | None) -> None:
        self.release = threading.Event()
        super().__init__(limit, on_wait=self.release.set)


class AsyncSaver:
    """One background save at a time; see the module docstring.

    ``memory_budget`` bounds the bytes of staged copies (``None``: a rank's whole share may be
    copied at once). ``on_done`` runs in the writer thread after each successful save (with
    its :class:`SaveSummary`), e.g. to delete old steps.
    """

    def __init__(self, *, memory_budget: int | None = None,
                 on_done: Callable[[SaveSummary], None] | None = None) -> None:
        check_int(memory_budget, "memory_budget (bytes)", none_ok=True)
        self.memory_budget, self.on_done = memory_budget, on_done
        #: Staging buffers kept between saves, by size: a model saves the same chunks every time,
        #: and a reused buffer costs no page faults (fresh memory made the copy several times
        #: slower). They stay within the budget: no more are ever in use at once.
        self._free: dict[int, list[bytearray]] = {}
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last: SaveSummary | None = None
        #: Most staged bytes held at once by the last save.
        self.peak_staged = 0

    def save(self, job: SaveJob) -> None:
        """Wait for the previous save, then copy ``job``'s chunks to host memory and write them in
        the background; returns once every chunk is copied (or the writer failed)."""
        self.wait()
        budget = _Budget(self.memory_budget)
        staged: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._write, args=(job, staged, budget), name="ckptstore-save",
                                        daemon=True)
        self._thread.start()
        try:
            if self.memory_budget is not None:  # pieces fit the budget (a smaller one would wait for an empty budget)
                job.piece_bytes = max(1, min(job.piece_bytes, self.memory_budget))
            for p, offset, view in job.pieces():
                if not budget.take(len(view)):
                    break  # the writer failed: its error is raised by the next call
                staged.put((p, offset, self._copy(view)))
        except BaseException as e:
            staged.put(e)  # the writer abandons the step (nothing marked done, nothing committed)
            budget.release.set()
            self._thread.join()
            self._thread, self._error = None, None  # raised here, not once more by the next call
            raise
        finally:
            staged.put(_END)
            budget.release.set()
            self.peak_staged = budget.peak

    def _copy(self, view: memoryview) -> bytearray:
        spare = self._free.get(len(view))
        if not spare:
            return bytearray(view)
        buf = spare.pop()
        buf[:] = view  # same length: copied in place
        return buf

    def _write(self, job: SaveJob, staged: queue.Queue[Any], budget: _Budget) -> None:
        try:
            budget.release.wait()
            summary = job.write(_drain(staged, budget, self._free))
            self.last = summary
            if self.on_done is not None:
                self.on_done(summary)
        except BaseException as e:  # kept for the training loop
            self._error = e
        finally:
            budget.stop()

    def check(self) -> None:
        """Raise the error of a background save that failed (once)."""
        error, self._error = self._error, None
        if error is not None:
            raise error

    def wait(self) -> None:
        """Wait for the save in progress to finish; raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.check()

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def _drain(staged: queue.Queue[Any], budget: _Budget, free: dict[int, list[bytearray]]) -> Iterator[Piece]:
    """The staged pieces in order; each piece's buffer goes back to ``free`` and its budget is
    freed once the writer asks for the next (by then it has been written)."""
    while True:
        item = staged.get()
        if item is _END:
            return
        if isinstance(item, BaseException):
            raise item
        yield item
        free.setdefault(len(item[2]), []).append(item[2])
        budget.give(len(item[2]))
