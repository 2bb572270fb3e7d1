"""Byte sources: where ckptstore reads file bytes from (see :mod:`ckptstore.io.base`)."""
from __future__ import annotations

from ckptstore.io.base import ByteSource, FileStat, ReadableFile, Request, check_key
from ckptstore.io.local import LocalFile, LocalSource
from ckptstore.io.locations import is_url, open_location, open_user_file

__all__ = ["ByteSource", "FileStat", "LocalFile", "LocalSource", "ReadableFile", "Request", "check_key", "is_url",
           "open_location", "open_user_file"]
