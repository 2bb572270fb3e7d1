"""The index store kind (``ckptstore index``): only ``ckptstore.json``, whose chunks are byte
ranges in the original rank files; reading goes through the index's checked source of those
files (:mod:`ckptstore.store.index`; its writer is :class:`~ckptstore.write.kinds.index.IndexWriter`).
``convert --format`` does not make one: ``ckptstore index`` does, with its own options."""
from __future__ import annotations

from ckptstore.store.index import data_source
from ckptstore.store.kinds import StoreKind

KIND = StoreKind(
    name="index",
    writer="ckptstore.write.kinds.index:IndexWriter",
    help="an index of the rank files, made by 'ckptstore index' (which copies no payload)",
    label="an index of the rank files",
    open_data=data_source,
    convert=False,
    stores_data=False,
)
