"""A store of global tensors: ``open()``, the manifest, one module per store kind (Zarr, safetensors,
index), the work folder, the read plan and the executor that runs it."""
