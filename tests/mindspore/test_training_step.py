"""The training step ``StoreCheckpoint`` names a save by is read from the optimizer's
``global_step`` Parameter (issue 37 item 7): one finite integral value is a step; anything else
is an :class:`InvalidOptionError` naming the value, never a traceback nor a step rounded or picked."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("mindspore")
pytestmark = pytest.mark.mindspore

from ckptstore.errors import InvalidOptionError
from ckptstore.mindspore.callback import training_step


def _cb(value: np.ndarray) -> SimpleNamespace:
    import mindspore as ms

    counter = ms.Parameter(ms.Tensor(value), name="global_step", requires_grad=False)
    return SimpleNamespace(optimizer=SimpleNamespace(global_step=counter), cur_step_num=1)


@pytest.mark.parametrize("value, step", [
    (np.array([7], np.int32), 7),
    (np.array([0], np.int64), 0),
    (np.array([4.0], np.float32), 4),
    (np.array(12, np.int32), 12),
], ids=["int32", "zero", "integral-float", "scalar"])
def test_one_finite_integral_global_step_is_the_step(value, step):
    assert training_step(_cb(value)) == step


@pytest.mark.parametrize("value, shown", [
    (np.zeros((0,), np.int32), "[]"),
    (np.array([np.nan], np.float32), "[nan]"),
    (np.array([np.inf], np.float32), "[inf]"),
    (np.array([3.7], np.float64), "[3.7]"),
    (np.array([True]), "[ True]"),
    (np.array([5, 9], np.int32), "[5, 9]"),
    (np.array([-2], np.int32), "[-2]"),
], ids=["empty", "nan", "inf", "fraction", "bool", "two-values", "negative"])
def test_any_other_global_step_is_a_typed_error_naming_the_value(value, shown):
    with pytest.raises(InvalidOptionError) as e:
        training_step(_cb(value))
    expected = f"the training network's global_step is {shown} (dtype {value.dtype});"
    assert str(e.value).startswith(expected), str(e.value)
