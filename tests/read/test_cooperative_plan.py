"""The cooperative group plan (ckptstore.read.cooperative) is pure arithmetic: every byte a rank
needs is owned by exactly one rank that needs it, each rank receives exactly what it needs and
nothing else, owners are balanced, windows hold whole parameters under the budget."""
from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore.io.base import LOCAL_COST
from ckptstore.read.cooperative import Need, owned_requests, plan_group, transfers

RANKS = (0, 1, 2, 3)


@st.composite
def needs(draw: st.DrawFn) -> list[Need]:
    out = []
    for _ in range(draw(st.integers(0, 12))):
        rank = draw(st.sampled_from(RANKS))
        param = draw(st.sampled_from(["a", "b", "c"]))
        key = draw(st.sampled_from(["f0", "f1"]))
        start = draw(st.integers(0, 200))
        out.append(Need(rank, param, key, start, start + draw(st.integers(0, 80))))
    return out


def covered(ranges: list[tuple[str, str, int, int]]) -> set[tuple[str, str, int]]:
    return {(p, k, b) for p, k, s, e in ranges for b in range(s, e)}


@settings(max_examples=200, deadline=None)
@given(needs(), st.integers(1, 50))
def test_every_needed_byte_is_in_exactly_one_piece_owned_by_a_rank_that_needs_it(ns, piece_bytes):
    plan = plan_group(RANKS, ns, piece_bytes=piece_bytes, shared_min=1.0)
    seen: dict[tuple[str, str, int], int] = {}
    for p in plan.pieces:
        assert p.owner in p.needers and 0 < p.nbytes <= piece_bytes
        for b in range(p.start, p.end):
            seen[(p.param, p.key, b)] = seen.get((p.param, p.key, b), 0) + 1
    assert set(seen) == covered([(n.param, n.key, n.start, n.end) for n in ns])
    assert set(seen.values()) <= {1}
    assert plan.distinct_bytes == len(seen)


@settings(max_examples=200, deadline=None)
@given(needs(), st.integers(1, 50))
def test_each_rank_holds_exactly_the_bytes_it_needs(ns, piece_bytes):
    plan = plan_group(RANKS, ns, piece_bytes=piece_bytes, window_bytes=60, shared_min=1.0)
    for rank in RANKS:
        held = []
        for w in plan.windows:
            held += [(p.param, p.key, p.start, p.end) for p in plan.pieces[w.first:w.stop] if p.owner == rank]
            for owner, receivers, pieces in transfers(plan, w):
                assert owner in receivers and len(receivers) > 1
                if rank in receivers and owner != rank:
                    held += [(p.param, p.key, p.start, p.end) for p in pieces]
        mine = covered([(n.param, n.key, n.start, n.end) for n in ns if n.rank == rank])
        assert covered(held) == mine and sum(e - s for _, _, s, e in held) == len(mine)
        assert plan.received_by(rank) + plan.fetched_by(rank) >= len(mine)


@settings(max_examples=200, deadline=None)
@given(needs(), st.sets(st.sampled_from(RANKS), min_size=2), st.integers(1, 50))
def test_replicas_share_the_reading_so_that_no_piece_could_move_to_a_less_loaded_replica(ns, replicas, piece_bytes):
    """Ranks that need the same bytes (replicas), pieces largest first onto the least loaded: at the
    end, an owner's load minus any of its pieces' cost is at most every other replica's load."""
    same = [Need(r, n.param, n.key, n.start, n.end) for n in ns for r in sorted(replicas)]
    plan = plan_group(RANKS, same, piece_bytes=piece_bytes, shared_min=1.0)
    load = {r: 0.0 for r in RANKS}
    for p in plan.pieces:
        assert p.needers == tuple(sorted(replicas))
        load[p.owner] += LOCAL_COST.seconds(1, p.nbytes)
    for p in plan.pieces:
        cost = LOCAL_COST.seconds(1, p.nbytes)
        assert all(load[p.owner] - cost <= load[r] + 1e-12 for r in replicas)


@settings(max_examples=200, deadline=None)
@given(needs(), st.integers(1, 100), st.sets(st.sampled_from(["a", "b", "c"])))
def test_windows_cover_the_pieces_in_order_under_the_budget_and_never_cut_a_whole_parameter(ns, window_bytes, whole):
    plan = plan_group(RANKS, ns, piece_bytes=10, window_bytes=window_bytes, shared_min=1.0, whole=whole)
    stops = [w.stop for w in plan.windows]
    # with no window, [0] is one start more than the stops: the zip is not strict
    assert [(w.first, w.stop) for w in plan.windows] == list(zip([0, *stops[:-1]], stops, strict=False))
    assert (plan.windows[-1].stop if plan.windows else 0) == len(plan.pieces)
    for w in plan.windows:
        assert w.params == tuple(dict.fromkeys(p.param for p in plan.pieces[w.first:w.stop]))
        pieces = plan.pieces[w.first:w.stop]
        alone = len(pieces) == 1 or (len(w.params) == 1 and w.params[0] in whole)
        assert alone or all(plan.window_bytes(w, r) <= window_bytes for r in RANKS)
    for name in whole:
        assert sum(name in w.params for w in plan.windows) <= 1


def test_replicas_of_one_slice_split_its_reading_evenly():
    ns = [Need(r, "w", "f", 0, 64 << 20) for r in (0, 1)]
    plan = plan_group((0, 1), ns, piece_bytes=16 << 20)
    assert plan.cooperative and plan.distinct_bytes == 64 << 20 and plan.independent_bytes == 128 << 20
    assert plan.fetched_by(0) == plan.fetched_by(1) == 32 << 20
    assert plan.received_by(0) == plan.received_by(1) == 32 << 20


def test_ranks_that_share_little_read_alone_and_the_plan_says_why():
    ns = [Need(0, "w", "f", 0, 100), Need(1, "w", "f", 96, 200)]
    plan = plan_group((0, 1), ns)
    assert not plan.cooperative
    assert plan.reason == "the ranks share little: 200 distinct bytes of 204 needed (98% > 95%)"
    assert (plan.fetched_by(0), plan.fetched_by(1), plan.received_by(1)) == (100, 104, 0)


def test_every_rank_computes_the_same_plan_from_needs_in_any_order():
    ns = [Need(r, p, "f", 10 * r, 10 * r + 50) for r in RANKS for p in ("a", "b")]
    assert plan_group(RANKS, ns, piece_bytes=7) == plan_group(RANKS, ns[::-1], piece_bytes=7)


@settings(max_examples=200, deadline=None)
@given(needs(), st.integers(1, 50), st.integers(0, 30))
def test_an_owner_sends_each_of_its_pieces_in_one_request_of_sorted_pieces_and_short_gaps(ns, piece_bytes, gap):
    cost = replace(LOCAL_COST, request_seconds=gap * 4 / LOCAL_COST.bytes_per_second, in_flight=4,
                   max_request_bytes=100, max_gap_bytes=None)
    plan = plan_group(RANKS, ns, piece_bytes=piece_bytes, shared_min=1.0, cost=cost)
    for rank in RANKS:
        requests = owned_requests(plan.pieces, rank, cost)
        sent = [p for _, ps in requests for p in ps]
        assert sorted(sent, key=id) == sorted((p for p in plan.pieces if p.owner == rank), key=id)
        for key, ps in requests:
            assert all(p.key == key for p in ps) and ps[-1].end - ps[0].start <= max(100, ps[0].nbytes)
            assert all(0 <= b.start - a.end <= cost.gap_bytes for a, b in pairwise(ps))
