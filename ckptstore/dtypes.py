"""Element types, named once: MindSpore, numpy, safetensors and the store formats.

MindSpore writes a ``tensor_type`` string in each checkpoint record (``"Float32"``,
``"BFloat16"``, ``"str"`` ...); safetensors headers use codes (``"F32"``, ``"BF16"``); stores
and ``ckptstore info`` use lowercase numpy names (``"float32"``, ``"bfloat16"``). One table,
:data:`DTYPES`, holds every numeric type with all its names; everything else is derived from
it. bfloat16 is ``ml_dtypes.bfloat16``, whose bits are MindSpore's (the upper 16 bits of a
float32), so bytes move between the two unchanged.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np


@functools.cache
def _bfloat16() -> np.dtype:
    """``ml_dtypes.bfloat16``, imported on first need: importing ml_dtypes costs more than the
    rest of ckptstore's imports together (0.6 s on a 2-core machine), which every rank's process
    and every CLI command would pay for checkpoints that hold no bfloat16."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def __getattr__(name: str) -> Any:
    # ``BFLOAT16``: the numpy dtype of bfloat16, made when first asked for (see _bfloat16)
    if name == "BFLOAT16":
        return _bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class DType:
    """One numeric element type under each of its names (``numpy_dtype`` ``None``: bfloat16,
    whose numpy dtype comes from ml_dtypes when first used)."""

    name: str          # ckptstore / numpy name: "float32", "bfloat16"
    mindspore: str     # checkpoint tensor_type and MindSpore dtype name: "Float32"
    safetensors: str   # safetensors header code: "F32"
    numpy_dtype: np.dtype | None

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype (``ml_dtypes.bfloat16`` for bfloat16)."""
        return self.numpy_dtype if self.numpy_dtype is not None else _bfloat16()

    @property
    def is_float(self) -> bool:
        return self.numpy_dtype is None or np.issubdtype(self.numpy_dtype, np.floating)


DTYPES: tuple[DType, ...] = (
    DType("float16", "Float16", "F16", np.dtype("float16")),
    DType("float32", "Float32", "F32", np.dtype("float32")),
    DType("float64", "Float64", "F64", np.dtype("float64")),
    DType("bfloat16", "BFloat16", "BF16", None),
    DType("int8", "Int8", "I8", np.dtype("int8")),
    DType("int16", "Int16", "I16", np.dtype("int16")),
    DType("int32", "Int32", "I32", np.dtype("int32")),
    DType("int64", "Int64", "I64", np.dtype("int64")),
    DType("uint8", "UInt8", "U8", np.dtype("uint8")),
    DType("uint16", "UInt16", "U16", np.dtype("uint16")),
    DType("uint32", "UInt32", "U32", np.dtype("uint32")),
    DType("uint64", "UInt64", "U64", np.dtype("uint64")),
    DType("bool", "Bool", "BOOL", np.dtype("bool")),
)

_BY_NUMPY = {d.numpy_dtype: d for d in DTYPES if d.numpy_dtype is not None}
_BF16_ROW = next(d for d in DTYPES if d.numpy_dtype is None)
_BY_NAME = {n: d for d in DTYPES for n in (d.name, d.mindspore)}
_BY_SAFETENSORS = {d.safetensors: d for d in DTYPES}

#: The ``tensor_type`` of string values (``append_dict`` entries such as a network name).
STR_TYPE = "str"

#: Types MindSpore can write that ckptstore refuses, with the reason shown to the user.
UNSUPPORTED_TYPES: dict[str, str] = {
    "Int4": "packed 4-bit (qint4x2) tensors are not supported",
}


def lookup(dtype: object) -> DType:
    """The :class:`DType` for a numpy dtype, a ckptstore/numpy name or a MindSpore name.

    Accepts ``np.float32``, ``"float32"``, ``"Float32"``, ``"bfloat16"``, a MindSpore dtype
    object (it prints as ``"Float32"``) ...; raises ``ValueError`` for anything else.
    """
    found = _BY_NAME.get(dtype) if isinstance(dtype, str) else None
    if found is None:
        try:
            as_numpy = np.dtype(dtype)  # type: ignore[call-overload]  # any object: numpy refuses a non-dtype
            found = _BY_NUMPY.get(as_numpy)
            # only a process that imported ml_dtypes can hold a bfloat16 dtype
            if found is None and "ml_dtypes" in sys.modules and as_numpy == _bfloat16():
                found = _BF16_ROW
        except (TypeError, ValueError):
            found = None
    if found is None and not isinstance(dtype, str):
        found = _BY_NAME.get(str(dtype))  # a MindSpore dtype object prints as "Float32"
    if found is not None:
        return found
    raise ValueError(f"{dtype!r} is not an element type MindSpore checkpoints hold "
                     f"({', '.join(d.name for d in DTYPES)})")


def from_safetensors(code: str) -> DType:
    """The :class:`DType` of a safetensors header code (``"BF16"``); ``ValueError`` if unknown."""
    try:
        return _BY_SAFETENSORS[code]
    except (KeyError, TypeError):
        raise ValueError(f"safetensors dtype {code!r} is not one MindSpore checkpoints hold") from None


def numpy_dtype(name: object) -> np.dtype:
    """The numpy dtype for a dtype name (``"bfloat16"``, ``"Float32"``) or dtype; see :func:`lookup`."""
    return lookup(name).numpy


def dtype_name(dtype: object) -> str:
    """The canonical lowercase name ckptstore writes for ``dtype`` (``"bfloat16"``, ``"int8"``)."""
    return lookup(dtype).name


def mindspore_name(dtype: object) -> str:
    """MindSpore's name of ``dtype`` (``"BFloat16"``): its checkpoint ``tensor_type``."""
    return lookup(dtype).mindspore


def safetensors_code(dtype: object) -> str:
    """The safetensors header code of ``dtype`` (``"BF16"``)."""
    return lookup(dtype).safetensors


def is_float(dtype: object) -> bool:
    """True for floating-point types (bfloat16 included)."""
    return lookup(dtype).is_float
