"""The rank files of a source checkpoint, read through the same planner and executor as a load.

An index store describes rank files as byte ranges; so does the converter. Every rank file is a
key of one :class:`~ckptstore.io.base.ByteSource`, rooted at the folder (or bucket prefix) that
holds them all (:func:`~ckptstore.store.index.common_folder`, as ``ckptstore index`` records it),
and the byte ranges to read (a converter's chunks: ``nbytes`` bytes from ``byte_start`` of a rank
file's entry) are described as an index describes its chunks: a one-dimensional byte array whose
chunk ``k`` lies at the pieces ``(file key, offset, length)`` of the ``k``-th range. Reading is then
planning that array (:func:`~ckptstore.store.read_plan.plan_ranges`: what
:func:`~ckptstore.store.read_plan.plan_param` makes of such a manifest, from its columns) and
running the plan with the :class:`~ckptstore.store.executor.Executor`, straight into the
caller's buffer. Callers read in bounded blocks (at most :data:`~ckptstore.store.checksum.BLOCK`
bytes at once, several small chunks per plan), so memory stays at one block per thread whatever
the checkpoint's size.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from ckptstore.errors import CorruptCheckpointError, ShortReadError, TruncatedCheckpointError
from ckptstore.formats.ckpt_cipher import DecryptingSource, Decryption
from ckptstore.formats.ckpt_reader import CkptEntry, entry_ranges, entry_requests, read_str
from ckptstore.io.base import ByteSource, ReadableFile
from ckptstore.io.locations import open_location
from ckptstore.store.executor import Executor, IOStats
from ckptstore.store.index import common_folder
from ckptstore.store.read_plan import AnyParamReadPlan, ByteRangesPlan, plan_ranges


class RankFiles:
    """Rank files (by the path or URL the source gave) as one byte source; thread-safe.

    ``paths`` are every rank file that will be read. Files are opened on first use and kept open
    (by the byte source) until :meth:`close`.
    """

    def __init__(self, paths: Sequence[str], decryption: Decryption | None = None) -> None:
        self.root, self.keys = common_folder([str(p) for p in paths], ".")
        self._decryption = decryption  # files saved with enc_key are read as their plaintext
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
                    opened = open_location(self.root)
                    self._source = (opened if self._decryption is None
                                    else DecryptingSource(opened, *self._decryption))
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

    def plan(self, parts: Sequence[tuple[str, CkptEntry, int]], nbytes: int) -> ByteRangesPlan:
        """The reads that fill a byte array of ``len(parts) * nbytes`` whose chunk ``k`` is bytes
        ``[start, start + nbytes)`` of ``entry`` of rank file ``path`` (``parts[k]``), lying at the
        pieces of the entry's records that hold them: an index-like manifest of the ranges, planned
        by :func:`~ckptstore.store.read_plan.plan_ranges` from its columns (``nbytes`` > 0)."""
        keys: dict[str, int] = {}
        files: list[int] = []
        offsets: list[int] = []
        lengths: list[int] = []
        for path, entry, start in parts:
            fid = keys.setdefault(self.key(path), len(keys))
            pieces = entry.pieces
            if len(pieces) == 1 and 0 <= start and start + nbytes <= pieces[0][1]:
                # one record holds the tensor (the usual case): one range, no search
                files.append(fid)
                offsets.append(pieces[0][0] + start)
                lengths.append(nbytes)
                continue
            try:
                ranges = entry_ranges(pieces, start, nbytes)
            except ValueError as e:
                raise CorruptCheckpointError(str(e), path=str(path), param=entry.name) from None
            for offset, length in ranges:
                files.append(fid)
                offsets.append(offset)
                lengths.append(length)
        return plan_ranges(parts[0][1].name, tuple(keys), files, offsets, lengths)

    def read(self, path: str, entry: CkptEntry, start: int, out: memoryview) -> None:
        """Fill ``out`` with bytes ``[start, start + len(out))`` of ``entry`` (its pieces concatenated)."""
        self.read_chunks([(path, entry, start)], len(out), out)

    def read_chunks(self, parts: Sequence[tuple[str, CkptEntry, int]], nbytes: int, out: memoryview) -> None:
        """Fill ``out`` (``len(parts) * nbytes`` bytes) with ``nbytes`` bytes from each ``(path, entry,
        start)`` of ``parts`` in turn: one plan, executed at once (planning costs per plan, not per byte,
        so a converter reads its small chunks together)."""
        if nbytes and parts:
            # one worker: the reads happen here, before submit returns
            self.executor.submit(self.plan(parts, nbytes), np.frombuffer(out, dtype=np.uint8))

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
                if len(view):
                    requests += entry_requests(entry.pieces, start, view)
        except ValueError as e:
            raise CorruptCheckpointError(str(e), path=str(path), param=entry.name) from None
        try:
            self.open(path).read_requests(requests)
        except ShortReadError as e:
            raise _truncated(path, entry.name, e) from None

    def read_str(self, path: str, entry: CkptEntry) -> str:
        """A string parameter's text."""
        return read_str(self.open(path), entry)

    def _plan_reading(self, plan: AnyParamReadPlan) -> _PlanReading:
        return _PlanReading(self, plan)

    def close(self) -> None:
        with self._lock:
            source, self._source, self._executor = self._source, None, None
        if source is not None:
            source.close()

    def __enter__(self) -> RankFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _PlanReading:
    """While a plan of rank-file ranges is read: a file that ends too soon is named as the source
    gave it (a plan may read several). A class, not a generator: it wraps every read call."""

    __slots__ = ("files", "plan")

    def __init__(self, files: RankFiles, plan: AnyParamReadPlan) -> None:
        self.files, self.plan = files, plan

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
        if isinstance(e, ShortReadError):
            files, plan = self.files, self.plan
            path = next((files._paths[k] for k in plan.keys if files.source.key_url(k) == e.path), e.path)
            raise _truncated(path, plan.name, e) from None


def _truncated(path: str, param: str, e: ShortReadError) -> TruncatedCheckpointError:
    # a rank file that ends before an entry's bytes was cut after its headers were scanned: say so
    # as the scan would, not as a damaged store (the executor's words for a short file)
    return TruncatedCheckpointError("the file ends before this parameter's bytes", path=str(path), param=param,
                                    offset=e.end)
