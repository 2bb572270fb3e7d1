"""rank_list: the one way a message lists ranks or parts (issue 34: three formatters before)."""
from __future__ import annotations

import pytest

from ckptstore.progress import rank_list


@pytest.mark.parametrize(("ranks", "kw", "text"), [
    ([0, 2, 3], {}, "0, 2, 3"),
    ([0, 1, 2, 4, 5, 7, 8, 9, 10], {}, "0..2, 4, 5, 7..10"),
    (list(range(30)), {}, "0..19 ..."),
    ([1, 3, 5, 7, 9, 11, 13, 15, 17], {"most": 8}, "1, 3, 5, 7, 9, 11, 13, 15 ..."),
    ([0, 1, 2, 5], {"most": None, "prefix": "rank_"}, "rank_0..2, rank_5"),
    ([], {}, ""),
], ids=["pairs-stay", "runs-shortened", "capped", "most", "prefixed", "none"])
def test_ranks_are_listed_with_runs_shortened_and_a_cap(ranks, kw, text):
    assert rank_list(ranks, **kw) == text
