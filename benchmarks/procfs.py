"""Read the few /proc files the benchmarks measure with (Linux only, standard library only).

The worker imports this module before it measures anything, so it must stay light: no numpy,
no psutil. All sizes are returned in bytes.
"""
from __future__ import annotations

import os
import platform
import re
import time
from collections.abc import Sequence

_STATUS_KEYS = ("VmRSS", "VmHWM", "VmPeak")
_IO_KEYS = ("rchar", "read_bytes", "syscr")


def read_status() -> dict[str, int]:
    """``VmRSS`` (resident now), ``VmHWM`` (peak resident) and ``VmPeak`` of this process, in bytes."""
    text = _read_text("/proc/self/status")
    out = {}
    for key in _STATUS_KEYS:
        m = re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE)
        out[key] = int(m.group(1)) * 1024 if m else 0
    return out


def read_io() -> dict[str, int]:
    """This process's I/O counters from ``/proc/self/io`` (all its threads, live and exited).

    ``rchar`` counts bytes returned by read-like syscalls, page-cache hits included;
    ``read_bytes`` counts bytes fetched from the block device (0 when the cache is warm);
    ``syscr`` counts read syscalls. Page faults on ``mmap``-ed files are in none of them.
    """
    fields = dict(line.split(": ") for line in _read_text("/proc/self/io").splitlines())
    return {key: int(fields[key]) for key in _IO_KEYS}


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (``clear_refs`` value 5, Linux >= 4.0).

    Without the reset, a peak reached while importing (MindSpore's import peaks above where it
    settles) would be charged to the measured call. Returns False where the kernel refuses.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def drop_page_cache() -> tuple[bool, str]:
    """Write back dirty pages and drop the clean page cache (``vm/drop_caches`` = 1).

    Returns ``(done, reason)``; ``reason`` says why it could not be done (not root, or /proc/sys
    mounted read-only as in most containers).
    """
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
        return True, ""
    except OSError as e:
        return False, f"cannot write /proc/sys/vm/drop_caches: {e.strerror}"


def evict_files(paths: Sequence[str | os.PathLike[str]]) -> int:
    """Drop the cached pages of each file (``posix_fadvise(POSIX_FADV_DONTNEED)``; no root needed).

    Dirty pages are written back first (``fdatasync``), since the kernel drops only clean pages;
    pages another process has mapped stay. Returns the number of files evicted.
    """
    done = 0
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done += 1
        finally:
            os.close(fd)
    return done


def machine_info() -> dict[str, object]:
    """CPU model, usable cores, total memory and kernel: enough to tell two machines apart."""
    cpuinfo = _read_text("/proc/cpuinfo")
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    meminfo = _read_text("/proc/meminfo")
    mem = re.search(r"^MemTotal:\s+(\d+) kB", meminfo, re.MULTILINE)
    return {
        "cpu_model": model.group(1).strip() if model else platform.processor(),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "mem_total": int(mem.group(1)) * 1024 if mem else None,
        "kernel": platform.release(),
    }


def mem_available() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes: what the kernel can give without swapping (0 if unknown)."""
    for line in _read_text("/proc/meminfo").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def make_first_oom_victim(pid: int) -> bool:
    """Set ``/proc/<pid>/oom_score_adj`` to 1000, so that if memory runs out anyway the kernel kills
    this benchmark process first, not another user's; ``False`` when the kernel refused."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w", encoding="ascii") as f:
            f.write("1000")
        return True
    except OSError:
        return False


def _read_text(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


def process_rss(pid: int) -> int | None:
    """Resident bytes of process ``pid`` from ``/proc/<pid>/statm`` (``None`` once it has exited)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid: int) -> list[int]:
    """Live descendants of ``pid`` (children, grandchildren, ...), from each process's parent id.

    Scans ``/proc/<n>/stat`` (this kernel has no ``/proc/<pid>/task/<tid>/children``).
    """
    return descendants_of([pid])[pid]


def descendants_of(pids: list[int]) -> dict[int, list[int]]:
    """Live descendants of each of ``pids``, from one scan of ``/proc``."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        parent[int(entry)] = int(fields[1])
    children: dict[int, list[int]] = {}
    for c, pp in parent.items():
        children.setdefault(pp, []).append(c)
    result = {}
    for pid in pids:
        out, frontier = [], [pid]
        while frontier:
            kids = children.get(frontier.pop(), [])
            out += kids
            frontier += kids
        result[pid] = out
    return result


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class ForeignLoad:
    """CPU time used by *other* processes (not this one or its reaped children) over an interval.

    ``/proc/stat`` gives the machine's busy time; ``os.times()`` gives this process's and its
    waited-for descendants'. The difference, divided by the elapsed time, is how many cores
    someone else kept busy meanwhile (0 on a quiet machine; this one has 2 cores).
    """

    def __init__(self) -> None:
        self._t0, self._busy0, self._own0 = time.monotonic(), _machine_busy_s(), _own_cpu_s()

    def cores(self) -> float:
        """Average cores used by other processes since this object was made."""
        elapsed = time.monotonic() - self._t0
        others = (_machine_busy_s() - self._busy0) - (_own_cpu_s() - self._own0)
        return max(0.0, others / elapsed) if elapsed > 0 else 0.0


def _machine_busy_s() -> float:
    fields = _read_text("/proc/stat").splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
