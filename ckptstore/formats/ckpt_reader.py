"""Stream the MindSpore ``.ckpt`` wire format: parameter names, dtypes, shapes and byte pieces.

A ``.ckpt`` file is a sequence of ``Checkpoint.value`` records (field 1, length-delimited), each
``Value{tag=1, tensor=2, maptensor=3}`` with ``TensorProto{dims=1, tensor_type=2,
tensor_content=3}``. A tensor larger than MindSpore's ``SLICE_SIZE`` is written as several
consecutive records with the same tag and the full dims in each; its C-order bytes are the
concatenation of their contents. ``save_checkpoint(crc_check=True)`` appends ``b"crc_num"`` and a
10-byte big-endian CRC-32 of everything before it.

:func:`scan_checkpoint` walks the records reading only their small headers and seeks past every
payload, so scanning costs a few KiB per record whatever the tensor sizes. Reads then go
straight from the recorded offsets into the caller's buffer.
"""
from __future__ import annotations

import functools
import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from math import prod

import numpy as np

from ckptstore.dtypes import STR_TYPE, UNSUPPORTED_TYPES, lookup
from ckptstore.errors import (
    ChecksumMismatchError,
    CorruptCheckpointError,
    EncryptedCheckpointError,
    ShortReadError,
    TruncatedCheckpointError,
    UnsupportedCheckpointError,
)
from ckptstore.formats import protowire
from ckptstore.io.base import ReadableFile
from ckptstore.io.locations import open_user_file
from ckptstore.limits import MAX_NAME_BYTES, MAX_NDIM, MAX_STR_BYTES, MAX_TENSOR_BYTES

CRC_MAGIC = b"crc_num"
CRC_TRAILER_BYTES = len(CRC_MAGIC) + 10
_VALUE_KEY = 0x0A  # Checkpoint.value: field 1, length-delimited
_WINDOW = 4 * 1024  # read-ahead for record headers: small, so neighbouring small payloads are not read
_CRC_BLOCK = 8 * 1024 * 1024
#: First 4 bytes of files MindSpore encrypts with ``enc_key``: the little-endian magic number of each
#: ``enc_mode`` (``mindspore/core/include/utils/crypto.h``: 0x7F3A5ED8 AES-GCM, 0x7F3A5ED9 AES-CBC,
#: 0x7F3A5EDA SM4-CBC); every encrypted block of the file starts with it.
CIPHER_MAGICS = {bytes.fromhex("d85e3a7f"): "AES-GCM", bytes.fromhex("d95e3a7f"): "AES-CBC",
                 bytes.fromhex("da5e3a7f"): "SM4-CBC"}


def cipher_mode(f: ReadableFile) -> str | None:
    """The ``enc_mode`` a checkpoint was encrypted with (``"AES-GCM"``, ``"AES-CBC"``, ``"SM4-CBC"``), or ``None``."""
    return CIPHER_MAGICS.get(f.pread(0, 4)) if f.size >= 4 else None


@dataclass(frozen=True)
class CkptEntry:
    """One parameter of a ``.ckpt`` file: its type, local shape and where its bytes lie.

    ``pieces`` are ``(offset, length)`` byte ranges in the file, in order; their concatenation is
    the tensor's C-order little-endian bytes (for ``str`` values, UTF-32-LE text).
    """

    name: str
    tensor_type: str
    shape: tuple[int, ...]
    pieces: tuple[tuple[int, int], ...]
    record_offset: int

    @property
    def is_str(self) -> bool:
        return self.tensor_type == STR_TYPE

    @property
    def dtype(self) -> np.dtype:
        if self.is_str:
            return np.dtype(f"<U{max(self.nbytes // 4, 1)}")
        return lookup(self.tensor_type).numpy

    #: Total payload bytes (the pieces' lengths summed once: a 128-rank scan makes 445k entries).
    nbytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        pieces = self.pieces
        object.__setattr__(self, "nbytes", pieces[0][1] if len(pieces) == 1 else sum(n for _, n in pieces))


@dataclass(frozen=True)
class CkptIndex:
    """What :func:`scan_checkpoint` found in one file: its entries in file order, and its CRC."""

    path: str
    size: int
    entries: Mapping[str, CkptEntry]
    stored_crc: int | None = None
    data_end: int = field(default=0)

    def __getitem__(self, name: str) -> CkptEntry:
        return self.entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def names(self) -> list[str]:
        return list(self.entries)


class _Window:
    """A forward cursor over a file that reads small headers through a read-ahead window."""

    def __init__(self, f: ReadableFile, end: int) -> None:
        self.f, self.path, self.end = f, f.url, end
        self.pos = 0
        self._buf = b""
        self._buf_at = 0
        self.param: str | None = None

    def _need(self, n: int) -> memoryview:
        if self.pos + n > self.end:
            raise TruncatedCheckpointError(
                f"the file ends {self.pos + n - self.end} bytes too early inside a record",
                path=self.path, param=self.param, offset=self.pos)
        lo = self.pos - self._buf_at
        if lo < 0 or lo + n > len(self._buf):
            self._buf = self.f.pread(self.pos, max(n, self.f.read_ahead or _WINDOW))
            self._buf_at, lo = self.pos, 0
            if len(self._buf) < n:
                raise TruncatedCheckpointError(
                    "the file is shorter than its size says (it changed while being read?)",
                    path=self.path, param=self.param, offset=self.pos)
        return memoryview(self._buf)[lo:lo + n]

    def ahead(self) -> bytes:
        """The bytes buffered from the cursor on (read ahead first if little is left)."""
        lo = self.pos - self._buf_at
        if lo < 0 or len(self._buf) - lo < 512:
            self._buf = self.f.pread(self.pos, self.f.read_ahead or _WINDOW)
            self._buf_at, lo = self.pos, 0
        return self._buf[lo:] if lo else self._buf

    def varint(self, limit: int) -> int:
        avail = min(protowire.MAX_VARINT_BYTES, limit - self.pos)
        if avail <= 0:
            raise self._truncated("a varint")
        buf = self._need(avail)
        try:
            value, used = protowire.decode_varint(buf, 0)
        except protowire.WireError as e:
            if e.problem.startswith("truncated"):
                # bytes ran out at the end of the file (not of an enclosing record): a cut file
                raise self._truncated("a varint", at_eof=limit >= self.end) from None
            raise CorruptCheckpointError(e.problem, path=self.path, param=self.param, offset=self.pos) from None
        self.pos += used
        return value

    def take(self, n: int, limit: int, *, most: int = MAX_NAME_BYTES) -> bytes:
        if self.pos + n > limit:
            raise self._truncated(f"a {n}-byte field")
        if n > most:
            raise CorruptCheckpointError(f"a name or type string of {n} bytes (more than {most})", path=self.path,
                                         param=self.param, offset=self.pos)
        data = bytes(self._need(n))
        self.pos += n
        return data

    def _truncated(self, what: str, *, at_eof: bool = False) -> Exception:
        if at_eof or self.pos >= self.end:
            return TruncatedCheckpointError(f"the file ends inside {what}", path=self.path,
                                            param=self.param, offset=self.pos)
        return CorruptCheckpointError(f"{what} runs past the end of its record", path=self.path,
                                      param=self.param, offset=self.pos)


@dataclass
class _Record:
    tag: str | None = None
    dims: list[int] = field(default_factory=list)
    tensor_type: str | None = None
    content: tuple[int, int] | None = None
    offset: int = 0
    end: int = 0


def _parse_tensor(w: _Window, end: int, rec: _Record) -> None:
    while w.pos < end:
        key_at = w.pos
        key = w.varint(end)
        num, wire = key >> 3, key & 7
        if num == 1 and wire == protowire.VARINT:
            rec.dims.append(protowire.as_signed64(w.varint(end)))
            if len(rec.dims) > MAX_NDIM:
                raise CorruptCheckpointError(f"a tensor with more than {MAX_NDIM} dimensions", path=w.path,
                                             param=w.param, offset=key_at)
        elif num == 1 and wire == protowire.LEN:
            payload = w.take(w.varint(end), end, most=MAX_NDIM * protowire.MAX_VARINT_BYTES)
            try:
                rec.dims.extend(protowire.as_signed64(v) for v in protowire.packed_varints(memoryview(payload)))
                if len(rec.dims) > MAX_NDIM:
                    raise protowire.WireError(f"more than {MAX_NDIM} dimensions", 0)
            except protowire.WireError as e:
                raise CorruptCheckpointError(f"the dimensions are malformed ({e.problem})", path=w.path,
                                             param=w.param, offset=key_at) from None
        elif num == 2 and wire == protowire.LEN:
            rec.tensor_type = _text(w, w.take(w.varint(end), end), key_at)
        elif num == 3 and wire == protowire.LEN:
            length = w.varint(end)
            if w.pos + length > end:
                raise w._truncated(f"tensor content of {length} bytes")
            rec.content = (w.pos, length)
            w.pos += length
        else:
            _skip(w, wire, end, key_at)


def _skip(w: _Window, wire: int, end: int, key_at: int) -> None:
    if wire == protowire.VARINT:
        w.varint(end)
    elif wire == protowire.LEN:
        length = w.varint(end)
        if w.pos + length > end:
            raise w._truncated(f"a field of {length} bytes")
        w.pos += length
    elif wire in (protowire.FIXED64, protowire.FIXED32):
        w.take(8 if wire == protowire.FIXED64 else 4, end)
    else:
        raise CorruptCheckpointError(f"invalid protobuf wire type {wire}", path=w.path, param=w.param,
                                     offset=key_at)


def _text(w: _Window, raw: bytes, at: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptCheckpointError("a name or type string is not valid UTF-8", path=w.path,
                                     param=w.param, offset=at) from None


def _parse_value(w: _Window, end: int) -> _Record:
    rec = _Record(offset=w.pos)
    while w.pos < end:
        key_at = w.pos
        key = w.varint(end)
        num, wire = key >> 3, key & 7
        if num == 1 and wire == protowire.LEN:
            rec.tag = _text(w, w.take(w.varint(end), end), key_at)
            w.param = rec.tag
        elif num == 2 and wire == protowire.LEN:
            tensor_end = w.varint(end)
            tensor_end += w.pos
            if tensor_end > end:
                raise w._truncated("a tensor")
            _parse_tensor(w, tensor_end, rec)
        elif num == 3 and wire == protowire.LEN:
            raise UnsupportedCheckpointError(
                "this is a MapParameter (map tensor); ckptstore does not support map tensors",
                path=w.path, param=rec.tag, offset=key_at)
        else:
            _skip(w, wire, end, key_at)
    return rec


def _crc_trailer(f: ReadableFile) -> int | None:
    if f.size < CRC_TRAILER_BYTES:
        return None
    tail = f.pread(f.size - CRC_TRAILER_BYTES, CRC_TRAILER_BYTES)
    if tail[:len(CRC_MAGIC)] != CRC_MAGIC:
        return None
    return int.from_bytes(tail[len(CRC_MAGIC):], "big")


class _Irregular(Exception):
    """The fast path met something it does not handle: the general parser takes the record."""


def _fast_record(b: bytes, base: int, size: int) -> _Record:
    """The record at the start of ``b`` (the file's bytes from offset ``base``), when it has the
    shape ``mindspore.save_checkpoint`` writes: name, then a tensor of dims, type and content,
    each field once and in that order, all headers inside ``b``.

    Raises :class:`_Irregular` for anything else (other field orders, extra fields, a header
    that runs past ``b``, a record past the end of the file): the general parser, which says
    what is wrong with a damaged record, takes over. Parsing MindSpore's own records in one
    function, without the window's per-field bounds checks, is what makes a header scan of a
    128-rank job (445,696 records) fast.
    """
    try:
        if b[0] != _VALUE_KEY:
            raise _Irregular
        length, p = protowire.decode_varint(b, 1)
        end = p + length
        if base + end > size or b[p] != 0x0A:
            raise _Irregular
        n, p = protowire.decode_varint(b, p + 1)
        if n > MAX_NAME_BYTES or p + n > len(b):
            raise _Irregular
        tag = b[p:p + n].decode("utf-8")
        p += n
        if b[p] != 0x12:
            raise _Irregular
        n, p = protowire.decode_varint(b, p + 1)
        if p + n != end:
            raise _Irregular
        rec = _Record(tag=tag)
        dims = rec.dims
        while True:
            key = b[p]
            if key == 0x08:
                d, p = protowire.decode_varint(b, p + 1)
                dims.append(d - (1 << 64) if d >= 1 << 63 else d)
                if len(dims) > MAX_NDIM:
                    raise _Irregular
            elif key == 0x12 and rec.tensor_type is None:
                n, p = protowire.decode_varint(b, p + 1)
                if n > MAX_NAME_BYTES or p + n > len(b):
                    raise _Irregular
                rec.tensor_type = b[p:p + n].decode("utf-8")
                p += n
            elif key == 0x1A:
                n, p = protowire.decode_varint(b, p + 1)
                if p + n != end:
                    raise _Irregular  # content is the last field, and ends the record
                rec.content = (base + p, n)
                break
            else:
                raise _Irregular
        rec.offset, rec.end = base, base + end
        return rec
    except (IndexError, UnicodeDecodeError, protowire.WireError):
        raise _Irregular from None


def _iter_records(f: ReadableFile) -> Iterator[_Record]:
    w = _Window(f, f.size)
    size = f.size
    while w.pos < size:
        w.param = None
        start = w.pos
        try:
            rec = _fast_record(w.ahead(), start, size)
        except _Irregular:
            pass
        else:
            _check_record(rec, f.url, start)
            yield rec
            w.pos = rec.end
            continue
        first = w._need(1)[0]
        if first != _VALUE_KEY:
            _explain_non_record(f, start, first)
            return
        w.pos += 1
        length = w.varint(size)
        end = w.pos + length
        if end > size:
            w.param = _peek_tag(w, size)
            raise TruncatedCheckpointError(
                f"a record of {length} bytes runs {end - size} bytes past the end of the file",
                path=f.url, param=w.param, offset=start)
        rec = _parse_value(w, end)
        rec.offset, rec.end = start, end
        _check_record(rec, f.url, start)
        yield rec
        w.pos = end


def _explain_non_record(f: ReadableFile, at: int, first: int) -> None:
    """Return quietly at a CRC trailer; raise the error that explains any other non-record bytes."""
    tail = f.pread(at, CRC_TRAILER_BYTES)
    if f.size - at == CRC_TRAILER_BYTES and tail.startswith(CRC_MAGIC):
        return
    if CRC_MAGIC.startswith(tail[:len(CRC_MAGIC)]) or tail.startswith(CRC_MAGIC):
        raise TruncatedCheckpointError("the CRC trailer (crc_num) is cut short or damaged", path=f.url,
                                       offset=at)
    if at == 0:
        _refuse_encrypted(f)
        raise CorruptCheckpointError(
            f"this is not a MindSpore checkpoint: it starts with byte 0x{first:02x}, not a checkpoint record",
            path=f.url, offset=0)
    raise CorruptCheckpointError(f"unexpected byte 0x{first:02x} where a record should start", path=f.url,
                                 offset=at)


def _refuse_encrypted(f: ReadableFile) -> None:
    mode = cipher_mode(f)
    if mode is not None:
        raise EncryptedCheckpointError(
            f"the file is encrypted ({mode}, saved with enc_key and enc_mode={mode!r}); its records cannot be "
            f"read in place. Convert it with 'ckptstore convert --dec-key-file KEYFILE --dec-mode {mode}' (or "
            f"ckptstore.convert(dec_key=..., dec_mode={mode!r})), or decrypt it with "
            f"mindspore.load_checkpoint(path, dec_key=..., dec_mode={mode!r}) and save it again without enc_key",
            path=f.url, offset=0)


def _peek_tag(w: _Window, size: int) -> str | None:
    try:
        key = w.varint(size)
        if key == _VALUE_KEY:
            return w.take(w.varint(size), size).decode("utf-8", "replace")
    except (TruncatedCheckpointError, CorruptCheckpointError):
        pass
    return None


def _check_record(rec: _Record, path: str, at: int) -> None:
    if rec.tag is None:
        raise CorruptCheckpointError("a record has no parameter name", path=path, offset=at)
    if rec.tensor_type is None or rec.content is None:
        raise CorruptCheckpointError("a record has no tensor type or no content", path=path,
                                     param=rec.tag, offset=at)
    if rec.tensor_type in UNSUPPORTED_TYPES:
        raise UnsupportedCheckpointError(UNSUPPORTED_TYPES[rec.tensor_type], path=path, param=rec.tag,
                                         offset=at)
    if rec.tensor_type != STR_TYPE and not _known_type(rec.tensor_type):
        raise CorruptCheckpointError(f"unknown tensor type {rec.tensor_type!r}", path=path,
                                     param=rec.tag, offset=at)
    if rec.dims and min(rec.dims) < 0:
        raise CorruptCheckpointError(f"negative dimension in {rec.dims}", path=path, param=rec.tag,
                                     offset=at)


def _entry(records: Sequence[_Record], path: str, *, at_eof: bool = False) -> CkptEntry:
    last = records[-1]
    dims = tuple(last.dims)
    if last.tensor_type != STR_TYPE and dims == (0,):
        dims = ()  # MindSpore's loader reads dims [0] of a non-string value as a scalar
    if len(records) > 1 and any(r.tensor_type != last.tensor_type for r in records):
        raise CorruptCheckpointError("the records of one parameter disagree on its type", path=path,
                                     param=last.tag, offset=records[0].offset)
    pieces = tuple(r.content for r in records if r.content and r.content[1])
    # _check_record refused every record without a name or a type before it reached here
    assert last.tag is not None and last.tensor_type is not None
    entry = CkptEntry(last.tag, last.tensor_type, () if last.tensor_type == STR_TYPE else dims,
                      pieces, records[0].offset)
    if not entry.is_str:
        elements = 1
        for d in dims:  # bounded step by step: a hostile header may hold huge dimensions
            elements = min(elements * d, MAX_TENSOR_BYTES + 1)
        expected = elements * _itemsize(last.tensor_type)
        if entry.nbytes < expected and at_eof:
            # the file stops between two records of this parameter: it was cut there
            raise TruncatedCheckpointError(
                f"the file ends after {entry.nbytes} of the {expected} bytes of shape {list(dims)} of "
                f"{last.tensor_type}", path=path, param=last.tag, offset=last.end)
        if entry.nbytes != expected:
            raise CorruptCheckpointError(
                f"its content has {entry.nbytes} bytes but shape {list(dims)} of {last.tensor_type} "
                f"needs {expected}", path=path, param=last.tag, offset=records[0].offset)
    elif entry.nbytes % 4:
        raise CorruptCheckpointError("a string value's length is not a multiple of 4 (UTF-32)",
                                     path=path, param=last.tag, offset=records[0].offset)
    return entry


# Both cached: a job has a handful of tensor types, met 445k times in a 128-rank header scan.
@functools.lru_cache(maxsize=64)
def _itemsize(tensor_type: str) -> int:
    return lookup(tensor_type).numpy.itemsize


@functools.lru_cache(maxsize=64)
def _known_type(tensor_type: str) -> bool:
    try:
        lookup(tensor_type)
    except ValueError:
        return False
    return tensor_type[:1].isupper()  # MindSpore names ("Float32"), not numpy ones


def open_file(path: str | os.PathLike[str] | ReadableFile) -> tuple[ReadableFile, bool]:
    """``(file, opened_here)`` for a path or an already open file."""
    if isinstance(path, ReadableFile):
        return path, False
    return open_user_file(path), True


def scan_checkpoint(path: str | os.PathLike[str] | ReadableFile, *, verify_crc: bool = False) -> CkptIndex:
    """Index a MindSpore ``.ckpt`` file without reading its payloads.

    Returns a :class:`CkptIndex` mapping each parameter name to its :class:`CkptEntry` (dtype,
    local shape, byte pieces), in file order. Consecutive records with one name are one
    parameter; a name that appears again later replaces the earlier one, as in
    ``mindspore.load_checkpoint``. The CRC trailer is recognised and skipped; with
    ``verify_crc=True`` the whole file is read once (in 8 MiB blocks) to check it. Raises a
    :class:`~ckptstore.errors.CheckpointFileError` subclass naming the file, parameter and byte
    offset for truncated, corrupt, encrypted or unsupported files.
    """
    f, own = open_file(path)
    try:
        if f.size == 0:
            raise TruncatedCheckpointError("the file is empty", path=f.url, offset=0)
        _refuse_encrypted(f)
        stored = _crc_trailer(f)
        entries: dict[str, CkptEntry] = {}
        group: list[_Record] = []
        data_end = 0
        for rec in _iter_records(f):
            if group and rec.tag != group[-1].tag:
                entry = _entry(group, f.url)
                entries.pop(entry.name, None)
                entries[entry.name] = entry
                group = []
            group.append(rec)
            data_end = rec.end
        if group:
            entry = _entry(group, f.url, at_eof=data_end == f.size)
            entries.pop(entry.name, None)
            entries[entry.name] = entry
        # The records are length-delimited, so the trailer is exactly what follows the last one.
        trailer = stored is not None and data_end == f.size - CRC_TRAILER_BYTES
        index = CkptIndex(f.url, f.size, entries, stored if trailer else None, data_end)
        if verify_crc:
            verify_checkpoint_crc(index, f)
        return index
    except ShortReadError as e:
        raise TruncatedCheckpointError(f"the file shrank while being read ({e})", path=f.url, offset=e.end) from None
    finally:
        if own:
            f.close()


def verify_checkpoint_crc(index: CkptIndex, f: ReadableFile | None = None) -> None:
    """Check the file's ``crc_num`` trailer against a CRC-32 of its records.

    Raises :class:`~ckptstore.errors.ChecksumMismatchError` on a mismatch and when the file has
    no trailer (it was saved without ``crc_check=True``, so there is nothing to verify).
    """
    if index.stored_crc is None:
        raise ChecksumMismatchError("the file has no CRC trailer (it was saved without crc_check=True)",
                                    path=index.path)
    file, own = (f, False) if f is not None else open_file(index.path)
    try:
        crc, pos = 0, 0
        buf = bytearray(min(_CRC_BLOCK, index.data_end))
        while pos < index.data_end:
            view = memoryview(buf)[:min(len(buf), index.data_end - pos)]
            file.read_into(pos, view)
            crc = zlib.crc32(view, crc)
            pos += len(view)
    finally:
        if own:
            file.close()
    if crc != index.stored_crc:
        raise ChecksumMismatchError(
            f"CRC-32 of the records is {crc} but the trailer says {index.stored_crc}: the file is damaged",
            path=index.path, offset=index.data_end)


def entry_ranges(pieces: Sequence[tuple[int, int]], start: int, nbytes: int) -> list[tuple[int, int]]:
    """``(file offset, length)`` of the logical bytes ``[start, start + nbytes)`` of an entry stored
    as ``pieces`` (``(offset, length)`` in the file, concatenated in order)."""
    want_end = start + nbytes
    logical, found = 0, 0
    ranges = []
    for offset, length in pieces:
        lo, hi = max(start, logical), min(want_end, logical + length)
        if lo < hi:
            ranges.append((offset + lo - logical, hi - lo))
            found += hi - lo
        logical += length
        if logical >= want_end:
            break
    if found != nbytes:
        raise ValueError(f"asked for bytes [{start}, {want_end}) but the entry has {logical}")
    return ranges


def entry_requests(pieces: Sequence[tuple[int, int]], start: int, out: memoryview) -> list[tuple[int, memoryview]]:
    """Read requests that fill ``out`` with the logical bytes ``[start, start + len(out))`` of an
    entry stored as ``pieces`` (``(offset, length)`` in the file, concatenated in order)."""
    requests, written = [], 0
    for offset, length in entry_ranges(pieces, start, len(out)):
        requests.append((offset, out[written:written + length]))
        written += length
    return requests


def read_into(f: ReadableFile, pieces: Sequence[tuple[int, int]], start: int, out: memoryview, *,
              param: str | None = None) -> None:
    """Fill ``out`` with the logical bytes ``[start, start + len(out))`` of a parameter.

    ``pieces`` are the parameter's ``(offset, length)`` ranges in the file (its logical bytes
    are their concatenation). Bytes go straight from the file into ``out``.
    """
    try:
        requests = entry_requests(pieces, start, out)
    except ValueError as e:
        raise CorruptCheckpointError(str(e), path=f.url, param=param) from None
    try:
        f.read_requests(requests)
    except ShortReadError as e:
        raise TruncatedCheckpointError("the file ends before this parameter's bytes", path=f.url, param=param,
                                       offset=e.end) from None


def read_entry(path: str | os.PathLike[str] | ReadableFile, entry: CkptEntry, *,
               rows: tuple[int, int] | None = None, out: np.ndarray | None = None) -> np.ndarray | str:
    """Read one parameter (or rows ``[lo, hi)`` of its first axis) as a numpy array.

    The result equals what ``mindspore.load_checkpoint`` gives for that parameter (for ``str``
    values, the Python string). Only the needed byte ranges are read, directly into ``out``
    when given (it must be C-contiguous with the right dtype and shape).
    """
    f, own = open_file(path)
    try:
        if entry.is_str:
            return read_str(f, entry)
        shape = entry.shape
        start = 0
        if rows is not None:
            if not shape:
                raise ValueError(f"parameter {entry.name!r} is a scalar; it has no rows")
            lo, hi = rows
            if not 0 <= lo <= hi <= shape[0]:
                raise ValueError(f"rows [{lo}, {hi}) are outside {entry.name!r} of shape {list(shape)}")
            row_bytes = prod(shape[1:]) * entry.dtype.itemsize
            shape, start = (hi - lo, *shape[1:]), lo * row_bytes
        if out is None:
            out = np.empty(shape, dtype=entry.dtype)
        elif out.shape != shape or out.dtype != entry.dtype or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous {entry.dtype} array of shape {list(shape)}")
        read_into(f, entry.pieces, start, out.reshape(-1).view(np.uint8).data, param=entry.name)
        return out
    finally:
        if own:
            f.close()


def read_str(f: ReadableFile, entry: CkptEntry) -> str:
    if entry.nbytes > MAX_STR_BYTES:
        raise CorruptCheckpointError(f"a string value of {entry.nbytes} bytes (more than {MAX_STR_BYTES})",
                                     path=f.url, param=entry.name, offset=entry.record_offset)
    raw = bytearray(entry.nbytes)
    read_into(f, entry.pieces, 0, memoryview(raw), param=entry.name)
    if raw and int(np.frombuffer(raw, "<u4").max()) > 0x10FFFF:  # numpy raises SystemError
        raise CorruptCheckpointError("a string value holds a code point beyond U+10FFFF (not UTF-32)",
                                     path=f.url, param=entry.name, offset=entry.record_offset)
    return str(np.frombuffer(bytes(raw), entry.dtype)[0]) if raw else ""
