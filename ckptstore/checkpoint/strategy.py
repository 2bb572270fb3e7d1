"""MindSpore strategy files -> per-parameter layouts -> the global box each rank holds.

The parallel compiler writes, per parameter, a device matrix ``D``, a tensor map ``M`` (which
device axis splits each tensor axis, counted from the right; -1 for none) and the optimizer
shard size/step. Ranks are numbered within their pipeline stage, last device axis fastest. A
rank's slice is the box of the model-parallel split, further cut along axis 0 when optimizer
sharding is on. The arithmetic mirrors ``mindspore.parallel._tensor`` (``_get_tensor_slice_index``
and ``_construct_tensor_layout_for_opt_shard``) and is checked against MindSpore's own
``transform_checkpoints`` in the tests.

Files are read in both forms MindSpore accepts, the ``ParallelStrategyMap`` protobuf and JSON, by
:mod:`ckptstore.formats.strategy_file`; this module checks and assembles the layouts. Pipeline stages
come either as one file per stage, as several files of each stage (MindFormers saves one per
rank, in a folder), or as a file merged by ``merge_pipeline_strategys`` (names prefixed
``"<stage>-"``).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from math import prod
from typing import Iterable, Mapping, Sequence

from ckptstore.boxes import Box, even_part
from ckptstore.errors import StoreCorruptError, StrategyError
from ckptstore.formats.strategy_file import (AxisMap, LayoutRecord, StrategyFileContents, parse_strategy,
                                             read_strategy_bytes, strict_int, tensor_map_axes)
from ckptstore.limits import MAX_NDIM, MAX_WORLD
from ckptstore.io.locations import is_url, open_location


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
        for a, (index, parts) in enumerate(zip(indices, self.splits())):
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
        shape = [n * k for n, k in zip(local_shape, self.splits())]
        if self.opt_sharded and shape:
            shape[0] *= self.opt_shard_parts()
        return tuple(shape)


    def fit(self, shape: Sequence[int], *, local: bool = False) -> "Layout":
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

    def _folded(self, groups: Sequence[tuple[int, int]], strict: bool = False) -> "Layout | None":
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


@dataclass(frozen=True)
class Strategy:
    """The layouts of every parameter over the whole job, pipeline stages included.

    ``layouts[name]`` maps each pipeline stage that holds the parameter to its layout (a
    parameter shared by two stages, like a tied embedding, appears under both). Global rank
    ``r`` belongs to stage ``r // stage_devices`` and is rank ``r % stage_devices`` within it.
    """

    layouts: Mapping[str, Mapping[int, Layout]]
    stage_devices: int
    num_stages: int = 1
    sources: tuple[str, ...] = field(default=())

    @property
    def world_size(self) -> int:
        return self.stage_devices * self.num_stages

    def names(self) -> list[str]:
        return list(self.layouts)

    def stage_of(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise StrategyError(f"rank {rank} is outside the strategy's {self.world_size} ranks")
        return rank // self.stage_devices

    def layout(self, name: str, rank: int) -> Layout | None:
        """The layout of ``name`` on global rank ``rank``, or ``None`` if that rank's stage lacks it."""
        return self.layouts[name].get(self.stage_of(rank))

    def ranks_holding(self, name: str) -> list[int]:
        """Global ranks whose stage holds ``name``."""
        stages = self.layouts[name]
        return [r for r in range(self.world_size) if r // self.stage_devices in stages]

    def box(self, name: str, rank: int, global_shape: Sequence[int]) -> Box | None:
        """The global box of ``name`` held by global ``rank``, or ``None`` if it holds none."""
        layout = self.layout(name, rank)
        return None if layout is None else layout.box(rank % self.stage_devices, global_shape)

    def fitted(self, shapes: Mapping[str, Sequence[int]]) -> "Strategy":
        """This strategy with the layouts of each parameter in ``shapes`` as they apply to its global
        shape (:meth:`Layout.fit`: a JSON file's flattened Layout tuples in their nested form), so that
        what a store records of it is the same whichever form of strategy file it came from."""
        layouts = {n: {s: l.fit(shapes[n]) for s, l in st.items()} if n in shapes else st
                   for n, st in self.layouts.items()}
        if layouts == self.layouts:
            return self
        return Strategy(layouts, self.stage_devices, self.num_stages, self.sources)

    def replica_groups(self, name: str, global_shape: Sequence[int]) -> dict[Box, list[int]]:
        """Each distinct box of ``name`` and the global ranks holding it (replicas), in rank order.

        Worked out by :func:`stage_slices`, as a conversion does, stage by stage.
        """
        shape = tuple(int(s) for s in global_shape)
        groups: dict[Box, list[int]] = {}
        for stage in sorted(self.layouts[name]):
            base = stage * self.stage_devices
            for box, members in stage_slices(self.layouts[name][stage], shape, self.stage_devices)[1]:
                groups.setdefault(box, []).extend(base + i for i in members)
        return groups

    def summary(self) -> dict[str, object]:
        """A JSON-able description (world size, stages, each parameter's layout); a shallow copy of
        :attr:`_summary`, which is made once per strategy (a conversion asks for it twice, for its
        fingerprint and its header, and a large model's costs milliseconds)."""
        return dict(self._summary)

    @functools.cached_property
    def _summary(self) -> dict[str, object]:
        return {
            "world_size": self.world_size,
            "stage_devices": self.stage_devices,
            "num_stages": self.num_stages,
            "params": {n: {str(s): layout_to_json(l) for s, l in st.items()} for n, st in self.layouts.items()},
        }


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


# ---- reading files -------------------------------------------------------------------------

def _layout_from_record(rec: LayoutRecord, name: str, path: str) -> Layout:
    local = _declared_local_shape(rec.param_split_shape, rec.indices_offset, rec.field_size, name, path)
    return _make_layout(rec.dev_matrix, rec.tensor_map, rec.opt_shard_step, rec.opt_shard_size, rec.field_size,
                        name, path, local, rec.tensor_shape)


def _declared_local_shape(param_split_shape: Sequence[int], indices_offset: Sequence[int], field_size: int,
                          name: str, path: str) -> tuple[int, ...]:
    """What ``param_split_shape`` / ``indices_offset`` say, as a declared local shape (or ``()``).

    The parallel compiler leaves both empty for even splits and fills them for a manual split
    (one slice size along axis 0 and one offset per slice). MindFormers' ``save_strategy_file``
    writes each parameter's *local shape* into ``param_split_shape`` and no ``indices_offset``
    even for even splits; MindSpore's transform ignores it there, and so does ckptstore, after
    checking it matches the split. A manual split that is in fact even is accepted too; a
    truly uneven one is refused, since ``mindspore.transform_checkpoints`` cannot reshard it
    either (it produces wrong slices).
    """
    if field_size > 0:
        raise StrategyError(f"strategy file {path}: parameter {name!r} uses a field split (field {field_size}); "
                            "ckptstore does not support field-split embeddings")
    if not indices_offset:
        return tuple(param_split_shape)  # MindFormers: the local shape (or nothing at all)
    sizes = list(param_split_shape)
    even = (len(sizes) == len(indices_offset) and len(set(sizes)) == 1
            and list(indices_offset) == [i * sizes[0] for i in range(len(sizes))])
    if not even:
        raise StrategyError(
            f"strategy file {path}: parameter {name!r} is split manually into uneven slices (param_split_shape "
            f"{sizes[:16]}, indices_offset {list(indices_offset)[:16]}). mindspore.transform_checkpoints cannot "
            "reshard such a split either; merge it with mindspore.merge_sliced_parameter or "
            "load_distributed_checkpoint instead")
    return ()


def _make_layout(dev: Sequence[int], maps: tuple[AxisMap, ...], step: int, size: int, fld: int,
                 name: str, path: str, local_shape: Sequence[int] = (), tensor_shape: Sequence[int] = ()) -> Layout:
    try:
        layout = Layout(tuple(dev), maps, int(step), int(size), int(fld), tuple(int(x) for x in local_shape),
                        tuple(int(x) for x in tensor_shape))
    except StrategyError as e:
        raise StrategyError(f"strategy file {path}: parameter {name!r}: {e}") from None
    if layout.tensor_shape and (len(layout.tensor_shape) != len(layout.tensor_map)
                                or any(n < 0 for n in layout.tensor_shape)):
        raise StrategyError(f"strategy file {path}: parameter {name!r}: tensor_shape {list(layout.tensor_shape)} "
                            f"is not a shape for its {len(layout.tensor_map)} axes")
    if layout.local_shape and len(layout.local_shape) != len(layout.tensor_map):
        raise StrategyError(f"strategy file {path}: parameter {name!r}: param_split_shape "
                            f"{list(layout.local_shape)} is neither a slice shape for its {len(layout.tensor_map)} "
                            "axes nor a manual split (it has no indices_offset)")
    return layout


def _split_merged_name(name: str) -> tuple[int | None, str]:
    head, sep, rest = name.partition("-")
    if sep and head.isdigit() and rest:
        return int(head), rest
    return None, name


def read_strategy_file(path: str | os.PathLike[str]) -> StrategyFileContents:
    """Parse one strategy file (protobuf, or JSON when it ends in ``.json``) and check its layouts.

    The returned contents map each parameter to a :class:`Layout`. Raises
    :class:`~ckptstore.errors.StrategyError` naming the file for anything unreadable.
    """
    p = os.fspath(path)
    contents = parse_strategy(p, read_strategy_bytes(p))
    layouts = {name: _layout_from_record(rec, name, p) for name, rec in contents.layouts.items()}
    return StrategyFileContents(p, contents.stage, layouts)  # type: ignore[arg-type]


StrategyPaths = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

_STRATEGY_SUFFIXES = (".ckpt", ".json")


def strategy_files(paths: StrategyPaths) -> list[str]:
    """The strategy files ``paths`` name: each file as given, each folder replaced by the ``.ckpt``
    (or ``.json``) files in it, sorted by name.

    MindFormers saves one strategy file per rank into a folder (``strategy/ckpt_strategy_rank_<r>.ckpt``)
    and MindSpore's ``merge_pipeline_strategys`` takes such a folder; a folder may be local or an
    object-store prefix. Raises :class:`~ckptstore.errors.StrategyError` for a folder with no
    strategy file, or with both ``.ckpt`` and ``.json`` ones (MindSpore refuses that mix too).
    """
    given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out: list[str] = []
    for path in given:
        p = os.fspath(path)
        names = _folder_names(p)
        if names is None:
            out.append(p)
            continue
        kinds = {os.path.splitext(n)[1] for n in names}
        if not names:
            raise StrategyError(f"strategy folder {p} holds no .ckpt or .json strategy file")
        if len(kinds) > 1:
            raise StrategyError(f"strategy folder {p} holds both .ckpt and .json files; pass the files of one "
                                "format (MindSpore's merge_pipeline_strategys refuses the mix too)")
        out += [f"{p.rstrip('/')}/{n}" if is_url(p) else os.path.join(p, n) for n in names]
    return out


def _folder_names(path: str) -> list[str] | None:
    """The strategy file names in folder (or prefix) ``path``, or ``None`` when it is not a folder."""
    if is_url(path):
        if path.endswith(_STRATEGY_SUFFIXES):
            return None
        files = [n for n in open_location(path).list()[1] if n.endswith(_STRATEGY_SUFFIXES)]
        return sorted(files) if files else None  # nothing under it: read it as a file (and say if it is missing)
    if not os.path.isdir(path):
        return None
    return sorted(e.name for e in os.scandir(path) if e.name.endswith(_STRATEGY_SUFFIXES) and e.is_file())


def load_strategy(paths: StrategyPaths) -> Strategy:
    """Read one or more strategy files, or folders of them, into a :class:`Strategy`.

    Accepts a single file, a file merged by ``mindspore.merge_pipeline_strategys``, one file
    per pipeline stage (each names its stage in its ``parallel_strategy_item``), or several
    files of one stage, in any order: MindFormers saves one per rank (a folder passed here
    stands for the files in it, see :func:`strategy_files`). Files of one stage must agree.
    Raises :class:`~ckptstore.errors.StrategyError` for unreadable files, files of one stage
    that disagree (naming both and a parameter), stages missing, and stages whose device
    counts differ.
    """
    files = strategy_files(paths)
    if not files:
        raise StrategyError("no strategy file given")
    parsed = [read_strategy_file(f) for f in files]
    stageless = [sf.path for sf in parsed if sf.stage is None and any(
        _split_merged_name(n)[0] is None for n in sf.layouts)]
    if stageless and len(stageless) != len(parsed):
        raise StrategyError(f"strategy file {stageless[0]} does not say which pipeline stage it is (no "
                            "parallel_strategy_item) but other files given with it do; pass one file per stage as "
                            "saved")
    per_stage: dict[int, tuple[str, dict[str, Layout]]] = {}  # the first file seen of each stage
    staged: dict[str, dict[int, Layout]] = {}
    for sf in parsed:
        if not sf.layouts:  # MindSpore refuses these too ("The strategy file ... is empty")
            raise StrategyError(f"strategy file {sf.path} holds no parameter layouts (parallel_layout_item); "
                                "is it a strategy file? (checkpoints are often named *.ckpt too)")
        for stage, layouts in _stage_parts(sf).items():
            seen = per_stage.get(stage)
            if seen is not None:
                _check_same_stage(seen, (sf.path, layouts), stage)
                continue
            per_stage[stage] = (sf.path, layouts)
            for name, layout in layouts.items():
                staged.setdefault(name, {})[stage] = layout
    return _assemble(staged, tuple(files))


def _stage_parts(sf: StrategyFileContents) -> dict[int, dict[str, Layout]]:
    """The layouts of one file by pipeline stage: a merged file's ``"<stage>-"`` names, else the
    file's own stage (0 when it names none: a job without pipeline stages)."""
    out: dict[int, dict[str, Layout]] = {}
    for name, layout in sf.layouts.items():
        merged_stage, plain = _split_merged_name(name)
        stage = merged_stage if merged_stage is not None else (sf.stage or 0)
        out.setdefault(stage, {})[plain] = layout
    return out


def _check_same_stage(first: tuple[str, dict[str, Layout]], other: tuple[str, dict[str, Layout]],
                      stage: int) -> None:
    """Two files of one stage (say, two ranks' files of a MindFormers strategy folder) must agree."""
    (path_a, a), (path_b, b) = first, other
    where = f"strategy files {path_a} and {path_b} are both for pipeline stage {stage} but"
    for name in a:
        if name not in b:
            raise StrategyError(f"{where} only the first lays out parameter {name!r}; are they from one job?")
        if a[name] != b[name]:
            raise StrategyError(f"{where} disagree on parameter {name!r}: {_describe(a[name])} in the first, "
                                f"{_describe(b[name])} in the second; are they from one job?")
    extra = next((n for n in b if n not in a), None)
    if extra is not None:
        raise StrategyError(f"{where} only the second lays out parameter {extra!r}; are they from one job?")


def _describe(layout: Layout) -> str:
    text = f"device matrix {list(layout.dev_matrix)}, tensor map {layout.pretty_map()}"
    if layout.opt_sharded:
        text += f", optimizer shard size {layout.opt_shard_size} step {layout.opt_shard_step}"
    if layout.local_shape:
        text += f", slice shape {list(layout.local_shape)}"
    return text


def _assemble(staged: dict[str, dict[int, Layout]], sources: tuple[str, ...]) -> Strategy:
    if not staged:
        return Strategy({}, 1, 1, sources)
    stages = sorted({s for st in staged.values() for s in st})
    where = f" ({', '.join(sources)})" if sources else ""
    if stages != list(range(len(stages))):
        raise StrategyError(f"the strategy{where} has pipeline stages {stages}; every stage from 0 to "
                            f"{stages[-1]} is needed (pass each stage's strategy file)")
    counts = {l.device_count for st in staged.values() for l in st.values()}
    if len(counts) != 1:
        raise StrategyError(f"parameters are laid out over different device counts {sorted(counts)}{where}; "
                            "every pipeline stage must span the same number of ranks")
    devices = counts.pop()
    if devices * len(stages) > MAX_WORLD:
        raise StrategyError(f"the strategy{where} spans {devices * len(stages)} ranks, more than the {MAX_WORLD} "
                            "ckptstore supports")
    return Strategy(staged, devices, len(stages), sources)


def strategy_from_layouts(layouts: Mapping[str, Layout], *, num_stages: int = 1,
                          stages: Mapping[str, Iterable[int]] | None = None) -> Strategy:
    """Build a :class:`Strategy` from in-memory layouts (e.g. a compiled network's)."""
    staged = {n: {s: l for s in (stages or {}).get(n, [0])} for n, l in layouts.items()}
    st = _assemble(staged, ())
    return Strategy(st.layouts, st.stage_devices, max(num_stages, st.num_stages), ())


def strategy_from_summary(summary: object) -> Strategy:
    """Rebuild a :class:`Strategy` from :meth:`Strategy.summary` (as kept in a store's manifest).

    Raises :class:`~ckptstore.errors.StoreCorruptError` when the summary is malformed.
    """
    try:
        params = summary["params"]  # type: ignore[index]
        staged = {
            str(name): {int(s): Layout(tuple(strict_int(x, "dev_matrix") for x in d["dev_matrix"]),
                                       tensor_map_axes(d["tensor_map"]),
                                       strict_int(d["opt_shard_step"], "opt_shard_step"),
                                       strict_int(d["opt_shard_size"], "opt_shard_size"))
                        for s, d in stages.items()}
            for name, stages in params.items()
        }
        st = _assemble(staged, ())
        devices, stages_n = int(summary["stage_devices"]), int(summary["num_stages"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError, AttributeError, StrategyError) as e:
        raise StoreCorruptError(f"the store's record of its source strategy is malformed: {e}") from None
    if (staged and (devices, stages_n) != (st.stage_devices, st.num_stages)) or not 0 < devices * stages_n <= MAX_WORLD:
        raise StoreCorruptError("the store's record of its source strategy is inconsistent (device counts)")
    return Strategy(staged, devices, stages_n, ())
