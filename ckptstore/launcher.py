"""What the job's launcher says about this process: its rank, or that it is no rank at all.

msrun (MindSpore's launcher) sets ``RANK_ID``/``RANK_SIZE`` in every process it starts, and also
starts a *scheduler* process (``MS_ROLE=MS_SCHED``, ``RANK_ID=0``) that runs the same script but
is no rank of the job; mpirun (Open MPI) sets ``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE``.
Loads (``rank=None``) and ``convert --part auto`` ask here.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping

from ckptstore.errors import InvalidOptionError

#: Environment variables that name this process's rank, in the order they are asked: msrun's
#: (MindSpore's launcher), then mpirun's (Open MPI).
RANK_VARIABLES = ("RANK_ID", "OMPI_COMM_WORLD_RANK")
#: The (rank, size) pairs of variables a launcher sets, in the same order.
LAUNCHERS = (("RANK_ID", "RANK_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"))


def is_scheduler(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is msrun's scheduler (``MS_ROLE=MS_SCHED``): it runs the same script as
    the workers, with ``RANK_ID=0``, but is no rank of the job."""
    return (os.environ if environ is None else environ).get("MS_ROLE") == "MS_SCHED"


def process_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's rank as the job says it, or ``None`` when nothing says.

    Asked in order: ``mindspore.communication.get_rank()`` when MindSpore is already imported and
    its communication initialised (never importing it here: that costs a second and 800 MB), then
    ``RANK_ID`` (msrun), then ``OMPI_COMM_WORLD_RANK`` (mpirun). Raises
    :class:`~ckptstore.errors.InvalidOptionError` in msrun's scheduler process, which is no rank, and
    for a variable that is not a non-negative integer.
    """
    env = os.environ if environ is None else environ
    if is_scheduler(env):
        raise InvalidOptionError("this process is msrun's scheduler (MS_ROLE=MS_SCHED), which is no rank of the job: "
                                 "load only in the worker processes (MS_ROLE=MS_WORKER), or pass the rank (rank=, --rank)")
    if environ is None:
        rank = _communication_rank()
        if rank is not None:
            return rank
    for var in RANK_VARIABLES:
        value = env.get(var)
        if value is not None and value.strip():
            try:
                rank = int(value)
            except ValueError:
                rank = -1
            if rank < 0:
                raise InvalidOptionError(f"{var}={value!r} in the environment is not a rank (a whole number from 0); "
                                         "fix the launcher's environment or pass the rank (rank=, --rank)")
            return rank
    return None


def _communication_rank() -> int | None:
    """``get_rank()`` of MindSpore's communication, if it is imported and initialised.

    Before ``init()``, MindSpore 2.x's ``get_rank`` answers 0 in every process (standalone
    mode), so the answer counts only once ``GlobalComm.INITED`` says ``init()`` ran.
    """
    management = sys.modules.get("mindspore.communication.management")
    comm = getattr(management, "GlobalComm", None)
    if comm is None or not getattr(comm, "INITED", False):
        return None
    try:
        return int(management.get_rank())  # type: ignore[union-attr]
    except Exception:  # a failed or torn-down initialisation: let the environment say
        return None
