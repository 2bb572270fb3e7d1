"""A byte sink (and its source) held in a dict: for tests, and able to fail at any call.

``MemorySink(fail=...)`` calls ``fail(op, key)`` before every operation (``op`` is the
method's name: ``"put"``, ``"put_if_absent"``, ``"put_stream"``, ``"create"``, ``"pwrite"``,
``"publish"``, ``"delete"``, ``"sync"``, ...); whatever it raises — an ``OSError`` such as
``ENOSPC``, or a :class:`Crash` that stands for the process dying — comes out of that call
with nothing of the operation done, so a test can stop a writer at any step and look at what
the sink holds, as a rerun would find it.
"""
from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ckptstore.errors import FileAccessError, MissingFileError, ShortReadError
from ckptstore.io.base import ByteSource, FileStat, ReadableFile, Request, check_key
from ckptstore.io.sink import ByteSink, SinkFile, partial_key


class Crash(BaseException):
    """Raised by a ``fail`` hook to stand for the writing process dying at that call (a
    ``BaseException``, so no ``except Exception`` of the writer handles it)."""


class _MemoryFile(SinkFile):
    def __init__(self, sink: MemorySink, key: str, name: str, data: bytearray) -> None:
        self.sink, self.key, self.name, self.data = sink, key, name, data
        self.size = len(data)

    @property
    def url(self) -> str:
        return self.sink.key_url(self.name)

    def read_requests(self, requests: Sequence[Request]) -> None:
        for offset, buf in requests:
            if offset + len(buf) > len(self.data):
                raise ShortReadError(self.url, offset, len(buf), len(self.data))
            buf[:] = self.data[offset:offset + len(buf)]

    def pwrite(self, data: Any, offset: int) -> None:
        self.sink._hook("pwrite", self.name)
        view = memoryview(data).cast("B")
        if len(self.data) < offset:
            self.data.extend(bytes(offset - len(self.data)))
        self.data[offset:offset + len(view)] = view
        self.size = len(self.data)

    def truncate(self, size: int) -> None:
        self.sink._hook("truncate", self.name)
        del self.data[size:]
        self.data.extend(bytes(size - len(self.data)))
        self.size = size

    def close(self) -> None:
        pass


class MemorySource(ByteSource):
    """The files of a :class:`MemorySink`, read back."""

    def __init__(self, sink: MemorySink) -> None:
        self.sink = sink

    @property
    def url(self) -> str:
        return self.sink.name

    def open(self, key: str) -> ReadableFile:
        data = self.sink.contents.get(check_key(key, self.url))
        if data is None:
            raise MissingFileError(errno.ENOENT, f"file {self.key_url(key)} is missing", self.key_url(key))
        return _MemoryFile(self.sink, key, key, data)

    def stat(self, key: str) -> FileStat | None:
        data = self.sink.contents.get(check_key(key, self.url))
        return None if data is None else FileStat(len(data), 0, str(id(data)))

    def read_bytes(self, key: str, *, limit: int) -> bytes | None:
        data = self.sink.contents.get(check_key(key, self.url))
        if data is not None and len(data) > limit:
            raise FileAccessError(errno.EFBIG, f"{self.key_url(key)} is larger than {limit} bytes")
        return None if data is None else bytes(data)

    def list(self, prefix: str = "") -> tuple[list[str], list[str]]:
        base = check_key(prefix, self.url) + "/" if prefix else ""
        folders: set[str] = set()
        files: set[str] = set()
        for k in self.sink.contents:
            if k.startswith(base):
                head, sep, _ = k[len(base):].partition("/")
                (folders if sep else files).add(head)
        return sorted(folders), sorted(files)


class _HeldNames:
    def __init__(self, sink: MemorySink, name: str) -> None:
        self.sink, self.name = sink, name

    def release(self) -> None:
        with self.sink._mutex:
            self.sink.locks.discard(self.name)
            self.sink._freed.notify_all()


class MemorySink(ByteSink):
    """A dict of ``key -> bytearray``; see the module docstring. Partial files are keys ending
    in ``.partial``, as on disk; ``durable`` lists what a power loss would keep."""

    seekable = True

    def __init__(self, name: str = "memory://sink", *, fail: Callable[[str, str], None] | None = None) -> None:
        self.name = name
        self.contents: dict[str, bytearray] = {}
        self.fail = fail
        self.source = MemorySource(self)
        self.locks: set[str] = set()
        self.synced = 0
        self._mutex = threading.Lock()
        self._freed = threading.Condition(self._mutex)

    def _hook(self, op: str, key: str) -> None:
        if self.fail is not None:
            self.fail(op, key)

    def put(self, key: str, data: bytes, *, durable: bool = True) -> None:
        self._hook("put", check_key(key, self.name))
        self.contents[key] = bytearray(data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._hook("put_if_absent", check_key(key, self.name))
        with self._mutex:
            if key in self.contents:
                return False
            self.contents[key] = bytearray(data)
            return True

    def put_stream(self, key: str, pieces: Iterable[Any], *, durable: bool = True) -> int:
        self._hook("put_stream", check_key(key, self.name))
        data = bytearray()
        for piece in pieces:
            data += memoryview(piece).cast("B")
        self.contents[key] = data
        return len(data)

    def create(self, key: str, *, resume: bool = False) -> SinkFile:
        name = partial_key(check_key(key, self.name))
        self._hook("create", name)
        if not resume or name not in self.contents:
            self.contents[name] = bytearray()
        return _MemoryFile(self, key, name, self.contents[name])

    def append_log(self, key: str, *, keep: bytes = b"") -> SinkFile:
        self._hook("append_log", check_key(key, self.name))
        self.contents[key] = bytearray(keep)
        return _MemoryFile(self, key, key, self.contents[key])

    def publish(self, key: str) -> None:
        self._hook("publish", check_key(key, self.name))
        data = self.contents.pop(partial_key(key), None)
        if data is None:
            raise MissingFileError(errno.ENOENT, f"{self.key_url(partial_key(key))} is missing", key)
        self.contents[key] = data

    def unpublish(self, key: str) -> None:
        self._hook("unpublish", check_key(key, self.name))
        self.contents[partial_key(key)] = self.contents.pop(key)

    def size(self, key: str) -> int | None:
        data = self.contents.get(check_key(key, self.name))
        return None if data is None else len(data)

    def keys(self, prefix: str = "") -> list[str]:
        base = check_key(prefix, self.name) + "/" if prefix else ""
        return sorted(k for k in self.contents if k.startswith(base))

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._hook("delete", key)
            self.contents.pop(key, None)

    def sync(self) -> None:
        self._hook("sync", "")
        self.synced += 1

    def lock(self, name: str, on_wait: Callable[[str], None] | None = None, *, wait: bool = True) -> _HeldNames | None:
        with self._mutex:
            if name in self.locks:
                if not wait:
                    return None
                if on_wait is not None:
                    on_wait("another thread")
                while name in self.locks:
                    self._freed.wait()
            self.locks.add(name)
        return _HeldNames(self, name)
