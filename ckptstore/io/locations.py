"""Where a location the user names is: a local (or shared-filesystem) path, or a URL.

Every command and function that takes a store, a checkpoint folder or a rank file accepts
either. The byte source of a location is the one declared for its URL scheme
(:mod:`ckptstore.io.schemes`): ``s3://bucket/prefix`` and ``obs://bucket/prefix`` go to
:class:`~.s3_source.S3Source`, plain paths to :class:`~.local.LocalSource`; any other ``scheme://``
is refused with :class:`~ckptstore.errors.UnsupportedLocationError` rather than taken for a
local folder named ``scheme:``.
"""
from __future__ import annotations

import os
import posixpath

from ckptstore.errors import UnsafePathError, UnsupportedLocationError
from ckptstore.io.base import ByteSource, ReadableFile
from ckptstore.io.local import LocalFile
from ckptstore.io.schemes import BYTE_SOURCES, PATH, Scheme
from ckptstore.io.urls import redact, url_scheme
from ckptstore.registry import Registry


def is_url(location: object) -> bool:
    """Whether ``location`` is written as a URL (``scheme://...``), supported or not."""
    return url_scheme(location) is not None


def handler(registry: Registry[Scheme], location: object) -> Scheme:
    """The declaration in ``registry`` serving ``location``'s scheme; raises
    :class:`~ckptstore.errors.UnsupportedLocationError` naming the schemes there are."""
    scheme = url_scheme(location) or PATH
    found = registry.get(scheme)
    if found is None:
        known = list(dict.fromkeys(d.example or f"{d.schemes[0]}://..." for d in registry.entries().values()))
        raise UnsupportedLocationError(f"{redact(str(location)).split('://')[0]}:// locations are not supported: use "
                                       f"{', or '.join(known)}")
    return found


def open_location(location: str | os.PathLike[str]) -> ByteSource:
    """The byte source of a folder or bucket prefix the user named (nothing is read yet)."""
    source: ByteSource = handler(BYTE_SOURCES, location).open(str(location) if is_url(location) else location)
    return source


def open_user_file(location: str | os.PathLike[str]) -> ReadableFile:
    """Open one file the user named (a path, symbolic links followed, or a URL); the caller closes it."""
    if not is_url(location):
        return LocalFile.from_path(location)
    url = str(location).rstrip("/")
    handler(BYTE_SOURCES, url)  # an unknown scheme is refused as such, before the URL's form
    scheme, _, rest = url.partition("://")
    head, _, prefix = rest.partition("/")
    parent, _, name = prefix.rpartition("/")
    if not name:
        raise UnsafePathError(f"{redact(url)} names a bucket, not a file")
    return open_location(f"{scheme}://{head}/{parent}" if parent else f"{scheme}://{head}").open(name)


def join(location: str, relative: str) -> str:
    """``relative`` (a path from a metadata file) resolved against the folder or URL ``location``.

    Raises :class:`~ckptstore.errors.UnsafePathError` when it climbs out of the bucket.
    """
    if not is_url(location):
        return os.path.normpath(os.path.join(location, relative))
    scheme, _, rest = location.partition("://")
    bucket, _, prefix = rest.partition("/")
    joined = posixpath.normpath(posixpath.join("/" + prefix, relative))
    if relative.startswith("/") or joined.startswith("//") or ".." in joined.split("/"):
        raise UnsafePathError(f"{relative!r} leaves the bucket of {location}")
    joined = joined.strip("/")
    return f"{scheme}://{bucket}" + (f"/{joined}" if joined else "")
