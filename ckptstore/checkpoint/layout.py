"""How one parameter is laid out over the ranks of a pipeline stage, and the box each rank holds.

The parallel compiler gives each parameter a device matrix ``D``, a tensor map ``M`` (which
device axis splits each tensor axis, counted from the right; -1 for none) and the optimizer
shard size/step: a :class:`Layout`. Ranks are numbered within their pipeline stage, last device
axis fastest. A rank's slice is the box of the model-parallel split, further cut along axis 0
when optimizer sharding is on. The arithmetic mirrors ``mindspore.parallel._tensor``
(``_get_tensor_slice_index`` and ``_construct_tensor_layout_for_opt_shard``) and is checked
against MindSpore's own ``transform_checkpoints`` in the tests. :meth:`Layout.fit` fits a layout
to a parameter's global shape (a JSON file's flattened Layout tuples in their nested form).
Reading strategy files into layouts is :mod:`ckptstore.checkpoint.strategy`'s job.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

from ckptstore.boxes import Box, even_part
from ckptstore.errors import StrategyError
from ckptstore.formats.strategy_file import AxisMap
from ckptstore.limits import MAX_NDIM, MAX_WORLD


@dataclass(frozen=True)
class Layout:
    """How one parameter is distributed over the ranks of its pipeline stage.

    ``tensor_map[a]`` lists the device axes (numbered from the right of ``dev_matrix``) that
    split tensor axis ``a``, outermost first; an empty tuple means the axis is not split.
    ``opt_shard_size``/``opt_shard_step`` are MindSpore's optimizer-parallel settings (both 0
    when the parameter is not optimizer-sharded; size -1 means "all replicas").
    ``local_shape`` is the slice shape a MindFormers strategy file declares in
    ``param_split_shape`` (checked against the split once the global shape is known), or ``()``.
    ``tensor_shape`` is the global shape a JSON strategy file declares (``tensor_shape``), or
    ``()``; the protobuf form records none.
    """

    dev_matrix: tuple[int, ...]
    tensor_map: tuple[AxisMap, ...]
    opt_shard_step: int = 0
    opt_shard_size: int = 0
    field_size: int = 0
    local_shape: tuple[int, ...] = ()
    tensor_shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if (len(self.dev_matrix) > MAX_NDIM or len(self.tensor_map) > MAX_NDIM or len(self.local_shape) > MAX_NDIM
                or len(self.tensor_shape) > MAX_NDIM):
            raise StrategyError(f"a device matrix or tensor map with more than {MAX_NDIM} entries")
        if any(d <= 0 for d in self.dev_matrix):
            raise StrategyError(f"device matrix {list(self.dev_matrix)} has a non-positive entry")
        count = 1
        for d in self.dev_matrix:
            count *= d
            if count > MAX_WORLD:
                raise StrategyError(f"device matrix {list(self.dev_matrix)} spans more than {MAX_WORLD} devices")
        if not -1 <= self.opt_shard_size <= MAX_WORLD or not 0 <= self.opt_shard_step <= MAX_WORLD:
            raise StrategyError(f"optimizer shard size {self.opt_shard_size} / step {self.opt_shard_step} are out "
                                "of range")
        used = [m for axis in self.tensor_map for m in axis]
        if any(not 0 <= m < len(self.dev_matrix) for m in used) or len(used) != len(set(used)):
            raise StrategyError(f"tensor map {self.pretty_map()} does not fit device matrix "
                                f"{list(self.dev_matrix)}")

    @property
    def device_count(self) -> int:
        """Ranks in the stage this layout spans (the product of the device matrix)."""
        return prod(self.dev_matrix)

    @property
    def opt_sharded(self) -> bool:
        return self.opt_shard_step != 0 and self.opt_shard_size != 0

    def pretty_map(self) -> list[object]:
        """The tensor map as MindSpore prints it (``-1`` for unsplit axes)."""
        return [(-1 if not a else a[0] if len(a) == 1 else list(a)) for a in self.tensor_map]

    def splits(self) -> tuple[int, ...]:
        """How many model-parallel parts each tensor axis is cut into."""
        return tuple(prod(self._dim(m) for m in axis) for axis in self.tensor_map)

    def _dim(self, m: int) -> int:
        return self.dev_matrix[len(self.dev_matrix) - 1 - m]

    def coordinates(self, rank: int) -> tuple[int, ...]:
        """Device-matrix coordinates of ``rank`` (within its stage), last axis fastest."""
        coords = []
        for size in reversed(self.dev_matrix):
            coords.append(rank % size)
            rank //= size
        return tuple(reversed(coords))

    def opt_shard_parts(self) -> int:
        """Into how many parts optimizer sharding cuts axis 0 of the model-parallel slice."""
        if not self.opt_sharded:
            return 1
        repeated = self._repeated_axes()
        total = prod(self.dev_matrix[i] for i in repeated)
        return total if self.opt_shard_size < 0 else self.opt_shard_size

    def _repeated_axes(self) -> list[int]:
        used = {len(self.dev_matrix) - 1 - m for axis in self.tensor_map for m in axis}
        return [i for i, d in enumerate(self.dev_matrix) if i not in used and d > 1]

    def _opt_shard_index(self, coords: Sequence[int]) -> int:
        # As MindSpore's _construct_tensor_layout_helper: take the repeated (unused) device axes
        # from the fastest one outwards until the shard size is used up; a partly used axis
        # contributes its fast factor. Outer axes are the more significant digits.
        remaining = self.opt_shard_parts()
        digits: list[tuple[int, int]] = []
        for i in reversed(self._repeated_axes()):
            if remaining == 1:
                break
            size = self.dev_matrix[i]
            if size <= remaining:
                if remaining % size:
                    raise StrategyError(self._opt_error())
                digits.append((coords[i], size))
                remaining //= size
            else:
                if size % remaining:
                    raise StrategyError(self._opt_error())
                digits.append((coords[i] % remaining, remaining))
                remaining = 1
        if remaining != 1:
            raise StrategyError(self._opt_error())
        index = 0
        for coord, size in reversed(digits):
            index = index * size + coord
        return index

    def _opt_error(self) -> str:
        return (f"optimizer shard size {self.opt_shard_size} does not divide the replicas of device matrix "
                f"{list(self.dev_matrix)} with tensor map {self.pretty_map()}")

    def _reordered_opt_layout(self) -> bool:
        # MindSpore's _construct_tensor_layout_for_opt_shard has two paths. When the only repeated
        # device axis is the outermost one (or every axis is repeated) and the map is not nested,
        # it rebuilds the device matrix as [repeat, shard, *splits], i.e. it numbers the model-
        # parallel parts in tensor-axis order, whatever the original tensor map's order was.
        # transform_checkpoints reads and writes files that way, so we do too.
        repeated = self._repeated_axes()
        nested = any(len(axis) > 1 for axis in self.tensor_map)
        return (self.opt_sharded and not nested and bool(repeated) and repeated[0] == 0
                and (len(repeated) == 1 or len(repeated) >= len(self.dev_matrix)))

    def _part_indices(self, rank: int) -> tuple[list[int], int]:
        """Model-parallel part index per tensor axis, and the optimizer-shard index, of ``rank``."""
        rank %= self.device_count
        if self._reordered_opt_layout():
            splits = self.splits()
            mp = prod(splits)
            parts, rest = [], rank % mp
            for k in reversed(splits):
                parts.append(rest % k)
                rest //= k
            return list(reversed(parts)), (rank // mp) % self.opt_shard_parts()
        coords = self.coordinates(rank)
        parts = []
        for axis in self.tensor_map:
            index = 0
            for m in axis:
                i = len(self.dev_matrix) - 1 - m
                index = index * self.dev_matrix[i] + coords[i]
            parts.append(index)
        return parts, (self._opt_shard_index(coords) if self.opt_sharded else 0)

    def box(self, rank: int, global_shape: Sequence[int]) -> Box:
        """The global box rank ``rank`` (numbered within its stage) holds of a tensor of ``global_shape``."""
        shape = tuple(int(s) for s in global_shape)
        return _layout_box(self.fit(shape), rank, shape)

    def _box(self, rank: int, shape: tuple[int, ...]) -> Box:
        if len(shape) != len(self.tensor_map):
            raise StrategyError(f"tensor map {self.pretty_map()} has {len(self.tensor_map)} axes but the "
                                f"tensor has shape {list(shape)}")
        indices, opt_index = self._part_indices(rank)
        start, stop = [], []
        for a, (index, parts) in enumerate(zip(indices, self.splits(), strict=True)):
            try:
                lo, hi = even_part(0, shape[a], parts, index)
            except ValueError:
                raise StrategyError(f"axis {a} of shape {list(shape)} cannot be split evenly into {parts} "
                                    f"parts (device matrix {list(self.dev_matrix)}, tensor map "
                                    f"{self.pretty_map()})") from None
            start.append(lo)
            stop.append(hi)
        if self.opt_sharded and shape:
            parts = self.opt_shard_parts()
            try:
                start[0], stop[0] = even_part(start[0], stop[0], parts, opt_index)
            except ValueError:
                raise StrategyError(f"axis 0 of the slice [{start[0]}, {stop[0]}) cannot be cut into {parts} "
                                    "optimizer shards") from None
        return Box(tuple(start), tuple(stop))

    def check_local_shape(self, box: Box) -> None:
        """Raise :class:`StrategyError` when a declared ``local_shape`` differs from the split's slice."""
        if self.local_shape and self.local_shape != box.shape:
            raise StrategyError(f"the strategy declares slices of shape {list(self.local_shape)} "
                                f"(param_split_shape) but its device matrix and tensor map give {list(box.shape)}")

    def check_tensor_shape(self, shape: Sequence[int]) -> None:
        """Raise :class:`StrategyError` when a declared global ``tensor_shape`` differs from ``shape``."""
        if self.tensor_shape and self.fit(shape).tensor_shape != tuple(shape):
            raise StrategyError(f"the strategy declares the global shape {list(self.tensor_shape)} (tensor_shape)")

    def global_shape(self, local_shape: Sequence[int]) -> tuple[int, ...]:
        """The global shape implied by one rank's local shape under this layout."""
        fitted = self.fit(local_shape, local=True)
        if fitted is not self:
            return fitted.global_shape(local_shape)
        if len(local_shape) != len(self.tensor_map):
            raise StrategyError(f"tensor map {self.pretty_map()} has {len(self.tensor_map)} axes but the "
                                f"local tensor has shape {list(local_shape)}")
        shape = [n * k for n, k in zip(local_shape, self.splits(), strict=True)]
        if self.opt_sharded and shape:
            shape[0] *= self.opt_shard_parts()
        return tuple(shape)


    def fit(self, shape: Sequence[int], *, local: bool = False) -> Layout:
        """This layout as it applies to a tensor of ``shape`` (a rank's slice shape with ``local``).

        The compiler's JSON strategy writes a tensor axis split over several device axes (a
        ``mindspore.parallel.Layout`` tuple) flattened, one tensor-map entry per device axis, with
        ``tensor_shape`` reshaped to match (``TensorLayout::InitFromExtendVector``): a ``[16, 16]``
        weight split ``(("dp", "mp"), "None")`` appears as map ``[1, 0, -1]`` with shape
        ``[2, 8, 16]``. Such a layout has more tensor-map entries than the tensor has axes; it is
        folded back into the nested form the protobuf file writes (``[[1, 0], -1]``), choosing the
        grouping of consecutive entries that gives ``shape``. Any other layout is returned as is
        (and a tensor it does not fit is reported by whoever applies it). Raises
        :class:`StrategyError` when two groupings fit the shape and lay it out differently.
        """
        shape = tuple(int(s) for s in shape)
        if len(shape) == len(self.tensor_map) or not self.tensor_shape:
            return self
        return _fit(self, shape, local)

    def _folded(self, groups: Sequence[tuple[int, int]], strict: bool = False) -> Layout | None:
        """The nested layout of flattened tensor-map entries grouped as ``groups`` ([lo, hi) runs),
        or ``None`` when the flattened form cannot have come from it: every entry but a group's
        last stands for one device axis whose size it has (the reshape InitFromExtendVector does).
        ``strict`` also refuses a group holding an unsplit entry (a tuple with ``"None"`` in it)."""
        maps, shape = [], []
        for lo, hi in groups:
            if strict and hi - lo > 1 and not all(self.tensor_map[lo:hi]):
                return None
            for i in range(lo, hi - 1):
                axis = self.tensor_map[i]
                if len(axis) != 1 or self.tensor_shape[i] != self._dim(axis[0]):
                    return None
            maps.append(tuple(m for i in range(lo, hi) for m in self.tensor_map[i]))
            shape.append(prod(self.tensor_shape[lo:hi]))
        local = self.local_shape
        if len(local) == len(self.tensor_map):
            local = tuple(prod(local[lo:hi]) for lo, hi in groups)
        return Layout(self.dev_matrix, tuple(maps), self.opt_shard_step, self.opt_shard_size, self.field_size,
                      local, tuple(shape))


_FOLD_TRIES = 4096  # groupings tried before giving up: a compiler's file has one or two that fit


@functools.lru_cache(maxsize=1 << 12)
def _fit(layout: Layout, shape: tuple[int, ...], local: bool) -> Layout:
    n, k = len(layout.tensor_map), len(shape)
    if not 0 < k < n or any(len(axis) > 1 for axis in layout.tensor_map):
        return layout
    found: dict[Layout, None] = {}
    tries = 0
    # A tuple with "None" in it (("mp", "None")) is legal but rare, and its flattened form is also
    # that of ("mp",) beside an unsplit axis: [1, 0, -1] of an [8, 8] weight whose slice is [1, 8]
    # reads as (("dp", "mp"), "None") or as ("dp", ("mp", "None")). Readings without such tuples
    # are tried first; only when none fits are they tried.
    strict = True

    def fits(candidate: Layout) -> bool:
        if not local:
            return candidate.tensor_shape == shape
        try:
            return candidate.global_shape(shape) == candidate.tensor_shape
        except StrategyError:
            return False

    def search(lo: int, groups: list[tuple[int, int]]) -> None:
        nonlocal tries
        if len(found) > 1 or tries > _FOLD_TRIES:
            return
        left = k - len(groups)
        if left == 1:
            tries += 1
            candidate = layout._folded(groups + [(lo, n)], strict)
            if candidate is not None and fits(candidate):
                found[candidate] = None
            return
        for hi in range(lo + 1, n - left + 2):
            if not local and prod(layout.tensor_shape[lo:hi]) != shape[len(groups)]:
                continue
            search(hi, groups + [(lo, hi)])

    search(0, [])
    if not found:
        strict, tries = False, 0
        search(0, [])
    if len(found) > 1 or tries > _FOLD_TRIES:
        raise StrategyError(f"tensor map {layout.pretty_map()} with tensor_shape {list(layout.tensor_shape)} can be "
                            f"read in more than one way for a tensor of shape {list(shape)}")
    return next(iter(found), layout)


@functools.lru_cache(maxsize=1 << 16)
def _layout_box(layout: Layout, rank: int, shape: tuple[int, ...]) -> Box:
    # A 128-rank job has a few dozen distinct (layout, shape) pairs over thousands of parameters.
    return layout._box(rank, shape)


@functools.lru_cache(maxsize=4096)
def stage_slices(layout: Layout, shape: tuple[int, ...],
                 devices: int) -> tuple[tuple[Box, ...], tuple[tuple[Box, tuple[int, ...]], ...]]:
    """Each rank's box (by rank within the stage) and the distinct boxes with their ranks.

    Every distinct box is checked against what the layout declares of a local shape. A 128-rank
    job has a few dozen distinct (layout, shape) pairs over thousands of parameters: worked out
    once each, not once per parameter and rank.
    """
    layout = layout.fit(shape)
    boxes = tuple(layout.box(i, shape) for i in range(devices))
    groups: dict[Box, list[int]] = {}
    for i, b in enumerate(boxes):
        groups.setdefault(b, []).append(i)
    for b in groups:
        layout.check_local_shape(b)
    return boxes, tuple((b, tuple(members)) for b, members in groups.items())


def layout_to_json(layout: Layout) -> dict[str, object]:
    """One layout as a JSON-able dict (the form ``ckptstore info --json`` prints)."""
    return {"dev_matrix": list(layout.dev_matrix), "tensor_map": layout.pretty_map(),
            "opt_shard_step": layout.opt_shard_step, "opt_shard_size": layout.opt_shard_size}
