"""Which byte source reads, and which byte sink writes, a location: chosen by its URL scheme.

A module of :mod:`ckptstore.io` that implements a source declares ``BYTE_SOURCE =
Scheme(...)`` (the URL schemes it serves and the class that opens one of their locations); a
sink declares ``BYTE_SINK`` the same way. A plain path (no ``scheme://``) has the scheme
:data:`PATH`. Another distribution adds a source or sink through the entry-point groups
``ckptstore.byte_sources`` / ``ckptstore.byte_sinks``, each naming such a declaration, so a new
source or sink is one new file (see :mod:`ckptstore.registry`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckptstore.registry import Registry

#: The scheme of a plain local (or shared-filesystem) path.
PATH = ""


@dataclass(frozen=True)
class Scheme:
    """The URL schemes one byte source or sink serves (lower case; :data:`PATH` for plain paths),
    the callable that opens it for a location (given as the user wrote it: a path or the whole
    URL), and how the message refusing an unknown scheme names it (e.g. ``"s3://bucket/prefix"``)."""

    schemes: tuple[str, ...]
    open: Callable[[Any], Any]
    example: str = ""


#: Byte sources by URL scheme.
BYTE_SOURCES: Registry[Scheme] = Registry("byte source", Scheme, "ckptstore.io", "BYTE_SOURCE",
                                          "ckptstore.byte_sources", lambda d: d.schemes)
#: Byte sinks by URL scheme.
BYTE_SINKS: Registry[Scheme] = Registry("byte sink", Scheme, "ckptstore.io", "BYTE_SINK",
                                        "ckptstore.byte_sinks", lambda d: d.schemes)
