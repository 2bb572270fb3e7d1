"""Resume state of an unfinished conversion, kept beside the data it describes.

While a parameter's file is being written (``<file>.partial``), each chunk that has reached it
is recorded as one JSON line in ``<file>.journal`` *after* its bytes were written (both through
the output's :class:`~ckptstore.io.sink.ByteSink`). A rerun trusts a journalled chunk only if its
bytes on disk still match the recorded CRC-32C, drops anything after the last good chunk, and
carries on from there; finished parameters (whose final file exists, with a done record in the
work directory) are skipped whole.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ckptstore.errors import ShortReadError
from ckptstore.io.base import ReadableFile
from ckptstore.io.sink import ByteSink
from ckptstore.store.checksum import crc32c_of


@dataclass(frozen=True)
class JournalEntry:
    """A chunk already in the partial file: where, how long, its checksum and source rank."""

    index: int
    offset: int
    nbytes: int
    crc: int
    rank: int


#: A journal holds one short line per chunk; more than this is not one of ours.
MAX_JOURNAL_BYTES = 1 << 30


def journal_key(key: str) -> str:
    """Where the journal of data file ``key`` is kept while it is written."""
    return key + ".journal"


def read_journal(sink: ByteSink, key: str) -> list[JournalEntry]:
    """The entries of journal ``key``, stopping at the first torn or unreadable line."""
    entries: list[JournalEntry] = []
    raw = sink.source.read_bytes(key, limit=MAX_JOURNAL_BYTES)
    for line in (raw or b"").decode("utf-8", "replace").splitlines():
        try:
            d = json.loads(line)
            entries.append(JournalEntry(int(d["i"]), int(d["o"]), int(d["n"]), int(d["c"]), int(d["r"])))
        except (ValueError, KeyError, TypeError):
            break
    return entries


def _contiguous(e: JournalEntry) -> list[tuple[int, int]]:
    return [(e.offset, e.nbytes)]


def good_prefix(data: ReadableFile, entries: list[JournalEntry],
                pieces_of: Callable[[JournalEntry], Sequence[tuple[int, int]]] = _contiguous) -> list[JournalEntry]:
    """The leading journal entries whose bytes in ``data`` match their CRC, in chunk order.

    ``pieces_of`` gives where an entry's bytes lie, as ``(offset, length)`` in order (one
    contiguous range by default; a chunk scattered through a whole tensor has many).
    """
    good: list[JournalEntry] = []
    for i, e in enumerate(entries):
        try:
            pieces = [(data.key, o, n) for o, n in pieces_of(e)]
            if e.index != i or crc32c_of(lambda _: data, pieces) != e.crc:
                break
        except ShortReadError:
            break
        good.append(e)
    return good


class JournalWriter:
    """Appends one line per finished chunk to journal ``key`` of ``sink``."""

    def __init__(self, sink: ByteSink, key: str, entries: list[JournalEntry]) -> None:
        # Rewrite the trusted prefix so a torn tail never precedes new lines.
        self._f = sink.append_log(key, keep="".join(_line(e) for e in entries).encode())

    def append(self, entry: JournalEntry) -> None:
        self._f.pwrite(_line(entry).encode(), self._f.size)

    def close(self) -> None:
        self._f.close()


def _line(e: JournalEntry) -> str:
    return json.dumps({"i": e.index, "o": e.offset, "n": e.nbytes, "c": e.crc, "r": e.rank}) + "\n"
