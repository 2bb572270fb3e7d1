"""An independent check used by the tests: do boxes tile a shape? (Slow, obviously right.)"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from ckptstore.boxes import Box


def tiles_exactly(boxes: Iterable[Box], shape: Sequence[int]) -> bool:
    """True when the distinct ``boxes`` cover ``shape`` with no gap and no overlap."""
    unique = list(dict.fromkeys(boxes))
    whole = Box.full(shape)
    if any(not whole.contains(b) for b in unique):
        return False
    if sum(b.size for b in unique) != whole.size:
        return False
    for i, a in enumerate(unique):
        for b in unique[i + 1:]:
            overlap = a.intersect(b)
            if overlap is not None and overlap.size:
                return False
    return True
