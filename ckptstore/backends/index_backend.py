"""The index kind of store: only a manifest, whose chunks are byte ranges of the original rank files.

``ckptstore index`` copies no payload: each distinct slice of each parameter is one chunk, whose
pieces are the slice's byte ranges in the rank file that holds it (one per ``.ckpt`` record,
one for a safetensors tensor). The manifest records the folder the rank files are in
(``source_root``: relative to the store when it can be, so the two can move together) and,
per file, its size and modification time. Reading goes through :class:`IndexSource`, which
confines every key to that folder like any byte source and refuses a file whose size or
modification time changed since the index was made: such a file may hold other bytes now.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from ..errors import SourceChangedError, StoreCorruptError
from ..manifest import StoreManifest
from ..sources.base import ByteSource, check_key
from ..sources.local import LocalFile, LocalSource

SOURCE_ROOT = "source_root"
SOURCE_FILES = "source_files"


def source_root_field(store: Path, root: Path) -> str:
    """How the manifest names the rank files' folder: relative to the store when it can be."""
    try:
        return os.path.relpath(root, store.resolve())
    except ValueError:  # another drive
        return str(root)


def file_records(source_root: Path, keys: list[str]) -> dict[str, dict[str, int]]:
    """``{key: {"size", "mtime_ns"}}`` of the rank files, as they are now."""
    out = {}
    for key in keys:
        st = os.stat(source_root / key)
        out[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return out


class IndexSource(LocalSource):
    """The rank files an index points into: confined to their folder, checked against the index."""

    def __init__(self, root: str | os.PathLike[str], records: Mapping[str, Mapping[str, int]]) -> None:
        super().__init__(root)
        self.records = records

    def _open(self, key: str) -> LocalFile:
        f = super()._open(key)
        st = os.fstat(f.fd)
        try:
            self._check(key, st.st_size, st.st_mtime_ns)
        except BaseException:
            f.close()
            raise
        return f

    def _check(self, key: str, size: int, mtime_ns: int) -> None:
        want = self.records.get(key)
        if want is None:
            raise StoreCorruptError(f"the index names {self.key_url(key)}, which it has no record of")
        if (size, mtime_ns) != (want["size"], want["mtime_ns"]):
            raise SourceChangedError(
                f"rank file {self.key_url(key)} changed since the index was made (size {size}, was {want['size']}; "
                f"modified at {mtime_ns} ns, was {want['mtime_ns']}): it may hold other bytes now. Run "
                "'ckptstore index' again")

    def check_all(self) -> None:
        """Stat every recorded file (at open): a changed or missing one is an error now, not at a read."""
        for key in self.records:
            st = self.stat(key)
            if st is None:
                raise SourceChangedError(f"rank file {self.key_url(key)} of the index is missing")
            self._check(key, st.size, st.mtime_ns)


def data_source(location: ByteSource, manifest: StoreManifest) -> IndexSource:
    """The byte source of an index's chunks, validated against the manifest's records."""
    where = location.url
    root, records = manifest.extra.get(SOURCE_ROOT), manifest.extra.get(SOURCE_FILES)
    if not isinstance(root, str) or not root or not isinstance(records, Mapping):
        raise StoreCorruptError(f"{where}: an index store needs '{SOURCE_ROOT}' and '{SOURCE_FILES}' in its manifest")
    clean: dict[str, dict[str, int]] = {}
    for key, rec in records.items():
        check_key(key, where)
        if (not isinstance(rec, Mapping) or type(rec.get("size")) is not int or type(rec.get("mtime_ns")) is not int):
            raise StoreCorruptError(f"{where}: the record of rank file {key!r} is malformed")
        clean[key] = {"size": rec["size"], "mtime_ns": rec["mtime_ns"]}
    for p in manifest.params.values():
        for f in set(p.chunks.files) | {piece[0] for ps in p.chunks.pieces.values() for piece in ps}:
            if f not in clean:
                raise StoreCorruptError(f"{where}: parameter {p.name!r} names rank file {f!r}, which the index has no "
                                        "record of")
    base = Path(location.url)
    resolved = Path(root) if os.path.isabs(root) else (base / root)
    source = IndexSource(os.path.normpath(resolved), clean)
    source.check_all()
    return source


def extra_fields(store: Path, root: Path, keys: list[str]) -> dict[str, Any]:
    """The manifest fields an index adds: where the rank files are and what they were."""
    return {SOURCE_ROOT: source_root_field(store, root), SOURCE_FILES: file_records(root, keys)}
