"""What a conversion or an index reports: :class:`ConvertSummary` (``ckptstore convert --json``).

Its own module because two writers return it: the converter of rank files
(:mod:`ckptstore.write.convert`) and the indexer of Hugging Face folders
(:mod:`ckptstore.write.hf_index`), which ``ckptstore.index(..., name_map=...)`` dispatches to.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ConvertSummary:
    """What a conversion did (``ckptstore convert --json`` prints this)."""

    store: str
    params: int
    chunks: int
    chunks_written: int
    chunks_resumed: int
    params_resumed: int
    source_bytes: int
    unique_bytes: int
    stored_bytes: int
    seconds: float
    already_complete: bool = False
    #: This process's part ("I/N"); counts above are of its share.
    part: str = "0/1"
    #: Whether the store is complete after this run (the last part commits).
    committed: bool = True
    #: Parameters the strategy lays out but no rank file holds (a filtered save): not stored.
    unsaved: tuple[str, ...] = ()
    #: Why this process did nothing (msrun's scheduler process takes no part), else ``None``.
    skipped: str | None = None
    #: Which checkpoint was taken when the rank folders held several, and why (else ``None``).
    chosen: str | None = None
    #: Parameters of the whole store (every part's), once it is complete; ``params`` is this part's share.
    store_params: int | None = None

    @property
    def dedup_saved_bytes(self) -> int:
        return self.source_bytes - self.unique_bytes

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "dedup_saved_bytes": self.dedup_saved_bytes}
