"""The exchange conformance checks (ckptstore.testing.exchange_tests) pass on threads of one process;
tests/mindspore/test_cooperative_msrun.py runs the same checks on MindSpore's collectives."""
from __future__ import annotations

import pytest

from ckptstore.errors import CooperativeLoadError
from ckptstore.read.exchange import SoloExchange
from ckptstore.testing.exchange import Hub, ThreadExchange, run_group
from ckptstore.testing.exchange_tests import CHECKS


@pytest.mark.parametrize("ranks", [(0, 1), (0, 2, 5)], ids=["2 ranks", "3 of 6 ranks"])
@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_thread_exchange_passes(check, ranks):
    run_group(ranks, check)


def test_a_peer_that_never_comes_is_an_error_not_a_hang():
    ex = ThreadExchange(Hub((0, 1), timeout=0.2), 0)
    with pytest.raises(CooperativeLoadError, match=r"rank 0: peers \[1\] did not answer within 0.2 s"):
        ex.gather(__import__("numpy").zeros(1))


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_solo_exchange_passes(check):
    check(SoloExchange(3))


def test_the_read_side_finds_mindspores_collectives_by_name_without_importing_them():
    pytest.importorskip("mindspore")
    from ckptstore.mindspore.exchange import MindSporeExchange, communication, local_ranks
    from ckptstore.read.exchange import collectives

    found = collectives("mindspore")
    assert (found.whoami, found.node_ranks, found.exchange) == (communication, local_ranks, MindSporeExchange)


def test_unknown_collectives_are_an_option_error_naming_the_known_ones():
    from ckptstore.errors import InvalidOptionError
    from ckptstore.read.exchange import collectives

    with pytest.raises(InvalidOptionError, match=r"^no job collectives named 'gloo' \(known: mindspore\)$"):
        collectives("gloo")
