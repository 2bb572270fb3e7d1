"""Store formats: Zarr v3 (default) and safetensors; here, finding a store's manifest in either."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from . import safetensors_backend, zarr_backend


def read_manifest(root: Path) -> Any:
    """The ckptstore manifest in folder ``root``, whichever format holds it.

    Returns ``ckptstore.json`` of a safetensors store, or the ``"ckptstore"`` attributes of the
    root ``zarr.json``; ``None`` when neither file exists; ``False`` for a Zarr group without
    ckptstore attributes. Raises ``ValueError`` when the metadata file is not a JSON object.
    """
    doc = safetensors_backend.read_manifest(root)
    if doc is not None:
        return doc
    attrs = zarr_backend.read_root_attributes(root)
    if attrs is None:
        return None
    if not isinstance(attrs, dict):
        raise ValueError(f"{root / zarr_backend.ROOT_METADATA} is not a JSON object")
    return attrs.get("ckptstore", False)
