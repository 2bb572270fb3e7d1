"""Byte sources: where ckptstore reads file bytes from (see :mod:`ckptstore.sources.base`)."""
from __future__ import annotations

from .base import ByteSource, FileStat, ReadableFile, Request, check_key
from .local import LocalFile, LocalSource

__all__ = ["ByteSource", "FileStat", "LocalFile", "LocalSource", "ReadableFile", "Request", "check_key"]
