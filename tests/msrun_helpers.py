"""Running real msrun jobs from tests (shared by the msrun test modules): ``msrun(tmp_path, *command,
workers=N)`` starts ``msrun --worker_num=N --local_worker_num=N --join=True`` with the venv's ``bin``
first on PATH (workers run ``python``) and returns its exit code and logs by name."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def msrun(tmp_path: Path, *command: str, env: dict[str, str] | None = None, workers: int = 2,
          timeout: float = 300) -> tuple[int, dict[str, str]]:
    """Run ``msrun --worker_num=<workers> --local_worker_num=<workers> <command>``; its exit code and logs by name."""
    full = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "PYTHONPATH": str(REPO), "GLOG_v": "3",
            **(env or {})}
    for var in ("RANK_ID", "RANK_SIZE", "MS_ROLE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        if env is None or var not in env:
            full.pop(var, None)
    port = _free_port()
    logs = tmp_path / "logs"
    done = subprocess.run([str(VENV_BIN / "msrun"), f"--worker_num={workers}", f"--local_worker_num={workers}",
                           f"--master_port={port}", f"--log_dir={logs}", "--join=True", *command],
                          env=full, capture_output=True, text=True, timeout=timeout, cwd=tmp_path, check=False)
    return done.returncode, {p.stem: p.read_text(errors="replace") for p in sorted(logs.glob("*.log"))}


def _free_port() -> int:
    """A port no one listens on now: the kernel's pick, not one derived from the pid, which two tests in
    one worker, or a proxy's ephemeral socket, could already hold (the scheduler then fails to start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
