"""Store kinds and where each keeps its manifest; reading one needs only JSON.

* ``zarr`` (default): a Zarr v3 group; the manifest is the ``"ckptstore"`` attribute of the
  root ``zarr.json``.
* ``safetensors``: ``model-*.safetensors`` files of whole global tensors and ``ckptstore.json``.
* ``index``: only ``ckptstore.json``, whose chunks are byte ranges inside the original rank
  files (a folder recorded in the manifest).

The manifest file is written last, so a folder without it is an unfinished conversion, which
leaves its work folder :data:`WORK_DIR` behind. Writing a Zarr store needs zarr-python
(:mod:`.zarr_backend`); reading any store needs none of it.
"""
from __future__ import annotations

import json
from typing import Any

from ckptstore.errors import StoreCorruptError
from ckptstore.limits import MAX_METADATA_BYTES
from ckptstore.io.base import ByteSource

ROOT_METADATA = "zarr.json"
MANIFEST = "ckptstore.json"
WORK_DIR = ".ckptstore-work"
KINDS = ("zarr", "safetensors", "index")


def read_manifest(source: ByteSource) -> Any:
    """The ckptstore manifest of the store in ``source``, whichever kind holds it.

    Returns ``ckptstore.json`` of a safetensors store or an index, or the ``"ckptstore"``
    attributes of the root ``zarr.json``; ``None`` when neither file exists; ``False`` for a
    Zarr group without ckptstore attributes. Raises :class:`StoreCorruptError` when the
    metadata file is not a JSON object.
    """
    for name in (MANIFEST, ROOT_METADATA):
        raw = source.read_bytes(name, limit=MAX_METADATA_BYTES)
        if raw is None:
            continue
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested too deep
            raise StoreCorruptError(f"{source.key_url(name)} is not valid JSON: {e}") from None
        if not isinstance(doc, dict):
            raise StoreCorruptError(f"{source.key_url(name)} is not a JSON object")
        if name == MANIFEST:
            return doc
        attrs = doc.get("attributes", {})
        return attrs.get("ckptstore", False) if isinstance(attrs, dict) else False
    return None
