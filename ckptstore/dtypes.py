"""Names of element types in MindSpore, numpy and the store formats.

MindSpore writes a ``tensor_type`` string in each checkpoint record (``"Float32"``,
``"BFloat16"``, ``"str"`` ...). ckptstore works in numpy dtypes; bfloat16 is
``ml_dtypes.bfloat16``, which has the same bit layout as MindSpore's (the upper 16 bits of a
float32), so bytes move between the two unchanged.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

#: MindSpore ``tensor_type`` string -> numpy dtype, for every numeric type ``save_checkpoint``
#: writes. ``"str"`` values and ``"Int4"`` are handled separately.
MINDSPORE_TO_NUMPY: dict[str, np.dtype] = {
    "Float16": np.dtype("float16"),
    "Float32": np.dtype("float32"),
    "Float64": np.dtype("float64"),
    "BFloat16": BFLOAT16,
    "Int8": np.dtype("int8"),
    "Int16": np.dtype("int16"),
    "Int32": np.dtype("int32"),
    "Int64": np.dtype("int64"),
    "UInt8": np.dtype("uint8"),
    "UInt16": np.dtype("uint16"),
    "UInt32": np.dtype("uint32"),
    "UInt64": np.dtype("uint64"),
    "Bool": np.dtype("bool"),
}

NUMPY_TO_MINDSPORE: dict[np.dtype, str] = {v: k for k, v in MINDSPORE_TO_NUMPY.items()}

#: The ``tensor_type`` of string values (``append_dict`` entries such as a network name).
STR_TYPE = "str"

#: Types MindSpore can write that ckptstore refuses, with the reason shown to the user.
UNSUPPORTED_TYPES: dict[str, str] = {
    "Int4": "packed 4-bit (qint4x2) tensors are not supported",
}


def numpy_dtype(name: str) -> np.dtype:
    """Return the numpy dtype for a dtype name as ckptstore writes it (``"bfloat16"``, ``"float32"``).

    Accepts numpy names, MindSpore ``tensor_type`` strings and ``"bfloat16"``; raises
    ``ValueError`` for anything else.
    """
    if name in MINDSPORE_TO_NUMPY:
        return MINDSPORE_TO_NUMPY[name]
    if name == "bfloat16":
        return BFLOAT16
    try:
        dt = np.dtype(name)
    except TypeError as e:
        raise ValueError(f"unknown dtype name {name!r}") from e
    if dt not in NUMPY_TO_MINDSPORE:
        raise ValueError(f"dtype {name!r} is not one MindSpore checkpoints hold")
    return dt


def dtype_name(dtype: np.dtype) -> str:
    """The canonical lowercase name ckptstore writes for ``dtype`` (``"bfloat16"``, ``"int8"``)."""
    dt = np.dtype(dtype)
    return "bfloat16" if dt == BFLOAT16 else dt.name
