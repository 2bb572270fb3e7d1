"""Reading a store for a target layout: one rank's slices as numpy arrays (loader), per-rank
checkpoint files (export), integrity checks (verify) and what ``ckptstore info`` reports."""
