"""Other dtypes for the peers comparison: the synthetic checkpoint with bfloat16 tensors.

:func:`benchmarks.synth.synth` writes fp32 checkpoints; :func:`dtype_synth` writes the same
PanGu-shaped model with every float32 tensor stored as ``dtype`` instead (sized for that
dtype), through the same grouped MindSpore writer, in its own cache directory. The ckptstore
contender's values are then MindSpore Parameters of bfloat16, which ``Parameter.asnumpy()``
cannot return under numpy 2, so :func:`check_load_rank` digests them through float32 (exact).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks import synth as synth_mod
from benchmarks.synth import Mesh, Synth


@dataclasses.dataclass(frozen=True)
class DtypeSynth(Synth):
    """A :class:`~benchmarks.synth.Synth` whose float32 tensors are stored as ``dtype``."""

    dtype: str = "bfloat16"

    @property
    def specs(self) -> list[Any]:
        return [dataclasses.replace(s, dtype=self.dtype) if s.dtype == "float32" else s
                for s in synth_mod.specs_for(self.dims, self.src)]


def dtype_synth(size: int, src: Mesh, seed: int = 0, *, dtype: str = "bfloat16",
                cache_dir: Path = synth_mod.CACHE_DIR) -> Synth:
    """The cached checkpoint of about ``size`` bytes of ``dtype`` tensors on ``src``, written on first use."""
    if dtype == "float32":
        return synth_mod.synth(size, src, seed, cache_dir=cache_dir)
    import ml_dtypes
    import numpy as np

    dims = synth_mod.choose_dims(size, itemsize=np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype).itemsize)
    root = Path(cache_dir) / f"pangu-v{synth_mod.GENERATOR_VERSION}-{size}B-{src.tag}-seed{seed}-{dtype}"
    s = DtypeSynth(root, size, src, seed, dims, dtype)
    if not (root / "ckpt" / "DONE").exists():
        synth_mod._write_source(s)  # the grouped writer works for any Synth
    return s


def ckptstore_load_rank(store: str, strategy: str, rank: int, names_file: str,
                        workers: int | None = None) -> dict[str, Any]:
    """``benchmarks.contenders.ckptstore_load_rank`` (every Parameter built), any dtype."""
    from benchmarks.contenders import ckptstore_load_rank as load

    return load(store, strategy, rank, names_file, workers=workers)


def check_load_rank(out: Mapping[str, Any], **args: Any) -> dict[str, Any]:
    """Digest of MindSpore Parameters of any dtype (bfloat16 through an exact float32 cast)."""
    import mindspore as ms
    import ml_dtypes

    from benchmarks.contenders import check_params

    arrays = {}
    for name, p in out.items():
        if isinstance(p, str):
            continue
        if p.dtype == ms.bfloat16:
            arrays[name] = p.astype(ms.float32).asnumpy().astype(ml_dtypes.bfloat16)
        else:
            arrays[name] = p.asnumpy()
    return check_params(arrays, **args)
