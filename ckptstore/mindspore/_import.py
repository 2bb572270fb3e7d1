"""MindSpore, imported on first use: the one place the package imports it from.

``import ckptstore`` (and ``import ckptstore.mindspore``) must not import MindSpore (a second
and 800 MB), so every module of this package asks :func:`mindspore` when it first needs it.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ckptstore.dtypes import mindspore_name


def mindspore() -> Any:
    """MindSpore, imported on first use; where it is not installed, an error that says what
    needs it and what reads the same values without it (the parameters are built lazily, so
    this may first be reached when one is looked up)."""
    try:
        import mindspore as ms
    except ModuleNotFoundError as e:
        if e.name != "mindspore":  # a module MindSpore itself lacks: its own message says which
            raise
        raise ModuleNotFoundError("ckptstore's load_rank, load_into_net and StoreCheckpoint build mindspore.Parameters "
                                  "and need MindSpore, which this Python cannot import (pip install "
                                  "'ckptstore[mindspore]'); ckptstore.read_rank gives the same values as numpy arrays "
                                  "without it", name="mindspore") from e
    return ms


def ms_dtype(dtype: np.dtype) -> Any:
    """The MindSpore dtype of a numpy dtype (``BFloat16`` -> ``mindspore.bfloat16``, ``Bool`` -> ``bool_``)."""
    name = mindspore_name(dtype)
    return getattr(mindspore(), "bool_" if name == "Bool" else name.lower())
