"""Make tests/data/bf16_safetensors: MindSpore safetensors rank files holding bfloat16 slices.

MindSpore's safetensors writer fails for bfloat16 under numpy 2 (its numpy bfloat16 type needs
the numpy 1.x it was built with), so this is run once in an environment with ``numpy<2`` and
MindSpore, and its output is committed (a few KiB)::

    python -m venv /tmp/np1 && /tmp/np1/bin/pip install "numpy<2" mindspore==2.10.0 ml_dtypes safetensors
    PYTHONPATH=.:tests /tmp/np1/bin/python tests/data/make_bf16_safetensors.py

The slices are cut by MindSpore's own slicing code and saved by
``mindspore.save_checkpoint(..., format="safetensors")``; ``global.npz`` holds the global tensors
(bfloat16 as their raw uint16 bits) that the test compares the converted store with.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

os.environ.setdefault("GLOG_v", "3")

import mindspore_fixtures as T

OUT = Path(__file__).resolve().parent / "bf16_safetensors"


def main() -> None:
    assert np.__version__.startswith("1."), f"run this with numpy < 2 (found {np.__version__})"
    specs, world, stages = T.layout_specs("mixed_dtypes")
    keep = {"bf16.w", "bf16.opt", "bf16.norm", "bf16.scale", "fp16.w", "i8.table"}
    specs = [s for s in specs if s.name in keep]
    tensors = T.make_global_tensors(specs, seed=21)
    shutil.rmtree(OUT, ignore_errors=True)
    T.save_distributed(OUT, specs, tensors, world_size=world, stages=stages, fmt="safetensors")
    np.savez(OUT / "global.npz", **{n: a.view(np.uint16) if a.dtype.name == "bfloat16" else a
                                    for n, a in tensors.items()})
    print(f"wrote {OUT}: {sorted(p.name for p in OUT.rglob('*') if p.is_file())}")


if __name__ == "__main__":
    main()
