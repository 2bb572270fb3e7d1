"""Where a location the user names is: a local (or shared-filesystem) path, or an object-store URL.

Every command and function that takes a store, a checkpoint folder or a rank file accepts
either. ``s3://bucket/prefix`` and ``obs://bucket/prefix`` go to :class:`~.s3.S3Source`; any
other ``scheme://`` is refused with :class:`~ckptstore.errors.UnsupportedLocationError` rather
than taken for a local folder named ``scheme:``.
"""
from __future__ import annotations

import os
import posixpath

from ckptstore.errors import UnsafePathError
from ckptstore.io.base import ByteSource, ReadableFile
from ckptstore.io.local import LocalFile, LocalSource
from ckptstore.io.s3 import S3Source, split_url, url_scheme


def is_url(location: object) -> bool:
    """Whether ``location`` is written as a URL (``scheme://...``), supported or not."""
    return url_scheme(location) is not None


def open_location(location: str | os.PathLike[str]) -> ByteSource:
    """The byte source of a folder or bucket prefix the user named (nothing is read yet)."""
    if is_url(location):
        return S3Source(str(location))
    return LocalSource(location)


def open_user_file(location: str | os.PathLike[str]) -> ReadableFile:
    """Open one file the user named (a path, symbolic links followed, or a URL); the caller closes it."""
    if is_url(location):
        url = str(location).rstrip("/")
        scheme, bucket, prefix = split_url(url)
        parent, _, name = prefix.rpartition("/")
        if not name:
            raise UnsafePathError(f"{url} names a bucket, not a file")
        return S3Source(f"{scheme}://{bucket}/{parent}" if parent else f"{scheme}://{bucket}").open(name)
    return LocalFile.from_path(location)


def join(location: str, relative: str) -> str:
    """``relative`` (a path from a metadata file) resolved against the folder or URL ``location``.

    Raises :class:`~ckptstore.errors.UnsafePathError` when it climbs out of the bucket.
    """
    if not is_url(location):
        return os.path.normpath(os.path.join(location, relative))
    scheme, bucket, prefix = split_url(location)
    joined = posixpath.normpath(posixpath.join("/" + prefix, relative))
    if relative.startswith("/") or joined.startswith("//") or ".." in joined.split("/"):
        raise UnsafePathError(f"{relative!r} leaves the bucket of {location}")
    joined = joined.strip("/")
    return f"{scheme}://{bucket}" + (f"/{joined}" if joined else "")
