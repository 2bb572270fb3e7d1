"""Store formats: Zarr v3 (default)."""
