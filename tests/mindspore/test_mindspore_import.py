"""Planning and reading a rank as numpy never import MindSpore (issue 37 item 19): only
``load_rank`` / ``load_into_net`` pay its import (1.1-3.0 s here), which the README says where it
shows load times. Run in a fresh interpreter, so nothing else has imported it first."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import ckptstore
from ckptstore.testing.sample_checkpoint import ParamSpec, write_strategy_json
from repo_paths import REPO


@pytest.mark.slow  # a fresh interpreter: nothing imported MindSpore before
def test_plan_and_read_rank_of_a_store_do_not_import_mindspore(tmp_path):
    weight = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    ckptstore.save_rank({"w": weight, "b": np.ones(32, np.float32)}, tmp_path / "run", step=1)
    specs = [ParamSpec("w", (64, 32), dev_matrix=(2,), tensor_map=(0, -1)),
             ParamSpec("b", (32,), dev_matrix=(2,), tensor_map=(-1,))]
    strategy = write_strategy_json(tmp_path / "tp2.json", specs)
    script = (f"import sys, ckptstore\n"
              f"plan = ckptstore.plan_rank({str(tmp_path / 'run')!r}, {str(strategy)!r}, rank=1)\n"
              f"got = ckptstore.read_rank({str(tmp_path / 'run')!r}, {str(strategy)!r}, rank=1)\n"
              f"print(plan.nbytes, sorted(got), got['w'][0, 0])\n"
              "print(sorted(m for m in sys.modules if m == 'mindspore' or m.startswith('mindspore.')))\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{32 * 32 * 4 + 32 * 4} ['b', 'w'] {32 * 32}.0\n[]\n"
