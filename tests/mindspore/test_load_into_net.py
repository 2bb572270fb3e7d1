"""``ckptstore.load_into_net``: a real ``mindspore.nn.Cell`` gets one target rank's slices, equal to
what ``mindspore.load_param_into_net`` sets from MindSpore's resharded checkpoint, and returns
the same ``(param_not_load, ckpt_not_load)``.

The parallel compiler does not run on the CPU wheel, so the networks here are plain Cells whose
Parameters have the target rank's slice shapes (what compiling with the target strategy would
give them) and the target strategy is passed explicitly.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

pytest.importorskip("mindspore")
pytestmark = pytest.mark.mindspore

import mindspore
from mindspore import Parameter, Tensor, nn
from mindspore.nn.utils import no_init_parameters

import ckptstore
from ckptstore.errors import InvalidOptionError, LayoutMismatchError
from load_fixtures import assert_same_dict, to_numpy
from mindspore_nets import TreeNet, net_like, net_values


@pytest.mark.parametrize("case_id,rank", [("dp2_mp4->dp2_mp2", 2), ("opt_shard->dp2_mp2_optshard", 1),
                                          ("pipeline2->1stage", 3), ("mixed_dtypes->dp2_mp2_optshard", 0)])
def test_load_into_net_sets_the_target_rank_values(load_env, case_id, rank):
    t = load_env.target(case_id)
    expected = t.oracle(rank)
    net = net_like(expected)
    result = ckptstore.load_into_net(net, t.store, strategy=t.strategy, rank=rank)
    assert result == ([], [])
    assert_same_dict(net_values(net), expected, f"{case_id} rank {rank}")


def test_returns_what_load_param_into_net_returns(load_env):
    t = load_env.target("dp2_mp4->dp2_mp2")
    oracle = t.oracle(1)

    def skip(n: str) -> bool:
        return n.startswith("adam_")

    extra = {"extra.w": ((3, 2), np.dtype(np.float32))}
    net = net_like(oracle, skip, extra)
    param_not_load, ckpt_not_load = ckptstore.load_into_net(net, t.store, strategy=t.target_file, rank=1)
    assert param_not_load == ["extra.w"]
    assert ckpt_not_load == [n for n in t.store.names() if skip(n)]
    assert_same_dict({n: v for n, v in net_values(net).items() if n != "extra.w"},
                     {n: v for n, v in oracle.items() if not skip(n)}, "rank 1")
    assert not net_values(net)["extra.w"].any()  # untouched

    ms_net = net_like(oracle, skip, extra)
    ms_result = mindspore.load_param_into_net(ms_net, mindspore.load_checkpoint(str(t.oracle_file(1))))
    assert (param_not_load, sorted(ckpt_not_load)) == (list(ms_result[0]), sorted(ms_result[1]))
    assert_same_dict(net_values(net), net_values(ms_net), "ckptstore vs load_param_into_net")


def test_strict_raises_for_a_network_parameter_missing_from_the_store(load_env):
    t = load_env.target("dp2_mp4->dp2_mp2")
    net = net_like(t.oracle(0), extra={"extra.w": ((3, 2), np.dtype(np.float32))})
    with pytest.raises(LayoutMismatchError, match=r"1 network parameters are not in the store .*: extra\.w"):
        ckptstore.load_into_net(net, t.store, strategy=t.strategy, rank=0, strict=True)


def test_a_network_parameter_of_the_wrong_shape_raises_naming_it(load_env):
    t = load_env.target("dp2_mp4->dp2_mp2")
    shapes = {n: (a.shape, a.dtype) for n, a in t.oracle(0).items()}
    shapes["layer1.w"] = ((16, 8), np.dtype(np.float32))  # the target holds (16, 16)
    net = TreeNet(shapes)
    with pytest.raises(LayoutMismatchError,
                       match=r"parameter 'layer1\.w': the network expects shape \[16, 8\] but rank 0 of the target "
                             r"layout holds \[16, 16\] of the global \[16, 32\]"):
        ckptstore.load_into_net(net, t.store, strategy=t.strategy, rank=0)


def test_without_a_strategy_an_uncompiled_net_gets_whole_tensors(load_env):
    t = load_env.target("opt_shard->1rank")
    expected = t.oracle(0)
    net = net_like(expected)
    assert ckptstore.load_into_net(net, t.store_path) == ([], [])
    assert_same_dict(net_values(net), expected, "whole")


def test_without_a_strategy_a_net_of_slice_shapes_raises(load_env):
    t = load_env.target("dp2_mp4->dp2_mp2")
    net = net_like(t.oracle(0))
    with pytest.raises(LayoutMismatchError, match=r"parameter 'layer0\.w': the network expects shape \[16, 16\]"):
        ckptstore.load_into_net(net, t.store, rank=0)


@pytest.mark.parametrize("rank_id", ["3", "1"], ids=["RANK_ID=3", "RANK_ID=1"])
def test_rank_defaults_to_the_rank_id_environment_variable(load_env, monkeypatch, rank_id):
    t = load_env.target("dp2_mp4->dp2_mp2")
    monkeypatch.setenv("RANK_ID", rank_id)
    expected = t.oracle(int(rank_id))
    net = net_like(expected)
    assert ckptstore.load_into_net(net, t.store, strategy=t.strategy) == ([], [])
    assert_same_dict(net_values(net), expected, f"RANK_ID={rank_id}")


def test_without_rank_id_a_layout_of_several_ranks_asks_which_rank(load_env, monkeypatch):
    t = load_env.target("dp2_mp4->dp2_mp2")
    for var in ("RANK_ID", "OMPI_COMM_WORLD_RANK", "MS_ROLE"):
        monkeypatch.delenv(var, raising=False)
    net = net_like(t.oracle(0))
    with pytest.raises(InvalidOptionError, match="which rank of the 4-rank target layout is this process"):
        ckptstore.load_into_net(net, t.store, strategy=t.strategy)
    assert not any(net_values(net)["layer0.w"].ravel())  # nothing loaded


@pytest.mark.parametrize("rank_id", ["3", "0"])
def test_a_data_parallel_job_loads_whole_tensors_on_every_rank(load_env, monkeypatch, rank_id):
    t = load_env.target("dp2_mp4->1rank")  # an uncompiled network: pure data parallel, one-rank layout
    monkeypatch.setenv("RANK_ID", rank_id)
    monkeypatch.setenv("RANK_SIZE", "4")
    net = net_like(t.oracle(0))
    assert ckptstore.load_into_net(net, t.store_path) == ([], [])
    assert_same_dict(net_values(net), t.oracle(0), f"RANK_ID={rank_id}")


def test_verify_and_dtype_pass_through(load_env):
    t = load_env.target("dp2_mp4->dp2_mp2")
    expected = {n: a.astype(np.float16) for n, a in t.oracle(3).items() if a.dtype == np.float32}
    net = net_like(expected)
    result = ckptstore.load_into_net(net, t.store, strategy=t.strategy, rank=3, dtype=mindspore.float16,
                                     verify=True)
    assert result == ([], ["global_step", "epoch_num", "step_num"])
    assert_same_dict(net_values(net), expected, "float16")


# ---- one-element values and 0-d parameters (issue 25.6) --------------------------------------


class _Scalars(nn.Cell):
    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        super().__init__()
        self.values = mindspore.ParameterTuple(Parameter(Tensor(np.zeros(s, np.float32)), name=n)
                                               for n, s in shapes.items())


@pytest.mark.parametrize("stored,net", [((1,), ()), ((), (1,)), ((4, 1), (4,))],
                         ids=["[1]->[]", "[]->[1]", "[4,1]->[4]"])
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "set_data"])
def test_a_value_that_differs_only_by_trailing_ones_loads_into_the_parameters_own_shape(tmp_path, stored, net,
                                                                                        in_place):
    value = np.arange(1, 1 + int(np.prod(stored)), dtype=np.float32).reshape(stored)
    mindspore.save_checkpoint([{"name": "learning_rate", "data": Tensor(value)}], str(tmp_path / "lr.ckpt"))
    ckptstore.convert(tmp_path / "lr.ckpt", tmp_path / "store")
    cell = _Scalars({"learning_rate": net})
    if not in_place:  # a Parameter without host memory yet takes its data by set_data
        with no_init_parameters():
            cell = _Scalars({"learning_rate": net})
    assert ckptstore.load_into_net(cell, tmp_path / "store") == ([], [])
    loaded = cell.values[0]
    assert tuple(loaded.shape) == net and np.array_equal(to_numpy(loaded), value.reshape(net))


def test_a_real_layout_mismatch_still_asks_for_the_strategy(tmp_path):
    mindspore.save_checkpoint([{"name": "w", "data": Tensor(np.ones((4, 2), np.float32))}], str(tmp_path / "w.ckpt"))
    ckptstore.convert(tmp_path / "w.ckpt", tmp_path / "store")
    with pytest.raises(LayoutMismatchError, match=r"parameter 'w': the network expects shape \[8\] but .* holds "
                                                  r"\[4, 2\].*pass the strategy file the network was compiled with"):
        ckptstore.load_into_net(_Scalars({"w": (8,)}), tmp_path / "store")


def test_printing_a_load_plan_says_params_bytes_and_requests_in_one_line(load_env):
    t = load_env.target("dp2_mp4->dp2_mp2")
    plan = ckptstore.load_rank(t.store_path, t.strategy, 1).plan
    assert repr(plan) == (f"<ReadPlan {len(plan.params)} params: {plan.nbytes:,} bytes in {plan.requests} requests "
                          f"from {len(plan.files)} files>")
    assert "\n" not in str(plan)
    one = next(iter(plan.params.values()))
    assert repr(one).startswith(f"<ParamReadPlan {one.name!r} ") and "array(" not in repr(one)


def test_load_into_net_is_quiet_by_default_and_shows_progress_when_asked(load_env, capsys):
    t = load_env.target("opt_shard->1rank")
    ckptstore.load_into_net(net_like(t.oracle(0)), t.store_path)
    assert capsys.readouterr().err == ""
    ckptstore.load_into_net(net_like(t.oracle(0)), t.store_path, quiet=False)
    last = [line for line in capsys.readouterr().err.splitlines() if line][-1]
    assert last.startswith("load_into_net rank 0: ") and last.endswith(" MiB/s (100%)"), last
