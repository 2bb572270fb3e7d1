"""Locations written as URLs: their scheme, a bucket URL's parts, and credentials hidden in messages.

The generic layer (:mod:`ckptstore.io.locations`, the CLI, exports) parses and redacts
locations through this module alone, so it does not depend on any object-store backend.
Credentials in a URL are refused (:func:`split_url`), and :func:`redact` hides them in every
message that may hold a location or an endpoint.
"""
from __future__ import annotations

import os
import re

from ckptstore.errors import UnsupportedLocationError
from ckptstore.io.base import check_key

#: URL schemes of object storage that speaks S3 (Huawei OBS does; ModelArts names its checkpoints ``obs://``).
SCHEMES = ("s3", "obs")

_URL = re.compile(r"^([a-z][a-z0-9+.-]*)://(.*)$", re.IGNORECASE)


#: Credentials written into a URL (``s3://KEY:SECRET@bucket``): everything from the scheme's
#: slashes to the last ``@`` before a blank or a quote (a secret may hold ``/``).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*:/{1,2})[^\s@'\"]*@")
#: Schemes whose name followed by one slash or none (``s3:/bucket``) is a mistyped URL, not a folder.
KNOWN_SCHEMES = (*SCHEMES, "gs", "oss", "cos", "hdfs", "http", "https", "file")


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it hidden (``s3://***@bucket/...``).

    Every message that may hold a location the user typed or an endpoint goes through this one
    function: job logs are kept and shared, and a secret must never reach them.
    """
    return _USERINFO.sub(r"\1***@", text)


def url_scheme(location: object) -> str | None:
    """The lower-case scheme of ``location`` if it is a URL (``"s3"`` for ``s3://b/p``), else ``None``.

    A location whose first path component is a known scheme and a colon (``obs:/ckpt/x.zarr``,
    ``s3:``) is a URL with a slash missing, not a local folder named ``obs:``: it is refused with
    :class:`~ckptstore.errors.UnsupportedLocationError` (a local folder of that name can be
    written ``./obs:/...``).
    """
    if isinstance(location, os.PathLike):
        location = os.fspath(location)
    if not isinstance(location, str):
        return None
    m = _URL.match(location)
    if m:
        return m.group(1).lower()
    first = location.split("/", 1)[0]
    if first.endswith(":") and first[:-1].lower() in KNOWN_SCHEMES:
        scheme = first[:-1]
        rest = location[len(first):].lstrip("/") or "bucket/prefix"
        raise UnsupportedLocationError(
            f"{redact(location)} is not a URL (it needs two slashes after '{scheme}:') and ckptstore will not take it "
            f"for a local folder named '{first}': write {redact(f'{scheme}://{rest}')}, or ./{redact(location)} if you "
            "mean a local folder")
    return None


def split_url(url: str) -> tuple[str, str, str]:
    """``(scheme, bucket, prefix)`` of an ``s3://`` or ``obs://`` URL; other schemes are refused."""
    scheme = url_scheme(url)
    if scheme not in SCHEMES:
        raise UnsupportedLocationError(
            f"{url.split('://')[0]}:// locations are not supported: use a local or shared-filesystem path, "
            "or s3://bucket/prefix (obs://bucket/prefix for Huawei OBS)")
    rest = url.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket or redact(url) != url and ":" in bucket:
        raise UnsupportedLocationError(
            f"{redact(url)} has credentials in it: ckptstore takes none from a URL (they would be printed and "
            "recorded in the store); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) instead")
    if not bucket or _FORBIDDEN_BUCKET.search(bucket):
        raise UnsupportedLocationError(f"{redact(url)} does not name a bucket: write {scheme}://bucket/prefix")
    prefix = prefix.strip("/")
    if prefix:
        check_key(prefix, redact(url))
    return scheme, bucket, prefix


_FORBIDDEN_BUCKET = re.compile(r"[^a-z0-9.\-_]", re.IGNORECASE)
