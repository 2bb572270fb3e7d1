"""What a MindSpore distributed checkpoint is: rank files, strategy files -> layouts -> the global
box each rank holds, replica groups, the check that a strategy describes the rank files, and the
rank files' bytes (:mod:`~ckptstore.checkpoint.rank_bytes`: read through the load's read plan and executor)."""
