"""The global parameters a distributed checkpoint makes up: each one's shape, dtype and slices.

Pure data, shared by the code that builds them (:mod:`ckptstore.checkpoint.source`), the code
that checks them against the rank files' bytes (:mod:`ckptstore.checkpoint.layout_check`) and
the chunk planner; it imports neither, so they need not import each other.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ckptstore.boxes import Box
from ckptstore.formats.ckpt_reader import CkptEntry


@dataclass(frozen=True)
class SourceSlice:
    """One distinct global box of a parameter and the rank files that hold it (replicas)."""

    box: Box
    ranks: tuple[int, ...]
    entries: tuple[CkptEntry, ...]
    paths: tuple[str, ...]
    #: every rank the strategy places this box on (``ranks`` are those whose files hold it)
    group: tuple[int, ...] = ()

    @property
    def rank(self) -> int:
        """The rank whose file supplies this box (the first replica)."""
        return self.ranks[0]

    @property
    def entry(self) -> CkptEntry:
        return self.entries[0]

    @property
    def path(self) -> str:
        """The file of the rank that supplies this box."""
        return self.paths[0]


@dataclass(frozen=True)
class SourceParam:
    """A parameter of the whole job: global shape, dtype, and its distinct slices."""

    name: str
    tensor_type: str
    dtype: np.dtype
    shape: tuple[int, ...]
    slices: tuple[SourceSlice, ...]
    in_strategy: bool
    #: Slices of other pipeline stages that hold the parameter in another layout (a tied
    #: embedding): not stored, checked against the stored slices.
    copies: tuple[SourceSlice, ...] = ()

    @property
    def is_str(self) -> bool:
        return self.tensor_type == "str"

    @property
    def nbytes(self) -> int:
        return sum(s.entry.nbytes for s in self.slices)
