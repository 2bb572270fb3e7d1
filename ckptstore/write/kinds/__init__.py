"""One module per built-in store kind's writer, the twin of :mod:`ckptstore.store.kinds`: each
holds the :class:`~ckptstore.write.store_writer.StoreWriter` subclass that the kind's declaration
names by its ``writer=`` string (``"ckptstore.write.kinds.zarr:ZarrWriter"``), so that opening a
store for reading never imports this package."""
