"""The save attempt: one id that every rank of one job agrees on, and that differs between jobs.

A step's records (each rank's record, its done marker) are stamped with the attempt, and a
commit merges the records of one attempt only; a save that finds an unfinished step of another
attempt starts that step over (:mod:`ckptstore.write.output_folder`). Where the id comes from,
first that applies:

1. ``attempt=`` given to ``save_rank`` / ``StoreCheckpoint`` (every rank must pass the same);
2. MindSpore's communication, when initialised: rank 0 draws a random id and broadcasts it over
   the job's collectives (:func:`broadcast_attempt`; every rank calls ``save_rank`` for the same
   step, as a collective save must);
3. the launcher's job identity: mpirun (OpenMPI's ``OMPI_MCA_ess_base_jobid``, PMIx's
   ``PMIX_NAMESPACE``) and Slurm (``SLURM_JOB_ID``, ``SLURM_STEP_ID``, ``SLURM_RESTART_COUNT``)
   give every process of one launch the same value and another launch another. msrun's
   variables (``MS_SCHED_HOST``, ``MS_SCHED_PORT``, ``MS_WORKER_NUM``) are the same for every
   launch of the same command, but a job on one host (its scheduler on loopback, msrun's
   default) has one msrun process, the parent of every worker: its pid and start time (from
   ``/proc``) name the launch, and a relaunch (a restarted job) is another msrun process. It is
   taken only while it runs: a worker whose msrun exited (reparented to init or a subreaper,
   which orphans of other launches share) falls to 5.
   A job of msrun on several hosts has one msrun per host, so there the id comes from
   MindSpore's communication (``init()``) or ``attempt=``;
4. a job of one process draws a random id;
5. otherwise (several ranks, no communication, no launcher id, no ``attempt=``: ranks saved by
   separate scripts) there is no attempt (``None``): records of every run of the step count, as
   if one job saved them, so rerunning one rank completes the step. The limit: two such jobs
   saving the same step into one root, or a restart with other values, can mix in one commit
   (the first such save into a root logs it).
"""
from __future__ import annotations

import itertools
import logging
import os
import sys
import uuid
from collections.abc import Mapping

from ckptstore.errors import InvalidOptionError

#: Launcher variables that name one launch (the same in every process of it), with the ones
#: that tell restarts of it apart.
JOB_IDS = (("OMPI_MCA_ess_base_jobid",), ("PMIX_NAMESPACE",),
           ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT"))


def save_attempt(explicit: str | None, world: int, environ: Mapping[str, str] | None = None) -> str | None:
    """The attempt of this save (see the module docstring for the order), ``None`` when a job of
    several ranks gives no way to agree on one."""
    if explicit is not None:
        if not isinstance(explicit, str) or not explicit.strip() or len(explicit) > 200:
            raise InvalidOptionError(f"attempt must be a non-empty string of at most 200 characters, not {explicit!r}")
        return explicit
    if world > 1:
        shared = broadcast_attempt()
        if shared is not None:
            return shared
    env = os.environ if environ is None else environ
    launched = launcher_attempt(env)
    if launched is None:
        launched = msrun_attempt(env)
    if launched is not None:
        return launched
    return uuid.uuid4().hex if world == 1 else None


#: The roots this process has said :func:`say_no_attempt` for (once a root: a training loop saves many steps).
_SAID: set[str] = set()


def say_no_attempt(root: str, world: int) -> None:
    """Say in one log line, once a root in this process, that a job of ``world`` ranks saves with
    no attempt (the documented limit of item 5 above: its saves can mix with another run's)."""
    if root in _SAID:
        return
    _SAID.add(root)
    logging.getLogger("ckptstore").warning(
        "ckptstore: %s: this job of %d ranks has no save attempt id (MindSpore's communication is not initialised, "
        "no mpirun or Slurm job id, no attempt=), so every run of a step counts as one save: a restart or another job "
        "saving the same step can mix into it. Call mindspore.communication.init() (msrun's workers can), or pass "
        "attempt= (the same on every rank, new for each launch)", root, world)


def launcher_attempt(environ: Mapping[str, str]) -> str | None:
    """The launcher's identity of this launch (``mpirun:<jobid>``...), or ``None``."""
    for names in JOB_IDS:
        if environ.get(names[0]):
            return "launch:" + ":".join(f"{n}={environ.get(n, '')}" for n in names)
    return None


#: Scheduler addresses that put every worker of an msrun job on this host (msrun's default is 127.0.0.1).
LOOPBACK = ("127.0.0.1", "localhost", "::1")


#: How many ancestors of a worker are asked for its msrun (``msrun ... bash train.sh`` puts a shell between).
MSRUN_DEPTH = 4


def msrun_attempt(environ: Mapping[str, str], pid: int | None = None) -> str | None:
    """The launch of an msrun worker on a one-host job: ``msrun:<host>:<msrun's pid>:<its start>``,
    or ``None`` (not an msrun worker, a job on several hosts, no ``/proc`` to ask, or a worker
    whose msrun is gone). ``pid`` is the worker (this process by default).

    msrun starts every worker itself (``subprocess.Popen``), so the workers of one launch share
    that msrun process, and each launch is a new one: its pid and start time (in clock ticks
    since boot, which tell apart a pid the kernel reused) differ between launches. A worker whose
    msrun has exited is reparented to init or a subreaper, which the orphans of every launch
    share: so the msrun is looked for among the worker's nearest ancestors (:func:`launching_msrun`)
    by its command, and taken only if it started before the worker; else there is no attempt.
    """
    if environ.get("MS_ROLE") != "MS_WORKER" or environ.get("MS_SCHED_HOST", "127.0.0.1") not in LOOPBACK:
        return None
    found = launching_msrun(os.getpid() if pid is None else pid)
    return None if found is None else f"msrun:{os.uname().nodename}:{found[0]}:{found[1]}"


def launching_msrun(pid: int) -> tuple[int, int] | None:
    """``(pid, start ticks)`` of the msrun process that launched process ``pid``: its parent, or
    a nearer ancestor (:data:`MSRUN_DEPTH`), running msrun's command and started no later than the
    process below it; ``None`` when the chain reaches init, a process that is gone, or none is msrun."""
    child, child_start = pid, process_start_ticks(pid)
    for _ in range(MSRUN_DEPTH):
        parent = parent_pid(child)
        if parent is None or parent <= 1 or child_start is None:
            return None
        started = process_start_ticks(parent)
        if started is None or started > child_start:  # gone, or a pid reused after the parent exited
            return None
        if is_msrun(command_line(parent)):
            return parent, started
        child, child_start = parent, started
    return None


def is_msrun(argv: list[str]) -> bool:
    """Whether a command line is msrun's: the ``msrun`` script (run directly or by an interpreter)
    or ``python -m mindspore.parallel.cluster.run``."""
    names = [a.rsplit("/", 1)[-1] for a in argv[:2]]
    return "msrun" in names or ("-m", "mindspore.parallel.cluster.run") in set(itertools.pairwise(argv))


def command_line(pid: int) -> list[str]:
    """Process ``pid``'s arguments (``/proc/<pid>/cmdline``), ``[]`` where it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(1 << 16)
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def parent_pid(pid: int) -> int | None:
    """Process ``pid``'s parent (``/proc/<pid>/stat`` field 4), or ``None``."""
    return _stat_field(pid, 1)


def process_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22), or
    ``None`` where there is no such process or no ``/proc``."""
    return _stat_field(pid, 19)


def _stat_field(pid: int, index: int) -> int | None:
    """Field ``index + 3`` of ``/proc/<pid>/stat`` as a number (``None`` where unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096)
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return int(fields[index])
    except (IndexError, ValueError):
        return None


def broadcast_attempt() -> str | None:
    """A random id drawn by rank 0 and broadcast to every rank over MindSpore's collectives;
    ``None`` when MindSpore is not imported or its communication is not initialised.

    The only MindSpore call of this module, imported lazily (``import ckptstore`` never imports
    MindSpore).
    """
    if "mindspore" not in sys.modules:
        return None
    try:
        from mindspore.communication import GlobalComm, get_group_size, get_rank
    except ImportError:
        return None
    if not getattr(GlobalComm, "INITED", False) or get_group_size() < 2:
        return None
    import mindspore as ms
    import numpy as np
    from mindspore import ops

    mine = np.frombuffer(uuid.uuid4().bytes, np.int32).copy() if get_rank() == 0 else np.zeros(4, np.int32)
    shared = ops.Broadcast(0)((ms.Tensor(mine),))[0].asnumpy()
    return "job:" + shared.astype("<i4").tobytes().hex()
