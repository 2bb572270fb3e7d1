"""MindSpore strategy files -> per-parameter layouts -> the job's :class:`Strategy`.

Files are read in both forms MindSpore accepts, the ``ParallelStrategyMap`` protobuf and JSON, by
:mod:`ckptstore.formats.strategy_file`; this module checks their records into
:class:`~ckptstore.checkpoint.layout.Layout`\\ s and assembles them. Pipeline stages come either as
one file per stage, as several files of each stage (MindFormers saves one per rank, in a folder),
or as a file merged by ``merge_pipeline_strategys`` (names prefixed ``"<stage>-"``). The layout
arithmetic (the box each rank holds) is :mod:`ckptstore.checkpoint.layout`'s.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ckptstore.boxes import Box
from ckptstore.checkpoint.layout import Layout, layout_to_json, stage_slices
from ckptstore.errors import StoreCorruptError, StrategyError
from ckptstore.formats.strategy_file import (
    AxisMap,
    LayoutRecord,
    parse_strategy,
    read_strategy_bytes,
    strict_int,
    tensor_map_axes,
)
from ckptstore.io.locations import is_url, open_location
from ckptstore.limits import MAX_WORLD


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

    def fitted(self, shapes: Mapping[str, Sequence[int]]) -> Strategy:
        """This strategy with the layouts of each parameter in ``shapes`` as they apply to its global
        shape (:meth:`Layout.fit`: a JSON file's flattened Layout tuples in their nested form), so that
        what a store records of it is the same whichever form of strategy file it came from."""
        layouts = {n: {s: lay.fit(shapes[n]) for s, lay in st.items()} if n in shapes else st
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
            "params": {n: {str(s): layout_to_json(lay) for s, lay in st.items()} for n, st in self.layouts.items()},
        }


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


@dataclass(frozen=True)
class StrategyFile:
    """One strategy file read and checked: its path, the pipeline stage it names (``None`` when it
    names none) and each parameter's :class:`~ckptstore.checkpoint.layout.Layout` (the file's
    :class:`~ckptstore.formats.strategy_file.LayoutRecord`\\ s, checked)."""

    path: str
    stage: int | None
    layouts: dict[str, Layout]


def read_strategy_file(path: str | os.PathLike[str]) -> StrategyFile:
    """Parse one strategy file (protobuf, or JSON when it ends in ``.json``) and check its layouts.

    Raises :class:`~ckptstore.errors.StrategyError` naming the file for anything unreadable.
    """
    p = os.fspath(path)
    contents = parse_strategy(p, read_strategy_bytes(p))
    layouts = {name: _layout_from_record(rec, name, p) for name, rec in contents.layouts.items()}
    return StrategyFile(p, contents.stage, layouts)


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


def _stage_parts(sf: StrategyFile) -> dict[int, dict[str, Layout]]:
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
    counts = {lay.device_count for st in staged.values() for lay in st.values()}
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
    staged = {n: {s: lay for s in (stages or {}).get(n, [0])} for n, lay in layouts.items()}
    st = _assemble(staged, ())
    return Strategy(st.layouts, st.stage_devices, max(num_stages, st.num_stages), ())


def strategy_from_summary(summary: object) -> Strategy:
    """Rebuild a :class:`Strategy` from :meth:`Strategy.summary` (as kept in a store's manifest).

    Raises :class:`~ckptstore.errors.StoreCorruptError` when the summary is malformed.
    """
    if not isinstance(summary, Mapping):
        raise StoreCorruptError(f"the store's record of its source strategy is malformed: {type(summary).__name__}, "
                                "not a JSON object")
    try:
        params = summary["params"]
        staged = {
            str(name): {int(s): Layout(tuple(strict_int(x, "dev_matrix") for x in d["dev_matrix"]),
                                       tensor_map_axes(d["tensor_map"]),
                                       strict_int(d["opt_shard_step"], "opt_shard_step"),
                                       strict_int(d["opt_shard_size"], "opt_shard_size"))
                        for s, d in stages.items()}
            for name, stages in params.items()
        }
        st = _assemble(staged, ())
        devices, stages_n = int(summary["stage_devices"]), int(summary["num_stages"])
    except (KeyError, TypeError, ValueError, AttributeError, StrategyError) as e:
        raise StoreCorruptError(f"the store's record of its source strategy is malformed: {e}") from None
    if (staged and (devices, stages_n) != (st.stage_devices, st.num_stages)) or not 0 < devices * stages_n <= MAX_WORLD:
        raise StoreCorruptError("the store's record of its source strategy is inconsistent (device counts)")
    return Strategy(staged, devices, stages_n, ())
