"""The training loop end to end (issue 25.1, 25.5): a resumed job continues the numbering.

A real ``Model.train`` job saves with ``StoreCheckpoint``, is "killed" (stops after some steps),
is resumed from the store with ``load_into_net`` and trains on: its steps are named by the
optimizer's ``global_step`` (``cur_step_num`` starts again at 1), so retention keeps the newest
steps and ``open(ROOT)`` returns the last. Custom loops get the same through ``StoreSaver``.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")
pytestmark = pytest.mark.mindspore

import mindspore as ms
from mindspore import Tensor, nn

import ckptstore
from ckptstore.errors import StaleStepError
from load_fixtures import assert_same_dict
from mindspore_nets import Net, X, Y, train_cell, values


def _train(cell: nn.Cell, steps: int, *callbacks) -> nn.Cell:
    """``steps`` steps of Model.train (one batch per epoch)."""
    import mindspore.dataset as ds
    from mindspore.train import Model

    data = ds.NumpySlicesDataset({"x": X, "y": Y}, shuffle=False).batch(16)
    Model(cell).train(steps, data, callbacks=list(callbacks), dataset_sink_mode=False)
    return cell


def _steps(root) -> list[str]:
    return sorted((p.name for p in root.iterdir()), key=lambda n: int(n.split("_")[1]))


def test_a_job_killed_and_resumed_with_load_into_net_keeps_its_newest_steps_and_open_returns_the_last(tmp_path):
    root = tmp_path / "run"
    _train(train_cell(), 7, ckptstore.StoreCheckpoint(root, save_checkpoint_steps=3, keep_checkpoint_max=2))
    assert _steps(root) == ["step_3", "step_6"]  # "killed" after step 7: step 6 is the newest
    resumed = train_cell(seed=99)
    assert ckptstore.load_into_net(resumed, root) == ([], [])
    callback = ckptstore.StoreCheckpoint(root, save_checkpoint_steps=3, keep_checkpoint_max=2,
                                         append_info=["step_num"])
    _train(resumed, 6, callback)  # cur_step_num 1..6 again; the training steps are 7..12
    assert [s.step for s in callback.summaries] == [9, 12]
    assert _steps(root) == ["step_9", "step_12"]
    store = ckptstore.open(root)
    assert (store.source["step"], int(store.read("step_num")), int(store.read("global_step")[0])) == (12, 12, 12)
    uninterrupted = _train(train_cell(), 12)  # the resumed job took the same steps as one that never stopped
    assert_same_dict({n: store.read(n) for n in values(uninterrupted)}, values(uninterrupted), "step 12")


def test_a_first_save_below_the_newest_committed_step_is_refused_naming_it(tmp_path):
    root = tmp_path / "run"
    _train(train_cell(), 6, ckptstore.StoreCheckpoint(root, save_checkpoint_steps=3))
    with pytest.raises(StaleStepError, match=r"step 2 is not newer than step 6, the newest committed step in .*run: "
                                             r"open\(\) would still return step 6.* load step 6 first"):
        _train(train_cell(), 4, ckptstore.StoreCheckpoint(root, save_checkpoint_steps=2))  # not resumed
    assert _steps(root) == ["step_3", "step_6"]


def test_a_first_save_of_a_committed_step_is_refused_at_once(tmp_path):
    root = tmp_path / "run"
    _train(train_cell(), 3, ckptstore.StoreCheckpoint(root, save_checkpoint_steps=3))
    with pytest.raises(StaleStepError, match=r"step 3 is not newer than step 3, .*: a step is saved once"):
        _train(train_cell(), 3, ckptstore.StoreCheckpoint(root, save_checkpoint_steps=3))


def test_replace_saves_an_older_timeline_and_removes_the_steps_after_it_once_committed(tmp_path):
    root = tmp_path / "run"
    _train(train_cell(), 6, ckptstore.StoreCheckpoint(root, save_checkpoint_steps=3))
    callback = ckptstore.StoreCheckpoint(root, save_checkpoint_steps=2, keep_checkpoint_max=2, replace=True)
    _train(train_cell(seed=5), 4, callback)
    assert _steps(root) == ["step_2", "step_4"]  # steps 3 and 6 were another run's: replaced
    assert ckptstore.open(root).source["step"] == 4


# ---- custom training loops: StoreSaver --------------------------------------------------------


def _functional_loop(saver: ckptstore.StoreSaver, steps: int, every: int) -> tuple[nn.Cell, nn.Optimizer]:
    """A MindSpore functional loop (``value_and_grad``), saving every ``every`` steps."""
    ms.set_seed(7)
    net = Net()
    optimizer = nn.Adam(net.trainable_params(), 0.01)
    loss_fn = nn.MSELoss()
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, optimizer.parameters)
    for step in range(1, steps + 1):
        _, grads = grad_fn(Tensor(X), Tensor(Y))
        optimizer(grads)
        if step % every == 0:
            saver.save(step, {**net.parameters_dict(), **optimizer.parameters_dict()}, extra={"step_num": step})
    saver.wait()
    return net, optimizer


@pytest.mark.parametrize("async_save", [True, False], ids=["async", "sync"])
def test_a_custom_loop_keeps_its_newest_steps_and_resumes_from_the_last(tmp_path, async_save):
    saver = ckptstore.StoreSaver(tmp_path / "run", keep=2, async_save=async_save, memory_budget_mb=1)
    net, optimizer = _functional_loop(saver, 7, 2)
    assert [s.step for s in saver.summaries] == [2, 4, 6] and all(s.committed for s in saver.summaries)
    assert _steps(tmp_path / "run") == ["step_4", "step_6"]
    ms.set_seed(99)
    fresh = Net()
    fresh_optimizer = nn.Adam(fresh.trainable_params(), 0.01)
    ckptstore.load_into_net(fresh, tmp_path / "run")
    ckptstore.load_into_net(fresh_optimizer, tmp_path / "run")
    assert int(fresh_optimizer.global_step.asnumpy()[0]) == 6
    assert int(ckptstore.open(tmp_path / "run").read("step_num")) == 6


def test_a_saver_refuses_a_step_that_does_not_grow(tmp_path):
    saver = ckptstore.StoreSaver(tmp_path / "run", async_save=False)
    saver.save(4, {"w": np.ones(2, np.float32)})
    with pytest.raises(StaleStepError, match="step 4 is not after step 4, which this saver saved last"):
        saver.save(4, {"w": np.ones(2, np.float32)})


def test_a_saver_in_msruns_scheduler_saves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("MS_ROLE", "MS_SCHED")
    saver = ckptstore.StoreSaver(tmp_path / "run")
    assert saver.save(1, {"w": np.ones(2, np.float32)}).rank == -1
    assert saver.save(2, {"w": np.ones(2, np.float32)}) is None  # said once
    assert saver.wait() is None and not (tmp_path / "run").exists()
