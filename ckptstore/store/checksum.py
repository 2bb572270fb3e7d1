"""CRC-32C of bytes already stored in files, read piece by piece in bounded blocks."""
from __future__ import annotations

from typing import Callable, Sequence

import crc32c

from ckptstore.io.base import ReadableFile

BLOCK = 16 << 20


def crc32c_of(open_file: Callable[[str], ReadableFile], pieces: Sequence[tuple[str, int, int]], *,
              block: int = BLOCK) -> int:
    """CRC-32C of the bytes at ``pieces`` (``(file, offset, length)``, in order).

    ``open_file`` maps a file key to an open file (``source.open``). Reads at most ``block``
    bytes at a time. Raises :class:`~ckptstore.errors.ShortReadError` when a file ends before
    its piece does.
    """
    crc = 0
    buf = bytearray(min(block, max((n for _, _, n in pieces), default=0)))
    for key, offset, nbytes in pieces:
        f = open_file(key)
        done = 0
        while done < nbytes:
            view = memoryview(buf)[:min(len(buf), nbytes - done)]
            f.read_into(offset + done, view)
            crc = crc32c.crc32c(view, crc)
            done += len(view)
    return crc
