"""What a MindSpore distributed checkpoint is: rank files, strategy files -> layouts -> the global
box each rank holds, replica groups, and the check that a strategy describes the rank files."""
