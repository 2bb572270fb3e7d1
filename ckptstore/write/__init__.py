"""Writing stores: convert and index rank files, conversions split into parts, each store kind's
writer (:mod:`ckptstore.write.kinds`) and the commit, the output folder's claim and work records,
saves from training; all written through a :class:`~ckptstore.io.sink.ByteSink`."""
