"""A training loop's checkpointing: numbered steps, the newest K kept, saving in the background.

:class:`StoreSaver` is what :class:`~ckptstore.StoreCheckpoint` does for ``Model.train``, for
any loop (MindSpore's functional ``value_and_grad`` loops, MindFormers' own trainer): each
:meth:`StoreSaver.save` saves one step (:func:`~ckptstore.write.save.save_rank` on every rank),
by default in the background (:class:`~ckptstore.write.async_save.AsyncSaver`: the loop waits
only while this rank's slices are copied to host memory, within a budget); the rank that
commits a step then deletes steps older than the newest ``keep`` committed ones.

Steps are the training step, which must grow across resumes: a first save at or below the
newest committed step of the folder (a resumed job whose counter started again at 1) is
refused with :class:`~ckptstore.errors.StaleStepError`, naming that step, unless
``replace=True``: then committed steps newer than the saved one are removed once it is
committed, so ``open(ROOT)`` returns it. The step just saved is never deleted.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ckptstore.errors import InvalidOptionError, StaleStepError, check_int
from ckptstore.launcher import is_scheduler
from ckptstore.write.async_save import AsyncSaver
from ckptstore.write.retention import prune_steps, remove_steps, saved_steps
from ckptstore.write.save import SaveSummary, save_job, skipped_in_scheduler
from ckptstore.write.values import host_values


class StoreSaver:
    """Save a training job's steps into ``root/step_<N>``: keep-K retention and background saving.

    Create one per process (every rank of the job) and call :meth:`save` with the training step
    and the values: a MindSpore Cell (its parameters by ``Parameter.name``, optimizer state
    included), or a mapping of names to ``Parameter``/``Tensor``/numpy values. ``keep`` committed
    steps are kept (``None``: all); ``async_save`` writes in the background, copying at most
    ``memory_budget_mb`` MB of this rank's slices at a time; ``strategy``, ``rank``, ``include``,
    ``exclude``, ``chunk_mb``, ``attempt`` and ``incremental`` are :func:`ckptstore.save_rank`'s.
    ``replace=True`` lets the first save go at or below the newest committed step (restarting
    from an older step on purpose): committed steps newer than it are removed once it is
    committed. Call :meth:`wait` at the end
    (or use the saver as a context manager); an error of a background save is raised by the
    next :meth:`save`, :meth:`check` or :meth:`wait`.
    """

    def __init__(self, root: str | os.PathLike[str], *, keep: int | None = 5, async_save: bool = True,
                 memory_budget_mb: int | None = None, strategy: Any = None, rank: int | None = None,
                 include: Sequence[str] = (), exclude: Sequence[str] = (), chunk_mb: int | None = None,
                 replace: bool = False, attempt: str | None = None, incremental: bool = False) -> None:
        check_int(keep, "keep", none_ok=True)
        check_int(memory_budget_mb, "memory_budget_mb", none_ok=True)
        self.root, self.keep, self.async_save, self.replace = root, keep, async_save, replace
        self.strategy, self.rank, self.chunk_mb, self.attempt = strategy, rank, chunk_mb, attempt
        self.include, self.exclude = tuple(include), tuple(exclude)
        self.incremental = incremental
        self._async = AsyncSaver(memory_budget=None if memory_budget_mb is None else memory_budget_mb << 20,
                                 on_done=self._after)
        #: What each finished save of this rank did, oldest first.
        self.summaries: list[SaveSummary] = []
        self._first: int | None = None  # the step of this saver's first save (checked against the folder)
        self.last_step: int | None = None

    def save(self, step: int, params: Any, *, extra: Mapping[str, Any] | None = None) -> SaveSummary | None:
        """Save ``params`` (and ``extra`` values, e.g. ``{"epoch_num": 3}``) as step ``step``.

        Returns the :class:`~ckptstore.write.save.SaveSummary` of a synchronous save, ``None`` for
        a background one (its summary lands in :attr:`summaries` when it is written). Steps must
        grow from save to save; the first is checked against the folder (see the class).
        """
        self._async.check()  # a background save that failed stops the loop here
        check_int(step, "step", least=0)
        if self.last_step is not None and step <= self.last_step:
            raise StaleStepError(f"step {step} is not after step {self.last_step}, which this saver saved last; "
                                 "steps grow from save to save")
        if is_scheduler():  # msrun's scheduler runs the training script too: it saves nothing
            summary = skipped_in_scheduler(self.root, step) if self.last_step is None else None
            self.last_step = step
            return summary
        if self._first is None:
            self._check_first(step)
            self._first = step
        values, compiled = host_values(params)
        if extra:
            more = host_values(dict(extra))[0]
            clash = sorted(set(more) & set(values))
            if clash:
                raise InvalidOptionError(f"extra values {clash} have the names of saved parameters; rename them")
            values.update(more)
        job = save_job(values, self.root, step=step, strategy=self.strategy if self.strategy is not None
                           else compiled, rank=self.rank, include=self.include, exclude=self.exclude,
                           chunk_mb=self.chunk_mb, attempt=self.attempt, incremental=self.incremental)
        self.last_step = step
        if self.async_save:
            self._async.save(job)  # copies within the budget; the writer runs _after when done
            return None
        summary = job.write()
        self._after(summary)
        return summary

    def wait(self) -> SaveSummary | None:
        """Wait for the background save in progress; raise its error. Returns the last summary."""
        self._async.wait()
        return self.summaries[-1] if self.summaries else None

    def check(self) -> None:
        """Raise the error of a background save that failed (once)."""
        self._async.check()

    @property
    def busy(self) -> bool:
        """Whether a background save is still writing."""
        return self._async.busy

    @property
    def peak_staged(self) -> int:
        """Most bytes of host copies the last background save held at once."""
        return self._async.peak_staged

    def __enter__(self) -> StoreSaver:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.wait()
        else:  # the loop failed: let the save in progress end, but raise the loop's error
            try:
                self._async.wait()
            except Exception:  # the loop's error is the one to see
                pass

    def _check_first(self, step: int) -> None:
        """Refuse a first save at or below the newest committed step of the folder (unless replacing)."""
        committed = [s for s, done in saved_steps(self.root) if done]
        if step in committed and self.replace:
            raise StaleStepError(f"step {step} is already committed in {self.root}; a step is saved once, also with "
                                 "replace=True (which replaces the steps after it): save under a new step")
        if committed and step <= committed[-1] and not self.replace:
            newest = committed[-1]
            raise StaleStepError(
                f"step {step} is not newer than step {newest}, the newest committed step in {self.root}: "
                f"{'a step is saved once' if step == newest else 'open() would still return step ' + str(newest)}"
                ", and retention keeps the highest steps. A resumed job names its steps by the training step: "
                f"load step {newest} first (load_into_net restores the optimizer's global_step), or pass "
                "replace=True to save it anyway (committed steps after it are removed once it is committed)")

    def _after(self, summary: SaveSummary) -> None:
        """After a save finished (in the writer thread for a background one): the committing
        rank removes replaced steps and old steps. The step just saved is never deleted."""
        self.summaries.append(summary)
        if not summary.committed:
            return
        if self.replace and self._first is not None:  # another timeline's later steps, replaced on purpose
            remove_steps(self.root, [s for s, done in saved_steps(self.root) if done and s > summary.step])
        if self.keep:
            prune_steps(self.root, self.keep, protect=(summary.step,))
