"""ByteBudget: the one cap on bytes held at once (the executor's scratch, a save's staged copies)."""
from __future__ import annotations

import threading

from ckptstore.store.executor import ByteBudget


def _take_in_thread(budget: ByteBudget, n: int) -> tuple[threading.Thread, list[bool]]:
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(budget.take(n)))
    t.start()
    return t, got


def test_a_take_that_does_not_fit_waits_until_bytes_are_given_back():
    waits: list[int] = []
    budget = ByteBudget(10, on_wait=lambda: waits.append(1))
    assert budget.take(8)
    t, got = _take_in_thread(budget, 4)
    t.join(0.2)
    assert got == [] and waits
    budget.give(8)
    t.join(5)
    assert got == [True] and budget.used == 4 and budget.peak == 8


def test_one_take_larger_than_the_budget_proceeds_alone():
    budget = ByteBudget(10)
    assert budget.take(25) and budget.used == 25


def test_stop_ends_a_wait_and_refuses_later_takes():
    budget = ByteBudget(10)
    budget.take(10)
    t, got = _take_in_thread(budget, 1)
    budget.stop()
    t.join(5)
    assert got == [False] and not budget.take(1)


def test_no_limit_never_waits():
    budget = ByteBudget(None)
    assert budget.take(1 << 40) and budget.take(1 << 40)
