"""The rank files of a source checkpoint, read through the same planner and executor as a load.

An index store describes rank files as byte ranges; so does the converter. Every rank file is a
key of one :class:`~ckptstore.io.base.ByteSource`, rooted at the folder (or bucket prefix) that
holds them all (:func:`~ckptstore.store.index.common_folder`, as ``ckptstore index`` records it),
and each entry (one parameter of one rank file) is described like an index's chunk: a
one-dimensional byte array whose one chunk is the entry's pieces ``(file key, offset, length)``.
Reading bytes ``[start, stop)`` of an entry is then planning that box with
:func:`~ckptstore.store.read_plan.plan_param` and running the plan with the
:class:`~ckptstore.store.executor.Executor`, straight into the caller's buffer. Callers read in
bounded blocks (:func:`~ckptstore.store.checksum.read_blocks`), so memory stays at one block
per thread whatever the checkpoint's size.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import ContextManager, Iterator, Sequence

import numpy as np

from ckptstore.errors import CorruptCheckpointError, ShortReadError, TruncatedCheckpointError
from ckptstore.formats.ckpt_reader import CkptEntry, entry_ranges, entry_requests, read_str
from ckptstore.io.base import ByteSource, ReadableFile
from ckptstore.io.locations import open_location
from ckptstore.store.executor import Executor, IOStats
from ckptstore.store.index import common_folder
from ckptstore.store.manifest import ChunkTable, ParamManifest
from ckptstore.store.read_plan import ParamReadPlan, plan_param


class RankFiles:
    """Rank files (by the path or URL the source gave) as one byte source; thread-safe.

    ``paths`` are every rank file that will be read. Files are opened on first use and kept open
    (by the byte source) until :meth:`close`.
    """

    def __init__(self, paths: Sequence[str]) -> None:
        self.root, self.keys = common_folder([str(p) for p in paths], ".")
        self._paths = {key: path for path, key in self.keys.items()}
        #: What was read through :meth:`read` (not counted in a load's ``IO_STATS``).
        self.stats = IOStats()
        self._source: ByteSource | None = None
        self._executor: Executor | None = None
        self._lock = threading.Lock()

    @property
    def source(self) -> ByteSource:
        """The byte source of the rank files' folder (opened on first use)."""
        source = self._source
        if source is None:
            with self._lock:
                if self._source is None:
                    self._source = open_location(self.root)
                source = self._source
        return source

    @property
    def executor(self) -> Executor:
        """The executor of the reads: one read at a time on the calling thread (the converter's
        workers are the parallelism), its errors told as the rank file's, not a store's."""
        executor = self._executor
        if executor is None:
            executor = self._executor = Executor(self.source, reading=self._plan_reading, stats=self.stats)
        return executor

    def key(self, path: str) -> str:
        """The key of rank file ``path`` in :attr:`source`."""
        try:
            return self.keys[str(path)]
        except KeyError:
            raise ValueError(f"{path} is not one of the rank files this source was opened with") from None

    def open(self, path: str) -> ReadableFile:
        """The open rank file ``path`` (for its headers; payload goes through :meth:`read`)."""
        return self.source.open(self.key(path))

    def manifest(self, path: str, entry: CkptEntry, start: int, nbytes: int) -> ParamManifest:
        """Bytes ``[start, start + nbytes)`` of entry ``entry`` of rank file ``path`` described as an
        index describes a chunk: a byte array of ``nbytes`` whose one chunk lies at the pieces of
        the entry's records that hold those bytes."""
        key = self.key(path)
        try:
            ranges = entry_ranges(entry.pieces, start, nbytes)
        except ValueError as e:
            raise CorruptCheckpointError(str(e), path=str(path), param=entry.name) from None
        pieces = tuple((key, o, n) for o, n in ranges)
        table = ChunkTable((key,), (pieces[0][1],), (nbytes,), None, (0,), (1,), {0: pieces} if len(pieces) > 1 else {})
        return ParamManifest(entry.name, key, "uint8", (nbytes,), (nbytes,), table)

    def plan(self, path: str, entry: CkptEntry, start: int, nbytes: int) -> ParamReadPlan:
        """The reads of bytes ``[start, start + nbytes)`` (``nbytes`` > 0) of ``entry`` (its pieces
        concatenated), as the load's planner makes them."""
        return plan_param(self.manifest(path, entry, start, nbytes))

    def read(self, path: str, entry: CkptEntry, start: int, out: memoryview) -> None:
        """Fill ``out`` with bytes ``[start, start + len(out))`` of ``entry`` (its pieces concatenated)."""
        n = len(out)
        if n:
            # one worker: the reads happen here, before submit returns
            self.executor.submit(self.plan(path, entry, start, n), np.frombuffer(out, dtype=np.uint8))

    def read_windows(self, path: str, entry: CkptEntry, windows: Sequence[tuple[int, memoryview]]) -> None:
        """Fill each ``(start, view)`` of ``windows`` with bytes ``[start, start + len(view))`` of ``entry``,
        in one vectored request of the rank file.

        For a few small windows (the layout check's 1 KiB samples, thousands per checkpoint) the
        requests go to the byte source as they are, not through the planner: planning and
        executing a 1 KiB read costs tens of times the read itself, and there is nothing to plan.
        """
        requests = []
        try:
            for start, view in windows:
                requests += entry_requests(entry.pieces, start, view)
        except ValueError as e:
            raise CorruptCheckpointError(str(e), path=str(path), param=entry.name) from None
        with self._reading(path, entry.name):
            self.open(path).read_requests(requests)

    def read_str(self, path: str, entry: CkptEntry) -> str:
        """A string parameter's text."""
        return read_str(self.open(path), entry)

    def _plan_reading(self, plan: ParamReadPlan) -> ContextManager[None]:
        return self._reading(self._paths.get(plan.keys[0], self.root) if plan.keys else self.root, plan.name)

    @contextmanager
    def _reading(self, path: str, param: str) -> Iterator[None]:
        # a rank file that ends before an entry's bytes was cut after its headers were scanned;
        # say so as the scan would, not as a damaged store
        try:
            yield
        except ShortReadError as e:
            raise TruncatedCheckpointError("the file ends before this parameter's bytes", path=str(path),
                                           param=param, offset=e.end) from None

    def close(self) -> None:
        with self._lock:
            source, self._source, self._executor = self._source, None, None
        if source is not None:
            source.close()

    def __enter__(self) -> "RankFiles":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
