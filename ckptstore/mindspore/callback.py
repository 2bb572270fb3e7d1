"""StoreCheckpoint: a ``mindspore.train.Callback`` that saves the trained cell into a store.

The class is built on first use (it subclasses MindSpore's ``Callback``, so importing this
module imports MindSpore only when :class:`StoreCheckpoint` is first asked for).
"""
from __future__ import annotations

import functools
import os
from typing import Any, Sequence

from ckptstore.errors import InvalidOptionError
from ckptstore.mindspore.values import host_values


@functools.cache
def store_checkpoint_class() -> type:
    """Build :class:`StoreCheckpoint` (a ``mindspore.train.Callback``, so MindSpore is imported
    only when it is first asked for)."""
    from mindspore.train import Callback

    from ckptstore.write.async_save import AsyncSaver
    from ckptstore.write.save import SaveSummary, prepare_save, prune_steps

    class StoreCheckpoint(Callback):  # type: ignore[misc, valid-type]
        """Save the trained cell into ``root/step_<N>`` every ``save_checkpoint_steps`` steps.

        For ``Model.train(callbacks=[...])`` (and MindFormers' callback lists) on every rank of
        the job, like ``ModelCheckpoint``: the saved cell is the training network (weights and
        optimizer state, by ``Parameter.name``), each distinct slice written once across the job
        (:func:`ckptstore.save_rank`). ``strategy`` is the job's strategy file(s); by default the
        network's compiled layouts, or whole tensors. With ``async_save`` the step waits only
        while this rank's slices are copied to host memory (at most ``memory_budget_mb`` MB at a
        time; the copy waits for the writer when the rank holds more), a background thread
        writes them, the next save waits for the previous, and an error of the writer is raised
        at the next step or at the end of training. The newest ``keep_checkpoint_max`` committed
        steps are kept; older ones are deleted once a newer one is committed. ``append_info``
        adds ``"epoch_num"``/``"step_num"`` (names) or a dict of values, as ``CheckpointConfig``
        does. ``include``/``exclude`` are name globs.
        """

        def __init__(self, root: str | os.PathLike[str], *, save_checkpoint_steps: int = 1,
                     keep_checkpoint_max: int | None = 5, strategy: Any = None, async_save: bool = True,
                     include: Sequence[str] = (), exclude: Sequence[str] = (), memory_budget_mb: int | None = None,
                     append_info: Any = None, rank: int | None = None) -> None:
            super().__init__()
            for what, v in (("save_checkpoint_steps", save_checkpoint_steps), ("keep_checkpoint_max",
                                                                             keep_checkpoint_max or 1),
                            ("memory_budget_mb", memory_budget_mb or 1)):
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise InvalidOptionError(f"{what} must be a positive integer, not {v!r}")
            self.root, self.every, self.keep = root, save_checkpoint_steps, keep_checkpoint_max
            self.strategy, self.rank, self.async_save = strategy, rank, async_save
            self.include, self.exclude, self.append_info = tuple(include), tuple(exclude), append_info
            self.saver = AsyncSaver(memory_budget=None if memory_budget_mb is None else memory_budget_mb << 20,
                                    on_done=self._after)
            self.summaries: list[SaveSummary] = []
            self._last = 0

        def on_train_step_end(self, run_context: Any) -> None:
            self.saver.check()  # a background save that failed stops training here
            cb = run_context.original_args()
            # as ModelCheckpoint triggers: in sink mode the step number advances by the sink size
            if cb.cur_step_num - self._last >= self.every:
                self._last = cb.cur_step_num
                self._save(cb)

        def on_train_end(self, run_context: Any) -> None:
            self.saver.wait()

        def _save(self, cb: Any) -> None:
            values, compiled = host_values(cb.train_network)
            values.update(_append(self.append_info, cb))
            strategy = self.strategy if self.strategy is not None else compiled
            job = prepare_save(values, self.root, step=int(cb.cur_step_num), strategy=strategy, rank=self.rank,
                               include=self.include, exclude=self.exclude)  # the saver copies within its budget
            if self.async_save:
                self.saver.save(job)
            else:
                self._after(job.write())

        def _after(self, summary: SaveSummary) -> None:
            self.summaries.append(summary)
            if summary.committed and self.keep:
                prune_steps(self.root, self.keep)

    StoreCheckpoint.__module__, StoreCheckpoint.__qualname__ = "ckptstore.mindspore", "StoreCheckpoint"
    return StoreCheckpoint


def _append(info: Any, cb: Any) -> dict[str, Any]:
    """The ``append_info`` values of this step (``CheckpointConfig``'s meaning)."""
    if not info:
        return {}
    if isinstance(info, dict):
        return dict(info)
    counters = {"epoch_num": int(cb.cur_epoch_num), "step_num": int(cb.cur_step_num)}
    out = {}
    for item in info:
        if isinstance(item, dict):
            out.update(item)
        elif item in counters:
            out[item] = counters[item]
        else:
            raise InvalidOptionError(f"append_info entries are 'epoch_num', 'step_num' or a dict, not {item!r}")
    return out
