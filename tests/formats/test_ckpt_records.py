"""The ``.ckpt`` record parsers without MindSpore: the two parsers agree, and junk is refused.

ckptstore parses a record header in one of two ways: a fast parser for the exact layout
``mindspore.save_checkpoint`` writes (name, then dims, type and content, each once and in that
order), and the general wire parser that takes any record the fast one declines (other field
orders, packed dims, unknown fields) and says what is wrong with a damaged one. Whichever parser
takes a record, the entries must be the same: the differential test below scans random files
once as they come and once with the fast parser declining every record, and compares the
outcomes (entries, CRC, or the error). Files made by MindSpore itself are in test_ckpt_reader.py.
"""
from __future__ import annotations

import os
import zlib
from math import prod
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore.dtypes import DTYPES, STR_TYPE
from ckptstore.errors import CheckpointFileError, CorruptCheckpointError, TruncatedCheckpointError
from ckptstore.formats import ckpt_reader
from ckptstore.formats.ckpt_reader import CkptIndex, read_entry, scan_checkpoint
from ckptstore.formats.ckpt_writer import CheckpointWriter
from ckptstore.formats.protowire import encode_varint
from conftest import examples

# ---- random records, in MindSpore's layout and in the layouts only the general parser takes ----

#: How a record's header is laid out. "mindspore" is what save_checkpoint writes (the fast parser's
#: case); "long-lengths" is that with every length as a padded 3-byte varint; the others are valid
#: protobuf that MindSpore does not write, which the fast parser may decline.
ENCODINGS = ["mindspore", "long-lengths", "packed-dims", "type-first", "unknown-fields"]


def _varint(value: int, padded: bool) -> bytes:
    raw = encode_varint(value)
    if not padded or len(raw) >= 3:
        return raw
    # the same value with continuation bytes of zero bits: legal protobuf, not what MindSpore writes
    return bytes(b | 0x80 for b in raw) + b"\x80" * (2 - len(raw)) + b"\x00"


def _len_field(number: int, payload: bytes, padded: bool) -> bytes:
    return encode_varint(number << 3 | 2) + _varint(len(payload), padded) + payload


def _record(name: str, dims: list[int], tensor_type: str, content: bytes, encoding: str) -> bytes:
    """One ``Checkpoint.value`` record: ``Value{tag=1, tensor=2{dims=1, tensor_type=2, content=3}}``."""
    padded = encoding == "long-lengths"
    if encoding == "packed-dims":
        dim_fields = _len_field(1, b"".join(encode_varint(d) for d in dims), False) if dims else b""
    else:
        dim_fields = b"".join(encode_varint(1 << 3) + encode_varint(d) for d in dims)
    type_field = _len_field(2, tensor_type.encode(), padded)
    head = type_field + dim_fields if encoding == "type-first" else dim_fields + type_field
    unknown = encode_varint(7 << 3) + encode_varint(300) if encoding == "unknown-fields" else b""
    tensor = head + unknown + _len_field(3, content, padded)
    value = unknown + _len_field(1, name.encode(), padded) + _len_field(2, tensor, padded)
    return _len_field(1, value, padded)


NAMES = st.one_of(st.sampled_from(["w", "layer0.w", "adam_m.layer0.w"]),  # repeats: a later one replaces
                  st.text(min_size=1, max_size=12))
DIMS = st.lists(st.integers(min_value=0, max_value=4), max_size=4)


@st.composite
def parameters(draw) -> tuple[list[bytes], bool]:
    """One parameter as 1-3 consecutive records (``(records, in MindSpore's layout)``).

    A tensor is cut into several records with the full dims in each, as MindSpore does above
    ``SLICE_SIZE``; sometimes its content is a few bytes short or long, or a dimension negative,
    which both parsers must refuse alike.
    """
    name = draw(NAMES)
    if draw(st.booleans()) and draw(st.booleans()):
        text = draw(st.text(max_size=6))
        tensor_type, dims, content = STR_TYPE, [0], text.encode("utf-32-le")
    else:
        dtype = draw(st.sampled_from(DTYPES))
        dims = draw(DIMS)
        elements = 1 if dims == [0] else prod(dims)  # dims [0] of a number is a scalar to MindSpore
        nbytes = elements * dtype.numpy.itemsize + draw(st.sampled_from([0] * 8 + [-1, 1]))
        content = draw(st.binary(min_size=max(nbytes, 0), max_size=max(nbytes, 0)))
        if draw(st.integers(0, 19)) == 0:
            dims = dims + [-1]
        tensor_type = dtype.mindspore
    cuts = sorted(draw(st.lists(st.integers(0, len(content)), max_size=2)))
    pieces = [content[a:b] for a, b in zip([0, *cuts], [*cuts, len(content)], strict=True)]
    encodings = [draw(st.sampled_from(ENCODINGS)) for _ in pieces]
    records = [_record(name, dims, tensor_type, p, e) for p, e in zip(pieces, encodings, strict=True)]
    return records, all(e in ("mindspore", "long-lengths") for e in encodings)


@st.composite
def checkpoint_files(draw) -> tuple[bytes, int, bool]:
    """``(file bytes, number of records, every record in MindSpore's layout)``, maybe with a CRC trailer."""
    params = draw(st.lists(parameters(), max_size=6))
    records = [r for rs, _ in params for r in rs]
    data = b"".join(records)
    if draw(st.booleans()):
        data += b"crc_num" + zlib.crc32(data).to_bytes(10, "big")
    return data, len(records), all(mindspore for _, mindspore in params)


def _outcome(path: Path) -> tuple:
    """What a scan gives: the index's entries and CRC, or the error with its location."""
    try:
        index = scan_checkpoint(path)
    except CheckpointFileError as e:
        return ("error", type(e).__name__, str(e), e.path, e.param, e.offset)
    return ("index", list(index.entries.items()), index.stored_crc, index.data_end, index.size)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("records")


@settings(max_examples=examples(400), deadline=None)
@given(checkpoint_files())
def test_the_fast_and_the_general_record_parser_give_the_same_entries(scratch, case):
    data, n_records, mindspore_layout = case
    path = scratch / "random.ckpt"
    path.write_bytes(data)
    fast_parser = ckpt_reader._fast_record
    taken = []

    def counted(*args):
        rec = fast_parser(*args)
        taken.append(rec.offset)
        return rec

    def declined(*args):
        raise ckpt_reader._Irregular

    # The two parsers are reached through the module's own names: no public switch exists for a
    # choice that only a test has reason to make.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ckpt_reader, "_fast_record", counted)
        fast = _outcome(path)
        mp.setattr(ckpt_reader, "_fast_record", declined)
        general = _outcome(path)
    assert fast == general
    if mindspore_layout and fast[0] == "index":
        assert len(taken) == n_records  # the comparison really ran the fast parser on every record


# ---- junk -----------------------------------------------------------------------------------


def scan_or_refuse(path: Path) -> None:
    """Scan; when that succeeds, read every entry. Only CheckpointFileError may escape."""
    try:
        index = scan_checkpoint(path)
    except CheckpointFileError:
        return
    assert isinstance(index, CkptIndex)
    for entry in index.entries.values():
        try:
            read_entry(path, entry)
        except CheckpointFileError:
            pass


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_raise_checkpoint_file_error_or_scan(scratch, data):
    path = scratch / "junk.ckpt"
    path.write_bytes(data)
    scan_or_refuse(path)


@pytest.mark.parametrize(
    "data,error,message",
    [
        (b"", TruncatedCheckpointError, "the file is empty"),
        (b"\x00", CorruptCheckpointError, "it starts with byte 0x00"),
        (b"\x0a", TruncatedCheckpointError, "the file ends inside a varint"),
        (b"\x0a\x00", CorruptCheckpointError, "a record has no parameter name"),
        (b"\x0a\x03\x0a\x01x", CorruptCheckpointError, "a record has no tensor type or no content"),
        (b"\x0a" + b"\xff" * 20, CorruptCheckpointError, "varint longer than 10 bytes"),
        (b"\xff" * 20, CorruptCheckpointError, "it starts with byte 0xff"),
        (b"crc_num" + bytes(5), TruncatedCheckpointError, "the CRC trailer (crc_num) is cut short or damaged"),
        (b"\x89PNG\r\n\x1a\n" + bytes(16), CorruptCheckpointError, "it starts with byte 0x89"),
        (b'{"current_stage": 1}', CorruptCheckpointError, "it starts with byte 0x7b"),
    ],
    ids=["empty", "zero-byte", "lone-key", "empty-record", "no-tensor", "endless-varint", "all-ff", "short-trailer",
         "png", "json"],
)
def test_fixed_junk_raises_a_located_checkpoint_file_error(tmp_path, data, error, message):
    path = tmp_path / "junk.ckpt"
    path.write_bytes(data)
    with pytest.raises(error) as info:
        scan_checkpoint(path)
    assert message in str(info.value)
    assert info.value.path == str(path) and info.value.offset is not None


# ---- writing ----------------------------------------------------------------------------------


def test_writer_abort_leaves_no_file(tmp_path):
    path = tmp_path / "x.ckpt"
    with pytest.raises(RuntimeError):
        with CheckpointWriter(path) as w:
            w.add("a", np.arange(3, dtype=np.float32))
            raise RuntimeError("stop")
    assert os.listdir(tmp_path) == []
