"""What the job says about this process: its rank and the job's size, or that it is no rank at all.

The one place ckptstore asks (loads with ``rank=None``, ``convert --part auto``, saves). In
order: MindSpore's communication when it is imported and initialised (it decides); else the
launcher's environment. msrun (MindSpore's launcher) sets ``RANK_ID``/``RANK_SIZE`` in every
process it starts, and also starts a *scheduler* process (``MS_ROLE=MS_SCHED``, ``RANK_ID=0``)
that runs the same script but is no rank of the job; mpirun (Open MPI) sets
``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE``. Variables of two launchers that disagree are
refused, naming both: taking the rank from one and the size from the other would put two
processes in one place of the job.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from ckptstore.errors import InvalidOptionError

#: Environment variables that name this process's rank, in the order they are asked: msrun's
#: (MindSpore's launcher), then mpirun's (Open MPI).
RANK_VARIABLES = ("RANK_ID", "OMPI_COMM_WORLD_RANK")
#: The (rank, size) pairs of variables a launcher sets, in the same order.
LAUNCHERS = (("RANK_ID", "RANK_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"))
_LAUNCHER_NAMES = {"RANK_ID": "msrun", "RANK_SIZE": "msrun", "OMPI_COMM_WORLD_RANK": "mpirun",
                   "OMPI_COMM_WORLD_SIZE": "mpirun"}
#: Who said it when MindSpore's communication did.
COMMUNICATION = "mindspore.communication"


@dataclass(frozen=True)
class Job:
    """This process's place in its job: ``rank`` and ``world`` (``None`` where nothing says),
    and ``said_by``, the variables (or :data:`COMMUNICATION`) that said it."""

    rank: int | None
    world: int | None
    said_by: str = ""


def is_scheduler(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is msrun's scheduler (``MS_ROLE=MS_SCHED``): it runs the same script as
    the workers, with ``RANK_ID=0``, but is no rank of the job."""
    return (os.environ if environ is None else environ).get("MS_ROLE") == "MS_SCHED"


def job(environ: Mapping[str, str] | None = None) -> Job:
    """This process's rank and the job's size as the job says them (see the module docstring).

    MindSpore's communication is asked only when ``environ`` is ``None`` (this process) and
    MindSpore is already imported and initialised (never importing it here: that costs a second
    and 800 MB). Raises :class:`~ckptstore.errors.InvalidOptionError` for a variable that is not
    a whole number, a rank outside the size, and launchers' variables that disagree. msrun's
    scheduler is not told apart here (:func:`is_scheduler`).
    """
    if environ is None:
        found = _communication()
        if found is not None:
            return found
    env = os.environ if environ is None else environ
    ranks = [(var, _number(env, var, "a rank (a whole number from 0)", 0)) for var, _ in LAUNCHERS]
    sizes = [(var, _number(env, var, "a job size (a whole number from 1)", 1)) for _, var in LAUNCHERS]
    ranks = [(v, n) for v, n in ranks if n is not None]
    sizes = [(v, n) for v, n in sizes if n is not None]
    for what, said in (("rank", ranks), ("job size", sizes)):
        if len({n for _, n in said}) > 1:
            both = " but ".join(f"{v}={n} ({_LAUNCHER_NAMES[v]})" for v, n in said)
            raise InvalidOptionError(f"the launchers' variables disagree about this process's {what}: {both}; unset "
                                     "the stale ones (or initialise mindspore.communication, which then decides), or "
                                     "pass the rank (rank=, --rank, --part I/N)")
    rank = ranks[0][1] if ranks else None
    world = sizes[0][1] if sizes else None
    if rank is not None and world is not None and rank >= world:
        raise InvalidOptionError(f"{ranks[0][0]}={rank} is no rank of a job of {sizes[0][0]}={world} ranks (ranks are "
                                 "numbered 0..N-1); fix the launcher's environment or pass the rank (rank=, --rank)")
    return Job(rank, world, "/".join(v for v, _ in ranks + sizes))


def process_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's rank as the job says it (:func:`job`), or ``None`` when nothing says.

    Raises :class:`~ckptstore.errors.InvalidOptionError` in msrun's scheduler process, which is
    no rank, and where :func:`job` does.
    """
    env = os.environ if environ is None else environ
    if is_scheduler(env):
        raise InvalidOptionError("this process is msrun's scheduler (MS_ROLE=MS_SCHED), which is no rank of the job: "
                                 "load only in the worker processes (MS_ROLE=MS_WORKER), or pass the rank (rank=, "
                                 "--rank)")
    return job(environ).rank


def process_world(environ: Mapping[str, str] | None = None) -> int | None:
    """The job's size as the job says it (:func:`job`), or ``None`` when nothing says."""
    return job(environ).world


def _number(env: Mapping[str, str], var: str, what: str, least: int) -> int | None:
    value = env.get(var)
    if value is None or not value.strip():
        return None
    try:
        n = int(value)
    except ValueError:
        n = least - 1
    if n < least:
        raise InvalidOptionError(f"{var}={value!r} in the environment is not {what}; fix the launcher's environment "
                                 "or pass the rank (rank=, --rank)")
    return n


def _communication() -> Job | None:
    """Rank and size of MindSpore's communication, if it is imported and initialised.

    Before ``init()``, MindSpore 2.x's ``get_rank`` answers 0 in every process (standalone
    mode), so the answer counts only once ``GlobalComm.INITED`` says ``init()`` ran.
    """
    management = sys.modules.get("mindspore.communication.management")
    comm = getattr(management, "GlobalComm", None)
    if management is None or comm is None or not getattr(comm, "INITED", False):
        return None
    try:
        return Job(int(management.get_rank()), int(management.get_group_size()), COMMUNICATION)
    except Exception:  # a failed or torn-down initialisation: let the environment say
        return None
