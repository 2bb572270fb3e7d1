"""The Zarr store kind (the default): a Zarr v3 group, one array per parameter, whose root
``zarr.json`` carries the manifest as its ``"ckptstore"`` attribute (the format's details are in
:mod:`ckptstore.store.zarr`; its writer is :class:`~ckptstore.write.kinds.zarr.ZarrWriter`)."""
from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ckptstore.errors import AccessDeniedError, CkptStoreError, StoreUnavailableError
from ckptstore.io.base import ByteSource
from ckptstore.limits import MAX_METADATA_BYTES
from ckptstore.store.kinds import ROOT_METADATA, StoreKind
from ckptstore.store.manifest import ParamManifest


def _attributes(doc: dict[str, Any]) -> Any:
    """The ``"ckptstore"`` attribute of a root ``zarr.json`` (``False``: a Zarr group of another program)."""
    attrs = doc.get("attributes", {})
    return attrs.get("ckptstore", False) if isinstance(attrs, dict) else False


def _arrays(keys: Sequence[str]) -> list[str]:
    """Every file of the Zarr array folders (those with a ``zarr.json``) at the top of a listing."""
    arrays = {k.split("/")[0] for k in keys if k.count("/") == 1 and k.endswith("/" + ROOT_METADATA)}
    return [k for k in keys if "/" in k and k.split("/")[0] in arrays]


@dataclass(frozen=True)
class ArrayLayout:
    """How a Zarr v3 array's own ``zarr.json`` cuts it: what any Zarr reader goes by."""

    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]  # the inner chunks (a shard's, when the array is sharded)
    grid_shape: tuple[int, ...]  # the chunk grid's: the shards, when sharded
    separator: str
    sharding: dict[str, Any] | None  # the ``sharding_indexed`` codec's configuration


def array_layout(raw: bytes) -> ArrayLayout:
    """The layout an array's ``zarr.json`` describes (``ValueError``, ``KeyError``, ``TypeError``
    or ``AttributeError`` when it is not the metadata of an array)."""
    meta = json.loads(raw)
    grid_shape = tuple(int(c) for c in meta["chunk_grid"]["configuration"]["chunk_shape"])
    separator = meta.get("chunk_key_encoding", {}).get("configuration", {}).get("separator", "/")
    sharding = next((c.get("configuration", {}) for c in meta.get("codecs", []) if c.get("name") == "sharding_indexed"),
                    None)
    inner = tuple(int(c) for c in sharding["chunk_shape"]) if sharding is not None else grid_shape
    return ArrayLayout(tuple(int(n) for n in meta.get("shape", ())), inner, grid_shape, separator, sharding)


def read_array_layout(source: ByteSource, info: ParamManifest) -> ArrayLayout | str:
    """``info``'s array layout as its ``zarr.json`` in ``source`` gives it, or why a Zarr reader
    could not open the array (an outage or a refusal is raised, not reported)."""
    key = f"{info.path}/{ROOT_METADATA}"
    try:
        raw = source.read_bytes(key, limit=MAX_METADATA_BYTES)
        if raw is None:
            return f"parameter {info.name!r}: {source.key_url(key)} is missing; a Zarr reader cannot open the array"
        return array_layout(raw)
    except (AccessDeniedError, StoreUnavailableError):
        raise
    except (CkptStoreError, ValueError, KeyError, TypeError, AttributeError):
        return (f"parameter {info.name!r}: {source.key_url(key)} is not the Zarr metadata of an array; a Zarr "
                "reader cannot open it")


def layout_problem(source: ByteSource, info: ParamManifest, *, unreadable: bool = True) -> str | None:
    """Where ``info``'s array metadata cuts the array otherwise than the manifest (see
    :attr:`~ckptstore.store.kinds.StoreKind.layout_problem`); with ``unreadable=False``, metadata
    that is missing or no array's is not reported (``verify`` reports it; a read goes by the manifest)."""
    layout = read_array_layout(source, info)
    if isinstance(layout, str):
        return layout if unreadable else None
    return layout_mismatch(source, info, layout)


def layout_mismatch(source: ByteSource, info: ParamManifest, layout: ArrayLayout) -> str | None:
    """Where ``layout`` (``info``'s array as its ``zarr.json`` in ``source`` cuts it) differs from
    the manifest's shape and chunk shape, as a message; ``None`` where they agree."""
    if layout.chunk_shape == tuple(info.chunk_shape) and layout.shape == tuple(info.shape):
        return None
    return (f"parameter {info.name!r}: {source.key_url(f'{info.path}/{ROOT_METADATA}')} describes shape "
            f"{list(layout.shape)} in chunks of {list(layout.chunk_shape)}, the manifest {list(info.shape)} in "
            f"chunks of {list(info.chunk_shape)}")


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
    layout_problem=functools.partial(layout_problem, unreadable=False),
)
