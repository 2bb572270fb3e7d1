"""CRC-32C of bytes read in bounded blocks: the one read-and-checksum loop of ckptstore.

Copying a chunk, checking a replica, checksumming an index's slices, verifying a store and
checking a resumed journal all read some bytes a block at a time and fold them into a CRC-32C;
:func:`crc32c_read` is that loop (with a hook that sees each block, to copy it on), and
:func:`crc32c_of` applies it to pieces of stored files.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence

import crc32c

from ckptstore.io.base import ReadableFile

BLOCK = 16 << 20

#: ``read(offset, view)``: fill ``view`` with the bytes at ``offset`` of whatever is being read.
Reader = Callable[[int, memoryview], None]


def read_blocks(read: Reader, nbytes: int, *, fresh: bool = False, block: int = BLOCK) -> Iterator[memoryview]:
    """Bytes ``[0, nbytes)`` read by ``read``, as successive views of at most ``block`` bytes.

    The views share one buffer, each valid until the next is taken, unless ``fresh`` (a
    streamed upload may keep every block until it is sent).
    """
    buf = bytearray(0 if fresh else min(block, nbytes))
    done = 0
    while done < nbytes:
        n = min(block, nbytes - done)
        view = memoryview(bytearray(n)) if fresh else memoryview(buf)[:n]
        read(done, view)
        yield view
        done += n


def crc32c_read(read: Reader, nbytes: int, *, crc: int = 0, each: Reader | None = None,
                block: int = BLOCK) -> int:
    """CRC-32C (continuing ``crc``) of ``nbytes`` bytes read by ``read`` in bounded blocks;
    ``each(offset, view)`` sees every block once it is read (to write it somewhere too)."""
    offset = 0
    for view in read_blocks(read, nbytes, block=block):
        crc = crc32c.crc32c(view, crc)
        if each is not None:
            each(offset, view)
        offset += len(view)
    return crc


def crc32c_of(open_file: Callable[[str], ReadableFile], pieces: Sequence[tuple[str, int, int]], *,
              block: int = BLOCK) -> int:
    """CRC-32C of the bytes at ``pieces`` (``(file, offset, length)``, in order).

    ``open_file`` maps a file key to an open file (``source.open``). Reads at most ``block``
    bytes at a time. Raises :class:`~ckptstore.errors.ShortReadError` when a file ends before
    its piece does.
    """
    crc = 0
    for key, offset, nbytes in pieces:
        f = open_file(key)
        crc = crc32c_read(functools.partial(_read_at, f, offset), nbytes, crc=crc, block=block)
    return crc


def _read_at(f: ReadableFile, base: int, offset: int, view: memoryview) -> None:
    """A :data:`Reader` of the bytes of ``f`` from ``base`` on (a piece of a chunk)."""
    f.read_into(base + offset, view)
