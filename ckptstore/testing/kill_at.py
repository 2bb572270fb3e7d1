"""Run the ``ckptstore`` CLI and ``SIGKILL`` it at a chosen point: crash tests without hooks in runtime code.

    python -m ckptstore.testing.kill_at POINT -- <ckptstore arguments>

(:func:`run_cli` runs it in a subprocess, or the plain CLI in this process or a subprocess.)

``POINT`` is

* ``commit``: when a commit is about to write the manifest, every data file already final (the
  write seam's ``put`` of any store kind's manifest file, the root ``zarr.json`` or
  ``ckptstore.json``, for every built-in sink);
* ``chunks:N``: once ``N`` chunks have been written by this process (after the Nth chunk's
  bytes, and its journal line where there is one).

The process kills itself with signal 9, as an OOM killer or a pre-empted node would: no
``finally`` block, no ``atexit`` handler runs.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ckptstore.store.kinds import manifest_files


def _die() -> None:
    os.kill(os.getpid(), 9)


def kill_before_manifest() -> None:
    """Make every sink die when it is asked to write a store's manifest."""
    from ckptstore.io.local_sink import LocalSink
    from ckptstore.io.memory_sink import MemorySink
    from ckptstore.io.s3_sink import S3Sink

    for cls in (LocalSink, S3Sink, MemorySink):
        setattr(cls, "put", _before(cls.put, lambda key: key in manifest_files()))  # noqa: B010  (mypy refuses assigning a method)


def _before(put: Callable[..., Any], when: Callable[[str], bool]) -> Callable[..., Any]:
    def wrapped(self: Any, key: str, *args: Any, **kwargs: Any) -> Any:
        if when(key):
            _die()
        return put(self, key, *args, **kwargs)

    return wrapped


def kill_after_chunks(n: int) -> None:
    """Make the converter die once it has written ``n`` chunks."""
    from ckptstore.write.chunk_writer import ChunkCopier

    count = ChunkCopier.count

    def counted(self: ChunkCopier, written: int = 0, resumed: int = 0, params_resumed: int = 0) -> None:
        count(self, written, resumed, params_resumed)
        if written and self.chunks_written >= n:
            _die()

    setattr(ChunkCopier, "count", counted)  # noqa: B010  (mypy refuses assigning a method)


def main(argv: Sequence[str]) -> None:
    """``kill_at POINT -- ARGS...``: arm ``POINT``, then run ``ckptstore ARGS...``."""
    if len(argv) < 2 or argv[1] != "--":
        sys.exit("usage: python -m ckptstore.testing.kill_at commit|chunks:N -- <ckptstore arguments>")
    point = argv[0]
    if point == "commit":
        kill_before_manifest()
    elif point.startswith("chunks:"):
        kill_after_chunks(int(point.split(":", 1)[1]))
    else:
        sys.exit(f"unknown kill point {point!r}: commit or chunks:N")
    from ckptstore.cli import main as cli

    sys.argv = ["ckptstore", *argv[2:]]
    cli()


def run_cli(*args: str | os.PathLike[str], kill_at: str | None = None, env: Mapping[str, str] | None = None,
            timeout: float | None = None, process: bool = False,
            cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
    """``ckptstore ARGS``: its exit status, stdout and stderr (as text), run in ``cwd`` with ``env``
    added to the environment.

    By default in this process, through click's ``CliRunner``: a subprocess pays an interpreter
    start and the package's imports (about a second on two shared cores) per call, which a test of
    what a command prints does not test. An exception the CLI does not turn into its one-line
    message is raised into the caller (a process would print a traceback and exit 1). In a
    subprocess of this interpreter with ``process=True`` (tests of the process itself: what reaches
    its real stderr, signals) or a ``timeout`` (tests whose failure would be a hang: it is ended
    after ``timeout`` seconds); with ``kill_at`` (``"commit"``, ``"chunks:N"``) under this module,
    killed at that point.
    """
    argv = [str(a) for a in args]
    if process or kill_at is not None or timeout is not None:
        head = ["-m", "ckptstore.testing.kill_at", kill_at, "--"] if kill_at is not None else ["-m", "ckptstore.cli"]
        full_env = {**os.environ, "GLOG_v": "3", **(env or {})}
        return subprocess.run([sys.executable, *head, *argv], capture_output=True, text=True, env=full_env,
                              cwd=cwd, timeout=120 if timeout is None else timeout)
    from click.testing import CliRunner

    from ckptstore.cli import main as cli

    # (contextlib.chdir is Python 3.11+; the package supports 3.10)
    back = os.getcwd()
    os.chdir(cwd if cwd is not None else back)
    try:
        result = CliRunner().invoke(cli, argv, env={"GLOG_v": "3", **(env or {})}, prog_name="ckptstore",
                                    catch_exceptions=False)
    finally:
        os.chdir(back)
    return subprocess.CompletedProcess(["ckptstore", *argv], result.exit_code, result.stdout, result.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
