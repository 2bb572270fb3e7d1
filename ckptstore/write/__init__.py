"""Writing stores: convert and index rank files, conversions split into parts, the commit, the
output folder's lock and work journal."""
