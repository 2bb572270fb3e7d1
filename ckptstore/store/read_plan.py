"""Plan reads: which byte ranges of which files fill which bytes of a destination (pure; no I/O).

Given a parameter's manifest and the global box a rank needs, :func:`plan_param` returns a
:class:`ParamReadPlan`: a list of :class:`ReadGroup`\\ s, each a set of byte ranges
``(file, offset, length, destination offset)`` read into one buffer, then an optional step.

* Raw chunks, read as stored: one group whose buffer is the destination itself; the ranges of
  all overlapping chunks, coalesced where both the file and the destination are contiguous.
* Raw chunks converted to another dtype: one group per block of a chunk's overlap, whose buffer
  is a scratch array of that block (at most :func:`cast_block_bytes`), cast into the destination
  afterwards (one block in memory at a time per reading thread).
* Compressed chunks, or any chunk whose checksum is to be verified: one group per chunk that
  reads its stored bytes whole into a scratch buffer, checks the CRC-32C, decodes, and copies
  the overlap into the destination.

Each group's ranges are then cut into *requests* priced by the source's
:class:`~ckptstore.io.base.ReadCost` (:func:`~ckptstore.store.requests.plan_requests`, the
request coalescing: exact ranges, merged spans or whole spans per file, whichever costs the least
modelled time). A request's gaps are over-read into bounded scratch (a local file's discard
buffer, an object's stream) and dropped. The executor (:mod:`ckptstore.store.executor`) sends
exactly these requests, so :attr:`ParamReadPlan.nbytes` (bytes wanted),
:attr:`ParamReadPlan.fetched` (bytes the requests transfer), :attr:`ParamReadPlan.requests` and
:meth:`ParamReadPlan.ranges` are known before a byte moves.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptstore.boxes import Box, paired_runs
from ckptstore.io.base import LOCAL_COST, ReadCost
from ckptstore.store.manifest import ParamManifest, Piece
from ckptstore.store.requests import Columns, check_coalesce, plan_requests

_EMPTY = np.zeros(0, dtype=np.int64)
#: The least scratch block a chunk converted to another dtype is read in (:func:`cast_block_bytes`):
#: the planner used to read a converted chunk's whole overlap at once (54 MiB held per loader of the
#: 130B node proof, 5.5% above its fp16 slice).
CAST_BLOCK_BYTES = 1 << 20


@dataclass(frozen=True, eq=False)
class ReadGroup:
    """Byte ranges read into one buffer, then an optional step.

    ``into_destination``: the buffer is the destination array (a C-order block of ``frame`` in
    the stored dtype) and there is no step. Otherwise the buffer is a scratch block of ``frame``
    (``scratch_nbytes`` bytes, stored dtype, or stored bytes for a compressed chunk); afterwards
    its CRC-32C is checked when ``crc32c`` is set, it is decoded with the plan's codec when
    ``decode``, and its ``overlap`` is copied (and cast) into the destination. Range columns are
    int64 arrays; ``files`` index :attr:`ParamReadPlan.keys`; ``dests`` are byte offsets into the
    buffer. All boxes are in the global frame.
    """

    frame: Box
    overlap: Box
    files: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    dests: np.ndarray
    into_destination: bool
    chunk: int = -1
    crc32c: int | None = None
    decode: bool = False
    #: Request boundaries: request ``k`` reads ranges ``cuts[k]:cuts[k + 1]`` (one file, sorted by
    #: offset) in one call, the gaps between them included; ``None``: one request per range.
    cuts: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return int(self.lengths.sum())

    @property
    def request_cuts(self) -> np.ndarray:
        """:attr:`cuts`, or one request per range when there are none."""
        return np.arange(len(self.lengths) + 1, dtype=np.int64) if self.cuts is None else self.cuts

    @property
    def requests(self) -> int:
        """Requests the executor sends for this group."""
        return len(self.lengths) if self.cuts is None else len(self.cuts) - 1

    @property
    def fetched(self) -> int:
        """Bytes the group's requests transfer: the wanted ones and the gaps inside requests."""
        if self.cuts is None or len(self.cuts) < 2:
            return self.nbytes
        first, last = self.cuts[:-1], self.cuts[1:] - 1
        return int((self.offsets[last] + self.lengths[last] - self.offsets[first]).sum())

    @property
    def scratch_nbytes(self) -> int:
        return 0 if self.into_destination else int((self.dests + self.lengths).max(initial=0))


@dataclass(frozen=True, eq=False)
class ParamReadPlan:
    """Reads that fill one parameter's destination box (global frame ``box``).

    ``chunks`` are the indices of the chunks the box overlaps and ``overlaps`` each one's
    overlap with the box, in grid order. ``partial_files`` are the files (indices into ``keys``)
    in which the plan leaves some of the parameter's stored bytes unread: a chunk read in part, or
    a chunk not read at all beside chunks that are. The executor tells those files
    (:meth:`~ckptstore.io.base.ReadableFile.expect_holes`), so that a local file's readahead does
    not fetch the unread bytes too; a file from which the parameter is read whole (a rank file
    of many parameters read one after another) keeps the readahead that streams it.
    """

    name: str
    dtype: np.dtype
    box: Box
    keys: tuple[str, ...]
    groups: tuple[ReadGroup, ...]
    codec: Mapping[str, Any] | None
    chunks: tuple[int, ...] = ()
    overlaps: tuple[Box, ...] = ()
    partial_files: frozenset[int] = frozenset()

    @property
    def shape(self) -> tuple[int, ...]:
        return self.box.shape

    @property
    def nbytes(self) -> int:
        """Bytes wanted (the sum of every range's length)."""
        return sum(g.nbytes for g in self.groups)

    @property
    def requests(self) -> int:
        """Requests the execution sends (a ``preadv`` of a local file, a ranged GET of an object)."""
        return sum(g.requests for g in self.groups)

    @property
    def fetched(self) -> int:
        """Bytes the requests transfer: :attr:`nbytes` and the over-read gaps inside requests."""
        return sum(g.fetched for g in self.groups)

    @property
    def files(self) -> tuple[str, ...]:
        """The file keys read, in first-use order."""
        used = dict.fromkeys(self.keys[i] for g in self.groups for i in np.unique(g.files).tolist())
        return tuple(used)

    def __repr__(self) -> str:  # a line, not the groups' arrays (issue 25.7)
        return (f"<ParamReadPlan {self.name!r} {np.dtype(self.dtype).name} {list(self.shape)}: {self.nbytes:,} bytes "
                f"in {self.requests} requests from {len(self.files)} files>")

    def ranges(self) -> Iterator[tuple[str, int, int, int | None]]:
        """Every ``(file, offset, length, dest_offset)`` byte range, in execution order.

        ``dest_offset`` is the byte offset in the destination array, or ``None`` for ranges read
        into a scratch buffer first (compressed, checksummed or converted chunks).
        """
        for g in self.groups:
            columns = (g.files.tolist(), g.offsets.tolist(), g.lengths.tolist(), g.dests.tolist())
            for f, o, n, d in zip(*columns, strict=True):
                yield self.keys[f], o, n, (d if g.into_destination else None)


@dataclass(frozen=True)
class ReadPlan:
    """Reads for several parameters (e.g. everything one rank needs)."""

    params: Mapping[str, ParamReadPlan]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.params.values())

    @property
    def requests(self) -> int:
        return sum(p.requests for p in self.params.values())

    @property
    def fetched(self) -> int:
        return sum(p.fetched for p in self.params.values())

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f for p in self.params.values() for f in p.files))

    def __repr__(self) -> str:  # a line, not every parameter's arrays (issue 25.7); .params has the detail
        return (f"<ReadPlan {len(self.params)} params: {self.nbytes:,} bytes in {self.requests} requests "
                f"from {len(self.files)} files>")

    def ranges(self) -> Iterator[tuple[str, str, int, int, int | None]]:
        """``(parameter, file, offset, length, dest_offset)`` for every range of every parameter."""
        for name, p in self.params.items():
            for r in p.ranges():
                yield (name, *r)


def plan_param(manifest: ParamManifest, box: Box | None = None, *, out_dtype: np.dtype | None = None,
               verify: bool = False, cost: ReadCost | None = None, coalesce: str = "auto") -> ParamReadPlan:
    """The reads that fill global ``box`` (whole tensor when ``None``) of one parameter.

    ``out_dtype`` is the destination's dtype (the stored one when ``None``); ``verify`` reads
    every touched chunk whole to check its CRC-32C. ``cost`` prices requests and bytes (the
    source's :meth:`~ckptstore.io.base.ByteSource.read_cost`; a local file's when ``None``) and
    ``coalesce`` is ``"auto"`` (per file, the least modelled time) or one of
    :data:`~ckptstore.store.requests.COALESCE_MODES` for every file. Raises ``ValueError`` when
    ``box`` is not inside the tensor.
    """
    check_coalesce(coalesce)
    cost = LOCAL_COST if cost is None else cost
    full = Box.full(manifest.shape)
    box = full if box is None else box
    if box is not full and (box.ndim != len(manifest.shape) or not full.contains(box)):
        raise ValueError(f"box [{list(box.start)}, {list(box.stop)}) is outside parameter {manifest.name!r} "
                         f"of shape {list(manifest.shape)}")
    keys: dict[str, int] = {}
    item = manifest.np_dtype.itemsize
    cast = out_dtype is not None and np.dtype(out_dtype) != manifest.np_dtype
    whole = verify or manifest.codec is not None
    direct = _Columns()
    extents: set[tuple[int, int, int]] = set()  # the direct group's chunks' bytes: (file, start, end)
    groups: list[ReadGroup] = []
    touched: list[tuple[int, Box]] = []
    partial: set[int] = set()  # files of the chunks read only in part
    for i in manifest.chunks_overlapping(box):
        cbox = manifest.chunk_box(i)
        overlap = cbox.intersect(box)
        if overlap is None or (overlap.size == 0 and overlap.ndim):
            continue
        touched.append((i, overlap))
        if whole:
            groups.append(_whole_group(manifest, i, cbox, overlap, keys, cost))
            continue
        # the chunk itself holds its bytes, unless the layout is dense (the whole tensor does)
        container, pieces = manifest.container(i) if manifest.dense else (cbox, manifest.chunks.chunk_pieces(i))
        frame = overlap if cast else box
        at = _contiguous_at(overlap, frame) if overlap == container and len(pieces) == 1 else None
        if at is not None and not cast:  # a whole chunk landing in one run of the destination
            f, offset, nbytes = pieces[0]
            direct.add(_key_id(keys, f), offset, nbytes, at * item)
            extents.add((_key_id(keys, f), offset, offset + nbytes))
            continue
        within = {(_key_id(keys, f), o, o + n) for f, o, n in pieces}
        if not box.contains(container):  # the chunk (or the dense tensor) is read in part
            partial.update(f for f, _, _ in within)
        if cast:  # converted block by block: the scratch of one group is one block, not the whole overlap
            for block in cast_blocks(overlap, max(1, cast_block_bytes(cost) // item)):
                cols = _runs(block, container, pieces, block, item, keys)
                files, offsets, lengths, dests, cuts = plan_requests(cols, cost, coalesce, within)
                groups.append(ReadGroup(block, block, files, offsets, lengths, dests, into_destination=False,
                                        chunk=i, cuts=cuts))
        else:
            cols = _runs(overlap, container, pieces, frame, item, keys)
            direct.extend(cols)
            extents |= within
    if len(touched) < len(manifest.chunks) and not manifest.dense:  # files holding chunks left unread
        read = {i for i, _ in touched}
        partial.update(keys[f] for i, f in enumerate(manifest.chunks.files) if i not in read and f in keys)
    if direct:
        files, offsets, lengths, dests, cuts = plan_requests(_coalesce(direct.arrays()), cost, coalesce, extents)
        groups.insert(0, ReadGroup(box, box, files, offsets, lengths, dests, into_destination=True, cuts=cuts))
    return ParamReadPlan(manifest.name, manifest.np_dtype, box, tuple(keys), tuple(groups), manifest.codec,
                         tuple(i for i, _ in touched), tuple(o for _, o in touched), frozenset(partial))


def cast_block_bytes(cost: ReadCost) -> int:
    """The largest scratch block (stored bytes) a converted chunk is read and cast in: one whose
    request's latency is at most a quarter of its transfer under ``cost`` (16 MB at 20 ms and
    200 MB/s), within the source's longest request, and at least :data:`CAST_BLOCK_BYTES`."""
    return max(CAST_BLOCK_BYTES, min(cost.max_request_bytes, int(4 * cost.request_seconds * cost.bytes_per_second)))


def cast_blocks(box: Box, limit: int) -> list[Box]:
    """``box`` cut into C-order blocks of at most ``limit`` elements (at least one element each):
    whole trailing axes, runs of the axis where they no longer fit, single indices before it."""
    inner, axis = 1, box.ndim
    while axis > 0 and inner * box.shape[axis - 1] <= limit:
        axis -= 1
        inner *= box.shape[axis]
    if axis == 0:
        return [box]
    axis -= 1  # cut along this axis into runs of `step`, one block per index of the axes before it
    step = max(1, limit // inner)
    blocks = []
    for lead in itertools.product(*(range(box.start[a], box.stop[a]) for a in range(axis))):
        for lo in range(box.start[axis], box.stop[axis], step):
            hi = min(lo + step, box.stop[axis])
            blocks.append(Box((*lead, lo, *box.start[axis + 1:]),
                              (*(x + 1 for x in lead), hi, *box.stop[axis + 1:])))
    return blocks


def plan_ranges(name: str, keys: Sequence[str], files: Sequence[int], offsets: Sequence[int],
                lengths: Sequence[int]) -> ByteRangesPlan:
    """The plan that reads byte ranges back to back into a flat ``uint8`` destination.

    ``files`` (indices into ``keys``), ``offsets`` and ``lengths`` give one range per row, in
    destination order. This is what :func:`plan_param` makes of an index-like manifest of a
    one-dimensional byte array read whole, raw and unchecked, whose chunk ``k`` lies at the
    ``k``-th ranges (a converter's chunks of rank files): one group straight into the
    destination, neighbours contiguous in the file coalesced. It is worked out from the columns
    in one pass, without the manifest, the chunk boxes or numpy calls per step, because a
    converter plans thousands of such reads of a few ranges each.
    """
    if len(files) == 1:  # one range (a converter's chunk or block): nothing to coalesce
        return ByteRangesPlan(name, tuple(keys), [files[0]], [offsets[0]], [lengths[0]], [0], lengths[0])
    c_files: list[int] = []
    c_offsets: list[int] = []
    c_lengths: list[int] = []
    c_dests: list[int] = []
    dest = 0
    for f, offset, length in zip(files, offsets, lengths, strict=True):
        if c_files and c_files[-1] == f and c_offsets[-1] + c_lengths[-1] == offset:
            c_lengths[-1] += length  # continues the previous range in the file and the destination
        else:
            c_files.append(f)
            c_offsets.append(offset)
            c_lengths.append(length)
            c_dests.append(dest)
        dest += length
    return ByteRangesPlan(name, tuple(keys), c_files, c_offsets, c_lengths, c_dests, dest)


class ByteRangesPlan:
    """A :class:`ParamReadPlan` of byte ranges read back to back into a flat ``uint8`` array
    (what :func:`plan_ranges` makes): the same reading interface (``box``, ``dtype``, ``keys``,
    ``groups``, ``nbytes``, :meth:`ranges`; the executor runs it), its range columns kept as
    Python lists and its one group built only when asked. A converter makes one per chunk or
    batch of small chunks, thousands per checkpoint, and building the general plan's frozen
    records and int64 columns for one range cost three times the read of a small chunk.
    """

    __slots__ = ("name", "keys", "range_files", "offsets", "lengths", "dests", "nbytes", "_groups")
    dtype = np.dtype(np.uint8)
    codec = None
    chunks: tuple[int, ...] = ()
    overlaps: tuple[Box, ...] = ()
    partial_files: frozenset[int] = frozenset()  # its ranges are whole records

    def __init__(self, name: str, keys: tuple[str, ...], range_files: list[int], offsets: list[int],
                 lengths: list[int], dests: list[int], nbytes: int) -> None:
        self.name, self.keys, self.nbytes = name, keys, nbytes
        #: One row per range: index into :attr:`keys`, offset in that file, length, offset in the destination.
        self.range_files, self.offsets, self.lengths, self.dests = range_files, offsets, lengths, dests
        self._groups: tuple[ReadGroup, ...] | None = None

    @property
    def box(self) -> Box:
        return Box((0,), (self.nbytes,))

    @property
    def requests(self) -> int:
        """One request per range (neighbours contiguous in a file were joined already)."""
        return len(self.range_files)

    @property
    def fetched(self) -> int:
        return self.nbytes

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.nbytes,)

    @property
    def groups(self) -> tuple[ReadGroup, ...]:
        """The plan as :class:`ParamReadPlan` states it: one group straight into the destination."""
        if self._groups is None:
            box = self.box
            files, offsets, lengths, dests = np.array((self.range_files, self.offsets, self.lengths, self.dests),
                                                      dtype=np.int64).reshape(4, -1)
            self._groups = (ReadGroup(box, box, files, offsets, lengths, dests, into_destination=True),)
        return self._groups

    @property
    def files(self) -> tuple[str, ...]:
        """The file keys read, in first-use order."""
        return tuple(dict.fromkeys(self.keys[i] for i in self.range_files))

    def ranges(self) -> Iterator[tuple[str, int, int, int | None]]:
        """Every ``(file, offset, length, dest_offset)`` byte range, in execution order."""
        for f, o, n, d in zip(self.range_files, self.offsets, self.lengths, self.dests, strict=True):
            yield self.keys[f], o, n, d


class _Columns:
    """Range columns collected in order: single ranges as Python ints (cheap), runs as arrays."""

    def __init__(self) -> None:
        self._parts: list[Columns] = []
        self._rows: list[tuple[int, int, int, int]] = []

    def __bool__(self) -> bool:
        return bool(self._parts or self._rows)

    def add(self, f: int, offset: int, length: int, dest: int) -> None:
        self._rows.append((f, offset, length, dest))

    def extend(self, cols: Columns) -> None:
        self._flush()
        self._parts.append(cols)

    def _flush(self) -> None:
        if self._rows:
            files, offsets, lengths, dests = (np.array(c, dtype=np.int64) for c in zip(*self._rows, strict=True))
            self._parts.append((files, offsets, lengths, dests))
            self._rows = []

    def arrays(self) -> list[Columns]:
        self._flush()
        return self._parts


def _contiguous_at(box: Box, frame: Box) -> int | None:
    """The element offset of ``box`` in the C-order block ``frame`` when ``box`` is one contiguous
    run of it (whole trailing axes, single leading ones), else ``None``."""
    ndim = box.ndim
    j = ndim - 1
    while j >= 0 and box.start[j] == frame.start[j] and box.stop[j] == frame.stop[j]:
        j -= 1
    if any(box.stop[a] - box.start[a] != 1 for a in range(j)):
        return None
    offset = 0
    for a in range(ndim):
        offset = offset * (frame.stop[a] - frame.start[a]) + (box.start[a] - frame.start[a])
    return offset


def _key_id(keys: dict[str, int], key: str) -> int:
    return keys.setdefault(key, len(keys))


def _whole_group(manifest: ParamManifest, i: int, cbox: Box, overlap: Box, keys: dict[str, int],
                 cost: ReadCost) -> ReadGroup:
    pieces = manifest.chunk_pieces(i)
    lengths = np.array([n for _, _, n in pieces], dtype=np.int64)
    dests = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    files = np.array([_key_id(keys, f) for f, _, _ in pieces], dtype=np.int64)
    offsets = np.array([o for _, o, _ in pieces], dtype=np.int64)
    crc = manifest.chunks.crc32c
    files, offsets, lengths, dests, cuts = plan_requests((files, offsets, lengths, dests), cost, "exact")
    return ReadGroup(cbox, overlap, files, offsets, lengths, dests, into_destination=False, chunk=i,
                     crc32c=None if crc is None else crc[i], decode=manifest.codec is not None, cuts=cuts)


def _runs(overlap: Box, container: Box, pieces: Sequence[Piece], frame: Box, item: int,
          keys: dict[str, int]) -> Columns:
    """Byte ranges copying ``overlap`` from ``container`` (stored as ``pieces``) into ``frame``."""
    src, dst, run = paired_runs(overlap, container, frame)
    src, dst, n = src * item, dst * item, run * item
    if len(pieces) == 1:
        f, base, _ = pieces[0]
        fid = _key_id(keys, f)
        # the file and the length are the same for every run: read-only broadcasts, not two columns
        # of memory (a converted read's groups keep them: 7.6 MiB of a 130B node loader's plan)
        return (np.broadcast_to(np.int64(fid), src.shape), src + base, np.broadcast_to(np.int64(n), src.shape), dst)
    # Several pieces (a tensor MindSpore wrote as several records): map each run through them,
    # cutting the few runs that cross a piece boundary.
    sizes = np.array([m for _, _, m in pieces], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    ids = np.array([_key_id(keys, f) for f, _, _ in pieces], dtype=np.int64)
    bases = np.array([o for _, o, _ in pieces], dtype=np.int64)
    cols: list[list[int]] = [[], [], [], []]
    for s, d in zip(src.tolist(), dst.tolist(), strict=True):
        left = n
        k = int(np.searchsorted(starts, s, side="right")) - 1
        while left:
            take = min(left, int(starts[k + 1]) - s)
            for col, v in zip(cols, (int(ids[k]), int(bases[k]) + s - int(starts[k]), take, d), strict=True):
                col.append(v)
            s, d, left, k = s + take, d + take, left - take, k + 1
    files, offsets, lengths, dests = (np.array(c, dtype=np.int64) for c in cols)
    return files, offsets, lengths, dests


def _coalesce(parts: list[Columns]) -> Columns:
    """Concatenate range columns and merge neighbours contiguous in the same file and the destination."""
    if len(parts) == 1:
        files, offsets, lengths, dests = parts[0]
    else:
        files, offsets, lengths, dests = (np.concatenate([p[k] for p in parts]) if parts else _EMPTY for k in range(4))
    if len(files) < 2:
        return files, offsets, lengths, dests
    joins = ((files[1:] == files[:-1]) & (offsets[:-1] + lengths[:-1] == offsets[1:])
             & (dests[:-1] + lengths[:-1] == dests[1:]))
    if not joins.any():
        return files, offsets, lengths, dests
    heads = np.concatenate([[0], np.flatnonzero(~joins) + 1])
    return files[heads], offsets[heads], np.add.reduceat(lengths, heads), dests[heads]


#: A plan the executor runs: the general one, or a converter's byte ranges (the same reading interface).
AnyParamReadPlan = ParamReadPlan | ByteRangesPlan
