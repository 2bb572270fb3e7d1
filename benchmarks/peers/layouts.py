"""MindSpore layouts as the peers' sharding specs: DTensor placements and jax PartitionSpecs.

A MindSpore layout (``dev_matrix``, ``tensor_map``, optimizer shard) says which global box each
rank holds; ckptstore's strategy reader computes it (``Layout.box`` of the layouts
:func:`benchmarks.fixtures.load_layouts` returns), and the tests check
that against MindSpore's own slicing. A peer describes the same thing as a device mesh plus one
*placement* per mesh dimension. :func:`mesh_layout` translates: the mesh is the device matrix
with its dimensions reordered so that the ones the tensor map uses come first (in tensor-axis
order) and the replica dimensions last, because optimizer sharding cuts axis 0 of the
model-parallel slice *after* the model-parallel split (DTensor and jax apply shards in mesh
order, outermost first). Every translation is checked against ``Layout.box`` for every rank
(:func:`check_boxes`), so a layout the translation gets wrong fails loudly instead of silently
loading other values.

Everything here is pure metadata (no torch, no jax imports).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from benchmarks.fixtures import Box

#: A MindSpore layout of one pipeline stage, as ``load_layouts(...).layouts[name][0]`` gives it.
Layout = Any


@dataclass(frozen=True)
class MeshLayout:
    """A layout as a device mesh and one placement per mesh dimension.

    ``ranks`` is the mesh: an array of global ranks of shape ``mesh_shape`` (``ranks[c]`` is the
    rank at mesh coordinate ``c``). ``shard_axis[d]`` is the tensor axis mesh dimension ``d``
    shards, or ``None`` when the tensor is replicated along it. Several mesh dimensions may
    shard one tensor axis: the first one listed is the outermost (most significant) cut.
    """

    ranks: np.ndarray
    shard_axis: tuple[int | None, ...]

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.ranks.shape)

    @property
    def key(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Hashable identity of the mesh (shape and rank order), to share mesh objects."""
        return self.mesh_shape, tuple(int(r) for r in self.ranks.reshape(-1))

    def box(self, rank: int, shape: Sequence[int]) -> Box:
        """The global box ``rank`` holds under this mesh layout (DTensor/jax semantics, even splits)."""
        coord = [int(c[0]) for c in np.nonzero(self.ranks == rank)]
        start, stop = [0] * len(shape), [int(s) for s in shape]
        for d, axis in enumerate(self.shard_axis):
            if axis is None:
                continue
            n = self.mesh_shape[d]
            step = (stop[axis] - start[axis]) // n
            start[axis] += coord[d] * step
            stop[axis] = start[axis] + step
        return Box(tuple(start), tuple(stop))

    def partition_spec(self, ndim: int, names: Sequence[str]) -> tuple[object, ...]:
        """A jax ``PartitionSpec`` argument list: per tensor axis, the mesh axis names cutting it."""
        per_axis: list[list[str]] = [[] for _ in range(ndim)]
        for d, axis in enumerate(self.shard_axis):
            if axis is not None:
                per_axis[axis].append(names[d])
        return tuple(None if not a else a[0] if len(a) == 1 else tuple(a) for a in per_axis)


def mesh_layout(layout: Layout) -> MeshLayout:
    """Translate a MindSpore layout (one pipeline stage) into a :class:`MeshLayout`.

    Optimizer sharding is supported when it spans all replica dimensions (``opt_shard_size``
    ``-1``, as ``pangu_specs`` and ``enable_parallel_optimizer`` write it); other sizes raise
    ``NotImplementedError``.
    """
    dev = layout.dev_matrix
    n = len(dev)
    used: list[tuple[int, int]] = []  # (device axis, tensor axis), outermost first per tensor axis
    for a, axis in enumerate(layout.tensor_map):
        used += [(n - 1 - m, a) for m in axis]
    used_axes = {i for i, _ in used}
    replica = [i for i in range(n) if i not in used_axes]
    parts = layout.opt_shard_parts() if layout.opt_sharded else 1
    if parts not in (1, prod(dev[i] for i in replica)):
        raise NotImplementedError(f"optimizer shard of {parts} parts over replica dims "
                                  f"{[dev[i] for i in replica]} (device matrix {list(dev)})")
    order = [i for i, _ in used] + replica
    ranks = np.arange(prod(dev)).reshape(dev).transpose(order)
    shard = tuple([a for _, a in used] + [(0 if parts > 1 and dev[i] > 1 else None) for i in replica])
    return MeshLayout(ranks, shard)


def check_boxes(name: str, layout: Layout, mesh: MeshLayout, shape: Sequence[int]) -> None:
    """Raise ``AssertionError`` unless ``mesh`` gives every rank the box MindSpore gives it."""
    for r in range(layout.device_count):
        want, got = layout.box(r, shape), mesh.box(r, shape)
        if want != got:
            raise AssertionError(f"{name}: rank {r} holds {want} under MindSpore's layout but {got} under "
                                 f"the peer's mesh {mesh.mesh_shape} with shards {mesh.shard_axis}")
