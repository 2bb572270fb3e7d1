"""MindSpore values to save: a Cell's Parameters (and its compiled layouts) and Tensors as host values.

:func:`host_values` is what :func:`ckptstore.save_rank` and :class:`~ckptstore.StoreCheckpoint`
hand to the write side: Tensors become :class:`~ckptstore.write.values.LazyArray` values, brought
to host memory only when written; the write side never imports this module at its top level.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ckptstore.checkpoint.strategy import Strategy, strategy_from_layouts
from ckptstore.dtypes import lookup
from ckptstore.mindspore._import import mindspore as _ms
from ckptstore.mindspore.layouts import compiled_layout
from ckptstore.write.values import HostValues, LazyArray, plain_value


def host_values(params: Any) -> tuple[HostValues, Strategy | None]:
    """What :func:`ckptstore.save_rank` was given, numpy-side, and a Cell's own layouts.

    A Cell gives its ``parameters_dict()`` (keyed by ``Parameter.name``, so an optimizer's state
    keeps the names ``load_param_into_net`` matches) and, when compiled in (semi-)auto parallel
    mode, the layouts of its ``parameter_layout_dict`` (whose entries carry each global shape).
    ``Parameter``/``Tensor`` values become :class:`~ckptstore.write.values.LazyArray` values, brought
    to host memory only when written (bfloat16 as ``ml_dtypes.bfloat16``, which ``asnumpy``
    cannot return under numpy 2); other values are taken as they are.
    """
    ms = _ms()
    strategy = None
    if isinstance(params, ms.nn.Cell):
        compiled = getattr(params, "parameter_layout_dict", None) or {}
        layouts = {n: compiled_layout(lay, lay[6] if len(lay) > 6 else None) for n, lay in compiled.items()}
        strategy = strategy_from_layouts(layouts) if layouts else None
        params = params.parameters_dict()
    out: dict[str, Any] = {}
    for name, value in params.items():
        if isinstance(value, ms.Tensor):  # fetched when written: nothing is copied to plan the save
            out[str(name)] = LazyArray(value.shape, lookup(str(value.dtype)).numpy,
                                       functools.partial(host_array, value))
        else:
            out[str(name)] = plain_value(str(name), value)
    return out, strategy


def host_array(tensor: Any) -> np.ndarray:
    """A MindSpore Tensor's (or Parameter's) values in host memory, C-contiguous."""
    ms = _ms()
    if tensor.dtype == ms.bfloat16:  # asnumpy() of bfloat16 fails under numpy 2: go through float32 (exact)
        from ckptstore.dtypes import BFLOAT16

        return np.asarray(tensor.astype(ms.float32).asnumpy().astype(BFLOAT16), order="C")
    return np.asarray(tensor.asnumpy(), order="C")
