"""MindSpore strategy files, parsed: the ``ParallelStrategyMap`` protobuf and its JSON form.

The parallel compiler writes, per parameter, a ``parallel_layout_item`` (device matrix, tensor
map, optimizer shard step/size, field size, manual-split shape and offsets, and in JSON the
global ``tensor_shape``), and per operator a ``parallel_strategy_item`` carrying the pipeline
stage. This module turns the bytes of either form into :class:`StrategyFileContents` of plain
:class:`LayoutRecord` values and checks only what the file format says (types, integers, sizes);
what the layouts mean is :mod:`ckptstore.checkpoint.strategy`'s business. The protobuf form is
decoded with :mod:`ckptstore.formats.protowire`, so MindSpore need not be installed.

Tensor maps come in three spellings, all read by :func:`tensor_map_axes`: one device axis per
tensor axis (``[1, -1]``), nested lists for MindSpore's Layout tuples (``[[1, 0], -1]``; in the
protobuf form, one ``TensorMap`` per tensor axis), and what ``ckptstore info --json`` prints.
"""
from __future__ import annotations

import errno
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

from ckptstore.errors import MissingFileError, StrategyError
from ckptstore.formats import protowire
from ckptstore.io.locations import is_url, open_user_file
from ckptstore.limits import MAX_METADATA_BYTES, MAX_NDIM

#: A tensor axis is split by no device axis (``()``), one, or several (a Layout tuple), outermost first.
AxisMap = tuple[int, ...]


@dataclass(frozen=True)
class LayoutRecord:
    """One ``parallel_layout_item`` as written: nothing checked beyond its being integers.

    ``tensor_map`` is already in :func:`tensor_map_axes` form; ``param_split_shape`` and
    ``indices_offset`` are flattened; ``tensor_shape`` is ``()`` in the protobuf form, which
    records none.
    """

    dev_matrix: tuple[int, ...]
    tensor_map: tuple[AxisMap, ...]
    opt_shard_step: int = 0
    opt_shard_size: int = 0
    field_size: int = 0
    param_split_shape: tuple[int, ...] = ()
    indices_offset: tuple[int, ...] = ()
    tensor_shape: tuple[int, ...] = ()


@dataclass
class StrategyFileContents:
    """One strategy file: its path, the pipeline stage it names (``None`` when it names none), its layouts."""

    path: str
    stage: int | None
    layouts: dict[str, LayoutRecord]


def strict_int(value: object, what: str) -> int:
    """``value`` as an int when it is one (JSON ``2``), else :class:`TypeError` naming ``what``.

    JSON numbers such as ``2.5`` or ``1e999`` (a float infinity, which ``int()`` turns into an
    ``OverflowError``) are not silently truncated into a layout.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} holds {value!r}, not an integer")
    return value


def tensor_map_axes(raw: Sequence[object], what: str = "tensor_map") -> tuple[AxisMap, ...]:
    """A tensor map in any of its spellings as one tuple of device axes per tensor axis.

    Each entry is ``-1`` (the axis is not split), a device axis number (counted from the right of
    the device matrix), or a list of them for an axis split over several device axes (a
    ``mindspore.parallel.Layout`` tuple such as ``("dp", "mp")``), outermost first; ``-1`` inside
    a list is dropped, as MindSpore's readers do. Raises :class:`TypeError` for anything else.
    """
    if not isinstance(raw, (list, tuple)):
        raise TypeError(f"{what} is {raw!r}, not a list")
    out = []
    for m in raw:
        if isinstance(m, (list, tuple)):
            out.append(tuple(x for x in (strict_int(v, what) for v in m) if x != -1))
        else:
            v = strict_int(m, what)
            out.append(() if v == -1 else (v,))
    return tuple(out)


# ---- protobuf -------------------------------------------------------------------------------

def _ints(payload: memoryview) -> list[int]:
    # One repeated int field (DevMatrix/TensorMap/...): field 1, unpacked or packed. The isinstance
    # tests beside the wire types tell mypy what iter_fields yields for each (an int, a payload view).
    out = []
    for num, wire, value, _ in protowire.iter_fields(payload):
        if num != 1:
            continue
        if wire == protowire.VARINT and isinstance(value, int):
            out.append(protowire.as_signed64(value))
        elif wire == protowire.LEN and isinstance(value, memoryview):
            out.extend(protowire.as_signed64(v) for v in protowire.packed_varints(value))
    return out


def _layout_from_proto(payload: memoryview, name: str, path: str) -> LayoutRecord:
    dev: list[int] | None = None
    maps: list[list[int]] = []
    step, size, fld = 0, 0, 0
    split: list[int] = []
    offsets: list[int] = []
    for num, wire, value, _ in protowire.iter_fields(payload):
        if num == 1 and wire == protowire.LEN and isinstance(value, memoryview) and dev is None:
            dev = _ints(value)
        elif num == 2 and wire == protowire.LEN and isinstance(value, memoryview):
            if len(maps) >= MAX_NDIM:
                raise StrategyError(f"strategy file {path}: parameter {name!r} has more than {MAX_NDIM} tensor maps")
            maps.append(_ints(value))
        elif num == 3 and wire == protowire.LEN and isinstance(value, memoryview):
            split += _ints(value)
        elif num == 4 and wire == protowire.LEN and isinstance(value, memoryview):
            offsets += _ints(value)
        elif num == 5 and wire == protowire.VARINT and isinstance(value, int):
            fld = protowire.as_signed64(value)
        elif num == 6 and wire == protowire.VARINT and isinstance(value, int):
            step = protowire.as_signed64(value)
        elif num == 7 and wire == protowire.VARINT and isinstance(value, int):
            size = protowire.as_signed64(value)
    if dev is None or not maps:
        raise StrategyError(f"strategy file {path}: parameter {name!r} has no device matrix or tensor map")
    # One TensorMap lists one device axis per tensor axis; several (a Layout tuple) list, per tensor
    # axis, the device axes that split it, and empty ones are skipped (MindSpore's _convert_to_list).
    tensor_map = tensor_map_axes(maps[0] if len(maps) == 1 else [m for m in maps if m])
    return LayoutRecord(tuple(dev), tensor_map, step, size, fld, tuple(split), tuple(offsets))


def _strategy_item_stage(item: memoryview) -> int | None:
    for num, wire, value, _ in protowire.iter_fields(item):
        if num == 2 and wire == protowire.LEN and isinstance(value, memoryview):
            for n2, w2, v2, _ in protowire.iter_fields(value):
                if n2 == 1 and w2 == protowire.VARINT and isinstance(v2, int):
                    return int(v2)
    return None


def parse_proto(path: str, data: bytes) -> StrategyFileContents:
    """Parse a ``ParallelStrategyMap`` protobuf; :class:`StrategyError` naming ``path`` when it is not one."""
    layouts: dict[str, LayoutRecord] = {}
    stage = None
    try:
        for num, wire, value, _ in protowire.iter_fields(data):
            if num == 2 and wire == protowire.LEN and isinstance(value, memoryview) and stage is None:
                stage = _strategy_item_stage(value)
            elif num == 3 and wire == protowire.LEN and isinstance(value, memoryview):
                name, layout_bytes = None, None
                for n2, w2, v2, _ in protowire.iter_fields(value):
                    if n2 == 1 and w2 == protowire.LEN and isinstance(v2, memoryview):
                        name = bytes(v2).decode("utf-8")
                    elif n2 == 2 and w2 == protowire.LEN and isinstance(v2, memoryview):
                        layout_bytes = v2
                if name is None or layout_bytes is None:
                    raise StrategyError(f"strategy file {path}: a layout item has no name or no layout")
                layouts[name] = _layout_from_proto(layout_bytes, name, path)
    except (protowire.WireError, UnicodeDecodeError, TypeError) as e:
        raise StrategyError(f"strategy file {path} is not a MindSpore strategy file (protobuf "
                            f"ParallelStrategyMap or .json): {e}") from None
    return StrategyFileContents(path, stage, layouts)


# ---- JSON -----------------------------------------------------------------------------------

def _flat_ints(value: object, what: str) -> tuple[int, ...]:
    """A JSON list of ints, or of lists of ints, flattened (``None`` -> ``()``)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TypeError(f"{what} is {value!r}, not a list")
    return tuple(strict_int(x, what) for v in value for x in (v if isinstance(v, list) else [v]))


def _int_field(item: dict, key: str) -> int:
    value = item.get(key, 0)
    return 0 if value is None else strict_int(value, key)


def parse_json(path: str, data: bytes) -> StrategyFileContents:
    """Parse the JSON form (``StrategyCheckpointInfo::to_json``); :class:`StrategyError` naming ``path``."""
    try:
        content = json.loads(data)
        items = content.get("parallel_layout_item") or {}
        stage = None
        for item in (content.get("parallel_strategy_item") or {}).values():
            stage = strict_int(item["stage"], "stage")
            break
        layouts = {}
        for name, item in items.items():
            dev = item["dev_matrix"]
            if not isinstance(dev, list):
                raise TypeError(f"dev_matrix is {dev!r}, not a list")
            layouts[name] = LayoutRecord(
                tuple(strict_int(d, "dev_matrix") for d in dev), tensor_map_axes(item["tensor_map"]),
                _int_field(item, "opt_weight_shard_step"), _int_field(item, "opt_weight_shard_size"),
                _int_field(item, "field"), _flat_ints(item.get("param_split_shape"), "param_split_shape"),
                _flat_ints(item.get("indices_offset"), "indices_offset"),
                _flat_ints(item.get("tensor_shape"), "tensor_shape"))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:  # Recursion: nested too deep
        raise StrategyError(f"strategy file {path} is not a valid JSON strategy: {e!r}") from None
    return StrategyFileContents(path, stage, layouts)


# ---- files ----------------------------------------------------------------------------------

def parse_strategy(path: str, data: bytes) -> StrategyFileContents:
    """Parse the bytes of strategy file ``path``: JSON when its name ends in ``.json`` (as MindSpore
    decides), else protobuf."""
    return parse_json(path, data) if path.endswith(".json") else parse_proto(path, data)


def read_strategy_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of strategy file ``path`` (local or a URL), at most ``MAX_METADATA_BYTES``.

    Raises :class:`~ckptstore.errors.MissingFileError` when it does not exist and
    :class:`~ckptstore.errors.StrategyError` when it is a folder, too large or unreadable.
    """
    p = os.fspath(path)
    if is_url(p):
        f = open_user_file(p)
        if f.size > MAX_METADATA_BYTES:
            raise StrategyError(f"strategy file {p} is larger than {MAX_METADATA_BYTES} bytes")
        return f.pread(0, f.size)
    try:
        with open(p, "rb") as fh:
            if os.fstat(fh.fileno()).st_size > MAX_METADATA_BYTES:
                raise StrategyError(f"strategy file {p} is larger than {MAX_METADATA_BYTES} bytes")
            return fh.read()
    except FileNotFoundError:
        raise MissingFileError(errno.ENOENT, f"strategy file {p} does not exist", p) from None
    except IsADirectoryError:
        raise StrategyError(f"strategy path {p} is a directory; pass the strategy file(s) inside it") from None
    except OSError as e:
        raise StrategyError(f"cannot read strategy file {p}: {e.strerror}") from None
