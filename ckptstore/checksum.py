"""CRC-32C of bytes already stored in a file, read piece by piece in bounded blocks."""
from __future__ import annotations

import os
from typing import Sequence

import crc32c

BLOCK = 16 << 20


class ShortFileError(EOFError):
    """The file ended inside a piece: ``at`` is where, in the piece ``(offset, nbytes)``."""

    def __init__(self, at: int, offset: int, nbytes: int) -> None:
        super().__init__(f"file ends at byte offset {at}, expected {nbytes} bytes from offset {offset}")
        self.at, self.offset, self.nbytes = at, offset, nbytes


def crc32c_of(fd: int, pieces: Sequence[tuple[int, int]], *, block: int = BLOCK) -> int:
    """CRC-32C of the bytes at ``pieces`` (``(offset, length)``, in order) of ``fd``.

    Raises :class:`ShortFileError` when the file ends before a piece does.
    """
    crc = 0
    for offset, nbytes in pieces:
        done = 0
        while done < nbytes:
            data = os.pread(fd, min(block, nbytes - done), offset + done)
            if not data:
                raise ShortFileError(offset + done, offset, nbytes)
            crc = crc32c.crc32c(data, crc)
            done += len(data)
    return crc
