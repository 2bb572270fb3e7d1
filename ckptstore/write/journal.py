"""Resume state of an unfinished conversion, kept beside the data it describes.

While a parameter's file is being written (``<file>.partial``), each chunk that has reached it
is recorded as one JSON line in ``<file>.journal`` *after* its bytes were written. A rerun
trusts a journalled chunk only if its bytes on disk still match the recorded CRC-32C, drops
anything after the last good chunk, and carries on from there; finished parameters (whose
final file exists, with a done record in the work directory) are skipped whole.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ckptstore.store.checksum import crc32c_of
from ckptstore.errors import ShortReadError
from ckptstore.io.local import LocalFile


@dataclass(frozen=True)
class JournalEntry:
    """A chunk already in the partial file: where, how long, its checksum and source rank."""

    index: int
    offset: int
    nbytes: int
    crc: int
    rank: int


def read_journal(path: Path) -> list[JournalEntry]:
    """The entries of a journal, stopping at the first torn or unreadable line."""
    entries: list[JournalEntry] = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        return entries
    for line in text.splitlines():
        try:
            d = json.loads(line)
            entries.append(JournalEntry(int(d["i"]), int(d["o"]), int(d["n"]), int(d["c"]), int(d["r"])))
        except (ValueError, KeyError, TypeError):
            break
    return entries


def _contiguous(e: JournalEntry) -> list[tuple[int, int]]:
    return [(e.offset, e.nbytes)]


def good_prefix(data: Path, entries: list[JournalEntry],
                pieces_of: Callable[[JournalEntry], Sequence[tuple[int, int]]] = _contiguous, *,
                block: int = 16 << 20) -> list[JournalEntry]:
    """The leading journal entries whose bytes in ``data`` match their CRC, in chunk order.

    ``pieces_of`` gives where an entry's bytes lie, as ``(offset, length)`` in order (one
    contiguous range by default; a chunk scattered through a whole tensor has many).
    """
    good: list[JournalEntry] = []
    try:
        fd = os.open(data, os.O_RDONLY)
    except FileNotFoundError:
        return good
    f = LocalFile(fd, data.name, str(data), os.fstat(fd).st_size)
    try:
        for i, e in enumerate(entries):
            try:
                pieces = [(f.key, o, n) for o, n in pieces_of(e)]
                if e.index != i or crc32c_of(lambda _: f, pieces, block=block) != e.crc:
                    break
            except ShortReadError:
                break
            good.append(e)
    finally:
        f.close()
    return good


class JournalWriter:
    """Appends one line per finished chunk."""

    def __init__(self, path: Path, entries: list[JournalEntry]) -> None:
        # Rewrite the trusted prefix so a torn tail never precedes new lines.
        path.write_text("".join(_line(e) for e in entries))
        self._f = open(path, "a", encoding="utf-8")

    def append(self, entry: JournalEntry) -> None:
        self._f.write(_line(entry))
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _line(e: JournalEntry) -> str:
    return json.dumps({"i": e.index, "o": e.offset, "n": e.nbytes, "c": e.crc, "r": e.rank}) + "\n"
