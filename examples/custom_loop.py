# examples/custom_loop.py: a value_and_grad loop saving every 4 steps into ./loop with StoreSaver
import mindspore as ms
import numpy as np
from mindspore import nn

import ckptstore

ms.set_seed(7)
x = ms.Tensor(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32))
y = ms.Tensor(np.random.default_rng(1).standard_normal((16, 4)).astype(np.float32))
net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4))
optimizer = nn.Adam(net.trainable_params(), 0.01)
loss_fn = nn.MSELoss()
grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, optimizer.parameters)

saver = ckptstore.StoreSaver("loop", keep=2, async_save=True, memory_budget_mb=256)
start, total = 0, 12
for step in range(start + 1, total + 1):
    loss, grads = grad_fn(x, y)
    optimizer(grads)
    if step % 4 == 0:         # a Cell, or a dict of Parameters/Tensors/numpy arrays; extra= values
        saver.save(step, {**net.parameters_dict(), **optimizer.parameters_dict()}, extra={"step_num": step})
saver.wait()                  # the last background save; an error of one is raised by the next call
print("saved:", [(s.step, s.bytes_written, s.committed) for s in saver.summaries])
