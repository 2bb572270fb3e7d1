"""Data objects' versions recorded in the manifest at the commit, so readers pin them without asking.

On object storage every data object of a store is pinned to one version (its ETag) for the
whole read, so that a store replaced while it is read gives the old bytes or an error, never a
mix. Asking each object for its version costs a request; instead the commit lists the store
once and records every data object's ETag and size in the manifest (``object_versions``, see
docs/FORMAT.md), as an index records its rank files. A reader then sends the recorded ETag as
``If-Match`` with the first GET of each object: an object that is no longer the committed
version answers 412 and nothing of it is read. A sink whose files have no versions (a local
folder, where an open file keeps its bytes) records nothing.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ckptstore.errors import StoreCorruptError, UnsafePathError
from ckptstore.io.base import check_key
from ckptstore.io.sink import ByteSink
from ckptstore.limits import MAX_CHUNKS
from ckptstore.store.manifest import StoreManifest

#: The manifest's top-level field: ``{"<data key>": {"etag": "<ETag>", "size": <bytes>}}``.
FIELD = "object_versions"
#: The longest ETag a manifest may record (S3's are 34 characters, a multipart one a few more).
MAX_ETAG = 256


def data_files(manifest: StoreManifest) -> set[str]:
    """Every file key the manifest's chunk tables point into (relative to the store)."""
    out: set[str] = set()
    for p in manifest.params.values():
        out.update(p.chunks.files)
        for pieces in p.chunks.pieces.values():
            out.update(f for f, _, _ in pieces)
    return out


def record_versions(sink: ByteSink, manifest: StoreManifest) -> StoreManifest:
    """``manifest`` with the version and size of each of its data files in ``sink`` recorded.

    One listing of the sink (a LIST per 1,000 objects) at the commit, after every data file is
    written and before the manifest is: the versions recorded are those the manifest commits.
    Returned unchanged where the sink has no versions (a local folder) or where the data lie
    outside the store (an index's rank files, which it records itself).
    """
    from ckptstore.store.kinds import store_kind

    kind = store_kind(manifest.kind)
    if kind is not None and kind.open_data is not None:
        return manifest
    found = sink.versions()
    if not found:
        return manifest
    wanted = data_files(manifest)
    recorded = {k: {"etag": v, "size": n} for k, (v, n) in sorted(found.items()) if k in wanted}
    return dataclasses.replace(manifest, extra={**manifest.extra, FIELD: recorded})


def recorded_versions(manifest: StoreManifest, *, where: str) -> dict[str, tuple[str, int]]:
    """``{key: (ETag, size)}`` the manifest recorded (empty when it recorded none), validated:
    raises :class:`~ckptstore.errors.StoreCorruptError` naming ``where`` for a malformed field."""
    raw: Any = manifest.extra.get(FIELD)
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or len(raw) > MAX_CHUNKS:
        raise StoreCorruptError(f"{where}: malformed manifest ('{FIELD}' must be a JSON object of at most "
                                f"{MAX_CHUNKS} files)")
    out: dict[str, tuple[str, int]] = {}
    for key, rec in raw.items():
        try:
            check_key(key, where)
        except (UnsafePathError, TypeError):
            raise StoreCorruptError(f"{where}: '{FIELD}' names {key!r}, which is not a file of the store") from None
        etag = rec.get("etag") if isinstance(rec, Mapping) else None
        size = rec.get("size") if isinstance(rec, Mapping) else None
        if (not isinstance(etag, str) or not 0 < len(etag) <= MAX_ETAG or type(size) is not int
                or not 0 <= size < 1 << 62):
            raise StoreCorruptError(f"{where}: '{FIELD}' of {key!r} must be {{\"etag\": text, \"size\": bytes}}")
        out[key] = (etag, size)
    return out
