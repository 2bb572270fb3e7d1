"""The README's MindFormers recipe (issue 25.3): StoreCheckpoint in place of CheckpointMonitor.

Runs only where ``mindformers`` imports (it pins numpy < 2: its own venv, ``make venv-mf``). A tiny
``LlamaForCausalLM`` trains on CPU under ``Model.train`` with ``StoreCheckpoint`` built from a
MindFormers callback list (``{"type": "StoreCheckpoint", ...}``, as a yaml ``callbacks:`` entry
gives it); the store holds what MindFormers' resume reads (``loss_scale``, ``epoch_num``,
``step_num``, ``global_step``); MindFormers' own ``load_resume_context_from_checkpoint`` pointed at
an exported step sets the runner's initial step and epoch from it; and ``load_into_net`` resumes
the network, whose next saves go on numbering.

``MFTrainOneStepCell`` and ``TrainOneStepWithLossScaleCell`` run only on Ascend/GPU (their overflow
check is an NPU kernel), so the wrapper here is an ``nn.TrainOneStepCell`` that returns
``(loss, overflow, loss_scale)`` as they do, which is where ``CheckpointMonitor`` takes the scale.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindformers")
pytestmark = pytest.mark.mindspore

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Model

import ckptstore

APPEND = ["epoch_num", "step_num", "global_step", "loss_scale"]  # what CheckpointMonitor saves for resuming
BATCHES = 4  # batches of one epoch


class ScaledStep(nn.TrainOneStepCell):
    """``(loss, overflow, loss_scale)``, the outputs of MindFormers' training wrappers."""

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, scale: float) -> None:
        super().__init__(network, optimizer)
        self.scale = ms.Tensor(scale, ms.float32)

    def construct(self, *inputs):
        return super().construct(*inputs), ms.Tensor(False), self.scale


def tiny_llama(seed: int) -> ScaledStep:
    from mindformers import LlamaConfig, LlamaForCausalLM

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(seed)
    config = LlamaConfig(batch_size=1, seq_length=8, hidden_size=32, num_layers=1, num_heads=4, n_kv_heads=2,
                         intermediate_size=48, vocab_size=64, compute_dtype="float32",
                         layernorm_compute_type="float32", softmax_compute_type="float32", rotary_dtype="float32",
                         param_init_type="float32", use_rope_slice=True, use_flash_attention=False, use_past=False,
                         fused_rms_norm=False)
    net = LlamaForCausalLM(config)
    return ScaledStep(net, nn.AdamWeightDecay(net.trainable_params(), 1e-3), 1024.0)


def dataset() -> ds.Dataset:
    ids = np.random.default_rng(0).integers(0, 64, (BATCHES, 9)).astype(np.int32)
    return ds.NumpySlicesDataset({"input_ids": ids}, shuffle=False).batch(1)


def store_checkpoint(root) -> object:
    """StoreCheckpoint from a MindFormers callback list, as a yaml ``callbacks:`` entry names it."""
    from mindformers.core.callback import build_callback
    from mindformers.tools.register import MindFormerModuleType, MindFormerRegister

    if not MindFormerRegister.is_exist(MindFormerModuleType.CALLBACK, "StoreCheckpoint"):
        MindFormerRegister.register_cls(ckptstore.StoreCheckpoint, module_type=MindFormerModuleType.CALLBACK,
                                        alias="StoreCheckpoint")
    return build_callback({"type": "StoreCheckpoint", "root": str(root), "save_checkpoint_steps": 2,
                           "keep_checkpoint_max": 2, "append_info": APPEND})


def test_store_checkpoint_in_a_mindformers_job_saves_what_its_resume_reads_and_resumes_from_the_store(tmp_path):
    from mindformers import MindFormerConfig
    from mindformers.trainer.utils import load_resume_context_from_checkpoint

    root = tmp_path / "run"
    callback = store_checkpoint(root)
    assert type(callback) is ckptstore.StoreCheckpoint
    Model(tiny_llama(1)).train(1, dataset(), callbacks=[callback], dataset_sink_mode=False)
    store = ckptstore.open(root)
    assert store.source["step"] == 4
    assert {n: store.read(n).tolist() for n in APPEND} == {"epoch_num": 1, "step_num": 4, "global_step": [4],
                                                           "loss_scale": 1024.0}

    # MindFormers' own resume, pointed at the step exported as per-rank files
    ckptstore.export(root, tmp_path / "exported")
    config = MindFormerConfig(**{
        "checkpoint": {"load_path": str(tmp_path / "exported")}, "resume_training": True,
        "use_graceful_exit": False, "auto_trans_ckpt": False, "load_ckpt_format": "ckpt",
        "remove_redundancy": False, "runner_config": {"global_batch_size": 1, "sink_mode": False},
        "callbacks": [{"type": "StoreCheckpoint"}], "runner_wrapper": {"scale_sense": None}})
    load_resume_context_from_checkpoint(config, dataset())
    assert (config.runner_config.initial_step, config.runner_config.initial_epoch) == (4, 1)

    # the network and optimizer from the store; training goes on numbering from the optimizer's step
    resumed = tiny_llama(99)
    assert ckptstore.load_into_net(resumed, root) == ([], ["epoch_num", "step_num", "loss_scale"])  # the counters
    assert int(resumed.optimizer.global_step.asnumpy()[0]) == 4
    callback = store_checkpoint(root)
    Model(resumed).train(1, dataset(), callbacks=[callback], dataset_sink_mode=False)
    assert [s.step for s in callback.summaries] == [6, 8]
    assert sorted(p.name for p in root.iterdir()) == ["step_6", "step_8"]
    assert ckptstore.open(root).source["step"] == 8
