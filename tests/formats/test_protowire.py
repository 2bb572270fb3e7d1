"""Properties of the hand-written protobuf wire decoder (ckptstore.formats.protowire)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore.formats import protowire
from ckptstore.formats.protowire import FIXED32, FIXED64, LEN, VARINT, WireError
from conftest import examples

U64 = st.integers(min_value=0, max_value=2**64 - 1)
I64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
FIELD_NUMBER = st.integers(min_value=1, max_value=2**29 - 1)


def _field(draw_field: tuple[int, int, object]) -> bytes:
    num, wire, value = draw_field
    key = protowire.encode_varint(num << 3 | wire)
    if wire == VARINT:
        return key + protowire.encode_varint(value)
    if wire == LEN:
        return key + protowire.encode_varint(len(value)) + value
    width = 8 if wire == FIXED64 else 4
    return key + value.to_bytes(width, "little")


FIELDS = st.lists(
    st.one_of(
        st.tuples(FIELD_NUMBER, st.just(VARINT), U64),
        st.tuples(FIELD_NUMBER, st.just(LEN), st.binary(max_size=40)),
        st.tuples(FIELD_NUMBER, st.just(FIXED64), U64),
        st.tuples(FIELD_NUMBER, st.just(FIXED32), st.integers(min_value=0, max_value=2**32 - 1)),
    ),
    max_size=8,
)


def _message(fields: list[tuple[int, int, object]]) -> tuple[bytes, list[int]]:
    """The message bytes and the offset where each field's key starts (plus the end offset)."""
    parts = [_field(f) for f in fields]
    offsets = [0]
    for p in parts:
        offsets.append(offsets[-1] + len(p))
    return b"".join(parts), offsets


def _decoded(buf: bytes) -> list[tuple[int, int, object, int]]:
    return [(num, wire, bytes(v) if wire == LEN else v, at) for num, wire, v, at in protowire.iter_fields(buf)]


@settings(max_examples=examples(300))
@given(U64)
def test_varint_round_trips_every_uint64(value):
    encoded = protowire.encode_varint(value)
    assert protowire.decode_varint(encoded, 0) == (value, len(encoded))
    assert len(encoded) == max(1, -(-value.bit_length() // 7))


@settings(max_examples=examples(200))
@given(st.binary(max_size=5), U64)
def test_varint_decodes_at_an_offset_inside_a_buffer(prefix, value):
    buf = prefix + protowire.encode_varint(value) + b"\x01"
    assert protowire.decode_varint(buf, len(prefix)) == (value, len(buf) - 1)


@settings(max_examples=examples(200))
@given(I64)
def test_negative_int64_round_trips_through_as_signed64(value):
    encoded = protowire.encode_varint(value)
    decoded, end = protowire.decode_varint(encoded, 0)
    assert protowire.as_signed64(decoded) == value
    assert end == len(encoded) == (10 if value < 0 else len(encoded))


@pytest.mark.parametrize(
    "value,encoded",
    [(0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"), (300, b"\xac\x02"),
     (2**64 - 1, b"\xff" * 9 + b"\x01"), (-1, b"\xff" * 9 + b"\x01")],
    ids=["zero", "one", "max-1-byte", "min-2-byte", "300", "max-uint64", "minus-one"],
)
def test_varint_encoding_matches_the_protobuf_spec(value, encoded):
    assert protowire.encode_varint(value) == encoded


@settings(max_examples=examples(300))
@given(FIELDS)
def test_iter_fields_returns_the_fields_a_message_was_built_from(fields):
    buf, offsets = _message(fields)
    expected = [(num, wire, value, at) for (num, wire, value), at in zip(fields, offsets[:-1], strict=True)]
    assert _decoded(buf) == expected


@settings(max_examples=examples(200))
@given(FIELDS, st.binary(max_size=6), st.binary(max_size=6))
def test_iter_fields_honours_start_and_end(fields, before, after):
    buf, offsets = _message(fields)
    whole = before + buf + after
    got = [(n, w, bytes(v) if w == LEN else v, at)
           for n, w, v, at in protowire.iter_fields(whole, len(before), len(before) + len(buf))]
    assert got == [(n, w, v, at + len(before)) for (n, w, v), at in zip(fields, offsets[:-1], strict=True)]


@settings(max_examples=examples(150))
@given(FIELDS.filter(bool))
def test_truncated_messages_raise_wire_error_except_at_field_boundaries(fields):
    buf, offsets = _message(fields)
    expected = [(num, wire, value, at) for (num, wire, value), at in zip(fields, offsets[:-1], strict=True)]
    for cut in range(len(buf)):
        if cut in offsets:
            assert _decoded(buf[:cut]) == expected[:offsets.index(cut)]
        else:
            with pytest.raises(WireError) as info:
                _decoded(buf[:cut])
            assert 0 <= info.value.offset <= cut
            assert str(info.value).endswith(f"at offset {info.value.offset}")


@settings(max_examples=examples(300))
@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_wire_error(buf):
    try:
        fields = _decoded(buf)
    except WireError:
        return
    assert all(num >= 1 and wire in (VARINT, FIXED64, LEN, FIXED32) for num, wire, _, _ in fields)


@pytest.mark.parametrize(
    "buf,problem",
    [
        (b"", "truncated varint"),
        (b"\x80", "truncated varint"),
        (b"\xff" * 11, "varint longer than 10 bytes"),
    ],
    ids=["empty", "continuation-then-end", "eleven-bytes"],
)
def test_decode_varint_rejects_bad_input(buf, problem):
    with pytest.raises(WireError) as info:
        protowire.decode_varint(buf, 0)
    assert (info.value.problem, info.value.offset) == (problem, 0)


@pytest.mark.parametrize(
    "buf,message",
    [
        (b"\x00\x01", "field number 0 at offset 0"),
        (b"\x08\x01\x0b", "unsupported wire type 3 for field 1 at offset 2"),
        (b"\x0c", "unsupported wire type 4 for field 1 at offset 0"),
        (b"\x0a\x05abc", "truncated field 1 of 5 bytes at offset 0"),
        (b"\x09\x00\x00", "truncated fixed-width field 1 at offset 0"),
        (b"\x15\x00", "truncated fixed-width field 2 at offset 0"),
        (b"\x08", "truncated varint at offset 1"),
    ],
    ids=["field-zero", "group-start", "group-end", "short-len", "short-fixed64", "short-fixed32", "no-value"],
)
def test_iter_fields_error_messages(buf, message):
    with pytest.raises(WireError) as info:
        list(protowire.iter_fields(buf))
    assert str(info.value) == message


@settings(max_examples=examples(200))
@given(st.lists(U64, max_size=10))
def test_packed_varints_round_trip(values):
    payload = b"".join(protowire.encode_varint(v) for v in values)
    assert protowire.packed_varints(memoryview(payload)) == values
