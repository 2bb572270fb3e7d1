"""Progress reporting: a tqdm bar on a terminal, plain log lines otherwise, nothing when quiet."""
from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from tqdm import tqdm


class Progress:
    """Thread-safe byte and item counter for long jobs.

    On a terminal it draws a tqdm bar (bytes, rate, ETA, items done); when the stream is not a
    terminal it prints a line at most every ``interval`` seconds and one at the end, so CI logs
    stay readable; ``quiet=True`` prints nothing.
    """

    def __init__(self, total_bytes: int, total_items: int, *, desc: str, quiet: bool = False,
                 stream: TextIO | None = None, interval: float = 10.0) -> None:
        self._stream = stream or sys.stderr
        self._lock = threading.Lock()
        self.total_bytes, self.total_items = total_bytes, total_items
        self.done_bytes = self.done_items = 0
        self._desc, self._quiet, self._interval = desc, quiet, interval
        self._start = self._last = time.monotonic()
        self._bar = None
        if not quiet and self._stream.isatty():
            self._bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                             file=self._stream, dynamic_ncols=True)

    def resize(self, total_bytes: int, total_items: int) -> None:
        """New totals, before anything is counted (a part of a conversion does a share of it)."""
        with self._lock:
            self.total_bytes, self.total_items = total_bytes, total_items
            if self._bar is not None:
                self._bar.total = total_bytes
                self._bar.refresh()

    def add(self, nbytes: int = 0, items: int = 0) -> None:
        with self._lock:
            self.done_bytes += nbytes
            self.done_items += items
            if self._bar is not None:
                self._bar.update(nbytes)
                if items:
                    self._bar.set_postfix_str(f"{self.done_items}/{self.total_items} params", refresh=False)
            elif not self._quiet and time.monotonic() - self._last >= self._interval:
                self._line()

    def _line(self) -> None:
        self._last = time.monotonic()
        elapsed = max(self._last - self._start, 1e-9)
        pct = 100.0 * self.done_bytes / self.total_bytes if self.total_bytes else 100.0
        print(f"{self._desc}: {self.done_items}/{self.total_items} params, "
              f"{self.done_bytes / 2**20:.1f}/{self.total_bytes / 2**20:.1f} MiB ({pct:.0f}%), "
              f"{self.done_bytes / 2**20 / elapsed:.1f} MiB/s", file=self._stream, flush=True)

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
            elif not self._quiet:
                self._line()
