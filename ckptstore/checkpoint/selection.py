"""Which parameters a conversion, an index, a save or an export keeps: ``--include`` /
``--exclude`` globs and ``--drop-optimizer``, by the names MindSpore's optimizers give their state.
"""
from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence

#: What MindSpore's optimizers call the state they keep per parameter ``P``: ``<prefix>.P`` (Adam's
#: ``moment1.P``, FTRL's ``linear.P``, ASGD's ``ax_.P``) or ``<prefix>_P`` (ASGD's ``mu_P``, ``eta_P``),
#: read from the parameters of ``TrainOneStepCell`` with each ``mindspore.nn`` optimizer, plus
#: MindSpore's and MindFormers' gradient accumulation and Adam moments of parallel training.
OPTIMIZER_STATE_PREFIXES: tuple[str, ...] = (
    "adam_m", "adam_v", "moments", "moments1", "moments2", "moment1", "moment2", "moment", "accum", "accum_update",
    "linear", "mean_grad", "mean_square", "accu_grads", "lamb_m", "lamb_v", "prev", "step_size", "stat", "ax_", "mu",
    "eta",
)
#: Training counters and optimizer scalars, dropped by name. ``adam_m``/``adam_v`` are no counters:
#: MindSpore's Adam optimizers (``Parameter.clone(prefix=...)``) and MindFormers' AdamW
#: (``clone_state``) name their moments ``adam_m.P``/``adam_v.P``, never bare (a state prefix, above).
TRAINING_COUNTERS: tuple[str, ...] = (
    "global_step", "beta1_power", "beta2_power", "learning_rate", "momentum", "fake_lr", "fake_param", "scale_sense",
    "loss_scale", "current_iterator_step", "last_overflow_iterator_step", "epoch_num", "step_num",
)


def optimizer_state(names: Iterable[str]) -> set[str]:
    """The names ``--drop-optimizer`` removes: training counters, and ``<prefix>.P`` / ``<prefix>_P``
    for a state prefix only where ``P`` is itself one of ``names`` — so a network module that happens
    to be called ``linear`` or ``accum`` keeps its weights (``linear.weight`` is no state: there is
    no parameter ``weight``)."""
    names = list(names)
    present = set(names)
    dropped = {n for n in names if n in TRAINING_COUNTERS}
    for n in names:
        for prefix in OPTIMIZER_STATE_PREFIXES:
            if n.startswith(prefix) and n[len(prefix):len(prefix) + 1] in (".", "_") \
                    and n[len(prefix) + 1:] in present:
                dropped.add(n)
                break
    return dropped


def select_params(names: Iterable[str], *, include: Sequence[str] = (), exclude: Sequence[str] = (),
                  drop_optimizer: bool = False) -> list[str]:
    """The names kept by ``--include`` globs (all when empty), minus ``--exclude`` and, with
    ``drop_optimizer``, the optimizer state of :func:`optimizer_state`."""
    names = list(names)
    state = optimizer_state(names) if drop_optimizer else set()
    return [n for n in names
            if (not include or any(fnmatch.fnmatchcase(n, p) for p in include))
            and not any(fnmatch.fnmatchcase(n, p) for p in exclude) and n not in state]
