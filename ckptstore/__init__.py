"""ckptstore: bounded-memory resharding of MindSpore distributed checkpoints.

``import ckptstore`` never imports MindSpore; only the MindSpore adapter does, on first use.
"""
from __future__ import annotations

from .ckpt_reader import CkptEntry, CkptIndex, read_entry, scan_checkpoint
from .errors import CkptStoreError
from .strategy import Layout, Strategy, load_strategy

__all__ = [
    "CkptEntry",
    "CkptIndex",
    "CkptStoreError",
    "Layout",
    "Strategy",
    "load_strategy",
    "read_entry",
    "scan_checkpoint",
]
__version__ = "0.1.0"
