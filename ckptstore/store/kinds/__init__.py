"""Store kinds: what each is called, where its manifest is, how it is read and who writes it.

A store kind is declared by one module of this package (or of another distribution, through
the entry-point group ``ckptstore.store_kinds``) holding ``KIND = StoreKind(...)``; everything
that depends on the kind (``ckptstore.open``, ``convert(format=...)`` and its error message, the
CLI's ``--format`` choices, the commit, ``ckptstore info``) asks :func:`store_kind` /
:func:`store_kinds` instead of listing the kinds. The built-in ones:

* ``zarr`` (default): a Zarr v3 group; the manifest is the ``"ckptstore"`` attribute of the
  root ``zarr.json``.
* ``safetensors``: ``model-*.safetensors`` files of whole global tensors and ``ckptstore.json``.
* ``index``: only ``ckptstore.json``, whose chunks are byte ranges inside the original rank
  files (a folder recorded in the manifest).

The manifest file is written last, so a folder without it is an unfinished conversion, which
leaves its work folder :data:`WORK_DIR` behind. A built-in kind names its writer rather than
importing it, so that the store (read) layer does not import the write layer, which imports it.
Writing a Zarr store needs zarr-python; reading any store needs none of it.
"""
from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckptstore.errors import StoreCorruptError
from ckptstore.io.base import ByteSource, FileStat
from ckptstore.io.sink import LOCK_FOLDER
from ckptstore.limits import MAX_METADATA_BYTES
from ckptstore.registry import Registry
from ckptstore.store.manifest import ParamManifest, compact_columns

if TYPE_CHECKING:
    from ckptstore.store.manifest import StoreManifest

ROOT_METADATA = "zarr.json"
MANIFEST = "ckptstore.json"
#: A store's work folder, where an unfinished store keeps its records and locks (the sinks' lock
#: folder; every name in it is defined by :mod:`ckptstore.store.work`).
WORK_DIR = LOCK_FOLDER


def _whole(doc: dict[str, Any]) -> Any:
    return doc


def _nothing(keys: Sequence[str]) -> list[str]:
    return []


@dataclass(frozen=True)
class StoreKind:
    """What ckptstore needs to know of one kind of store; a kind's module declares one as ``KIND``.

    ``writer`` is the kind's :class:`~ckptstore.write.store_writer.StoreWriter` subclass, or its
    ``"module:Class"`` name (imported when a store is written: the built-in kinds name theirs,
    which live in the write layer). ``manifest_file`` is the file whose existence makes a store
    complete; ``manifest_in`` takes that file's JSON object to the ckptstore manifest (``False``
    when the file is there but holds none); kinds that share a file share the first one's
    ``manifest_in``.
    ``open_data`` gives the byte source of the chunk files (``None``: the store's own folder).
    ``convert`` says whether ``convert(format=...)`` and ``ckptstore convert --format`` may
    produce it; ``help`` is its line in ``--format``'s help and ``label`` its name in
    ``ckptstore info``.
    """

    name: str
    writer: type | str
    help: str
    label: str
    manifest_file: str = MANIFEST
    manifest_in: Callable[[dict[str, Any]], Any] = _whole
    open_data: Callable[[ByteSource, StoreManifest], ByteSource] | None = None
    convert: bool = True
    #: Whether ``compress=`` applies (chunks are stored encoded).
    compressible: bool = False
    #: ``False`` for a kind whose chunks are bytes of files outside the store (an index).
    stores_data: bool = True
    #: The keys, among a listing of an output, of data files a store of this kind writes (what
    #: ``convert --overwrite`` may delete besides the manifest and the work folder).
    written: Callable[[Sequence[str]], list[str]] = _nothing
    #: Where this kind's manifest file comes among the built-in kinds' when a store is opened
    #: (lower first): on object storage each file looked for in vain costs a round trip, so the
    #: default kind's comes first.
    probe_order: int = 1
    #: Where the kind's own metadata of a parameter (what another reader of the kind goes by)
    #: places its chunks differently from the manifest, as a message; ``None`` where they agree.
    #: Reads with ``verify=True`` ask once per parameter: chunk checksums cannot see a manifest
    #: whose chunk shape was changed for another of the same size (the same bytes, elsewhere).
    layout_problem: Callable[[ByteSource, ParamManifest], str | None] | None = None

    def writer_class(self) -> type:
        """The writer class (imported now when ``writer`` names it)."""
        if isinstance(self.writer, str):
            module, _, attr = self.writer.partition(":")
            return getattr(importlib.import_module(module), attr)
        return self.writer


#: Every store kind: each module of this package's ``KIND``, then the entry points'.
KINDS: Registry[StoreKind] = Registry("store kind", StoreKind, __name__, "KIND", "ckptstore.store_kinds",
                                      lambda k: (k.name,))


def store_kind(name: str) -> StoreKind | None:
    """The store kind called ``name``, or ``None``."""
    return KINDS.get(name)


def store_kinds(*, convert: bool | None = None) -> list[StoreKind]:
    """Every store kind; with ``convert=True`` only those ``convert`` may produce, with ``False`` the others."""
    return [k for k in KINDS.entries().values() if convert is None or k.convert == convert]


def manifest_files() -> list[str]:
    """The files a store's manifest may be in, in the order they are looked for."""
    return list(dict.fromkeys(k.manifest_file for k, _ in manifest_candidates()))


def manifest_candidates() -> Iterator[tuple[StoreKind, str]]:
    """Each kind with a manifest file not named before it: the built-in kinds first, by
    ``probe_order`` (the default kind, Zarr, first: opening one costs one request), then the
    plugins' — read only when the caller goes on looking, so opening a built-in kind's store
    reads no installed distribution's entry points."""
    seen: set[str] = set()
    builtins = KINDS.builtins()
    def kinds() -> Iterator[StoreKind]:
        yield from sorted(builtins.values(), key=lambda k: k.probe_order)  # stable: then by name
        yield from (k for n, k in KINDS.entries().items() if n not in builtins)

    for kind in kinds():
        if kind.manifest_file not in seen:
            seen.add(kind.manifest_file)
            yield kind, kind.manifest_file


@dataclass(frozen=True)
class FoundManifest:
    """A store's manifest file as :func:`find_manifest` read it."""

    kind: StoreKind
    key: str
    #: The ckptstore manifest (the kind's ``manifest_in`` of the file), ``False`` for a file
    #: that holds none (a Zarr group of another program).
    doc: Any
    #: The identity of exactly the bytes read, where the source tells it with them (an
    #: object's ETag); ``None`` elsewhere.
    stat: FileStat | None


def find_manifest(source: ByteSource, *, compact: bool = False) -> FoundManifest | None:
    """The manifest file of the store in ``source``, whichever kind holds it, or ``None``.

    Candidates are read in :func:`manifest_candidates` order; a Zarr group that holds no
    ckptstore manifest does not stop the search (another kind's file may be beside it) but is
    returned, with ``doc`` ``False``, when no other is found. Raises
    :class:`StoreCorruptError` when a metadata file is not a JSON object. ``compact``: parse chunk
    tables into compact columns as they are read (:func:`ckptstore.store.manifest.compact_columns`;
    for :func:`ckptstore.open`, which only hands the document to the manifest parser).
    """
    hook = compact_columns if compact else None
    plain: FoundManifest | None = None
    for kind, name in manifest_candidates():
        got = source.read_bytes_stat(name, limit=MAX_METADATA_BYTES)
        if got is None:
            continue
        raw, stat = got
        try:
            doc = json.loads(raw, object_hook=hook)
        except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested too deep
            raise StoreCorruptError(f"{source.key_url(name)} is not valid JSON: {e}") from None
        if not isinstance(doc, dict):
            raise StoreCorruptError(f"{source.key_url(name)} is not a JSON object")
        found = FoundManifest(kind, name, kind.manifest_in(doc), stat)
        if found.doc is not False:
            return found
        plain = plain or found
    return plain


def read_manifest(source: ByteSource) -> Any:
    """The ckptstore manifest of the store in ``source``, whichever kind holds it.

    Returns ``ckptstore.json`` of a safetensors store or an index, or the ``"ckptstore"``
    attributes of the root ``zarr.json`` (each kind's ``manifest_in``); ``None`` when no
    manifest file exists; ``False`` for a file that holds no ckptstore manifest (a Zarr group
    without ckptstore attributes). Raises :class:`StoreCorruptError` when the metadata file is
    not a JSON object.
    """
    found = find_manifest(source)
    return None if found is None else found.doc
