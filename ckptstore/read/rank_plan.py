"""What one target rank will read, worked out before it reads: ``ckptstore plan`` / :func:`plan_rank`.

The figures come from the same plan a load runs (:class:`~ckptstore.read.loader.RankView` plans
every parameter's box and the planner chooses its requests by the source's
:class:`~ckptstore.io.base.ReadCost`; the executor sends exactly those), so a load then reports
the same numbers in :func:`ckptstore.io_counts`: bytes wanted and fetched, files
(or objects) opened, requests, and scratch memory. Nothing here reads a payload byte.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ckptstore.read.loader import StrategyLike, include_globs, rank_view
from ckptstore.store.executor import MAX_INFLIGHT
from ckptstore.store.read_plan import plan_param
from ckptstore.store.store import StoreLike, store_argument


@dataclass(frozen=True)
class RankPlan:
    """What loading ``rank`` of a target from ``store`` will need.

    ``nbytes`` bytes wanted, fetched as ``fetched_bytes`` (``over_read_bytes`` more: the gaps the
    planner chose to read rather than pay another request) in ``requests`` read calls (a vectored
    read of a local file, a ranged GET of an object) from ``files`` files or objects;
    ``modelled_seconds`` what the source's cost model says they take (``request_ms``,
    ``bandwidth_mbps`` and ``in_flight`` are that model); ``result_bytes`` the arrays the rank receives;
    ``scratch_bytes`` at most this much memory held at once for chunks read whole (compressed,
    checksummed or converted to another dtype; 0 when every byte lands in place); ``peak_bytes``
    their sum, the memory the load needs besides the process itself.

    Why there is over-read: ``exact_requests`` requests (modelled ``exact_seconds``) would fetch only
    the wanted bytes of the parameters read with gaps, ``over_read_params`` of them, the most
    over-read first in ``over_read_top`` (``(name, bytes wanted, bytes fetched)``, at most three):
    the planner read the gaps because the cost model says that is faster.
    """

    store: str
    rank: int
    world_size: int
    params: int
    nbytes: int
    files: int
    requests: int
    result_bytes: int
    scratch_bytes: int
    workers: int
    fetched_bytes: int = 0
    modelled_seconds: float = 0.0
    request_ms: float = 0.0
    bandwidth_mbps: float = 0.0
    in_flight: int = 1
    exact_requests: int = 0
    exact_seconds: float = 0.0
    over_read_params: int = 0
    over_read_top: tuple[tuple[str, int, int], ...] = ()

    @property
    def peak_bytes(self) -> int:
        return self.result_bytes + self.scratch_bytes

    @property
    def over_read_bytes(self) -> int:
        return self.fetched_bytes - self.nbytes

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "peak_bytes": self.peak_bytes, "over_read_bytes": self.over_read_bytes,
                "over_read_top": [list(t) for t in self.over_read_top]}  # as JSON reads it back


def plan_rank(store: StoreLike, strategy: StrategyLike = None, rank: int | None = None, *,
              include: str | Sequence[str] | None = None, dtype: Any = None, verify: bool = False,
              workers: int | None = None, allow_whole: bool = False,
              names: str | Sequence[str] | None = None) -> RankPlan:
    """What rank ``rank`` of ``strategy`` will read from ``store``, before any payload is read.

    Takes the arguments of :func:`ckptstore.read_rank` (``rank=None``: this process's rank;
    ``strategy=None``: the store's source layout) and returns a :class:`RankPlan`: bytes,
    files or objects, requests and peak memory. A load with the same arguments reads exactly
    these bytes in these requests (:func:`ckptstore.io_counts` counts them).
    ``names=`` is the same option as ``include=``.
    """
    include = include_globs(include, names)
    with store_argument(store) as st:
        view = rank_view(st, strategy, rank, names=include, dtype=dtype, verify=verify, workers=workers,
                         allow_whole=allow_whole)
        plan = view.plan
        requests, fetched = plan.requests, plan.fetched
        cost = st.data.read_cost()
        scratch = sorted((g.scratch_nbytes for p in plan.params.values() for g in p.groups if not g.into_destination),
                         reverse=True)
        # The pool's threads and the thread that reads small parameters itself may each hold one
        # scratch buffer; the executor's budget caps the total (one larger buffer may go alone).
        at_once = view.workers + 1 if view.workers > 1 else 1
        held = min(sum(scratch[:at_once]), max(scratch[0], MAX_INFLIGHT)) if scratch else 0
        result = sum(p.box.size * view.dtype_of(n).itemsize for n, p in plan.params.items())
        # the over-read explained: what the parameters read with gaps would cost read exactly
        over = sorted(((n, p.nbytes, p.fetched) for n, p in plan.params.items() if p.fetched > p.nbytes),
                      key=lambda t: t[1] - t[2])
        exact = [plan_param(st.info(n), view.boxes[n], out_dtype=view.dtype_of(n), verify=view.verify, cost=cost,
                            coalesce="exact") for n, _, _ in over]
        exact_requests = requests - sum(plan.params[n].requests for n, _, _ in over) + sum(e.requests for e in exact)
        return RankPlan(store=st.location.url, rank=view.rank, world_size=view.world_size, params=len(view),
                        nbytes=plan.nbytes, files=len(plan.files), requests=requests, result_bytes=result,
                        scratch_bytes=held, workers=view.workers, fetched_bytes=fetched,
                        modelled_seconds=round(cost.seconds(requests, fetched), 6),
                        request_ms=cost.request_seconds * 1e3, bandwidth_mbps=cost.bytes_per_second / 1e6,
                        in_flight=cost.in_flight, exact_requests=exact_requests,
                        exact_seconds=round(cost.seconds(exact_requests, plan.nbytes), 6), over_read_params=len(over),
                        over_read_top=tuple(over[:3]))


@dataclass(frozen=True)
class GroupRankPlan:
    """One rank's share of a cooperative load: bytes and requests it sends to storage, bytes it receives."""

    rank: int
    needed_bytes: int
    fetched_bytes: int
    requests: int
    received_bytes: int


@dataclass(frozen=True)
class CooperativePlan:
    """What a group loading together (``cooperative=``) fetches from storage, per rank and in all,
    against what its ranks would fetch reading alone; ``cooperative`` False (and ``reason``) when the
    group would read alone."""

    store: str
    ranks: tuple[int, ...]
    cooperative: bool
    reason: str
    per_rank: tuple[GroupRankPlan, ...]
    distinct_bytes: int
    independent_bytes: int
    independent_requests: int

    @property
    def fetched_bytes(self) -> int:
        return sum(r.fetched_bytes for r in self.per_rank)

    @property
    def requests(self) -> int:
        return sum(r.requests for r in self.per_rank)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "fetched_bytes": self.fetched_bytes, "requests": self.requests}


def plan_cooperative(store: StoreLike, strategy: StrategyLike = None, rank: int | None = None, *,
                     cooperative: str | Sequence[int] = "replicas", include: str | Sequence[str] | None = None,
                     dtype: Any = None, allow_whole: bool = False, ranks_per_node: int = 8) -> CooperativePlan:
    """What the group of ``rank`` (``"replicas"``, ``"node"`` of ``ranks_per_node`` ranks, or a list of
    ranks) of ``strategy``'s layout fetches loading together, worked out from metadata alone (no
    collectives: every rank's plan is computed here, as the group would compute it)."""
    from ckptstore.read.cooperative import Need, plan_group
    from ckptstore.read.group_load import wanted_ranges
    from ckptstore.read.loader import name_patterns, replica_ranks, resolve_target

    with store_argument(store) as st:
        first = rank_view(st, strategy, rank, names=include, dtype=dtype, allow_whole=allow_whole)
        target = resolve_target(st, strategy)
        world = first.world_size
        if cooperative == "replicas":
            ranks = replica_ranks(st, target, first.rank, world, name_patterns(include))
        elif cooperative == "node":
            base = first.rank - first.rank % ranks_per_node
            ranks = tuple(range(base, min(world, base + ranks_per_node)))
        else:
            ranks = tuple(sorted({int(r) for r in cooperative}))
        needs, requests = [], 0
        for r in ranks:
            view = first if r == first.rank else rank_view(st, strategy, r, names=include, dtype=dtype,
                                                           allow_whole=allow_whole)
            plans = {n: view.plan_for(n) for n in view.names() if not st.info(n).is_str}
            requests += sum(p.requests for p in plans.values())
            needs += [Need(r, *row) for row in wanted_ranges(plans)]
        group = plan_group(ranks, needs, cost=st.data.read_cost())
        alone = {r: sum(n.end - n.start for n in needs if n.rank == r) for r in ranks}
        per_rank = tuple(GroupRankPlan(r, alone[r], group.fetched_by(r) if group.cooperative else alone[r],
                                       group.requests_by(r) if group.cooperative else -1, group.received_by(r))
                         for r in ranks)
        return CooperativePlan(st.location.url, ranks, group.cooperative, group.reason, per_rank,
                               group.distinct_bytes, group.independent_bytes, requests)
