"""Files written front to back that appear whole or not at all (exported checkpoints).

An :class:`AtomicFile` writes through a :class:`~ckptstore.io.sink.ByteSink`: under
``<name>.partial`` (created exclusively, no link followed), then published (fsynced and renamed)
and its folder synced when :meth:`AtomicFile.close` is reached, so a reader never sees half a
file; leaving a ``with`` block by an exception removes the partial file. Give it a path (its
folder becomes a local sink) or a :class:`SinkKey` (a file of any seekable sink).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ckptstore.io.sink import ByteSink, SinkFile, partial_key

_File = TypeVar("_File", bound="AtomicFile")


@dataclass(frozen=True)
class SinkKey:
    """File ``key`` of ``sink``: where an :class:`AtomicFile` is written."""

    sink: ByteSink
    key: str


class _Appender:
    """The sequential ``write`` of a file written at offsets."""

    def __init__(self, f: SinkFile) -> None:
        self.f, self.offset = f, 0

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self.f.pwrite(data, self.offset)
        self.offset += n
        return n


class AtomicFile:
    """A file written front to back through :attr:`_f` (``write``), moved into place only when
    complete; subclasses may append a trailer in :meth:`_finish`. See the module docstring."""

    def __init__(self, path: str | os.PathLike[str] | SinkKey) -> None:
        if isinstance(path, SinkKey):
            self.sink, self.key = path.sink, path.key
        else:
            from ckptstore.io.local_sink import LocalSink

            p = Path(path)
            self.sink, self.key = LocalSink(p.parent), p.name
        self._file = self.sink.create(self.key)
        self._f = _Appender(self._file)

    def _finish(self) -> None:
        """Last writes before the file is published (a trailer, a check)."""

    def close(self) -> None:
        """Finish, then publish the file durably."""
        self._finish()
        self._file.close()
        self.sink.publish(self.key)
        self.sink.sync()

    def abort(self) -> None:
        """Stop writing and drop the partial file."""
        self._file.close()
        self.sink.delete([partial_key(self.key)])

    def __enter__(self: _File) -> _File:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
