"""Resuming training through ckptstore gives the same next step as resuming through MindSpore.

A real ``nn.TrainOneStepCell(WithLossCell(net), nn.Adam(...))`` trains a few steps under
``Model.train`` and ``ModelCheckpoint`` saves it. Its optimizer state lives under parameter
*names* (``moment1.fc1.weight``, ``global_step``, ``beta1_power``) that differ from the cell's
attribute *paths* (``optimizer.moment1.fc1.weight``): ``load_into_net`` must match by name, as
``mindspore.load_param_into_net`` does, or the resumed step differs in every weight.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")
pytestmark = pytest.mark.mindspore

import mindspore as ms
from mindspore import Tensor, nn

import ckptstore
from ckptstore.errors import LayoutMismatchError
from load_fixtures import assert_same_dict, to_numpy
from mindspore_nets import X, Y, train_cell, values


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, Path]:
    """Three steps of Model.train saved by ModelCheckpoint, and the store converted from it."""
    import mindspore.dataset as ds
    from mindspore.train import CheckpointConfig, Model, ModelCheckpoint

    root = tmp_path_factory.mktemp("train")
    data = ds.NumpySlicesDataset({"x": X, "y": Y}, shuffle=False).batch(16)
    cell = train_cell()
    saver = ModelCheckpoint(prefix="net", directory=str(root / "ckpt"),
                            config=CheckpointConfig(save_checkpoint_steps=3))
    Model(cell).train(3, data, callbacks=[saver], dataset_sink_mode=False)
    ckpt = sorted((root / "ckpt").glob("net-3_1.ckpt"))[0]
    ckptstore.convert(ckpt, root / "store")
    return ckpt, root / "store"


def _resume_with_mindspore(ckpt: Path) -> tuple[nn.TrainOneStepCell, tuple]:
    cell = train_cell(seed=99)
    result = ms.load_param_into_net(cell, ms.load_checkpoint(str(ckpt)))
    return cell, result


def test_load_into_net_resumes_the_optimizer_state_like_load_param_into_net(saved):
    ckpt, store = saved
    ms_cell, (ms_not_load, ms_ckpt_not_load) = _resume_with_mindspore(ckpt)
    cell = train_cell(seed=99)
    param_not_load, ckpt_not_load = ckptstore.load_into_net(cell, store)
    assert (param_not_load, sorted(ckpt_not_load)) == (list(ms_not_load), sorted(ms_ckpt_not_load))
    loaded = values(cell)
    assert_same_dict(loaded, values(ms_cell), "resumed state")
    assert np.any(loaded["moment1.fc1.weight"] != 0) and int(loaded["global_step"][0]) == 3


def test_the_next_step_after_resuming_is_bit_identical(saved):
    ckpt, store = saved
    ms_cell, _ = _resume_with_mindspore(ckpt)
    cell = train_cell(seed=99)
    ckptstore.load_into_net(cell, store)
    for c in (ms_cell, cell):
        c(Tensor(X), Tensor(Y))
    assert_same_dict(values(cell), values(ms_cell), "after one more step")


def test_load_rank_passes_straight_to_load_param_into_net(saved):
    ckpt, store = saved
    ms_cell, (ms_not_load, ms_ckpt_not_load) = _resume_with_mindspore(ckpt)
    cell = train_cell(seed=99)
    params = ckptstore.load_rank(store)
    assert isinstance(params, dict)
    not_load, ckpt_not_load = ms.load_param_into_net(cell, params)
    assert (list(not_load), sorted(ckpt_not_load)) == (list(ms_not_load), sorted(ms_ckpt_not_load))
    assert_same_dict(values(cell), values(ms_cell), "through load_param_into_net")


def test_a_prefix_the_checkpoint_carries_is_dropped_as_mindspore_drops_it(saved, tmp_path):
    ckpt, _ = saved
    renamed = tmp_path / "prefixed.ckpt"
    ms.save_checkpoint([{"name": f"network.{n}", "data": p} for n, p in ms.load_checkpoint(str(ckpt)).items()
                        if not isinstance(p, str)], str(renamed))
    ckptstore.convert(renamed, tmp_path / "store")
    ms_cell = train_cell(seed=99)
    expected = ms.load_param_into_net(ms_cell, ms.load_checkpoint(str(renamed)))
    cell = train_cell(seed=99)
    assert ckptstore.load_into_net(cell, tmp_path / "store") == (list(expected[0]), list(expected[1]))
    assert_same_dict(values(cell), values(ms_cell), "prefix dropped")



def test_strict_loads_names_exactly_and_raises_for_what_it_cannot_load(saved, tmp_path):
    ckpt, _ = saved
    renamed = tmp_path / "prefixed.ckpt"
    ms.save_checkpoint([{"name": f"network.{n}", "data": p} for n, p in ms.load_checkpoint(str(ckpt)).items()
                        if not isinstance(p, str)], str(renamed))
    ckptstore.convert(renamed, tmp_path / "store")
    cell = train_cell(seed=99)
    with pytest.raises(LayoutMismatchError, match=r"network parameters are not in the store .*fc1\.weight"):
        ckptstore.load_into_net(cell, tmp_path / "store", strict=True)


def test_names_with_glob_characters_load_exactly(tmp_path):
    class Odd(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.a = ms.Parameter(Tensor(np.zeros(3, np.float32)), name="w[0]")
            self.b = ms.Parameter(Tensor(np.zeros(3, np.float32)), name="w*")
            self.c = ms.Parameter(Tensor(np.zeros(3, np.float32)), name="w0")

    values_by_name = {"w[0]": np.full(3, 1.0, np.float32), "w*": np.full(3, 2.0, np.float32),
                      "w0": np.full(3, 3.0, np.float32)}
    ms.save_checkpoint([{"name": n, "data": Tensor(v)} for n, v in values_by_name.items()], str(tmp_path / "o.ckpt"))
    ckptstore.convert(tmp_path / "o.ckpt", tmp_path / "store")
    net = Odd()
    assert ckptstore.load_into_net(net, tmp_path / "store") == ([], [])
    assert_same_dict({p.name: to_numpy(p) for p in net.get_parameters()}, values_by_name, "exact names")


def test_loading_reads_into_the_network_memory_it_already_has(saved):
    _, store = saved
    cell = train_cell(seed=99)
    before = {p.name: p.asnumpy() for p in cell.get_parameters() if p.dtype == ms.float32}
    ckptstore.load_into_net(cell, store)
    for p in cell.get_parameters():
        if p.name in before:  # same host buffer as before the load: read in place, not replaced
            assert np.shares_memory(before[p.name], p.asnumpy()), p.name


# ---- the compiled-network path: parameter_layout_dict as the parallel compiler fills it --------

def _compiled_net(t, rank: int):
    """A Cell whose Parameters have rank ``rank``'s slice shapes, with the ``parameter_layout_dict``
    the parallel compiler would give it for the target strategy (keyed by Parameter.name)."""
    from mindspore_nets import net_like

    target = ckptstore.checkpoint.strategy.load_strategy(t.target_file)
    expected = t.oracle(rank)
    net = net_like(expected)
    layout_dict = {}
    for name, st in target.layouts.items():
        layout = st[0]
        full = t.store.info(name).shape
        box = layout.box(rank % target.stage_devices, full)
        group = f"opt_group_{name}" if layout.opt_sharded else ""
        layout_dict[name] = [list(layout.dev_matrix), layout.pretty_map(), list(box.shape), 0, True, group,
                             list(full), list(box.shape)]
    net.parameter_layout_dict = layout_dict
    return net, expected


@pytest.mark.parametrize("case_id,rank", [("dp2_mp4->dp2_mp2", 3), ("opt_shard->dp2_mp2_optshard", 1),
                                          ("mixed_dtypes->dp2_mp2_optshard", 2)])
def test_a_compiled_network_loads_its_own_layout_without_a_strategy(load_env, case_id, rank):
    t = load_env.target(case_id)
    net, expected = _compiled_net(t, rank)
    assert ckptstore.load_into_net(net, t.store, rank=rank) == ([], [])
    from mindspore_nets import net_values

    assert_same_dict(net_values(net), expected, f"{case_id} rank {rank} from parameter_layout_dict")
