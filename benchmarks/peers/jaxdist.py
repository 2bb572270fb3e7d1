"""Join a ``jax.distributed`` job of ``world`` CPU processes *before* the measured call.

The Orbax peer loads one target rank the way a multi-host JAX job does: each process owns one
device of the target mesh and Orbax reads only the shards of its addressable devices. A
benchmark worker is that rank's process; the other ranks are idle *helper* processes that only
make up the job (they join the coordinator and wait; they read nothing).

Used as a ``preimport`` of the worker: on import, if ``CKPTSTORE_JAX_DIST`` is set (JSON
``{"rank": r, "world": w}``), this module picks a free port, starts the ``w - 1`` helpers
(``python -m benchmarks.peers.jaxdist helper``), and calls ``jax.distributed.initialize`` as
process ``r`` — all outside the measured call. At exit it closes the helpers' stdin, which
makes them shut down with it (``jax.distributed.shutdown`` is a barrier of all processes).
Without the variable, importing does nothing.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import time

ENV = "CKPTSTORE_JAX_DIST"
_helpers: list[subprocess.Popen[bytes]] = []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(rank: int, world: int) -> None:
    """Start the helpers and join the job as process ``rank`` of ``world``."""
    import jax

    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop(ENV, None)
    for r in range(world):
        if r != rank:
            cmd = [sys.executable, "-m", "benchmarks.peers.jaxdist", "helper", str(port), str(world), str(r)]
            _helpers.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env))
    atexit.register(stop)  # after jax's own atexit hook, so it runs first (LIFO)
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=world, process_id=rank,
                               initialization_timeout=120)
    jax.devices()  # start the backend now (it waits for every process's devices), not in the measured call
    if jax.process_index() != rank or len(jax.local_devices()) != 1:
        raise RuntimeError(f"jax.distributed: process {jax.process_index()} with {len(jax.local_devices())} "
                           f"local devices, expected process {rank} with 1")


def stop() -> None:
    """Release the helpers and leave the job (all processes shut down together)."""
    import jax

    for p in _helpers:
        if p.stdin:
            p.stdin.close()
    try:
        jax.distributed.shutdown()
    finally:
        for p in _helpers:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        _helpers.clear()


def _helper(port: int, world: int, rank: int) -> None:
    import jax

    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=world, process_id=rank,
                               initialization_timeout=120)
    jax.devices()  # the CPU backend starts here: every process publishes its devices to the others
    sys.stdin.buffer.read()  # idle until the measured process exits (EOF)
    jax.distributed.shutdown()


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "helper":
    _helper(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
elif os.environ.get(ENV) and __name__ != "__main__":
    _cfg = json.loads(os.environ[ENV])
    _t0 = time.perf_counter()
    start(int(_cfg["rank"]), int(_cfg["world"]))
    JOIN_SECONDS = time.perf_counter() - _t0
