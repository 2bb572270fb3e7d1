"""Fixture machinery of the benchmarks, which otherwise drive ckptstore through its public API only
(``tests/benchmarks/test_benchmarks_public_api.py``): what building their inputs needs of ckptstore's
internals lives here, one of the modules that test allow-lists (with ``index_profile`` and
``load_profile``), and the quick benchmark runs of the test suite
(``tests/benchmarks/test_benchmarks_quick.py``) keep it working.
It serves only the benchmarks, so it is not part of the installed package.

* :func:`rank_tensors`: name, local shape, dtype and "in the strategy" of every tensor a target
  rank holds (what a network built for the target layout declares; the peers' state dicts and the
  lower bound's flat file are built from it);
* :func:`read_rank_file` and :func:`load_layouts`: a MindSpore rank file's tensors as numpy arrays
  and a strategy file's layouts (the peers re-save the same slices as DTensors / jax arrays);
  :class:`Box` is the box type their translation is checked with;
* a writer of *sparse* MindSpore rank files (:func:`rank_records`, :func:`write_sparse_file`,
  :func:`check_wire_format`): every record header as ``mindspore.save_checkpoint`` writes it, the
  payloads left as holes, so a 130B-shaped checkpoint on 128 ranks costs a few MB of disk.

Nothing here imports MindSpore at import time.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from ckptstore.boxes import Box
from ckptstore.formats.ckpt_writer import record_header

__all__ = ["Box", "MINDSPORE_SLICE_BYTES", "check_wire_format", "load_layouts", "rank_records", "rank_tensors",
           "read_rank_file", "record_header", "records_of", "write_sparse_file"]


def rank_tensors(store: Any, strategy: Any, rank: int) -> list[list[Any]]:
    """``[name, local shape, dtype name, in_strategy]`` of every tensor (text values left out) rank
    ``rank`` of ``strategy`` holds in ``store``, in store order: what ``ckptstore.read_rank`` returns
    for that rank, worked out without reading a payload byte."""
    from ckptstore.checkpoint.strategy import load_strategy
    from ckptstore.read.loader import rank_view
    from ckptstore.store.store import as_store

    st = as_store(store)
    view = rank_view(st, strategy, rank)
    target = load_strategy(strategy)
    rows = []
    for name in view.names():
        if st.info(name).is_str:
            continue
        plan = view.plan_for(name)
        rows.append([name, [int(n) for n in plan.shape], np.dtype(plan.dtype).name, name in target.layouts])
    return rows


def read_rank_file(path: str | os.PathLike[str], *, in_memory: bool = True) -> dict[str, np.ndarray]:
    """The tensors of one MindSpore ``.ckpt`` rank file, by name, in file order (text values left out).

    ``in_memory=False`` returns tensors stored in one record as private copy-on-write maps of
    the file (nothing read up front); others are read into their own memory."""
    from ckptstore.formats.ckpt_reader import read_entry, scan_checkpoint

    index = scan_checkpoint(path)
    out: dict[str, np.ndarray] = {}
    for name in index.names():
        entry = index[name]
        if entry.is_str:
            continue
        if not in_memory and len(entry.pieces) == 1 and entry.nbytes:
            out[name] = np.memmap(path, dtype=entry.dtype, mode="c", offset=entry.pieces[0][0], shape=entry.shape)
        else:
            out[name] = np.asarray(read_entry(path, entry))
    return out


def load_layouts(strategy: Any) -> Any:
    """A strategy file (or files) read: ``.world_size``, ``.layouts[name]`` (one layout per pipeline
    stage, each with ``dev_matrix``, ``tensor_map``, ``device_count``, ``global_shape(local)`` and
    ``box(rank, global_shape)``)."""
    from ckptstore.checkpoint.strategy import load_strategy

    return load_strategy(strategy)


# ---------------------------------------------------------------------------------------------
# sparse rank files: the wire format's record headers, payloads skipped


def _mindspore_slice_bytes() -> int:
    from ckptstore.formats.ckpt_writer import DEFAULT_SLICE_BYTES

    return int(DEFAULT_SLICE_BYTES)


#: The bytes of one record MindSpore writes at most (``_write_parameter_bytes_data``): a longer
#: tensor is cut into several consecutive records.
MINDSPORE_SLICE_BYTES = _mindspore_slice_bytes()


def records_of(name: str, shape: Sequence[int], tensor_type: str, nbytes: int,
               slice_bytes: int) -> list[tuple[bytes, int]]:
    """``(header, payload bytes)`` of each record MindSpore writes for one local tensor: one per
    ``slice_bytes`` of its bytes (``_write_parameter_bytes_data``), the full dims in each."""
    sizes = [min(slice_bytes, nbytes - start) for start in range(0, max(nbytes, 1), slice_bytes)]
    return [(record_header(name, shape, tensor_type, n), n) for n in sizes]


def write_sparse_file(path: str | os.PathLike[str], records: Sequence[tuple[bytes, int]]) -> int:
    """Write each record's header, seek past its payload; truncate to the full size. Returns the size."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pos = 0
        for header, payload in records:
            os.pwrite(fd, header, pos)
            pos += len(header) + payload
        os.ftruncate(fd, pos)
    finally:
        os.close(fd)
    return pos


def rank_records(specs: Sequence[Any], strategy: Any, rank: int, slice_bytes: int = MINDSPORE_SLICE_BYTES,
                 boxes: dict[tuple[Any, ...], tuple[int, ...]] | None = None) -> list[tuple[bytes, int]]:
    """Every record of rank ``rank``'s file, in spec order: local shape = the strategy's box for the
    rank (whole tensor for parameters the strategy does not list), tensor type from the dtype.

    ``strategy`` is a strategy file or what :func:`load_layouts` returned (read once for many
    ranks); ``boxes`` a cache shared between calls (many parameters share a layout and a shape)."""
    from ckptstore.dtypes import mindspore_name

    strategy = load_layouts(strategy) if isinstance(strategy, (str, os.PathLike)) else strategy
    boxes = {} if boxes is None else boxes
    out: list[tuple[bytes, int]] = []
    for s in specs:
        if s.in_strategy:
            layout = strategy.layout(s.name, rank)
            key = (layout, tuple(s.shape), rank)
            shape = boxes.get(key)
            if shape is None:
                shape = boxes[key] = strategy.box(s.name, rank, s.shape).shape
        else:
            shape = tuple(s.shape)
        nbytes = prod(shape) * s.np_dtype.itemsize
        out += records_of(s.name, shape, mindspore_name(s.np_dtype), nbytes, slice_bytes)
    return out


def check_wire_format(tmp: str | os.PathLike[str], specs: Sequence[Any]) -> None:
    """The sparse writer, byte for byte against ``mindspore.save_checkpoint`` and ckptstore's own
    ``.ckpt`` writer (zero-filled tensors of rank 3 of ``specs``, which must describe at least 4
    ranks; a small slice size for the latter, so a tensor cut into several records is compared
    too). Raises ``AssertionError`` when a file differs (the wire format changed)."""
    from ckptstore.formats.ckpt_writer import CheckpointWriter
    from ckptstore.testing import sample_checkpoint as testing

    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    strategy = load_layouts(testing.write_strategy(tmp / "strategy.ckpt", specs))
    rank = 3
    zeros = {}
    for s in specs:
        shape = strategy.box(s.name, rank, s.shape).shape if s.in_strategy else tuple(s.shape)
        zeros[s.name] = np.zeros(shape, s.np_dtype)
    ms = testing._ms()  # MindSpore, imported quietly
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(a)} for n, a in zeros.items()], str(tmp / "ms.ckpt"))
    write_sparse_file(tmp / "sparse.ckpt", rank_records(specs, strategy, rank))
    small = 1000
    with CheckpointWriter(tmp / "writer.ckpt", slice_bytes=small) as w:
        for n, a in zeros.items():
            w.add(n, a)
    write_sparse_file(tmp / "sparse_small.ckpt", rank_records(specs, strategy, rank, small))
    for written, sparse in (("ms.ckpt", "sparse.ckpt"), ("writer.ckpt", "sparse_small.ckpt")):
        if (tmp / written).read_bytes() != (tmp / sparse).read_bytes():
            raise AssertionError(f"the sparse writer's {sparse} differs from {written} (the wire format changed?)")
