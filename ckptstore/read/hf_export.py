"""``ckptstore export STORE OUT --format hf --name-map RULES``: a Hugging Face folder from any store.

The rule set read backwards (:meth:`~ckptstore.formats.hf_rules.NameMap.reverse`) names the
Hugging Face tensors of every store parameter; a fused one (QKV, gate/up) is split back into
its sources in the groups its rule says. Tensors are packed, in the store's order, into shards
of at most ``max_shard_size`` bytes (a larger tensor gets a shard of its own), written as
``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json`` (or one
``model.safetensors``) and the ``config.json`` the store recorded when it indexed a Hugging
Face folder. Each shard is streamed front to back through the output's
:class:`~ckptstore.io.sink.ByteSink` (a folder or a bucket; it appears only when complete), a
bounded block at a time: a source's rows are read from the store segment by segment, and
segments of a few rows (gate/up interleaved row by row) a window of whole groups at a time, of
which only the source's own rows are fetched (a fused view's bytes are read once, not once per
output tensor), so memory stays at one window (``window_bytes``), whatever the tensor's size. A tensor split along
a later axis is read whole, one tensor at a time.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from ckptstore.boxes import Box
from ckptstore.checkpoint.selection import select_params
from ckptstore.errors import InvalidOptionError, StoreExistsError
from ckptstore.formats.hf_folder import CONFIG_FILE, INDEX_FILE, SINGLE_FILE
from ckptstore.formats.hf_rules import NameMap, Target, load_name_map, shipped_name_maps
from ckptstore.formats.safetensors_header import build_header
from ckptstore.io.sink import open_sink
from ckptstore.read.export_folder import claim_export_folder, commit_export_folder
from ckptstore.store.executor import execute
from ckptstore.store.read_plan import ParamReadPlan, ReadGroup
from ckptstore.store.requests import plan_requests
from ckptstore.store.store import Store, StoreLike, store_argument

#: Hugging Face's default shard size (``save_pretrained(max_shard_size="5GB")``: decimal units).
DEFAULT_MAX_SHARD = 5 * 10 ** 9
#: Bytes read from the store at once while a shard streams.
WINDOW_BYTES = 16 << 20
#: Segments shorter than this are read a window of groups at a time (one read, not one per row).
_SMALL_SEGMENT = 64 << 10
#: How :func:`~ckptstore.formats.hf_rules.load_name_map` names a shipped rule set (``"llama (shipped)"``).
SHIPPED_SUFFIX = " (shipped)"
_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}


@dataclass(frozen=True)
class HFExportSummary:
    """What :func:`export_hf` wrote: the files (shards, then the index and config) and bytes read."""

    files: tuple[str, ...]
    tensors: int
    bytes_read: int


def parse_size(text: str | int) -> int:
    """``"5GB"`` (10^9), ``"500MiB"`` (2^20), ``"2000000"``: a shard size in bytes, as ``save_pretrained`` takes it."""
    if isinstance(text, int) and not isinstance(text, bool):
        n = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", str(text), re.IGNORECASE)
        if m is None:
            raise InvalidOptionError(f"max shard size {text!r} is not a size like 5GB, 500MiB or 2000000")
        n = int(float(m.group(1)) * _UNITS[(m.group(2) or "").upper()])
    if n < 1:
        raise InvalidOptionError(f"max shard size {text!r} is not positive")
    return n


@dataclass(frozen=True)
class _Tensor:
    hf_name: str
    store_name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    target: Target
    source: int  # index into target.sources

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.dtype.itemsize


def export_hf(store: StoreLike, out: str | os.PathLike[str], *,
              name_map: str | os.PathLike[str] | NameMap | None = None,
              max_shard_size: str | int = DEFAULT_MAX_SHARD, include: Sequence[str] | None = None,
              exclude: Sequence[str] = (), config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
              window_bytes: int = WINDOW_BYTES, overwrite: bool = False) -> HFExportSummary:
    """Write the store's parameters as a Hugging Face folder at ``out`` (a folder or ``s3://`` prefix).

    ``name_map`` is the rule set the store's names came from (``"llama"``, ``"mcore"``, a rule
    file...); by default the shipped one the store recorded when it indexed a Hugging Face folder
    (:func:`recorded_name_map`). An ``out`` holding files is refused unless ``overwrite``, which
    replaces only what an earlier export wrote, never leaving old shards beside new ones
    (:mod:`ckptstore.read.export_folder`). ``include``/``exclude`` are globs over store names (string values are never
    exported). ``config`` (a mapping or a ``config.json`` path) gives the head counts a fused
    parameter is split by, and is written as ``config.json``; by default the one recorded when
    the store indexed a Hugging Face folder. Raises
    :class:`~ckptstore.errors.NameMapError` when a parameter cannot be split as its rule says.
    """
    limit = parse_size(max_shard_size)
    with store_argument(store) as st:
        if name_map is None:
            name_map = recorded_name_map(st)
        rules = name_map if isinstance(name_map, NameMap) else load_name_map(name_map)
        cfg = _config(st, config)
        names = [n for n in st.names() if not st.info(n).is_str]
        if include or exclude:
            names = select_params(names, include=include or (), exclude=exclude)
        targets = rules.reverse({n: st.info(n).shape for n in names}, cfg)
        tensors = []
        for t in targets:
            info = st.info(t.name)
            for i, hf in enumerate(t.sources):
                shape = info.shape if not t.fused else \
                    info.shape[:t.axis] + (t.sizes[i],) + info.shape[t.axis + 1:]
                tensors.append(_Tensor(hf, t.name, info.np_dtype, tuple(shape), t, i))
        shards = _pack(tensors, limit)
        sink = open_sink(os.fspath(out))
        for where in (st.location.url, *(st.data.key_url(f) for f in sorted(
                {f for p in st.manifest.params.values() for f in p.chunks.files}))):
            if sink.contains(where):
                raise StoreExistsError(f"export folder {sink.url} holds {where}, which the store reads; choose an "
                                       "output folder outside the store and its source files")
        keys = [SINGLE_FILE] if len(shards) == 1 else \
            [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        keys += [INDEX_FILE] * (len(shards) > 1) + [CONFIG_FILE] * bool(cfg)
        sink.make_root()
        claim_export_folder(sink, keys, overwrite=overwrite, entry_points=(INDEX_FILE, SINGLE_FILE))
        files, weight_map, read = [], {}, [0]
        for key, shard in zip(keys, shards, strict=False):  # keys also name the index and config
            head, _ = build_header([(t.hf_name, t.dtype, t.shape) for t in shard], {"format": "pt"})
            sink.put_stream(key, _shard_pieces(st, head, shard, window_bytes, read))
            files.append(sink.key_url(key))
            weight_map.update({t.hf_name: key for t in shard})
        if len(shards) > 1:
            index = {"metadata": {"total_size": sum(t.nbytes for t in tensors)}, "weight_map": weight_map}
            sink.put(INDEX_FILE, json.dumps(index, indent=2).encode())
            files.append(sink.key_url(INDEX_FILE))
        if cfg:
            sink.put(CONFIG_FILE, json.dumps(dict(cfg), indent=2).encode())
            files.append(sink.key_url(CONFIG_FILE))
        sink.sync()
        commit_export_folder(sink, keys)
        return HFExportSummary(tuple(files), len(tensors), read[0])


def recorded_name_map(st: Store) -> str:
    """The shipped rule set (``"llama"``) a Hugging Face index recorded, for ``export --format hf``
    without ``--name-map``. A rule file's path recorded in a store is not opened on its own (a store
    is data, not trust): it is named, to be passed again. Raises
    :class:`~ckptstore.errors.InvalidOptionError` when there is none to use."""
    recorded = st.source.get("name_map")
    if isinstance(recorded, str) and recorded.endswith(SHIPPED_SUFFIX):
        name = recorded[:-len(SHIPPED_SUFFIX)]
        if name in shipped_name_maps():
            return name
    if isinstance(recorded, str) and recorded:
        raise InvalidOptionError(f"the store {st.location.url} was indexed with the rule file {recorded!r}, which "
                                 "export does not open on its own: pass it as --name-map (name_map=)")
    raise InvalidOptionError(f"the store {st.location.url} records no name map (it was not indexed from a Hugging "
                             "Face folder): pass --name-map llama|qwen2|mcore|RULES.json (name_map=)")


def _config(st: Store, config: Mapping[str, Any] | str | os.PathLike[str] | None) -> Mapping[str, Any]:
    if config is None:
        recorded = st.source.get("hf_config")
        return recorded if isinstance(recorded, Mapping) else {}
    if isinstance(config, Mapping):
        return config
    try:
        with open(config, "rb") as f:
            doc = json.loads(f.read(4 << 20))
    except (OSError, ValueError) as e:
        raise InvalidOptionError(f"cannot read the model config {os.fspath(config)}: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidOptionError(f"{os.fspath(config)} is not a JSON object")
    return doc


def _pack(tensors: Sequence[_Tensor], limit: int) -> list[list[_Tensor]]:
    """Tensors in order into shards of at most ``limit`` bytes (a larger tensor alone), as
    ``save_pretrained`` shards them."""
    shards: list[list[_Tensor]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


def _shard_pieces(st: Store, head: bytes, shard: Sequence[_Tensor], window: int, read: list[int]) -> Iterator[Any]:
    yield head
    for t in shard:
        for block in _tensor_blocks(st, t, window, read):
            yield np.ascontiguousarray(block).reshape(-1).view(np.uint8).data


def _tensor_blocks(st: Store, t: _Tensor, window: int, read: list[int]) -> Iterator[np.ndarray]:
    """``t``'s bytes in C order, a block at a time, read from its store parameter (``read[0]``
    counts the bytes read)."""
    target, info = t.target, st.info(t.store_name)

    def get(index: Any = None) -> np.ndarray:
        got = np.asarray(st.read(t.store_name, index=index))
        read[0] += got.nbytes
        return got

    shape = info.shape
    if not shape or 0 in shape:
        yield get().reshape(t.shape)
        return
    a = target.axis
    segs = [(start, n, dst) for s, start, n, dst in target.segments() if s == t.source] if target.fused \
        else [(0, shape[0], 0)]
    if a > 0:  # rows of a later axis interleave with the leading ones: the tensor whole
        parts = [get((slice(None),) * a + (slice(d, d + n),)) for _, n, d in segs]
        yield np.concatenate(parts, axis=a)
        return
    row = prod(shape[1:]) * t.dtype.itemsize
    per = max(1, window // max(row, 1))
    if not target.fused or segs[0][1] * row >= _SMALL_SEGMENT:
        for _, n, d in segs:
            for r in range(d, d + n, per):
                yield get((slice(r, min(r + per, d + n)),))
        return
    # short segments (every row, a few rows): a window of whole groups at a time, one plan for it,
    # of which only this source's rows are fetched (the other sources' rows are theirs to read:
    # reading the window whole for each source read a fused view once per output tensor)
    group_rows = shape[0] // target.groups
    k = t.shape[0] // target.groups
    offset = segs[0][2] % group_rows
    groups = max(1, per // group_rows)
    for g in range(0, target.groups, groups):
        h = min(g + groups, target.groups)
        starts = np.arange(g, h, dtype=np.int64) * group_rows + offset
        rows = _read_rows(st, t.store_name, g * group_rows, h * group_rows, starts, k)
        if rows is None:  # compressed, checked or converted chunks: read whole, keep this source's rows
            block = get((slice(g * group_rows, h * group_rows),))
            rows = block.reshape((h - g, group_rows) + shape[1:])[:, offset:offset + k].reshape((-1,) + shape[1:])
        else:
            read[0] += rows.nbytes
        yield rows


def _read_rows(st: Store, name: str, lo: int, hi: int, starts: np.ndarray, k: int) -> np.ndarray | None:
    """Rows ``[s, s + k)`` for each ``s`` in ``starts`` (ascending, within ``[lo, hi)``) of ``name``,
    stacked, fetching only their bytes: the plan of rows ``[lo, hi)`` with its destination ranges
    cut to those rows and renumbered, then priced again by the source's cost model (requests may
    still merge a gap, inside what the whole plan would have fetched). ``None`` when the plan is
    not raw ranges straight into the destination (compressed, checked or converted chunks)."""
    info = st.info(name)
    plan = st.plan(name, (slice(lo, hi),))
    shape = (len(starts) * k,) + tuple(info.shape[1:])
    if len(plan.groups) != 1 or not plan.groups[0].into_destination:
        return None
    g = plan.groups[0]
    row = prod(info.shape[1:]) * info.np_dtype.itemsize
    # wanted destination bytes of the window, as sorted disjoint intervals, and where each lands
    want_lo = (starts - lo) * row
    want_hi = want_lo + k * row
    lands = np.arange(len(starts), dtype=np.int64) * (k * row)
    # every (range, wanted interval) pair that overlaps: the ranges' dest intervals are disjoint too
    d_lo, d_hi = g.dests, g.dests + g.lengths
    first = np.searchsorted(want_hi, d_lo, side="right")  # first interval ending after the range starts
    last = np.searchsorted(want_lo, d_hi, side="left")  # intervals starting before the range ends
    count = np.maximum(last - first, 0)
    r = np.repeat(np.arange(len(d_lo)), count)
    w = np.repeat(first - np.cumsum(count) + count, count) + np.arange(int(count.sum()))
    a = np.maximum(d_lo[r], want_lo[w])
    b = np.minimum(d_hi[r], want_hi[w])
    files, offsets = g.files[r], g.offsets[r] + (a - d_lo[r])
    dests = lands[w] + (a - want_lo[w])
    cuts = g.request_cuts
    spans = {(int(g.files[i]), int(g.offsets[i]), int(g.offsets[j - 1] + g.lengths[j - 1]))
             for i, j in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True)}
    f, o, n, d, c = plan_requests((files, offsets, b - a, dests), st.data.read_cost(), "auto", spans)
    box = Box.full(shape)
    part = ReadGroup(box, box, f, o, n, d, into_destination=True, cuts=c)
    return execute(ParamReadPlan(name, info.np_dtype, box, plan.keys, (part,), None), st.data)


__all__ = ["HFExportSummary", "export_hf", "parse_size", "recorded_name_map"]
