"""A 2-rank msrun resume from a root whose newest step is damaged in rank 1's chunks only: both
ranks agree (one all-reduce a round) and load the step before, each saying so in one line
(issue 35, item 2). One msrun job (10-40 s here): slow tier."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")
pytestmark = [pytest.mark.mindspore, pytest.mark.slow]

from test_fallback import TWO, _chunk_of, _flip, _save_steps, _values

import ckptstore
from msrun_helpers import msrun

RESUME = '''
import os, sys
import numpy as np
from mindspore.communication import init

init()
if os.environ.get("MS_ROLE") == "MS_SCHED":
    sys.exit(0)
import mindspore as ms
from mindspore import nn
import ckptstore
from ckptstore.checkpoint.layout import Layout
from ckptstore.checkpoint.strategy import Strategy
from mindspore.communication import get_rank

two = Strategy({"w": {0: Layout((2,), ((0,), ()))}}, stage_devices=2)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = ms.Parameter(ms.Tensor(np.zeros((2, 4), np.float32)), name="w")
        self.b = ms.Parameter(ms.Tensor(np.zeros(3, np.float32)), name="b")


net = Net()
step = ckptstore.StoreCheckpoint(sys.argv[1], strategy=two).resume(net)
print("RESUMED", get_rank(), step, net.w.asnumpy().tobytes().hex(), net.b.asnumpy().tobytes().hex(), flush=True)
'''


def test_both_ranks_of_an_msrun_resume_fall_back_together_when_only_rank_1s_chunk_is_damaged(tmp_path):
    root = tmp_path / "run"
    _save_steps(root)
    _flip(_chunk_of(root, 2, "w", 1))
    (tmp_path / "job.py").write_text(RESUME)
    code, logs = msrun(tmp_path, str(tmp_path / "job.py"), str(root))
    assert code == 0, "\n".join(logs.values())[-3000:]
    for rank in (0, 1):
        log = logs[f"worker_{rank}"]
        (resumed,) = [line.split() for line in log.splitlines() if line.startswith("RESUMED")]
        want = _values(1, rank)
        assert resumed == ["RESUMED", str(rank), "1", want["w"].tobytes().hex(), want["b"].tobytes().hex()]
        (line,) = [x for x in log.splitlines() if "failed verification" in x]
        why = "another rank of the job found damage" if rank == 0 else "parameter 'w': chunk 1: checksum mismatch"
        assert f"loading step 1, not the newer committed step(s) that failed verification: step 2: {why}" in line
    assert not (root / "step_2").exists()  # rank 0 removed the damaged step: the job's next save may take it
    with ckptstore.open(root) as store:
        assert store.step == 1 and store.read("b").tobytes() == np.full(3, 1, np.float32).tobytes()
    assert TWO.world_size == 2
