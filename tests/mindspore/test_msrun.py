"""Real msrun jobs on the CPU wheel (issue 25.4, 24.13): the lines the README gives work.

msrun runs a *script file* in every worker (``python <file> args``) and in a scheduler process
(``MS_ROLE=MS_SCHED``) that is no rank: ``msrun ... ckptstore convert`` fails ("can't open file
'.../ckptstore'"), ``msrun ... $(which ckptstore) convert ... --part auto`` converts in parts; a
``save_rank`` script without ``init()`` saves in the workers and does nothing in the scheduler, so
msrun exits 0. Each test starts a 2-worker msrun job (10-40 s here): slow tier.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("mindspore")
pytestmark = [pytest.mark.mindspore, pytest.mark.slow]

import ckptstore
import mindspore_fixtures as T
from convert_fixtures import assert_same_array
from msrun_helpers import VENV_BIN, msrun

SPECS = [T.ParamSpec("w", (8, 4), dev_matrix=(2,), tensor_map=(0, -1)),
         T.ParamSpec("emb", (6, 4), dev_matrix=(2,), tensor_map=(-1, -1))]


@pytest.fixture
def source(tmp_path: Path) -> tuple[Path, dict]:
    tensors = T.make_global_tensors(SPECS, seed=3)
    T.save_distributed(tmp_path / "ckpt", SPECS, tensors, world_size=2, stages=1)
    return tmp_path / "ckpt", tensors


def test_msrun_converts_in_parts_through_the_ckptstore_script_file(tmp_path, source):
    src, tensors = source
    ckptstore_script = shutil.which("ckptstore", path=str(VENV_BIN))
    code, logs = msrun(tmp_path, ckptstore_script, "convert", str(src), "-s", str(src / "strategy.ckpt"),
                       "--out", str(tmp_path / "out.zarr"), "--part", "auto")
    assert code == 0, "\n".join(logs.values())[-3000:]
    assert "takes no part" in logs["scheduler"]
    store = ckptstore.open(tmp_path / "out.zarr")
    for name, value in tensors.items():
        assert_same_array(store.read(name), value, name)


SAVE_WITHOUT_INIT = '''
import sys
import numpy as np
import ckptstore

rank = int(__import__("os").environ["RANK_ID"])
rows = np.arange(32, dtype=np.float32).reshape(8, 4)[rank * 4:(rank + 1) * 4]
summary = ckptstore.save_rank({"w": rows}, sys.argv[1], step=5, strategy=sys.argv[2])  # rank from RANK_ID
print("SAVED", summary.rank, summary.committed, flush=True)
'''


def test_a_save_rank_script_without_init_saves_in_the_workers_and_nothing_in_the_scheduler(tmp_path, source):
    src, _ = source
    (tmp_path / "job.py").write_text(SAVE_WITHOUT_INIT)
    code, logs = msrun(tmp_path, str(tmp_path / "job.py"), str(tmp_path / "run"), str(src / "strategy.ckpt"))
    assert code == 0, "\n".join(logs.values())[-3000:]
    assert [line for line in logs["scheduler"].splitlines() if "ckptstore" in line or "SAVED" in line] == [
        f"ckptstore: not saving {tmp_path / 'run' / 'step_5'} in msrun's scheduler process (MS_ROLE=MS_SCHED), which "
        "is no rank of the job; the worker processes save it", "SAVED -1 False"]
    saved = sorted(line.split()[1:] for name in ("worker_0", "worker_1") for line in logs[name].splitlines()
                   if line.startswith("SAVED"))
    assert [s[0] for s in saved] == ["0", "1"] and sorted(s[1] for s in saved) == ["False", "True"]
    assert_same_array(ckptstore.open(tmp_path / "run").read("w"), __import__("numpy").arange(32, dtype="float32")
                      .reshape(8, 4), "w")


SAVE_WITH_INIT = '''
import os, sys
import numpy as np
from mindspore.communication import init

init()
if os.environ.get("MS_ROLE") == "MS_SCHED":
    sys.exit(0)
import ckptstore
from mindspore.communication import get_rank

rows = np.arange(32, dtype=np.float32).reshape(8, 4)[get_rank() * 4:(get_rank() + 1) * 4]
summary = ckptstore.save_rank({"w": rows}, sys.argv[1], step=5, strategy=sys.argv[2])  # rank=None
print("SAVED", summary.rank, summary.committed, flush=True)
'''


def test_initialised_communication_decides_where_launcher_variables_disagree(tmp_path, source):
    src, _ = source
    (tmp_path / "job.py").write_text(SAVE_WITH_INIT)
    stale = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}  # worker 0 has RANK_ID=0: they disagree
    code, logs = msrun(tmp_path, str(tmp_path / "job.py"), str(tmp_path / "run"), str(src / "strategy.ckpt"),
                       env=stale)
    assert code == 0, "\n".join(logs.values())[-3000:]
    saved = sorted(line.split()[1] for name in ("worker_0", "worker_1") for line in logs[name].splitlines()
                   if line.startswith("SAVED"))
    assert saved == ["0", "1"]
    assert ckptstore.open(tmp_path / "run").source["step"] == 5


SAVE_ONE_RANK = '''
import os, sys
import numpy as np
import ckptstore

rank = int(os.environ["RANK_ID"])
if os.environ.get("MS_ROLE") == "MS_WORKER" and rank == int(sys.argv[3]):  # the other rank dies before it saves
    value = float(sys.argv[4])
    summary = ckptstore.save_rank({"w": np.full((4, 4), value, np.float32)}, sys.argv[1], step=7,
                                  strategy=sys.argv[2])
    print("SAVED", summary.rank, summary.committed, flush=True)
'''


def test_two_msrun_launches_without_init_never_mix_in_one_step(tmp_path, source):
    """Issue 24.1/24.2 under msrun without init(): launch A saves rank 0 of step 7 and dies; launch B
    (other values) saves rank 1. Each launch is its own attempt (its msrun process), so B's rank 1
    starts the step over instead of committing A's rank 0 with its own rank 1."""
    src, _ = source
    (tmp_path / "job.py").write_text(SAVE_ONE_RANK)
    run, strategy = str(tmp_path / "run"), str(src / "strategy.ckpt")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert msrun(tmp_path / "a", str(tmp_path / "job.py"), run, strategy, "0", "1")[0] == 0
    code, logs = msrun(tmp_path / "b", str(tmp_path / "job.py"), run, strategy, "1", "2")
    assert code == 0, "\n".join(logs.values())[-3000:]
    assert [line for line in logs["worker_1"].splitlines() if line.startswith("SAVED")] == ["SAVED 1 False"]
    assert sorted(p.name for p in (tmp_path / "run" / "step_7" / ".ckptstore-work" / "parts").iterdir()) == ["1-of-2"]
