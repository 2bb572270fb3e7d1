"""A store of global tensors: ``open()``, the manifest, one module per store kind (Zarr, safetensors,
index), chunking, the read plan and the executor that runs it."""
