"""One rank of a saving job, run as its own process by tests/write/test_save.py.

It reads its local slices from the rank file MindSpore wrote for it (with ckptstore's own
``.ckpt`` reader: numpy only, so eight of these start quickly) and saves them with
``ckptstore.save_rank``. ``--kill-after K`` SIGKILLs the process after it has written K
chunks, through the pieces it hands to :meth:`SaveJob.write` (no hook in the library).
Prints the rank's :class:`SaveSummary` as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from ckptstore.formats.ckpt_reader import read_entry, scan_checkpoint
from ckptstore.write.save import prepare_save


def local_slices(rank_file: str) -> dict:
    index = scan_checkpoint(rank_file)
    return {name: read_entry(rank_file, entry) for name, entry in index.entries.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank-file", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--step", type=int, required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--strategy", action="append", default=[])
    ap.add_argument("--chunk-mb", type=int, default=None)
    ap.add_argument("--kill-after", type=int, default=None)
    a = ap.parse_args()
    job = prepare_save(local_slices(a.rank_file), a.root, step=a.step, strategy=a.strategy or None, rank=a.rank,
                       chunk_mb=a.chunk_mb)

    def pieces():
        for i, piece in enumerate(job.pieces()):
            if i == a.kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
            yield piece

    summary = job.write(pieces())
    json.dump(summary.to_json(), sys.stdout)


if __name__ == "__main__":
    main()
