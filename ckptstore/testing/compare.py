"""Bit-for-bit comparisons for tests: arrays, dicts of arrays, MindSpore values, store folders.

"Equal" here is dtype, shape and bytes, so bfloat16, ``-0.0``, NaN payloads and bool arrays
compare exactly; ``np.array_equal`` would call two NaNs different and ``0.0 == -0.0`` equal.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)


def assert_same_array(actual: Any, expected: Any, what: str = "") -> None:
    """Bit-for-bit equality: dtype, shape and bytes (bfloat16 and bool included)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.tobytes() == expected.tobytes(), f"{what}: bytes differ"


def assert_same_dict(actual: Mapping[str, Any], expected: Mapping[str, np.ndarray], what: str) -> None:
    """Same key set, and every value bit for bit (dtype, shape, bytes)."""
    assert sorted(actual) == sorted(expected), f"{what}: keys differ: {sorted(set(actual) ^ set(expected))}"
    for name in expected:
        assert_same_array(actual[name], expected[name], f"{what} {name}")


def to_numpy(value: Any) -> Any:
    """A MindSpore Parameter/Tensor as a numpy array of its own dtype (bfloat16 exactly, as
    ``ml_dtypes.bfloat16``: ``asnumpy`` cannot return bfloat16 under numpy 2). ``str`` as is."""
    if isinstance(value, str):
        return value
    import mindspore as ms

    if value.dtype == ms.bfloat16:
        return value.astype(ms.float32).asnumpy().astype(BF16)
    return np.array(value.asnumpy(), copy=True)


def store_files(store: Path) -> dict[str, bytes]:
    """Every file under ``store`` (relative path -> bytes)."""
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}
