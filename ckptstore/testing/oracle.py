"""Conformance with MindSpore: what ``mindspore.transform_checkpoints`` gives, to compare against.

ckptstore's promise is that rank *j* of a target layout gets exactly the bytes MindSpore's own
``transform_checkpoints`` followed by ``load_checkpoint`` would give it. These helpers run that
route on the same files, so the promise can be checked on any checkpoint (the tests and
``make demo`` do; so can a user on their own layout, at the cost of MindSpore's full merge).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import ml_dtypes
import numpy as np


def _ms():
    """Import mindspore (quietly) and return the module."""
    os.environ.setdefault("GLOG_v", "3")
    import mindspore

    return mindspore


def _merge_stage_files(files: Sequence, workdir: Path) -> str:
    ms = _ms()
    files = [Path(f) for f in files]
    exts = {f.suffix for f in files}
    if len(exts) != 1:
        raise ValueError(f"stage strategy files must share one extension, got {exts}")
    ext = exts.pop()
    src_dir = workdir / "stages"
    src_dir.mkdir()
    for i, f in enumerate(files):
        # merge_pipeline_strategys globs "*.ckpt" / "*.json" in a directory
        shutil.copyfile(f, src_dir / f"stage_file{i}{ext if ext == '.json' else '.ckpt'}")
    merged = workdir / f"merged{'.json' if ext == '.json' else '.ckpt'}"
    ms.parallel.merge_pipeline_strategys(str(src_dir), str(merged))
    return str(merged)


def transform_oracle(src_root, src_strategy, dst_strategy, dst_root, *, prefix: str = "oracle_") -> Path:
    """Run ``mindspore.transform_checkpoints(src_root, dst_root, prefix, src, dst)``.

    ``src_strategy``/``dst_strategy`` are a file, or a list of per-stage files which are first
    merged with ``mindspore.parallel.merge_pipeline_strategys`` (into a temporary directory).
    ``dst_strategy=None`` merges to a single rank. MindSpore writes
    ``dst_root/rank_<j>/<prefix><j>.ckpt`` (mode 0400). Returns ``dst_root``.
    """
    ms = _ms()
    dst_root = Path(dst_root)
    with tempfile.TemporaryDirectory(prefix="ckptstore_oracle_") as tmp:
        tmp_path = Path(tmp)

        def resolve(strategy, tag):
            if strategy is None:
                return None
            if isinstance(strategy, (list, tuple)):
                sub = tmp_path / tag
                sub.mkdir()
                return _merge_stage_files(strategy, sub)
            return str(strategy)

        src = resolve(src_strategy, "src")
        dst = resolve(dst_strategy, "dst")
        ms.transform_checkpoints(str(src_root), str(dst_root), prefix, src, dst)
    return dst_root


def load_oracle(path) -> dict[str, np.ndarray]:
    """``mindspore.load_checkpoint(path)`` as numpy arrays of the original dtype.

    bfloat16 parameters come back as ``ml_dtypes.bfloat16`` arrays, bit-exact: MindSpore's
    ``asnumpy`` cannot return bfloat16 under numpy 2, so the tensor is cast to float32 inside
    MindSpore (exact) and then to ``ml_dtypes.bfloat16`` (exact for values that came from bf16).
    """
    ms = _ms()
    loaded = ms.load_checkpoint(str(path))
    out: dict[str, np.ndarray] = {}
    for name, param in loaded.items():
        if param.dtype == ms.bfloat16:
            f32 = param.astype(ms.float32).asnumpy()
            out[name] = f32.astype(ml_dtypes.bfloat16)
        else:
            out[name] = np.array(param.asnumpy(), copy=True)
    return out
