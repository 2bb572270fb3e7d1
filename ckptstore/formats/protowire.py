"""The protobuf wire format, decoded by hand.

MindSpore checkpoints and strategy files are protobuf messages. The protobuf runtime parses a
whole message in memory, which for a checkpoint means the whole file; decoding the wire format
ourselves lets the checkpoint reader seek past payloads and lets ckptstore read strategy files
without importing MindSpore. Only what those two formats use is here: varints and
length-delimited fields (wire types 0 and 2), plus skipping fixed-width ones (1 and 5).
"""
from __future__ import annotations

from collections.abc import Iterator

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5
MAX_VARINT_BYTES = 10


class WireError(ValueError):
    """Malformed wire bytes; ``offset`` is relative to the buffer given to the decoder."""

    def __init__(self, problem: str, offset: int) -> None:
        super().__init__(f"{problem} at offset {offset}")
        self.problem = problem
        self.offset = offset


def decode_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Decode the unsigned varint at ``buf[pos:]``; return ``(value, next_pos)``.

    Raises :class:`WireError` when the buffer ends inside the varint (``problem`` starts with
    ``"truncated"``) or the varint is longer than 10 bytes. The one varint decoder: the header
    scan of a large job's rank files calls it for every field of ~450k records, so a one-byte
    varint (every tag, most lengths) returns at once and the rest loops without bounds checks
    (running off the buffer is the truncation).
    """
    try:
        byte = buf[pos]
        if byte < 0x80:
            return byte, pos + 1
        value, shift, i = byte & 0x7F, 7, pos + 1
        while True:
            byte = buf[i]
            value |= (byte & 0x7F) << shift
            i += 1
            if byte < 0x80:
                return value, i
            shift += 7
            if shift > 63:  # past the 10th byte (MAX_VARINT_BYTES): no 64-bit value is longer
                raise WireError("varint longer than 10 bytes", pos)
    except IndexError:
        raise WireError("truncated varint", pos) from None


def encode_varint(value: int) -> bytes:
    """Encode a non-negative int (or a negative one as its 64-bit two's complement) as a varint."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def as_signed64(value: int) -> int:
    """Interpret a decoded varint as a two's-complement int64 (how int32/int64 fields store -1)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def iter_fields(buf: bytes | memoryview, start: int = 0,
                end: int | None = None) -> Iterator[tuple[int, int, int | memoryview, int]]:
    """Yield ``(field_number, wire_type, value, offset)`` for each field of one message.

    ``value`` is the int for varints and fixed-width fields and a memoryview of the payload for
    length-delimited ones; ``offset`` is where the field's key starts. Raises
    :class:`WireError` on malformed or truncated bytes.
    """
    view = memoryview(buf)
    end = len(view) if end is None else end
    pos = start
    while pos < end:
        key_at = pos
        key, pos = decode_varint(view[:end], pos)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise WireError("field number 0", key_at)
        if wire == VARINT:
            value, pos = decode_varint(view[:end], pos)
            yield field, wire, value, key_at
        elif wire == LEN:
            length, pos = decode_varint(view[:end], pos)
            if pos + length > end:
                raise WireError(f"truncated field {field} of {length} bytes", key_at)
            yield field, wire, view[pos:pos + length], key_at
            pos += length
        elif wire in (FIXED64, FIXED32):
            width = 8 if wire == FIXED64 else 4
            if pos + width > end:
                raise WireError(f"truncated fixed-width field {field}", key_at)
            yield field, wire, int.from_bytes(view[pos:pos + width], "little"), key_at
            pos += width
        else:
            raise WireError(f"unsupported wire type {wire} for field {field}", key_at)


def packed_varints(payload: memoryview) -> list[int]:
    """Decode a packed repeated varint field's payload."""
    values, pos = [], 0
    while pos < len(payload):
        value, pos = decode_varint(payload, pos)
        values.append(value)
    return values
