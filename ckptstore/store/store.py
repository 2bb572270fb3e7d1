"""``ckptstore.open(path)``: a store, read by parameter and by slice.

Opening reads one file, the manifest (the root ``zarr.json`` of a Zarr store, ``ckptstore.json``
of a safetensors store or an index), and validates it; nothing else is touched until a read.
:meth:`Store.read` plans the chunks that overlap the requested index and reads only their
bytes, through the store's byte source, into one array.
"""
from __future__ import annotations

import operator
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ckptstore.boxes import Box
from ckptstore.errors import (
    CkptStoreError,
    IncompleteStoreError,
    InvalidIndexError,
    InvalidOptionError,
    MissingFileError,
    ParameterNotFoundError,
    ShortReadError,
    StoreChangedError,
    StoreCorruptError,
    StoreNotFoundError,
)
from ckptstore.io import ByteSource, FileStat, LocalSource, ReadableFile, open_location
from ckptstore.io.base import Request, SourceWrapper
from ckptstore.progress import binary_size
from ckptstore.store import fallback, steps, work
from ckptstore.store.executor import execute
from ckptstore.store.kinds import WORK_DIR, find_manifest, manifest_candidates, manifest_files, store_kind, store_kinds
from ckptstore.store.manifest import ParamManifest, StoreManifest
from ckptstore.store.read_plan import ParamReadPlan, plan_param
from ckptstore.store.versions import recorded_versions

Index = Any  # an int, a slice, or a tuple of them


class Store:
    """A complete ckptstore store. Thread-safe for reading; many processes may read one store.

    ``location`` is the store's folder; ``data`` is where its chunk files are (the same folder,
    or for an index the folder of the original rank files).
    """

    def __init__(self, location: ByteSource, manifest: StoreManifest, data: ByteSource | None = None) -> None:
        self.location = location
        self.manifest = manifest
        self.data = data if data is not None else location
        self._layouts_checked: set[str] = set()

    @property
    def root(self) -> Path | str:
        """The store's folder (a ``Path`` for local stores)."""
        return self.location.root if isinstance(self.location, LocalSource) else self.location.url

    @property
    def kind(self) -> str:
        """The store kind: ``"zarr"``, ``"safetensors"``, ``"index"`` (or a plugin's, see
        :mod:`ckptstore.store.kinds`)."""
        return self.manifest.kind

    @property
    def step(self) -> int | None:
        """The training step the store holds, from its manifest header: the step ``save_rank``
        saved, or the one a conversion chose with ``step=`` (``--step``); ``None`` for a
        conversion that chose none."""
        step = self.manifest.source.get("step")
        return step if isinstance(step, int) and not isinstance(step, bool) else None

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor the store holds, as loaded (not as stored: chunks may be compressed)."""
        return sum(p.nbytes for p in self.manifest.params.values())

    def summary(self) -> str:
        """One line: kind, place, step, parameters, tensor bytes and the world that saved it, e.g.
        ``ckptstore zarr store /x (step 20): 110 parameters, 1.2 GiB, world 8``."""
        step = "" if self.step is None else f" (step {self.step})"
        world, n = self.manifest.source.get("world_size"), len(self.manifest.params)
        return (f"ckptstore {self.kind} store {self.location.url}{step}: {n} parameter{'' if n == 1 else 's'}, "
                f"{binary_size(self.nbytes)}" + (f", world {world}" if isinstance(world, int) else ""))

    def __repr__(self) -> str:
        return f"<{self.summary()}>"

    def names(self) -> list[str]:
        """Parameter names, in the order of the source checkpoint."""
        return list(self.manifest.params)

    def __contains__(self, name: object) -> bool:
        return name in self.manifest.params

    def __iter__(self) -> Iterator[str]:
        return iter(self.manifest.params)

    def info(self, name: str) -> ParamManifest:
        """Shape, dtype, chunk grid and chunk table of one parameter."""
        try:
            return self.manifest.params[name]
        except (KeyError, TypeError):
            raise ParameterNotFoundError(f"parameter {name!r} is not in the store {self.location.url}") from None

    def read_info(self, name: str, *, verify: bool) -> ParamManifest:
        """``name``'s manifest entry as a read plans from it: with ``verify=True``, once checked
        against the kind's own metadata of it (a Zarr array's ``zarr.json``). A manifest that
        places the chunks otherwise is a :class:`~ckptstore.errors.StoreCorruptError`, since the
        chunks' checksums hold for their bytes wherever the manifest puts them."""
        info = self.info(name)
        if verify and name not in self._layouts_checked and not info.is_str:
            kind = store_kind(self.manifest.kind)
            problem = None if kind is None or kind.layout_problem is None else kind.layout_problem(self.data, info)
            if problem is not None:
                raise StoreCorruptError(f"{problem}; the store is damaged (ckptstore verify {self.location.url} "
                                        "lists every such parameter)")
            self._layouts_checked.add(name)
        return info

    @property
    def source(self) -> dict[str, Any]:
        """What the store was converted from: world size, files, step, strategy summary."""
        return dict(self.manifest.source)

    def plan(self, name: str, box: Box | Index = None, *, dtype: Any = None, verify: bool = False) -> ParamReadPlan:
        """The reads :meth:`read` would do for ``box`` of ``name`` (the whole tensor if ``None``).

        ``box`` is what :meth:`read` takes as ``index`` (ints and step-1 slices, e.g.
        ``(slice(0, 32), slice(None))``), a tuple of ``(start, stop)`` pairs, one per axis
        (e.g. ``((0, 32), (0, 128))``), or a :class:`~ckptstore.boxes.Box`; all in the global frame.
        """
        info = self.read_info(name, verify=verify)
        try:
            return plan_param(info, _as_box(box, info.shape, name),
                              out_dtype=None if dtype is None else np.dtype(dtype), verify=verify,
                              cost=self.data.read_cost())
        except ValueError as e:
            raise InvalidOptionError(str(e)) from None

    def read(self, name: str, index: Index = None, *, out: np.ndarray | None = None,
             verify: bool = False, workers: int = 1) -> np.ndarray | str:
        """Read ``name`` (or ``index`` of it: ints and step-1 slices) as a numpy array.

        Only bytes of the chunks overlapping the index are read (whole chunks when compressed
        or when ``verify=True`` checks their CRC-32C). ``out`` receives the data when given (its
        dtype may differ: values are cast chunk by chunk). String parameters return ``str``.
        """
        info = self.info(name)
        if info.is_str:
            return info.value or ""
        box, squeeze = _index_to_box(index, info.shape, name)
        plan = self.plan(name, box, dtype=None if out is None else out.dtype, verify=verify)
        result = execute(plan, self.data, out=out, workers=workers)
        if not any(squeeze):
            return result
        return result.reshape([n for n, s in zip(result.shape, squeeze, strict=True) if not s])

    def close(self) -> None:
        self.location.close()
        if self.data is not self.location:
            self.data.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _as_box(box: Box | Index, shape: Sequence[int], name: str) -> Box | None:
    """``box`` as a :class:`Box`: a box as is; ``(start, stop)`` pairs, one per axis; else an index."""
    if box is None or isinstance(box, Box):
        return box
    items = box if isinstance(box, (tuple, list)) else (box,)
    pairs = [isinstance(i, (tuple, list)) and len(i) == 2 for i in items]
    if items and all(pairs):
        try:
            start, stop = zip(*((operator.index(a), operator.index(b)) for a, b in items), strict=True)
        except TypeError:
            raise InvalidIndexError(f"box {box!r} for {name!r}: (start, stop) pairs must be integers") from None
        if len(items) != len(shape):
            raise InvalidIndexError(f"box {box!r} has {len(items)} (start, stop) pairs but {name!r} has "
                                    f"{len(shape)} axes")
        return Box(tuple(start), tuple(stop))
    if any(pairs):
        raise InvalidIndexError(f"box {box!r} for {name!r} mixes (start, stop) pairs with other indices; use one "
                                "kind for every axis")
    return _index_to_box(box, shape, name)[0]


def _index_to_box(index: Index, shape: Sequence[int], name: str) -> tuple[Box, list[bool]]:
    if index is None or index is Ellipsis:
        return Box.full(shape), [False] * len(shape)
    items = index if isinstance(index, tuple) else (index,)
    if len(items) > len(shape):
        raise InvalidIndexError(f"too many indices for parameter {name!r} of shape {list(shape)}")
    start, stop, squeeze = [], [], []
    for axis, n in enumerate(shape):
        item = items[axis] if axis < len(items) else slice(None)
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            i = int(item) + n if item < 0 else int(item)
            if not 0 <= i < n:
                raise InvalidIndexError(f"index {item} is out of bounds for axis {axis} of {name!r} with size {n}")
            start.append(i)
            stop.append(i + 1)
            squeeze.append(True)
        elif isinstance(item, slice):
            lo, hi, step = item.indices(n)
            if step != 1:
                raise InvalidIndexError(f"only step-1 slices are supported (axis {axis} of {name!r})")
            start.append(lo)
            stop.append(max(lo, hi))
            squeeze.append(False)
        else:
            raise InvalidIndexError(f"unsupported index {item!r} for {name!r}: use ints and slices")
    return Box(tuple(start), tuple(stop)), squeeze


def _unfinished(location: ByteSource) -> str:
    """Why an unfinished store cannot be opened, and what finishes it (:func:`~ckptstore.store.work.what_finishes`)."""
    said = work.what_finishes(location)
    is_step = steps.STEP_FOLDER.match(location.url.rstrip("/").rsplit("/", 1)[-1]) is not None
    if said is not None:
        return said + ("; open the folder above it for the newest committed step" if is_step else "")
    if is_step:  # a save's attempt record torn or damaged: its ranks cannot be told
        return (f"the step at {location.url} is not committed and its attempt record ({work.ATTEMPT_FILE}) is "
                "unreadable: rerun the job's save of the step (a new job starts it over); open the folder above it "
                "for the newest committed step")
    return (f"the store at {location.url} is incomplete: its conversion was interrupted. Run the same "
            "'ckptstore convert' command again to finish it")


def _no_committed_step(location: ByteSource, pending: list[int]) -> str:
    """Why a folder of steps none of which is committed does not open: what its newest unfinished
    step of ckptstore's waits for (:func:`~ckptstore.store.work.what_finishes`), and the others."""
    ours = [(n, said) for n in pending if (said := work.what_finishes(steps.step_source(location, n))) is not None]
    if not ours:
        return (f"{location.url} holds no committed step yet: step(s) {', '.join(map(str, pending[:5]))} are "
                "still being saved or some rank did not finish saving them")
    return (f"{location.url} holds no committed step yet: {ours[0][1]}; 'ckptstore steps {location.url}' lists every "
            f"step (unfinished: {', '.join(str(n) for n, _ in ours[:5])})")


def open(path: str | os.PathLike[str], *, fallback: bool = False) -> Store:  # the public name is ckptstore.open
    """Open a store written by ``ckptstore convert`` (or ``ckptstore index``), reading only its metadata.

    A folder of saved training steps (``step_<N>`` folders, see :mod:`ckptstore.store.steps`)
    opens as its newest committed step; with ``fallback=True``, as the newest committed step
    every chunk of which verifies (which reads every chunk of it; a rank's load checks only what
    it reads: ``read_rank``/``load_rank`` with ``fallback=True``), saying in one log line which
    steps it skipped and why (:mod:`ckptstore.store.fallback`). Raises
    :class:`~ckptstore.errors.StoreNotFoundError` when there is no store at ``path``,
    :class:`~ckptstore.errors.IncompleteStoreError` for an interrupted conversion, and
    :class:`~ckptstore.errors.StoreCorruptError` when the manifest fails validation (or, with
    ``fallback``, when no committed step verifies).
    """
    if fallback:
        return open_verified(path, None, agree=None)
    location = open_location(path)
    if isinstance(location, LocalSource) and not location.root.is_dir():
        what = "is a file" if location.root.exists() else "does not exist"
        raise StoreNotFoundError(f"no ckptstore store at {location.url}: it {what} (a store is a folder made by "
                                 "'ckptstore convert' or 'ckptstore index', or the root of save_rank's steps)")
    before = _manifest_identity(location)
    found = find_manifest(location, compact=True)
    doc = None if found is None else found.doc
    if found is not None and found.stat is not None and location.pins_read_files:
        before = found.key, found.stat  # the identity of exactly the bytes read (an object's ETag)
    if doc is None:
        folders = location.list()[0]
        if WORK_DIR in folders:
            raise IncompleteStoreError(_unfinished(location))
        stepped, pending = steps.newest_committed(location)
        if stepped is not None:
            return open(stepped.url)
        if pending:
            raise IncompleteStoreError(_no_committed_step(location, pending))
        raise StoreNotFoundError(f"no ckptstore store at {location.url} (no {' or '.join(manifest_files())})")
    if doc is False:
        raise StoreNotFoundError(f"{location.url} is a Zarr group but not a ckptstore store (no 'ckptstore' "
                                 "attributes)")
    if doc.get("complete") is not True:
        raise IncompleteStoreError(f"the store at {location.url} is marked incomplete; rerun the conversion")
    manifest = StoreManifest.from_json(doc, where=location.url)
    kind = store_kind(manifest.kind)
    if kind is None:
        known = ", ".join(k.name for k in store_kinds())
        raise StoreCorruptError(f"{location.url}: unknown store kind {manifest.kind!r} (this ckptstore reads {known}; "
                                "a kind from a plugin needs that plugin installed)")
    if before is not None and location.pins_open_files and _manifest_identity(location) != before:
        raise _changed(location)  # changed while read (an object needs no second look: its GET told its version)
    if kind.open_data is not None:  # the chunks are elsewhere (an index's rank files)
        data = kind.open_data(location, manifest)
        return Store(location, manifest, data if before is None else ReplaceGuard(data, location, before))
    versions = recorded_versions(manifest, where=location.url)
    return Store(location, manifest, None if before is None else ReplaceGuard(location, location, before, versions))


#: The part of each parameter a load reads (``None``: the whole parameter), as a store tells it.
Reads = Callable[[Store], Mapping[str, Box | None]]


def open_verified(path: str | os.PathLike[str], reads: Reads | None, *, workers: int = 1,
                  agree: fallback.Agree | None = None) -> Store:
    """The newest committed step of the root ``path`` whose chunks that ``reads`` names verify
    (``reads=None``: every chunk), opened; steps skipped are said in one log line.

    ``path`` may also be one store (a step, a conversion): it is checked the same way, and raises
    :class:`~ckptstore.errors.StoreCorruptError` when damaged (there is no earlier step). With
    ``agree`` (the job's agreement, :func:`ckptstore.read.exchange.job_agreement`) every rank of
    the job must call this, and all load the same step.
    """
    location = open_location(path)
    if isinstance(location, LocalSource) and not location.root.is_dir() or find_manifest(location) is not None:
        candidates, url_of = [0], {0: location.url}  # one store: nothing earlier to fall back to
    else:
        if WORK_DIR in location.list()[0]:
            raise IncompleteStoreError(_unfinished(location))
        candidates = [s for s in steps.steps(location) if steps.is_committed(steps.step_source(location, s))]
        if not candidates:
            return open(path)  # says why nothing opens
        url_of = {s: steps.step_source(location, s).url for s in candidates}
    opened: dict[int, Store] = {}

    def problem(step: int) -> str | None:
        store, found = checked_store(url_of[step], reads, workers=workers)
        if store is not None:
            opened[step] = store
        return found

    try:
        chosen, skipped = fallback.choose_step(candidates, problem, agree)
        if chosen is None:
            if candidates == [0]:
                why = skipped[0][1] if skipped else "on another rank"
                raise StoreCorruptError(f"{location.url} fails verification ({why}); it is one store, not a root of "
                                        "steps, so there is no earlier step to fall back to")
            raise fallback.no_step_error(location.url, skipped)
        fallback.say_skipped(location.url, chosen, skipped)
        return opened.pop(chosen)
    finally:
        for other in opened.values():
            other.close()


def checked_store(path: str | os.PathLike[str], reads: Reads | None = None, *,
                  workers: int = 1) -> tuple[Store | None, str | None]:
    """The store at ``path`` opened, if the chunks ``reads`` names (``None``: every chunk) verify;
    else ``None`` and the first damage found (a manifest or index record that fails, a missing,
    short or changed chunk: :func:`~ckptstore.store.fallback.chunk_problem`). An outage is raised."""
    try:
        store = open(path)
    except CkptStoreError as e:
        if not fallback.is_damage(e):
            raise
        return None, str(e)
    try:
        found = fallback.first_problem(store.data, store.manifest.params, None if reads is None else reads(store),
                                       workers=workers)
    except BaseException:
        store.close()
        raise
    if found is not None:
        store.close()
        return None, found
    return store, None


#: What every function that takes a store accepts: a ``Store``, a path or an ``s3://``/``obs://`` URL.
StoreLike = Store | str | os.PathLike[str]


def as_store(store: StoreLike) -> Store:
    """``store`` itself when it is a :class:`Store`, else the store opened at that path or URL."""
    if isinstance(store, Store):
        return store
    if not isinstance(store, (str, os.PathLike)):
        raise InvalidOptionError(f"a store is a path, an s3:// or obs:// URL, or a ckptstore.Store, not "
                                 f"{type(store).__name__}")
    return open(store)


@contextmanager
def store_argument(store: StoreLike) -> Iterator[Store]:
    """:func:`as_store` for the length of a call: a store opened here is closed afterwards; a
    :class:`Store` the caller passed stays open."""
    st = as_store(store)
    try:
        yield st
    finally:
        if st is not store:
            st.close()


def _manifest_identity(location: ByteSource) -> tuple[str, FileStat] | None:
    """The manifest file's key and identity, where open files keep their content (see
    :class:`ReplaceGuard`); ``None`` elsewhere (an object store tells the identity with the
    manifest's bytes instead)."""
    if not location.pins_open_files:
        return None
    for _, key in manifest_candidates():
        st = location.stat(key)
        if st is not None:
            return key, st
    return None


def _changed(location: ByteSource) -> StoreChangedError:
    return StoreChangedError(f"the store {location.url} was replaced while it was read (by 'ckptstore convert "
                             "--overwrite'?); open it again")


class ReplaceGuard(SourceWrapper):
    """The data files of a store, refused once the store has been replaced.

    Replacing a store (``convert --overwrite``) removes its manifest before anything else and
    writes the new one last. A data file is pinned to one version by its source, at its opening
    (a local file: an open descriptor keeps its inode's bytes) or at its first request (an
    object: its ETag, sent as ``If-Match`` on every later GET; see ``pins_read_files``). Right
    *after* that pin, before any of its bytes are handed on, the guard checks that the manifest
    is still the one the store was opened with (local: same size, time, inode and change time;
    an object: same size, time and ETag): then the replacement had not begun when the file was
    pinned, so the pinned version is the old store's, and every later read of it gives the old
    bytes or a :class:`~ckptstore.errors.StoreChangedError`, never a mix. A file that is missing
    or already changed is also reported as the replacement when the manifest changed.

    The check costs one ``stat`` of the manifest (one HEAD on object storage) per data file,
    fewer when many files are pinned at once: one check that began after several pins vouches
    for all of them (:class:`_ManifestCheck`). A data object whose version the manifest recorded
    at the commit (``versions``, see :mod:`ckptstore.store.versions`) needs no check: it is
    pinned to that version before its first request, which then asks for it (``If-Match``), so
    a replaced object answers 412 and none of its bytes are read.
    """

    def __init__(self, inner: ByteSource, location: ByteSource, manifest: tuple[str, FileStat],
                 versions: Mapping[str, tuple[str, int]] | None = None) -> None:
        super().__init__(inner)
        self.location, self.manifest = location, manifest
        self.versions = versions or {}
        self._checked: set[str] = set()
        self._check = _ManifestCheck(self)

    def open(self, key: str) -> ReadableFile:
        if key in self._checked:
            return self.inner.open(key)
        recorded = self.versions.get(key)
        if recorded is not None:
            f = self.inner.open(key)
            pin = getattr(f, "pin", None)
            if pin is not None:  # an object: pinned to the committed version, at no request
                pin(*recorded, lambda: self._not_committed(f.url))
                return f
        try:
            f = self.inner.open(key)
        except MissingFileError:
            self.confirm()  # a file deleted by the replacement is the replacement's
            raise
        if self.inner.pins_open_files:
            self.confirmed(key)
            return f
        return _PinThenCheck(f, self, key)

    def _not_committed(self, url: str) -> StoreChangedError:
        return StoreChangedError(f"{url} was replaced while it was read (it is no longer the version the store's "
                                 f"manifest recorded: the store {self.location.url} was replaced, or the object was "
                                 "changed after the commit); open it again")

    def confirmed(self, key: str) -> None:
        """Check the manifest after ``key`` was pinned (once per key until :meth:`close`)."""
        if key not in self._checked:
            self.confirm()
            self._checked.add(key)

    def confirm(self) -> None:
        """Raise :class:`~ckptstore.errors.StoreChangedError` unless a look at the manifest that
        began after this call was made finds it unchanged."""
        self._check.after_now()

    def unchanged(self) -> bool:
        """Whether the manifest is the one the store was opened with (a ``stat``: one HEAD)."""
        name, identity = self.manifest
        return self.location.stat(name) == identity

    def close(self) -> None:
        self._checked.clear()  # files are reopened, and checked again, on demand
        self.inner.close()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)  # what a particular source adds (an index's checks)


class _ManifestCheck:
    """Looks at the manifest for many threads at once: a caller waits for a look that *began*
    after it called (one under way began too early), and one look serves every caller waiting
    when it begins. Once the manifest changed, every caller gets the error at once."""

    def __init__(self, guard: ReplaceGuard) -> None:
        self.guard = guard
        self._cond = threading.Condition()
        self._begun = 0  # looks begun so far
        self._passed = 0  # the latest look that found the manifest unchanged
        self._running = False
        self._changed = False

    def after_now(self) -> None:
        with self._cond:
            wanted = self._begun + 1  # the next look to begin; one under way began before this call
            while True:
                if self._changed:
                    raise _changed(self.guard.location)
                if self._passed >= wanted:
                    return
                if not self._running:
                    break
                self._cond.wait()
            self._running = True
            self._begun += 1
            mine = self._begun
        try:
            ok = self.guard.unchanged()
        except BaseException:
            with self._cond:  # not answered (an outage): a waiting caller looks again itself
                self._running = False
                self._cond.notify_all()
            raise
        with self._cond:
            self._running = False
            if ok:
                self._passed = mine
            else:
                self._changed = True
            self._cond.notify_all()
        if not ok:
            raise _changed(self.guard.location)


class _PinThenCheck(ReadableFile):
    """A data file of a source that pins a file at its first request: its first read (which pins
    it) is followed by the guard's check before the bytes are handed on."""

    def __init__(self, inner: ReadableFile, guard: ReplaceGuard, key: str) -> None:
        self.inner, self.guard, self.key = inner, guard, key
        self.read_ahead = inner.read_ahead

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def size(self) -> int:  # type: ignore[override]  # ReadableFile.size is an attribute; the inner file's here
        return self.inner.size

    def read_requests(self, requests: Sequence[Request]) -> None:
        self._checked(self.inner.read_requests, requests)

    def read_span(self, requests: Sequence[Request]) -> None:
        self._checked(self.inner.read_span, requests)

    def _checked(self, read: Callable[[Sequence[Request]], None], requests: Sequence[Request]) -> None:
        try:
            read(requests)
        except (StoreChangedError, MissingFileError, ShortReadError):
            self.guard.confirm()  # the store's replacement, if it began, explains the failure
            raise
        self.guard.confirmed(self.key)

    def close(self) -> None:
        self.inner.close()
