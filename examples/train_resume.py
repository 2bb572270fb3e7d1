# examples/train_resume.py: train, save every 3 steps into ./run, resume with --resume
import sys

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import Model

import ckptstore

steps, resume = int(sys.argv[1]), "--resume" in sys.argv
ms.set_seed(7)
x = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
y = np.random.default_rng(1).standard_normal((16, 4)).astype(np.float32)
data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(16)   # 16 fixed samples, 1 batch
net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4))
cell = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.Adam(net.trainable_params(), 0.01))
if resume:  # weights, Adam moments and the optimizer's global_step
    print("not loaded:", ckptstore.load_into_net(cell, "run"), "global_step:", cell.optimizer.global_step.asnumpy())
saver = ckptstore.StoreCheckpoint("run", save_checkpoint_steps=3, keep_checkpoint_max=2)
Model(cell).train(steps, data, callbacks=[saver], dataset_sink_mode=False)
print("saved:", [(s.step, s.committed) for s in saver.summaries])
