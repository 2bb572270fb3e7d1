"""ckptstore: bounded-memory resharding of MindSpore distributed checkpoints.

``import ckptstore`` never imports MindSpore; only the MindSpore adapter does, on first use.
"""
from __future__ import annotations

from .ckpt_reader import CkptEntry, CkptIndex, read_entry, scan_checkpoint
from .convert import ConvertSummary, convert
from .errors import CkptStoreError
from .export import ExportSummary, export
from .loader import RankView, rank_view
from .store import Store, open
from .strategy import Layout, Strategy, load_strategy


_ADAPTER_NAMES = ("RankParameters", "load_into_net", "load_rank")


def __getattr__(name: str) -> object:
    # The MindSpore adapter is imported on first use, so `import ckptstore` stays light.
    if name in _ADAPTER_NAMES:
        from . import mindspore_adapter

        return getattr(mindspore_adapter, name)
    raise AttributeError(f"module 'ckptstore' has no attribute {name!r}")


__all__ = [
    "__version__",
    "CkptEntry",
    "CkptIndex",
    "CkptStoreError",
    "ConvertSummary",
    "ExportSummary",
    "RankParameters",
    "RankView",
    "export",
    "load_into_net",
    "load_rank",
    "rank_view",
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
