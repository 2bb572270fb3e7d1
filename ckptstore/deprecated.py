"""Keyword arguments that were renamed: the old spelling still works, with a DeprecationWarning.

The API and the CLI use one vocabulary (``format=`` like ``--format``, ``chunk_mb=`` like
``--chunk-mb``, ``include=`` like ``--include``, ``strict=``); the names used before keep working
for callers written against them, and passing both spellings at once is refused. ``names=`` of
the loading functions stays a synonym without a warning (:func:`synonym`): the published API
(``load_rank(store, strategy, rank, names=None)``) spells it so.
"""
from __future__ import annotations

import warnings
from typing import TypeVar

from ckptstore.errors import InvalidOptionError

T = TypeVar("T")


def renamed(new: T | None, old: T | None, *, new_name: str, old_name: str, default: T) -> T:
    """The value of option ``new_name``: ``new`` when given, else ``old`` (with a
    :class:`DeprecationWarning` naming the new spelling), else ``default``."""
    if old is None:
        return default if new is None else new
    if new is not None:
        raise InvalidOptionError(f"{old_name}= is the old name of {new_name}=; pass only {new_name}=")
    warnings.warn(f"ckptstore: {old_name}= is deprecated; use {new_name}=", DeprecationWarning, stacklevel=3)
    return old


def synonym(value: T | None, other: T | None, *, name: str, other_name: str) -> T | None:
    """The value of an option with two accepted spellings, ``name=`` and ``other_name=`` (neither
    deprecated); passing both at once is refused."""
    if value is not None and other is not None:
        raise InvalidOptionError(f"{name}= and {other_name}= are the same option; pass only one")
    return value if value is not None else other
