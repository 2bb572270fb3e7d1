"""Which rank writes which chunk when a training job saves itself (pure; no I/O).

Every rank of the job passes its *local* slices. With the strategy, each rank works out, for
every parameter of its pipeline stage, the global shape (from its own local shape), every
rank's box and the replica groups (ranks with equal boxes). A replicated slice cut into
several chunks along its first axis is split into pieces of whole chunks, at most one per
member of its group (:func:`_cut`). Each distinct slice or piece is then written by exactly one
rank of its group: they are dealt largest first to the member of their group with the fewest
bytes so far that writes no other piece of the parameter (ties: the lower rank). Every rank of a stage holds
the same parameters, so every rank computes the same assignment without talking to the
others. A parameter several stages hold (a tied embedding) is written by the lowest of them;
values the strategy does not describe (``global_step``, ``append_info`` scalars) are whole on
every rank and written by the ranks of stage 0. Without a strategy every parameter is whole
and every rank holds all of them (one process, or pure data parallelism).

Chunks are the slices, cut along leading axes only to bound their size
(:func:`ckptstore.write.chunk_plan.chunk_shape_for`), so each chunk is a contiguous byte range
of the local array that holds it. A rank writes each slice (or piece) it is given as **one file**: the
slice's single chunk, or, when the slice is cut into several chunks, a Zarr shard of exactly
that slice or piece (the chunks in C order, which is their byte order, then the shard index). A slice
whose leading axis has no divisor that fits (a vocabulary of 46747 rows, a prime) is cut into
one-row chunks; as separate files that made 46747 files, each fsynced, for one tensor. A
replicated slice that fits in one chunk and spans its first axis is cut for the split instead,
into one chunk a replica with a padded edge chunk at the array's end (:func:`_cut`): the 3 GB
model's three embedding-sized tensors (46747 rows each, replicated on 8 ranks) went whole to
three ranks, each then writing 478 MiB against the median rank's 285 MiB.

The slice files sit beside their array's ``zarr.json`` (chunk key separator ``"."``:
``<array>/c.0.1``), so each array is one folder: with ``c/<i>/`` folders a rank of an 8-rank
1 GB save made and fsynced 544-919 folders for its 181-369 files.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod

import numpy as np

from ckptstore.boxes import Box
from ckptstore.checkpoint.layout import Layout
from ckptstore.checkpoint.strategy import Strategy
from ckptstore.errors import InvalidOptionError, LayoutMismatchError, StrategyError
from ckptstore.store.zarr import SEPARATOR, array_path, grid_key
from ckptstore.write.chunk_plan import chunk_shape_for


@dataclass(frozen=True)
class SaveChunk:
    """Chunk ``index`` (C order over the parameter's grid): its global box and where its bytes
    are in the local array (``byte_start``, ``nbytes``); ``key`` is the file that holds it (its
    slice's file), at offset ``byte_start`` there too (the file is the slice, in C order)."""

    index: int
    key: str
    box: Box
    byte_start: int
    nbytes: int


@dataclass(frozen=True)
class SaveParam:
    """One parameter as this rank sees it: global shape, chunk grid, and the chunks it writes.

    ``replicas`` is the size of each slice's replica group; ``writes_value`` says this rank
    records a string value; ``writes_metadata`` that it writes the Zarr array metadata (the
    rank that writes chunk 0). ``shard_shape`` is the slice shape when slices are cut into
    several chunks (each slice is then one Zarr shard), else ``None``.
    """

    name: str
    path: str
    dtype: np.dtype | None  # None for a string value
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    replicas: int
    chunks: tuple[SaveChunk, ...]
    writes_value: bool = False
    shard_shape: tuple[int, ...] | None = None
    #: Where the bytes of :attr:`file` start in the local array (a piece of a replicated slice
    #: starts inside it; a whole slice at 0).
    local_start: int = 0
    #: Zero bytes after the last chunk in :attr:`file`: the rest of an edge chunk, which Zarr
    #: readers read at the full chunk shape (the manifest's chunk is the part inside the array).
    pad: int = 0

    @property
    def sharded(self) -> bool:
        return self.shard_shape is not None

    @property
    def file(self) -> str:
        """The one file this rank writes for the parameter (its slice, or its piece of one)."""
        return self.chunks[0].key

    @property
    def is_str(self) -> bool:
        return self.dtype is None

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)

    @property
    def writes_metadata(self) -> bool:
        return bool(self.chunks) and self.chunks[0].index == 0

    @property
    def chunks_per_shard(self) -> int:
        """Entries of a shard's index: every inner chunk of the shard shape (a shard at the
        array's edge holds fewer; the others are empty entries)."""
        if self.shard_shape is None:
            return 1
        return prod(s // c for s, c in zip(self.shard_shape, self.chunk_shape, strict=True))


@dataclass(frozen=True)
class SavePlan:
    """What rank ``rank`` of ``world`` writes; ``params`` lists every parameter it holds."""

    rank: int
    world: int
    params: tuple[SaveParam, ...]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    @property
    def chunks(self) -> int:
        return sum(len(p.chunks) for p in self.params)


@dataclass(frozen=True)
class _Slice:
    """A distinct slice of a parameter and the global ranks holding it."""

    name: str
    box: Box
    group: tuple[int, ...]
    nbytes: int


#: Smallest piece a replicated single-chunk slice is split into (:func:`_cut`): below it one more
#: file (and fsync) per replica costs more than the bytes it takes off one rank.
MIN_PIECE_BYTES = 8 << 20


def plan_save(local: Mapping[str, np.ndarray | str], *, rank: int, world: int, strategy: Strategy | None,
              max_chunk_bytes: int, min_piece_bytes: int | None = None) -> SavePlan:
    """The chunks rank ``rank`` writes of its ``local`` values (see the module docstring);
    ``min_piece_bytes`` is the smallest piece a replicated single-chunk slice is split into
    (default :data:`MIN_PIECE_BYTES`).

    Raises :class:`~ckptstore.errors.LayoutMismatchError` when a local shape does not fit the
    strategy's layout (naming the parameter, its shape and the rank).
    """
    min_piece = MIN_PIECE_BYTES if min_piece_bytes is None else min_piece_bytes
    stage = strategy.stage_of(rank) if strategy is not None else 0
    devices = strategy.stage_devices if strategy is not None else world
    base = stage * devices
    shapes: dict[str, tuple[int, ...]] = {}
    slices: list[_Slice] = []
    mine_box: dict[str, Box] = {}
    cuts: dict[str, tuple[tuple[int, ...], int]] = {}  # each parameter's chunk shape and piece rows (_cut)
    for name in sorted(local):
        value = local[name]
        _check_text(name, value)
        layout = _layout_of(name, rank, strategy)
        if isinstance(value, str):
            shapes[name] = ()
            group = tuple(range(devices)) if stage == 0 or strategy is None else ()
            if group:
                slices.append(_Slice(name, Box((), ()), group, len(value.encode())))
            continue
        shape, boxes = _boxes(name, value, layout, devices, rank)
        shapes[name] = shape
        mine_box[name] = boxes[rank - base]
        item = value.dtype.itemsize
        groups: dict[Box, list[int]] = {}
        for i, b in enumerate(boxes):
            groups.setdefault(b, []).append(base + i)
        # every stage holding the parameter cuts it alike: the chunk grid is recorded by all of them
        cuts[name] = _cut(mine_box[name].shape, shape, len(groups[mine_box[name]]), item, max_chunk_bytes,
                          min_piece)
        if not _written_by_stage(name, stage, strategy):
            continue
        slices += [_Slice(name, piece, tuple(g), piece.size * item)
                   for b, g in groups.items() for piece in _pieces(b, cuts[name][1])]
    writer = _assign(slices)
    by_name: dict[str, list[_Slice]] = {}
    for s in slices:
        by_name.setdefault(s.name, []).append(s)
    params = []
    for name in local:
        value = local[name]
        if isinstance(value, str):
            params.append(SaveParam(name, array_path(name), None, (), (), 1, (),
                                    writes_value=writer.get((name, ())) == rank))
            continue
        params.append(_param(name, value, shapes[name], mine_box[name], by_name.get(name, []),
                             writer, rank, cuts[name]))
    return SavePlan(rank, world, tuple(params))


def _check_text(name: str, value: np.ndarray | str) -> None:
    """Refuse a name or a string value that UTF-8 cannot hold (a lone surrogate such as ``'\\udc80'``,
    which ``os.fsdecode`` makes of undecodable bytes): the store keeps both as UTF-8 JSON."""
    for what, text in (("name", name), ("value", value)):
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise InvalidOptionError(f"parameter {name!r}: its {what} holds {text[e.start:e.end]!r} at character "
                                         f"{e.start}, which is not valid text (UTF-8 cannot encode it); pass a name "
                                         "and string values of valid text") from None


def _layout_of(name: str, rank: int, strategy: Strategy | None) -> Layout | None:
    if strategy is None or name not in strategy.layouts:
        return None
    layout = strategy.layout(name, rank)
    if layout is None:
        held = sorted(strategy.layouts[name])
        raise LayoutMismatchError(f"rank {rank} passed parameter {name!r}, but the strategy places it only on "
                                  f"pipeline stage(s) {', '.join(map(str, held))} (rank {rank} is in stage "
                                  f"{strategy.stage_of(rank)}); pass the strategy files of every stage")
    return layout


def _boxes(name: str, value: np.ndarray, layout: Layout | None, devices: int,
           rank: int) -> tuple[tuple[int, ...], list[Box]]:
    """The global shape and every rank's box (by rank within the stage)."""
    local_shape = tuple(value.shape)
    if layout is None:
        return local_shape, [Box.full(local_shape)] * devices
    try:
        shape = layout.global_shape(local_shape)
        boxes = [layout.box(i, shape) for i in range(devices)]
    except StrategyError as e:
        raise LayoutMismatchError(f"parameter {name!r} of local shape {list(local_shape)} on rank {rank}: "
                                  f"{e}") from None
    mine = boxes[rank % devices]
    if mine.shape != local_shape:
        raise LayoutMismatchError(f"parameter {name!r} on rank {rank} has shape {list(local_shape)} but the strategy "
                                  f"gives rank {rank} a slice of shape {list(mine.shape)} of the global "
                                  f"{list(shape)}; is the strategy file from this job?")
    return shape, boxes


def _written_by_stage(name: str, stage: int, strategy: Strategy | None) -> bool:
    """The lowest stage holding a parameter writes it; values outside the strategy come from stage 0."""
    if strategy is None:
        return True
    if name not in strategy.layouts:
        return stage == 0
    return stage == min(strategy.layouts[name])


def _cut(box_shape: tuple[int, ...], shape: tuple[int, ...], replicas: int, item: int,
         max_chunk_bytes: int, min_piece_bytes: int = MIN_PIECE_BYTES) -> tuple[tuple[int, ...], int]:
    """The chunk shape of a parameter whose ranks hold slices of ``box_shape``, and the rows of
    each piece a replicated slice is split into (the slice's rows when it is not split).

    A slice held by ``replicas`` ranks and cut into several chunks along its first axis is split
    into at most ``replicas`` pieces of whole chunks, written by different members of its group,
    so that one rank does not write it all (a 478 MiB embedding of 46747 rows, a prime, went
    whole to one rank of a 256 MB budget). Pieces are one shard each, so the shard grid must be
    regular: a slice that spans its axis ends at the array's edge and may have a shorter last
    piece (Zarr's edge shard); one that does not is split evenly (the largest number of equal
    pieces, at most ``replicas``, that its chunks give).

    A replicated slice that is **one chunk** and spans its first axis (a replicated embedding and
    its optimizer moments) gets a chunk grid chosen for the split: chunks of ``ceil(rows / k)``
    rows, one a piece, for the largest ``k`` ≤ ``replicas`` whose pieces hold at least
    ``min_piece_bytes`` and whose edge chunk is padded by at most 1% of the slice. The last chunk
    is then Zarr's edge chunk, stored padded to the chunk shape (:attr:`SaveParam.pad`). This is
    what lets a prime row count (46747) be split at all.
    """
    chunk_shape = chunk_shape_for(box_shape, item, max_chunk_bytes)
    if not box_shape or replicas < 2:
        return chunk_shape, box_shape[0] if box_shape else 0
    rows, c = box_shape[0], chunk_shape[0]
    m = rows // c  # chunks along the first axis (c divides rows)
    if m < 2:
        return _cut_one_chunk(box_shape, shape, replicas, item, min_piece_bytes) or (chunk_shape, rows)
    if rows == shape[0]:
        per = -(-m // replicas)
    else:
        per = m // max(d for d in range(1, replicas + 1) if m % d == 0)
    return chunk_shape, per * c


def _cut_one_chunk(box_shape: tuple[int, ...], shape: tuple[int, ...], replicas: int, item: int,
                   min_piece_bytes: int) -> tuple[tuple[int, ...], int] | None:
    """:func:`_cut`'s grid for a replicated single-chunk slice spanning its first axis, or ``None``
    when it is not split (it does not span the axis, is too small, or every split pads too much)."""
    rows = box_shape[0]
    if rows != shape[0]:  # an inner slice: a padded chunk would sit inside the array, which Zarr cannot hold
        return None
    row_bytes = prod(box_shape[1:]) * item
    most = min(replicas, rows, rows * row_bytes // max(min_piece_bytes, 1))
    for k in range(most, 1, -1):
        c = -(-rows // k)
        pad = -(-rows // c) * c - rows
        if pad * 100 <= rows:
            return (c,) + box_shape[1:], c
    return None


def _pieces(box: Box, rows: int) -> list[Box]:
    """``box`` cut along its first axis into pieces of ``rows`` (the last may be shorter)."""
    if not box.shape or rows >= box.shape[0] or rows < 1:
        return [box]
    first, end = box.start[0], box.stop[0]
    return [Box((r,) + box.start[1:], (min(r + rows, end),) + box.stop[1:]) for r in range(first, end, rows)]


def _assign(slices: Sequence[_Slice]) -> dict[tuple[str, tuple[int, ...]], int]:
    """The writing rank of each slice or piece (keyed by name and box start): largest first to
    the member of its group with the fewest bytes so far that writes no other piece of that
    parameter (each rank writes one file a parameter); deterministic for a given set of slices."""
    load: dict[int, int] = {}
    out: dict[tuple[str, tuple[int, ...]], int] = {}
    taken: set[tuple[str, int]] = set()
    for s in sorted(slices, key=lambda s: (-s.nbytes, s.name, s.box.start)):
        # a slice has at most as many pieces as members (_cut), so one is always free
        best = min((r for r in s.group if (s.name, r) not in taken), key=lambda r: (load.get(r, 0), r))
        load[best] = load.get(best, 0) + max(s.nbytes, 1)
        out[(s.name, s.box.start)] = best
        taken.add((s.name, best))
    return out


def _param(name: str, value: np.ndarray, shape: tuple[int, ...], box: Box, slices: Sequence[_Slice],
           writer: Mapping[tuple[str, tuple[int, ...]], int], rank: int,
           cut: tuple[tuple[int, ...], int]) -> SaveParam:
    item = value.dtype.itemsize
    replicas = len(slices[0].group) if slices else 1
    chunk_shape, rows = cut
    # every rank holds a slice of the same shape, so all agree on the chunks and the shards
    piece_shape = (rows,) + box.shape[1:] if box.shape else ()
    whole = tuple(max(s, 1) for s in piece_shape)
    shard_shape = whole if chunk_shape != whole else None
    mine = [s.box for s in slices if writer.get((name, s.box.start)) == rank]
    chunks: list[SaveChunk] = []
    local_start = pad = 0
    if mine:
        piece = mine[0]
        grid = tuple(-(-s // c) for s, c in zip(shape, chunk_shape, strict=True))  # an edge chunk may be short
        grid_strides = [prod(grid[a + 1:]) for a in range(len(grid))]
        local_strides = [prod(box.shape[a + 1:]) for a in range(len(box.shape))]
        # where the piece starts in the local slice (pieces are cut along the first axis only)
        lead = tuple(p - b for p, b in zip(piece.start, box.start, strict=True))
        local_start = sum(i * st for i, st in zip(lead, local_strides, strict=True)) * item
        per_axis = [range(-(-n // c)) for n, c in zip(piece.shape, chunk_shape, strict=True)]
        file_shape = shard_shape or chunk_shape
        # the piece's one file
        key = _chunk_key(name, tuple(s // c for s, c in zip(piece.start, file_shape, strict=True)))
        for local in itertools.product(*per_axis):
            start = tuple(p + i * c for p, i, c in zip(piece.start, local, chunk_shape, strict=True))
            coords = tuple(s // c for s, c in zip(start, chunk_shape, strict=True))
            index = sum(c * st for c, st in zip(coords, grid_strides, strict=True))
            first = sum(i * c * st for i, c, st in zip(local, chunk_shape, local_strides, strict=True))
            # clipped at the array's edge (only a split single-chunk slice has such a chunk: _cut)
            stop = tuple(min(s + c, n) for s, c, n in zip(start, chunk_shape, shape, strict=True))
            inside = Box(start, stop)
            chunks.append(SaveChunk(index, key, inside, first * item, inside.size * item))
        pad = prod(chunk_shape) * item - chunks[-1].nbytes if chunks and shard_shape is None else 0
    return SaveParam(name, array_path(name), value.dtype, shape, chunk_shape, replicas, tuple(chunks),
                     shard_shape=shard_shape, local_start=local_start, pad=pad)


def _chunk_key(name: str, coords: Sequence[int]) -> str:
    """The Zarr v3 key of one chunk (or shard) at grid ``coords`` (``<path>/c.<i>.<j>``; ``<path>/c`` for a scalar)."""
    return grid_key(array_path(name), coords, SEPARATOR)
