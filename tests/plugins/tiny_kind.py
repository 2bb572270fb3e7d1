"""A store kind that ckptstore does not know, in one file: ``tiny``, a Zarr array per parameter
like the ``zarr`` kind but with the manifest in ``tiny.json`` instead of the root ``zarr.json``.

It is registered only by the entry point ``tiny = tiny_kind:KIND`` in the group
``ckptstore.store_kinds`` (tests/store/test_plugins.py installs that), which is how a third party's
kind joins: nothing in ckptstore names it.
"""
from __future__ import annotations

from collections.abc import Sequence

from ckptstore.store.kinds import ROOT_METADATA, StoreKind
from ckptstore.store.manifest import StoreManifest
from ckptstore.write.kinds.zarr import ZarrWriter

MANIFEST_FILE = "tiny.json"


class TinyWriter(ZarrWriter):
    """Writes each parameter as the Zarr writer does; the commit writes ``tiny.json``."""

    kind = "tiny"

    @classmethod
    def manifest_file(cls, manifest: StoreManifest) -> tuple[str, bytes]:
        return MANIFEST_FILE, manifest.dumps().encode()


def _arrays(keys: Sequence[str]) -> list[str]:
    arrays = {k.split("/")[0] for k in keys if k.count("/") == 1 and k.endswith("/" + ROOT_METADATA)}
    return [k for k in keys if "/" in k and k.split("/")[0] in arrays]


KIND = StoreKind(name="tiny", writer=TinyWriter, help="Zarr arrays with the manifest in tiny.json (a test plugin)",
                 label="tiny test kind", manifest_file=MANIFEST_FILE, compressible=True, written=_arrays)
