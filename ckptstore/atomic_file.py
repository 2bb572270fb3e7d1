"""A file written under a temporary name and moved into place only when complete."""
from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO


class AtomicFile:
    """Base for writers of whole files: ``path + ".partial"`` until :meth:`close` fsyncs and
    renames it, so nobody ever sees half a file; :meth:`abort` (or an exception inside a
    ``with`` block) removes it. Subclasses write through ``self._f`` and may extend
    :meth:`_finish`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._tmp = self.path.with_name(self.path.name + ".partial")
        self._f: BinaryIO = open(self._tmp, "wb")

    def _finish(self) -> None:
        """Last writes before the file is synced (a trailer, a check)."""

    def close(self) -> None:
        """Finish, fsync and move the file into place."""
        self._finish()
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Drop the unfinished file."""
        self._f.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> "AtomicFile":
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
