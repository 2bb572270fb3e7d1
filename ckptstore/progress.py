"""Progress reporting: a tqdm bar on a terminal, plain log lines otherwise, nothing when quiet.

Sizes and rates are in binary units throughout (``MiB`` and ``MiB/s``, like every other size
ckptstore prints). A job whose bytes are not read (an index without checksums only notes where
slices are) counts parameters only: a byte rate would be meaningless there. The two ways
ckptstore says numbers in a message are here too: :func:`binary_size` and :func:`rank_list`.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

MIB = 1 << 20


def binary_size(nbytes: int) -> str:
    """``nbytes`` as ckptstore prints sizes: ``512 B``, ``7.6 MiB``, ``1.2 GiB`` (binary units)."""
    if nbytes < 1024:
        return f"{nbytes} B"
    n = nbytes / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def rank_list(ranks: Sequence[int], *, most: int | None = 20, prefix: str = "") -> str:
    """Ranks (or part numbers) for a message, in the order given: runs of three or more
    consecutive ones shortened (``rank_0..3, rank_6``), at most ``most`` of them shown, then
    ``...``."""
    shown = list(ranks if most is None else ranks[:most])
    runs: list[list[int]] = []
    for r in shown:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    text = ", ".join(f"{prefix}{g[0]}..{g[-1]}" if len(g) > 2 else ", ".join(f"{prefix}{r}" for r in g) for g in runs)
    return text + (" ..." if len(shown) < len(ranks) else "")


def terminal_columns(stream: TextIO) -> int:
    """The width of the terminal ``stream`` writes to; 0 when it is not a terminal or reports no width
    (a pseudo-terminal nobody sized, as some job runners allocate)."""
    try:
        if not stream.isatty():
            return 0
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0


class Progress:
    """Thread-safe byte and item counter for long jobs.

    On a terminal with a width it draws a tqdm bar (MiB done, MiB/s, ETA, items done);
    otherwise (not a terminal, or a terminal of zero columns) it prints a line at most every
    ``interval`` seconds and one at the end, so logs stay readable; ``quiet=True`` prints
    nothing. With ``count_bytes=False`` only items are shown. A log whose stream fails ends
    the report, never the job (tqdm already ignores a terminal that fails).
    """

    def __init__(self, total_bytes: int, total_items: int, *, desc: str, quiet: bool = False,
                 stream: TextIO | None = None, interval: float = 10.0, count_bytes: bool = True) -> None:
        self._stream = stream or sys.stderr
        quiet = quiet or self._stream is None  # started with file descriptor 2 closed: no stderr at all
        self._lock = threading.Lock()
        self.total_bytes, self.total_items = total_bytes, total_items
        self.done_bytes = self.done_items = 0
        self._desc, self._quiet, self._interval = desc, quiet, interval
        self._count_bytes = count_bytes
        self._start = self._last = time.monotonic()
        self._bar = None
        if not quiet and terminal_columns(self._stream) > 0:
            from tqdm import tqdm  # on first use: opening a store prints sizes (binary_size) but draws no bar

            self._bar = tqdm(total=self._bar_total(), desc=desc, file=self._stream, dynamic_ncols=True,
                             bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}{postfix}]")
            self._bar.set_postfix_str(self._figures(), refresh=False)

    def _bar_total(self) -> int:
        return self.total_bytes if self._count_bytes else self.total_items

    def resize(self, total_bytes: int, total_items: int) -> None:
        """New totals, before anything is counted (a part of a conversion does a share of it)."""
        with self._lock:
            self.total_bytes, self.total_items = total_bytes, total_items
            if self._bar is not None:
                self._bar.total = self._bar_total()
                self._bar.set_postfix_str(self._figures(), refresh=False)
                self._bar.refresh()

    def add(self, nbytes: int = 0, items: int = 0) -> None:
        with self._lock:
            self.done_bytes += nbytes
            self.done_items += items
            if self._bar is not None:
                self._bar.set_postfix_str(self._figures(), refresh=False)
                self._bar.update(nbytes if self._count_bytes else items)
            elif not self._quiet and time.monotonic() - self._last >= self._interval:
                self._line()

    def _figures(self) -> str:
        """``3/15 params, 1.2/7.6 MiB, 4.0 MiB/s`` (the MiB parts only when bytes are counted)."""
        items = f"{self.done_items}/{self.total_items} params"
        if not self._count_bytes:
            return items
        elapsed = max(time.monotonic() - self._start, 1e-9)
        return (f"{items}, {self.done_bytes / MIB:.1f}/{self.total_bytes / MIB:.1f} MiB, "
                f"{self.done_bytes / MIB / elapsed:.1f} MiB/s")

    def _line(self) -> None:
        self._last = time.monotonic()
        if self._count_bytes:
            done, total = self.done_bytes, self.total_bytes
        else:
            done, total = self.done_items, self.total_items
        pct = 100.0 * done / total if total else 100.0
        self._write(f"{self._desc}: {self._figures()} ({pct:.0f}%)\n")

    def _write(self, line: str) -> None:
        """Write ``line``; when the stream fails (its reader went away: a broken pipe; a full
        non-blocking pipe; a full disk), stop reporting instead of failing the job: a convert
        whose stderr reader exited (``| head``, a harness that timed out) used to leave its store
        incomplete, with exit 0 when its last line failed, exit 1 when a worker's line did."""
        try:
            self._stream.write(line)
            self._stream.flush()
        except (OSError, ValueError):  # ValueError: the stream was closed
            self._quiet = True

    def close(self, *, finished: bool = True) -> None:
        """End the report: a bar is closed; a log prints its last line only for a job that
        ``finished`` (a failed one ends with its error alone: one line, as every error is)."""
        with self._lock:
            if self._bar is not None:
                self._bar.set_postfix_str(self._figures(), refresh=False)
                self._bar.close()
            elif not self._quiet and finished:
                self._line()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.close(finished=kind is None)
