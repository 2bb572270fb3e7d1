"""StoreCheckpoint: a ``mindspore.train.Callback`` that saves the trained cell into a store.

The class is built on first use (it subclasses MindSpore's ``Callback``, so importing this
module imports MindSpore only when :class:`StoreCheckpoint` is first asked for). Saving, keep-K
and background writing are :class:`~ckptstore.write.saver.StoreSaver`'s, the same a custom
training loop uses; this module adds what ``Model.train`` says: which step it is.

Steps are named by the *training* step, which goes on across resumes: the optimizer's
``global_step`` Parameter (saved with the network and restored by ``load_into_net``), as
MindFormers' ``CheckpointMonitor`` reads it; only a network without one falls back to
``initial_step + cur_step_num`` (``Model.train``'s ``cur_step_num`` starts at 1 again after a
resume, also with ``initial_epoch``).
"""
from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from typing import Any

from ckptstore.errors import InvalidOptionError, check_int
from ckptstore.write.saver import StoreSaver

#: ``append_info`` names (``CheckpointConfig``'s and MindFormers' ``CheckpointMonitor``'s).
APPEND_NAMES = ("epoch_num", "step_num", "global_step", "loss_scale")


@functools.cache
def store_checkpoint_class() -> type:
    """Build :class:`StoreCheckpoint` (a ``mindspore.train.Callback``, so MindSpore is imported
    only when it is first asked for)."""
    from mindspore.train import Callback

    class StoreCheckpoint(Callback):
        """Save the trained cell into ``root/step_<N>`` every ``save_checkpoint_steps`` training steps.

        For ``Model.train(callbacks=[...])`` (and MindFormers' callback lists, in place of its
        ``CheckpointMonitor``) on every rank of the job, like ``ModelCheckpoint``: the saved cell
        is the training network (weights and optimizer state, by ``Parameter.name``), each
        distinct slice written once across the job (:func:`ckptstore.save_rank`). ``N`` is the
        training step across resumes (the optimizer's ``global_step``; see the module), so a job
        resumed with ``load_into_net`` goes on numbering where it stopped. ``strategy`` is the
        job's strategy file(s); by default the network's compiled layouts, or whole tensors.
        With ``async_save`` the step waits only while this rank's slices are copied to host
        memory (at most ``memory_budget_mb`` MB at a time), a background thread writes them,
        and an error of the writer is raised at the next step or at the end of training. The
        newest ``keep_checkpoint_max`` committed steps are kept (never deleting the step just
        saved). A first save at or below the newest committed step of ``root`` (a job that was
        not resumed from it) is refused with :class:`~ckptstore.errors.StaleStepError` unless
        ``replace=True``. ``append_info`` adds ``"epoch_num"``, ``"step_num"`` (the training
        step), ``"global_step"``, ``"loss_scale"`` (names, as MindFormers' resume reads them) or
        a dict of values, as ``CheckpointConfig`` does. ``include``/``exclude`` are name globs.
        ``attempt`` names the save attempt as :func:`ckptstore.save_rank`'s does (by default
        MindSpore's communication or the launcher gives one). ``incremental=True`` references the
        slices that did not change since the previous step instead of writing them again
        (:func:`ckptstore.save_rank`'s; README "Incremental saves").
        """

        def __init__(self, root: str | os.PathLike[str], *, save_checkpoint_steps: int = 1,
                     keep_checkpoint_max: int | None = 5, strategy: Any = None, async_save: bool = True,
                     include: Sequence[str] = (), exclude: Sequence[str] = (), memory_budget_mb: int | None = None,
                     append_info: Any = None, rank: int | None = None, initial_step: int = 0,
                     replace: bool = False, attempt: str | None = None, incremental: bool = False) -> None:
            super().__init__()
            check_int(save_checkpoint_steps, "save_checkpoint_steps")
            check_int(initial_step, "initial_step", least=0)
            _check_append_info(append_info)
            self.root, self.every, self.keep = root, save_checkpoint_steps, keep_checkpoint_max
            self.append_info, self.initial_step = append_info, initial_step
            self.saver = StoreSaver(root, keep=keep_checkpoint_max, async_save=async_save,
                                    memory_budget_mb=memory_budget_mb, strategy=strategy, rank=rank,
                                    include=include, exclude=exclude, replace=replace,
                                    attempt=attempt, incremental=incremental)
            self._last: int | None = None  # the training step at the previous step end
            self._counter: Any = _UNKNOWN  # the optimizer's global_step Parameter (None: there is none)

        def resume(self, network: Any, *, strategy: Any = None, rank: int | None = None, dtype: Any = None,
                   workers: int | None = None) -> int | None:
            """Load ``network`` (weights, optimizer state, ``global_step``) from the newest committed
            step of ``root`` whose chunks this rank reads verify, the same step on every rank of the
            job (``load_into_net(..., fallback=True)``), and return that step; ``None`` when ``root``
            holds no committed step yet (a first run: nothing is loaded). Steps skipped as damaged are
            said in one log line, and removed by rank 0 (only the files ckptstore wrote), so the
            job's next saves can take their numbers. ``strategy`` defaults to the callback's."""
            return resume_into(network, self.root, strategy=self.saver.strategy if strategy is None else strategy,
                               rank=self.saver.rank if rank is None else rank, dtype=dtype, workers=workers)

        @property
        def summaries(self) -> list[Any]:
            """What each finished save of this rank did, oldest first."""
            return self.saver.summaries

        def on_train_begin(self, run_context: Any) -> None:
            cb = run_context.original_args()
            self._counter = _global_step(cb)  # looked up once: the network's parameters do not change
            self._last = self._step(cb, before=True)

        def on_train_step_end(self, run_context: Any) -> None:
            self.saver.check()  # a background save that failed stops training here
            cb = run_context.original_args()
            step = self._step(cb)
            last = self._last if self._last is not None else step - 1
            self._last = step
            # every `every` training steps, as ModelCheckpoint triggers (in sink mode the step
            # advances by the sink size: a save when a multiple of `every` was passed)
            if step // self.every > last // self.every:
                self._save(cb, step)

        def on_train_end(self, run_context: Any) -> None:
            self.saver.wait()

        def _step(self, cb: Any, *, before: bool = False) -> int:
            if self._counter is _UNKNOWN:  # training began without on_train_begin (a hand-driven loop)
                self._counter = _global_step(cb)
            return training_step(cb, self.initial_step, before=before, counter=self._counter)

        def _save(self, cb: Any, step: int) -> None:
            extra = _append(self.append_info, cb, step)
            if self._counter is not None:  # the network saves its own global_step Parameter
                extra.pop("global_step", None)
            self.saver.save(step, cb.train_network, extra=extra)

    StoreCheckpoint.__module__, StoreCheckpoint.__qualname__ = "ckptstore.mindspore", "StoreCheckpoint"
    return StoreCheckpoint


_UNKNOWN = object()


def resume_into(network: Any, root: str | os.PathLike[str], *, strategy: Any = None, rank: int | None = None,
                dtype: Any = None, workers: int | None = None) -> int | None:
    """:meth:`StoreCheckpoint.resume`: the verified step loaded into ``network`` (``None``: no
    committed step), the newer committed steps that failed verification removed by rank 0."""
    import logging

    from ckptstore.io.locations import open_location
    from ckptstore.launcher import process_rank
    from ckptstore.mindspore.load import load_into_net, verified_store_for_net
    from ckptstore.store.steps import newest_committed
    from ckptstore.write.retention import remove_steps, saved_steps

    if newest_committed(open_location(root))[0] is None:
        return None
    with verified_store_for_net(network, root, strategy, rank, workers) as store:
        load_into_net(network, store, strategy, rank, dtype=dtype, workers=workers)
        step = store.step
    if step is None:
        return None
    skipped = [s for s, done in saved_steps(root) if done and s > step]
    if skipped and process_rank() in (0, None):
        removed = remove_steps(root, skipped)
        # the fallback said which steps it skipped, in its one line; what became of them is detail
        logging.getLogger("ckptstore").info("ckptstore: %s: resumed from step %d; %s (they failed verification)",
                                            os.fspath(root), step, removed.describe())
    return step


def training_step(cb: Any, initial_step: int = 0, *, before: bool = False, counter: Any = _UNKNOWN) -> int:
    """The training step of ``Model.train``'s ``cb_params``: the optimizer's ``global_step``
    (``cb.optimizer``, else the network's optimizer, else a ``global_step`` Parameter of the
    training network; ``counter`` when already looked up), else ``initial_step + cur_step_num``.
    ``before``: at the start of training (before any step ran)."""
    param = _global_step(cb) if counter is _UNKNOWN else counter
    if param is not None:
        return step_value(param.asnumpy(), f"the training network's {getattr(param, 'name', 'global_step')}")
    return initial_step + (0 if before else int(cb.cur_step_num))


def step_value(value: Any, what: str) -> int:
    """The step ``value`` (an array read from a ``global_step`` Parameter, ``what``) holds: one
    finite, integral, non-negative number (an integer or a float such as 4.0). Anything else (empty,
    several values, a bool, NaN, inf, 3.7, a negative number) is an
    :class:`~ckptstore.errors.InvalidOptionError` naming the value: a step saved under a number
    rounded or picked from it would be resumed from the wrong place without a word."""
    import numpy as np

    array = np.asarray(value)
    shown = np.array2string(array.reshape(-1)[:8], separator=", ") + (" ..." if array.size > 8 else "")
    refusal = InvalidOptionError(f"{what} is {shown} (dtype {array.dtype}); ckptstore names a saved step by one "
                                 "finite integral value >= 0: set the Parameter to one such value")
    if array.size != 1 or array.dtype.kind not in "iuf":
        raise refusal
    item = array.reshape(-1)[0].item()
    if isinstance(item, float) and not (math.isfinite(item) and item.is_integer()):
        raise refusal
    if item < 0:
        raise refusal
    return int(item)


def _global_step(cb: Any) -> Any:
    for owner in (getattr(cb, "optimizer", None), getattr(getattr(cb, "network", None), "optimizer", None)):
        param = getattr(owner, "global_step", None)
        if param is not None and hasattr(param, "asnumpy"):
            return param
    network = getattr(cb, "train_network", None)
    if network is not None:
        for param in network.get_parameters():
            if param.name == "global_step":
                return param
    return None


def _check_append_info(info: Any) -> None:
    if not info or isinstance(info, dict):
        return
    for item in info:
        if not isinstance(item, dict) and item not in APPEND_NAMES:
            raise InvalidOptionError(f"append_info entries are {', '.join(map(repr, APPEND_NAMES))} or a dict, "
                                     f"not {item!r}")


def _append(info: Any, cb: Any, step: int) -> dict[str, Any]:
    """The ``append_info`` values of this step (``CheckpointConfig``'s meaning; ``step_num`` and
    ``global_step`` are the training step, as MindFormers' ``CheckpointMonitor`` saves them)."""
    if not info:
        return {}
    if isinstance(info, dict):
        return dict(info)
    counters: dict[str, Any] = {"epoch_num": int(cb.cur_epoch_num), "step_num": step, "global_step": step}
    outputs = getattr(cb, "net_outputs", None)
    if isinstance(outputs, (tuple, list)) and len(outputs) >= 3:  # (loss, overflow, loss_scale)
        counters["loss_scale"] = outputs[2]
    out = {}
    for item in info:
        if isinstance(item, dict):
            out.update(item)
        elif item in counters:
            out[item] = counters[item]
    return out
