"""The index kind of store: only a manifest, whose chunks are byte ranges of the original rank files.

``ckptstore index`` copies no payload: each distinct slice of each parameter is one chunk, whose
pieces are the slice's byte ranges in the rank file that holds it (one per ``.ckpt`` record,
one for a safetensors tensor). The manifest records the folder the rank files are in
(``source_root``: relative to the store when it can be, so the two can move together) and,
per file, its size and modification time, and its inode number and status-change time (a
local file; an object's ETag). Reading goes through :class:`IndexSource`, which confines every
key to that folder like any byte source and refuses a file whose recorded fields changed since
the index was made: such a file may hold other bytes now. Size and modification time alone
miss bytes edited in place with the time restored (``touch -r``) and a same-size file renamed
over the original; the inode and ctime catch both. The device number is not recorded: a
shared filesystem has another on each host that mounts it.
"""
from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from ckptstore.errors import SourceChangedError, StoreCorruptError
from ckptstore.io.base import ByteSource, FileStat, ReadableFile, SourceWrapper, check_key
from ckptstore.io.local import local_stat
from ckptstore.io.locations import is_url, join, open_location
from ckptstore.store.manifest import StoreManifest

SOURCE_ROOT = "source_root"
SOURCE_FILES = "source_files"
#: The fields of a rank file's record, in the order a change is reported; ``ino`` and
#: ``ctime_ns`` only for local files (and not in indexes made before they were recorded),
#: ``etag`` only for objects.
_FIELDS = ("size", "mtime_ns", "ino", "ctime_ns", "etag")


def source_root_field(store: str, root: str) -> str:
    """How the manifest names the rank files' folder: relative to the store when it can be."""
    if is_url(store) or is_url(root):
        if is_url(store) and is_url(root) and root.split("/")[:3] == store.split("/")[:3]:  # one bucket
            rel = os.path.relpath("/" + root.split("/", 3)[3] if root.count("/") > 2 else "/",
                                  "/" + store.split("/", 3)[3] if store.count("/") > 2 else "/")
            return rel
        return root
    try:
        return os.path.relpath(root, os.path.realpath(store))
    except ValueError:  # another drive
        return root


def common_folder(paths: Sequence[str], fallback: str) -> tuple[str, dict[str, str]]:
    """The folder (or bucket prefix) holding every rank file, and each file's key below it.

    Local files are taken where they really are, so no key crosses a symbolic link; object URLs
    must share one bucket.
    """
    paths = sorted(set(paths))  # a few files, many chunks each
    if not paths:
        return fallback, {}
    if any(is_url(p) for p in paths):
        heads = {p.split("/", 3)[:3] == paths[0].split("/", 3)[:3] for p in paths}
        if heads != {True} or not all(is_url(p) for p in paths):
            raise StoreCorruptError("an index needs all rank files in one bucket (or all on local disks)")
        head = "/".join(paths[0].split("/", 3)[:3])
        rest = [p.split("/", 3)[3] for p in paths]
        root = posixpath.commonpath([posixpath.dirname(r) for r in rest]) if rest else ""
        cut = len(root) + 1 if root else 0
        return (f"{head}/{root}" if root else head), {p: r[cut:] for p, r in zip(paths, rest, strict=True)}
    real = {p: os.path.realpath(p) for p in paths}
    root = os.path.commonpath([os.path.dirname(r) for r in real.values()])
    return root, {p: os.path.relpath(r, root) for p, r in real.items()}


def file_records(source: ByteSource, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``{key: {"size", "mtime_ns"[, "ino", "ctime_ns"][, "etag"]}}`` of the rank files, as they are now."""
    out: dict[str, dict[str, Any]] = {}
    for key in keys:
        st = source.stat(key)
        if st is None:
            raise SourceChangedError(f"rank file {source.key_url(key)} disappeared while it was being indexed")
        out[key] = _record(source, st)
    return out


def _record(source: ByteSource, st: FileStat) -> dict[str, Any]:
    rec: dict[str, Any] = {"size": st.size, "mtime_ns": st.mtime_ns}
    if st.ino is not None and st.ctime_ns is not None:
        rec.update(ino=st.ino, ctime_ns=st.ctime_ns)
    if st.ino is None and st.version:  # an object (no inode): its ETag changes with every write
        rec["etag"] = st.version
    return rec


class IndexSource(SourceWrapper):
    """The rank files an index points into: confined to their folder, checked against the index."""

    def __init__(self, inner: ByteSource, records: Mapping[str, Mapping[str, Any]]) -> None:
        super().__init__(inner)
        self.records = records

    def open(self, key: str) -> ReadableFile:
        check_key(key, self.url)  # an unsafe key is refused as such, not as one the index lacks
        if key not in self.records:
            raise StoreCorruptError(f"the index names {self.key_url(key)}, which it has no record of")
        f = self.inner.open(key)
        fd = getattr(f, "fd", None)
        if fd is not None:  # a local file: check the one just opened, not a name that may change again
            self._check(key, local_stat(os.fstat(fd)))
        rec = self.records[key]
        pin = getattr(f, "pin", None)
        if pin is not None and "etag" in rec and getattr(f, "etag", None) is None:
            # an object: its first GET already asks for the recorded version (If-Match), so a
            # rank file replaced after the index was opened answers 412, at no extra request
            pin(rec["etag"], rec["size"], lambda: self._changed(key, "its ETag is no longer the recorded one"))
        return f

    def _changed(self, key: str, what: str) -> SourceChangedError:
        return SourceChangedError(
            f"rank file {self.key_url(key)} changed since the index was made ({what}): it may "
            "hold other bytes now (edited, replaced, or copied elsewhere). Run 'ckptstore index' again")

    def _check(self, key: str, st: FileStat) -> None:
        """Compare ``st`` with every field the index recorded (older indexes lack ino and ctime)."""
        want = self.records[key]
        now = {"size": st.size, "mtime_ns": st.mtime_ns, "ino": st.ino, "ctime_ns": st.ctime_ns,
               "etag": st.version or None}
        changed = [f"{field} {now[field]}, was {want[field]}" for field in _FIELDS
                   if field in want and now[field] is not None and now[field] != want[field]]
        if changed:
            raise self._changed(key, "; ".join(changed))

    def check_all(self) -> None:
        """Stat every recorded file (at open): a changed or missing one is an error now, not at a read."""
        for key in self.records:
            st = self.stat(key)
            if st is None:
                raise SourceChangedError(f"rank file {self.key_url(key)} of the index is missing")
            self._check(key, st)


def data_source(location: ByteSource, manifest: StoreManifest) -> IndexSource:
    """The byte source of an index's chunks, validated against the manifest's records."""
    where = location.url
    root, records = manifest.extra.get(SOURCE_ROOT), manifest.extra.get(SOURCE_FILES)
    if not isinstance(root, str) or not root or not isinstance(records, Mapping):
        raise StoreCorruptError(f"{where}: an index store needs '{SOURCE_ROOT}' and '{SOURCE_FILES}' in its manifest")
    clean: dict[str, dict[str, Any]] = {}
    for key, rec in records.items():
        check_key(key, where)
        if (not isinstance(rec, Mapping) or type(rec.get("size")) is not int or type(rec.get("mtime_ns")) is not int
                or not all(type(rec.get(k, 0)) is int for k in ("ino", "ctime_ns"))
                or not isinstance(rec.get("etag", ""), str)):
            raise StoreCorruptError(f"{where}: the record of rank file {key!r} is malformed")
        clean[key] = {k: rec[k] for k in _FIELDS if k in rec}
    for p in manifest.params.values():
        for f in set(p.chunks.files) | {piece[0] for ps in p.chunks.pieces.values() for piece in ps}:
            if f not in clean:
                raise StoreCorruptError(f"{where}: parameter {p.name!r} names rank file {f!r}, which the index has no "
                                        "record of")
    resolved = root if is_url(root) or os.path.isabs(root) else join(where, root)
    source = IndexSource(open_location(resolved), clean)
    source.check_all()
    return source


def extra_fields(store: str, source: ByteSource, keys: Sequence[str]) -> dict[str, Any]:
    """The manifest fields an index adds: where the rank files are and what they were."""
    return {SOURCE_ROOT: source_root_field(store, source.url), SOURCE_FILES: file_records(source, keys)}
