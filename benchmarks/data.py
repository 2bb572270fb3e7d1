"""Seeded synthetic single-file ``.ckpt`` checkpoints, written by MindSpore and cached on disk.

A file of a given size holds a few big float32 matrices (the bulk of the bytes, like a model's
weight matrices) interleaved with many small float32 vectors (biases, norms, scalars-ish), so a
scanner sees thousands of records and a loader sees large payloads.

Every byte is written by ``mindspore.save_checkpoint``, but one part at a time (one big tensor,
or one group of small ones) into a temporary file that is appended to the output. A ``.ckpt``
without a CRC trailer is just the concatenation of its parameters' records, so the result is the
file a single ``save_checkpoint`` call on the whole list would write, while peak memory stays at
one big tensor (and MindSpore's two transient copies of it) instead of three copies of the model.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from math import prod
from pathlib import Path

import numpy as np

CACHE_DIR = Path(__file__).resolve().parent / "cache"
#: Bump when the layout or the values change, so stale cached files are not reused.
GENERATOR_VERSION = 1
_SMALL_MIN, _SMALL_MAX = 64, 16384  # elements: 256 B .. 64 KiB per small tensor
_BIG_COLS = 1024
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


@dataclass(frozen=True)
class TensorSpec:
    """One float32 parameter of a synthetic checkpoint, in file order."""

    name: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * 4


def parse_size(text: str) -> int:
    """``"1GB"`` -> 10**9, ``"512MiB"`` -> 2**29, ``"1.5GB"`` -> 1.5e9 (SI and binary units)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"cannot read size {text!r}; write e.g. 1GB, 512MiB or 1000000")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def synthetic_layout(total_bytes: int, seed: int = 0, *, n_big: int = 5, n_small: int = 2000) -> list[TensorSpec]:
    """The parameters of a synthetic checkpoint of about ``total_bytes`` payload bytes, in file order.

    ``n_small`` tensors of 256 B–64 KiB (fewer for small totals, so they stay ~5% of the bytes)
    in ``n_big + 1`` groups, with one ``(rows, 1024)`` matrix between consecutive groups; the
    matrices share the remaining bytes equally. Deterministic in ``(total_bytes, seed)``.
    """
    rng = np.random.default_rng([seed, GENERATOR_VERSION, 0])
    n_small = max(n_big + 1, min(n_small, total_bytes // 20 // ((_SMALL_MIN + _SMALL_MAX) * 2)))
    small_sizes = rng.integers(_SMALL_MIN, _SMALL_MAX + 1, size=n_small)
    big_bytes = max(total_bytes - int(small_sizes.sum()) * 4, n_big * _BIG_COLS * 4)
    rows = big_bytes // n_big // (_BIG_COLS * 4)
    groups = np.array_split(small_sizes, n_big + 1)
    layout: list[TensorSpec] = []
    for g, group in enumerate(groups):
        layout += [TensorSpec(f"layers.{g}.param_{j:04d}", (int(k),)) for j, k in enumerate(group)]
        if g < n_big:
            layout.append(TensorSpec(f"layers.{g}.mlp.weight", (int(rows), _BIG_COLS)))
    return layout


def mid_file_tensor(layout: list[TensorSpec]) -> TensorSpec:
    """The big matrix whose bytes lie nearest the middle of the file."""
    total = sum(t.nbytes for t in layout)
    best, best_dist, at = layout[0], float("inf"), 0
    for t in layout:
        dist = abs(at + t.nbytes / 2 - total / 2)
        if len(t.shape) == 2 and dist < best_dist:
            best, best_dist = t, dist
        at += t.nbytes
    return best


def synthetic_ckpt(total_bytes: int, seed: int = 0, *, cache_dir: Path = CACHE_DIR) -> Path:
    """Path of the cached synthetic checkpoint for ``(total_bytes, seed)``, writing it if missing."""
    path = Path(cache_dir) / f"synthetic-v{GENERATOR_VERSION}-{total_bytes}B-seed{seed}.ckpt"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_synthetic(path, synthetic_layout(total_bytes, seed), seed)
    return path


def _parts(layout: list[TensorSpec]) -> list[list[TensorSpec]]:
    """Consecutive small tensors together, each big tensor alone: one save_checkpoint call each."""
    parts: list[list[TensorSpec]] = []
    for t in layout:
        if len(t.shape) == 2 or not parts or len(parts[-1][0].shape) == 2:
            parts.append([t])
        else:
            parts[-1].append(t)
    return parts


def _write_synthetic(path: Path, layout: list[TensorSpec], seed: int) -> None:
    os.environ.setdefault("GLOG_v", "3")
    import mindspore as ms  # imported here: only generating a file needs it

    partial = path.with_name(path.name + ".partial")
    with tempfile.TemporaryDirectory(prefix="synthetic_", dir=path.parent) as tmp, open(partial, "wb") as out:
        for i, part in enumerate(_parts(layout)):
            rng = np.random.default_rng([seed, GENERATOR_VERSION, 1, i])
            items = [{"name": t.name, "data": ms.Tensor.from_numpy(rng.standard_normal(t.shape, np.float32))}
                     for t in part]
            piece = os.path.join(tmp, f"part{i}.ckpt")
            ms.save_checkpoint(items, piece)
            del items  # free this part's arrays before the next part is generated
            with open(piece, "rb") as f:
                shutil.copyfileobj(f, out, 16 << 20)
            os.remove(piece)
    os.replace(partial, path)  # only a complete file ever has the cache name
