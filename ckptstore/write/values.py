"""What a save is given, numpy-side: arrays, plain values, and values fetched only when written.

:func:`~ckptstore.write.save.save_rank` writes host arrays (C-contiguous numpy), strings, and
:class:`LazyArray`\\ s, values known by shape and dtype whose bytes are fetched when written (a
MindSpore tensor: planning a save copies nothing, and a background save copies one piece at a
time). The MindSpore side (:mod:`ckptstore.mindspore.values`) turns Cells and Tensors into
these; :func:`host_values` hands such inputs over to it through the adapter the package installs
(:mod:`ckptstore.adapters`): the write side imports nothing of the MindSpore side, which sits
above it, and numpy callers never import MindSpore.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ckptstore.adapters import value_adapter
from ckptstore.dtypes import lookup
from ckptstore.errors import InvalidOptionError

if TYPE_CHECKING:
    from ckptstore.checkpoint.strategy import Strategy

#: A rank's values to save, by name: host arrays, :class:`LazyArray` values and strings.
HostValues = dict[str, Any]


class LazyArray:
    """A value known by shape and dtype, fetched into host memory only when its bytes are needed
    (a MindSpore tensor: planning a save needs no data, and a background save copies one
    parameter at a time). ``fetch`` returns the values as an array of that shape and dtype."""

    def __init__(self, shape: Sequence[int], dtype: np.dtype, fetch: Callable[[], Any]) -> None:
        self.shape, self.dtype, self._fetch = tuple(int(s) for s in shape), np.dtype(dtype), fetch

    def load(self) -> np.ndarray:
        return np.asarray(self._fetch(), order="C")

    def __repr__(self) -> str:
        return f"<LazyArray {self.dtype} {list(self.shape)}>"


def is_plain(value: Any) -> bool:
    """Whether ``value`` is saved as it is (no MindSpore value to adapt)."""
    return isinstance(value, (np.ndarray, np.generic, str, bool, int, float, LazyArray))


def plain_value(name: str, value: Any) -> Any:
    """A numpy-side value as a ``.ckpt`` holds it: Python ``int`` -> int64 and ``float`` ->
    float32 scalars (as ``append_dict`` saves them), strings as text, arrays C-contiguous."""
    if isinstance(value, (str, LazyArray)):
        return value
    if isinstance(value, bool):
        return np.array(value, dtype=np.bool_)
    if isinstance(value, int):
        return np.array(value, dtype=np.int64)
    if isinstance(value, float):
        return np.array(value, dtype=np.float32)
    array = np.asarray(value, order="C")
    try:
        lookup(array.dtype)
    except (ValueError, KeyError):
        raise InvalidOptionError(f"parameter {name!r} has dtype {array.dtype}, which a MindSpore checkpoint cannot "
                                 "hold") from None
    return array


def host_values(params: Any) -> tuple[HostValues, Strategy | None]:
    """``params`` as values :func:`~ckptstore.write.save.save_rank` writes, and a Cell's own layouts.

    A mapping of plain values (numpy arrays, Python scalars, strings, :class:`LazyArray`) is
    taken as it is. Anything else (a MindSpore Cell, ``Parameter``/``Tensor`` values) is adapted
    by the adapter installed in :mod:`ckptstore.adapters` (the package installs
    :func:`ckptstore.mindspore.values.host_values`, imported on first use).
    """
    if isinstance(params, Mapping) and all(is_plain(v) for v in params.values()):
        return {str(n): plain_value(str(n), v) for n, v in params.items()}, None
    adapt = value_adapter()
    if adapt is None:  # only a caller that replaced the package's adapter gets here
        raise InvalidOptionError("save_rank takes numpy arrays, Python scalars and strings by name; no adapter "
                                 f"of other values is installed (given {type(params).__name__})")
    return adapt(params)
