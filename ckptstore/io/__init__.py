"""All file I/O of ckptstore: byte sources, where it reads file bytes from (:mod:`ckptstore.io.base`),
and byte sinks, where it writes them (:mod:`ckptstore.io.sink`: a local folder, an object-store
prefix, a dict in memory). Store writers see only the sink: none of them asks whether its output
is local or remote. Which source reads, and which sink writes, a location the user names is
declared by the module that implements it, per URL scheme (:mod:`ckptstore.io.schemes`)."""
from __future__ import annotations

from ckptstore.io.base import ByteSource, FileStat, ReadableFile, Request, check_key
from ckptstore.io.local import LocalFile, LocalSource
from ckptstore.io.locations import is_url, open_location, open_user_file

__all__ = ["ByteSource", "FileStat", "LocalFile", "LocalSource", "ReadableFile", "Request", "check_key", "is_url",
           "open_location", "open_user_file"]
