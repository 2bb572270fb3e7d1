"""ckptstore: bounded-memory resharding of MindSpore distributed checkpoints.

``import ckptstore`` never imports MindSpore; only the MindSpore adapter does, on first use.
"""
from __future__ import annotations

from .ckpt_reader import CkptEntry, CkptIndex, read_entry, scan_checkpoint
from .convert import ConvertSummary, convert
from .errors import CkptStoreError
from .store import Store, open
from .strategy import Layout, Strategy, load_strategy

__all__ = [
    "CkptEntry",
    "CkptIndex",
    "CkptStoreError",
    "ConvertSummary",
    "Store",
    "convert",
    "open",
    "Layout",
    "Strategy",
    "load_strategy",
    "read_entry",
    "scan_checkpoint",
]
from .version import __version__  # noqa: E402
