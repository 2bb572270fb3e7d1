"""MindSpore networks the tests share: a Cell built from a name -> shape map (what compiling with a
strategy gives a rank), and a tiny network trained a few steps under ``nn.TrainOneStepCell``.

Imported only by tests marked ``mindspore`` (it imports MindSpore).
"""
from __future__ import annotations

from collections.abc import Mapping

import mindspore
import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn
from mindspore.common.initializer import initializer
from mindspore.nn.utils import no_init_parameters

from load_fixtures import BF16, to_numpy

X = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
Y = np.random.default_rng(1).standard_normal((16, 4)).astype(np.float32)


class Net(nn.Cell):
    """Two Dense layers: a network small enough to train a few steps in a test."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(8, 16)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(16, 4)

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def train_cell(seed: int = 7) -> nn.TrainOneStepCell:
    """:class:`Net` under MSE loss and Adam, seeded, in training mode."""
    ms.set_seed(seed)
    net = Net()
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.Adam(net.trainable_params(), 0.01))
    cell.set_train()
    return cell


def values(cell: nn.Cell) -> dict[str, np.ndarray]:
    """Each Parameter's value by its *name* (what a checkpoint holds), copied."""
    return {p.name: np.array(to_numpy(p), copy=True) for p in cell.get_parameters()}


class TreeNet(nn.Cell):
    """A Cell whose parameter names (``parameters_and_names``) are the dotted keys of ``shapes``."""

    def __init__(self, shapes: Mapping[str, tuple[tuple[int, ...], np.dtype]], prefix: str = "") -> None:
        super().__init__()
        tree: dict[str, object] = {}
        for name, spec in shapes.items():
            head, _, rest = name.partition(".")
            if rest:
                tree.setdefault(head, {})[rest] = spec
            else:
                tree[head] = spec
        for key, value in tree.items():
            if isinstance(value, dict):
                setattr(self, key, TreeNet(value, prefix + key + "."))
            else:
                shape, dtype = value
                if dtype == BF16:  # Parameter(bfloat16 data) calls asnumpy, which fails under numpy 2
                    with no_init_parameters():
                        param = Parameter(initializer("zeros", list(shape), mindspore.bfloat16), name=prefix + key)
                else:
                    param = Parameter(Tensor(np.zeros(shape, dtype=dtype)), name=prefix + key)
                setattr(self, key, param)


def net_like(arrays: Mapping[str, np.ndarray], skip=lambda n: False, extra=None) -> TreeNet:
    """A :class:`TreeNet` with a zero Parameter of each array's shape and dtype (``skip`` leaves names out)."""
    shapes = {n: (a.shape, a.dtype) for n, a in arrays.items() if not skip(n)}
    shapes.update(extra or {})
    return TreeNet(shapes)


def net_values(net: nn.Cell) -> dict[str, np.ndarray]:
    """Each Parameter's value by its path in the Cell, as numpy."""
    return {n: to_numpy(p) for n, p in net.parameters_and_names()}
