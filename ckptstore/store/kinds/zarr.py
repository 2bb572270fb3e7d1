"""The Zarr store kind (the default): a Zarr v3 group, one array per parameter, whose root
``zarr.json`` carries the manifest as its ``"ckptstore"`` attribute (the format's details are in
:mod:`ckptstore.store.zarr`; its writer is :class:`~ckptstore.write.kinds.zarr.ZarrWriter`)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckptstore.store.kinds import ROOT_METADATA, StoreKind


def _attributes(doc: dict[str, Any]) -> Any:
    """The ``"ckptstore"`` attribute of a root ``zarr.json`` (``False``: a Zarr group of another program)."""
    attrs = doc.get("attributes", {})
    return attrs.get("ckptstore", False) if isinstance(attrs, dict) else False


def _arrays(keys: Sequence[str]) -> list[str]:
    """Every file of the Zarr array folders (those with a ``zarr.json``) at the top of a listing."""
    arrays = {k.split("/")[0] for k in keys if k.count("/") == 1 and k.endswith("/" + ROOT_METADATA)}
    return [k for k in keys if "/" in k and k.split("/")[0] in arrays]


KIND = StoreKind(
    name="zarr",
    writer="ckptstore.write.kinds.zarr:ZarrWriter",
    help="Zarr v3 (chunked, optional compression)",
    label="Zarr v3",
    manifest_file=ROOT_METADATA,
    manifest_in=_attributes,
    compressible=True,
    written=_arrays,
    probe_order=0,  # the default kind
)
