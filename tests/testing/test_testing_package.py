"""ckptstore.testing without MindSpore: importing the sample writer, the oracle, the sample
layouts and the conformance classes does not import MindSpore, and the sample values are
distinct and deterministic. Runs in ``make test-pure``; that the samples are real MindSpore
checkpoints is test_sample_checkpoint.py."""
from __future__ import annotations

import subprocess
import sys

import numpy as np

import mindspore_fixtures as T


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_import_does_not_import_mindspore():
    modules = ["sample_checkpoint", "oracle", "layouts", "compare", "kill_at", "store_kind_tests", "source_tests",
               "sink_tests"]
    code = f"import sys, {', '.join('ckptstore.testing.' + m for m in modules)}; print('mindspore' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_make_global_tensors_distinct_and_deterministic():
    specs, _, _ = T.layout_specs("mixed_dtypes")
    a = T.make_global_tensors(specs, seed=5)
    b = T.make_global_tensors(specs, seed=5)
    c = T.make_global_tensors(specs, seed=6)
    for s in specs:
        assert _same(a[s.name], b[s.name])
        assert a[s.name].dtype == s.np_dtype and a[s.name].shape == s.shape
        if s.dtype != "bool" and a[s.name].size > 1:
            assert not _same(a[s.name], c[s.name])
        if s.dtype != "bool":
            flat = a[s.name].reshape(-1)
            assert len(np.unique(flat.view(f"u{flat.dtype.itemsize}"))) == flat.size, s.name
    bf = a["bf16.w"].astype(np.float32)
    assert np.isfinite(bf).all()

