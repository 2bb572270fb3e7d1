"""The rank files of a source checkpoint, opened once and shared by the threads that read them.

Rank files are named by the paths (or URLs) the user's source folder gave; each is opened on
first use and kept open until :meth:`SourceFiles.close`, so copying thousands of chunks or
sampling every parameter does not reopen a file per read.
"""
from __future__ import annotations

import threading

from ckptstore.formats.ckpt_reader import CkptEntry, open_file, read_into
from ckptstore.io.base import ReadableFile


class SourceFiles:
    """Open rank files by path; read an entry's logical bytes straight into a buffer."""

    def __init__(self) -> None:
        self._files: dict[str, ReadableFile] = {}
        self._lock = threading.Lock()

    def open(self, path: str) -> ReadableFile:
        with self._lock:
            f = self._files.get(path)
            if f is None:
                f, _ = open_file(path)
                self._files[path] = f
            return f

    def read(self, path: str, entry: CkptEntry, start: int, out: memoryview) -> None:
        """Fill ``out`` with bytes ``[start, start + len(out))`` of ``entry`` (its pieces concatenated)."""
        read_into(self.open(path), entry.pieces, start, out, param=entry.name)

    def close(self) -> None:
        with self._lock:
            files, self._files = list(self._files.values()), {}
        for f in files:
            f.close()

    def __enter__(self) -> "SourceFiles":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
