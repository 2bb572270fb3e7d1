"""Progress output (issue 19 item 11): binary units for sizes and rates alike, no byte rate where no
bytes are read, and a terminal of zero columns still gets progress. Real pseudo-terminals; no
MindSpore needed."""
from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import termios

import pytest

from ckptstore.progress import Progress

MIB = 1 << 20


def _on_terminal(columns: int, **kwargs) -> str:
    """Everything a job of three 1 MiB parameters prints on a pseudo-terminal ``columns`` wide."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    with os.fdopen(slave, "w") as stream:
        progress = Progress(3 * MIB, 3, desc="convert", stream=stream, interval=0, **kwargs)
        for _ in range(3):
            progress.add(MIB, 1)
        progress.close()
        stream.flush()
        os.set_blocking(master, False)
        out = b""
        try:
            while chunk := os.read(master, 1 << 16):
                out += chunk
        except BlockingIOError:
            pass
    os.close(master)
    return out.decode()


def test_the_bar_gives_sizes_and_rate_in_the_same_binary_unit():
    out = _on_terminal(100)
    assert "3/3 params, 3.0/3.0 MiB, " in out and " MiB/s]" in out, out
    assert "MB" not in out.replace("MiB", ""), out


def test_a_job_that_reads_no_bytes_shows_no_byte_rate():
    out = _on_terminal(100, count_bytes=False)
    assert "3/3 params]" in out, out
    assert "MiB" not in out and "/s" not in out, out


def test_a_terminal_of_zero_columns_gets_progress_lines():
    out = _on_terminal(0)
    lines = [line for line in out.splitlines() if line]
    assert lines[-1].startswith("convert: 3/3 params, 3.0/3.0 MiB, ") and lines[-1].endswith(" MiB/s (100%)"), out
    assert len(lines) == 4  # one per update at interval=0, and the closing one


@pytest.mark.parametrize("count_bytes,last", [(True, "index: 2/2 params, 0.0/0.0 MiB, 0.0 MiB/s (100%)"),
                                              (False, "index: 2/2 params (100%)")])
def test_log_lines_when_not_a_terminal(count_bytes, last):
    stream = io.StringIO()
    progress = Progress(0, 2, desc="index", stream=stream, count_bytes=count_bytes)
    progress.add(0, 2)
    progress.close()
    assert stream.getvalue().splitlines() == [last]


def test_quiet_prints_nothing():
    stream = io.StringIO()
    progress = Progress(MIB, 1, desc="convert", stream=stream, quiet=True, interval=0)
    progress.add(MIB, 1)
    progress.close()
    assert stream.getvalue() == ""


def _unbuffered(fd: int) -> io.TextIOWrapper:
    """A text stream on ``fd`` that keeps nothing back (so closing it flushes nothing that failed)."""
    return io.TextIOWrapper(io.FileIO(fd, "w"), write_through=True)


def test_a_log_whose_reader_went_away_stops_reporting_and_never_fails_the_job():
    """Issue 37 item 10: a broken pipe on stderr used to raise out of ``add`` (on a worker thread:
    a traceback, the conversion stopped) or ``close`` (the store left incomplete, exit 0)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with _unbuffered(write_end) as stream:
        progress = Progress(3 * MIB, 3, desc="convert", stream=stream, interval=0)
        for _ in range(3):
            progress.add(MIB, 1)
        progress.close()
        assert (progress.done_bytes, progress.done_items) == (3 * MIB, 3)



def test_a_process_without_stderr_reports_nothing_and_never_fails_the_job(monkeypatch):
    monkeypatch.setattr("sys.stderr", None)  # what Python sets when started with file descriptor 2 closed
    progress = Progress(MIB, 1, desc="convert", interval=0)
    progress.add(MIB, 1)
    progress.close()
    assert progress.done_items == 1
