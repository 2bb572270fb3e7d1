"""The zarr-extensions ``bfloat16`` data type for zarr-python 3.

zarr-python 3.1 has no bfloat16 of its own. This module defines a :class:`ZDType` over
``ml_dtypes.bfloat16`` under the v3 name ``"bfloat16"`` (the name the zarr-extensions registry
and tensorstore use), so arrays ckptstore writes keep their dtype. ckptstore's package metadata
declares it as a ``zarr.data_type`` entry point, so ``zarr.open`` reads such arrays wherever
ckptstore is installed, without importing ckptstore. Elements are stored little-endian, two
bytes each.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import ml_dtypes
import numpy as np
from zarr.core.dtype import data_type_registry
from zarr.core.dtype.common import DataTypeValidationError
from zarr.core.dtype.npy.float import BaseFloat

_BF16 = np.dtype(ml_dtypes.bfloat16)


@dataclass(frozen=True, kw_only=True)
class BFloat16(BaseFloat):
    """bfloat16 (the upper 16 bits of an IEEE float32), as ``ml_dtypes.bfloat16``."""

    dtype_cls = type(_BF16)
    _zarr_v3_name = "bfloat16"
    _zarr_v2_names: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_native_dtype(cls, dtype):
        if np.dtype(dtype) == _BF16:
            return cls(endianness="little")
        raise DataTypeValidationError(f"Invalid data type: {dtype}. Expected ml_dtypes.bfloat16")

    def to_native_dtype(self):
        return _BF16

    @classmethod
    def _check_native_dtype(cls, dtype):
        return np.dtype(dtype) == _BF16

    @property
    def item_size(self) -> int:
        return 2


def register() -> None:
    """Register ``bfloat16`` with zarr-python's data type registry (idempotent)."""
    if "bfloat16" not in data_type_registry.contents:
        data_type_registry.register("bfloat16", BFloat16)
