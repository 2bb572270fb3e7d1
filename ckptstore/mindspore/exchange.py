"""The cooperative load's :class:`~ckptstore.read.exchange.Exchange` over MindSpore's collectives.

Checked on the CPU wheel (MindSpore 2.10, mccl, msrun with 2 and 4 workers): ``mint.distributed``
``all_gather`` of small int tensors, ``all_reduce`` and ``broadcast`` work, also inside groups
made with ``mindspore.communication.create_group`` by their members only (a group of 2 of 4 ranks,
of 3 of 4); a broadcast into ``Tensor.from_numpy(array)`` fills ``array`` in place.
``mint.distributed.send``/``recv`` do not work there (the sender looks for ``hccl_world_group``), so
an owner reaches the ranks that need its bytes with a broadcast inside a group of exactly those
ranks, never a larger one. A peer that dies mid-collective makes mccl's waits fail after about 30 s
(``CollectiveWait ... failed``: a ``RuntimeError`` here, raised as
:class:`~ckptstore.errors.CooperativeLoadError`), and ``msrun --join=True`` ends the other
workers once one exits abnormally.
"""
from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ckptstore.errors import CooperativeLoadError, InvalidOptionError
from ckptstore.mindspore._import import mindspore as _ms
from ckptstore.read.exchange import Collectives, Exchange

_CREATED: set[str] = set()
#: The largest part of a message one broadcast sends (mccl stages a copy of it).
BROADCAST_BYTES = 4 << 20


def communication() -> tuple[int, int]:
    """This process's global rank and the job's size from ``mindspore.communication``; an
    :class:`InvalidOptionError` when it is not initialised (a cooperative load needs the job's collectives)."""
    _ms()
    from mindspore.communication import get_group_size, get_rank

    try:
        return int(get_rank()), int(get_group_size())
    except Exception as e:  # MindSpore raises RuntimeError or ValueError before init()
        raise InvalidOptionError("a cooperative load (cooperative=...) runs in a MindSpore job: call "
                                 f"mindspore.communication.init() first ({e})") from None


def local_ranks() -> tuple[int, ...]:
    """The global ranks of this node: this rank's neighbours under the same launcher host."""
    _ms()
    from mindspore.communication import get_local_rank, get_local_rank_size

    rank, _ = communication()
    local, size = int(get_local_rank()), int(get_local_rank_size())
    first = rank - local
    return tuple(range(first, first + size))


def group_name(ranks: Sequence[int]) -> str:
    """The communication group of exactly ``ranks``: the world group when they are all, else a
    group named from the ranks, created (by its members only) on first use."""
    from mindspore.communication import GlobalComm, create_group

    _, world = communication()
    ranks = tuple(sorted(ranks))
    if ranks == tuple(range(world)):
        return str(GlobalComm.WORLD_COMM_GROUP)
    name = "ckptstore_" + hashlib.sha1(",".join(map(str, ranks)).encode()).hexdigest()[:24]
    if name not in _CREATED:
        create_group(name, list(ranks))
        _CREATED.add(name)
    return name


class MindSporeExchange(Exchange):
    """Collectives among ``ranks`` of the running MindSpore job (``mint.distributed``)."""

    def __init__(self, ranks: Sequence[int]) -> None:
        self.rank, world = communication()
        self.ranks = tuple(sorted({int(r) for r in ranks}))
        if self.rank not in self.ranks or not all(0 <= r < world for r in self.ranks):
            raise InvalidOptionError(f"cooperative group {list(self.ranks)}: it must hold this rank ({self.rank}) and "
                                     f"only ranks of the job's {world}")
        self.group = group_name(self.ranks)

    def gather(self, array: np.ndarray) -> list[np.ndarray]:
        ms = _ms()
        from mindspore.mint import distributed as dist

        array = np.ascontiguousarray(array)
        outs = [ms.Tensor(np.zeros_like(array)) for _ in self.ranks]
        with _collective("gather"):
            dist.all_gather(outs, ms.Tensor(array), group=self.group)
            return [o.asnumpy().copy() for o in outs]

    def broadcast(self, buffer: np.ndarray, root: int, ranks: Sequence[int]) -> None:
        """See :meth:`Exchange.broadcast`; sent in parts of at most :data:`BROADCAST_BYTES` (mccl holds a
        copy of what it sends: a message of a whole window would cost another window of memory)."""
        ms = _ms()
        from mindspore.mint import distributed as dist

        group = group_name(ranks)
        flat = buffer.reshape(-1)
        for at in range(0, len(flat), BROADCAST_BYTES):
            part = flat[at:at + BROADCAST_BYTES]
            tensor: Any = ms.Tensor.from_numpy(part)  # shares the buffer: the bytes land in place
            with _collective(f"broadcast from rank {root}"):
                dist.broadcast(tensor, src=int(root), group=group)
                received = tensor.asnumpy()  # waits for the collective (and surfaces its error)
            if received.__array_interface__["data"][0] != part.__array_interface__["data"][0]:
                part[...] = received.reshape(part.shape)


class _collective:
    """Errors of a collective as :class:`CooperativeLoadError` (a peer failed or is gone)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, error: BaseException | None, tb: object) -> None:
        if isinstance(error, RuntimeError) and not isinstance(error, CooperativeLoadError):
            first = str(error).splitlines()[0][:200]
            raise CooperativeLoadError(f"cooperative load: the {self.what} failed ({first}); "
                                       "a rank of the group failed or is gone") from error


def in_job() -> bool:
    """Whether MindSpore's communication is initialised in a job of several ranks, asked without
    importing MindSpore: a process that never imported it cannot have called ``init()``."""
    if "mindspore" not in sys.modules:
        return False
    from mindspore.communication import GlobalComm

    if not getattr(GlobalComm, "INITED", False):
        return False
    return communication()[1] > 1


#: MindSpore's collectives, as the read side finds them by name (:data:`ckptstore.read.exchange.COLLECTIVES`).
COLLECTIVES = Collectives("mindspore", communication, in_job, local_ranks, MindSporeExchange)
