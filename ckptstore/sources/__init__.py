"""Byte sources: where ckptstore reads file bytes from (see :mod:`ckptstore.sources.base`)."""
from __future__ import annotations

from .base import ByteSource, FileStat, ReadableFile, Request, check_key
from .local import LocalFile, LocalSource
from .locations import is_url, open_location, open_user_file

__all__ = ["ByteSource", "FileStat", "LocalFile", "LocalSource", "ReadableFile", "Request", "check_key", "is_url",
           "open_location", "open_user_file"]
