"""check_int: the one check of an integer option (issue 34), one message per kind of bound."""
from __future__ import annotations

import pytest

from ckptstore.errors import InvalidOptionError, check_int


@pytest.mark.parametrize(("value", "kw", "message"), [
    (0, {}, "workers must be a positive integer, not 0"),
    (True, {}, "workers must be a positive integer, not True"),
    (2.0, {}, "workers must be a positive integer, not 2.0"),
    (-1, {"least": 0}, "workers must be a non-negative integer, not -1"),
    (1, {"least": 2}, "workers must be an integer of at least 2, not 1"),
    (4, {"least": 0, "most": 3}, "workers must be an integer in 0..3, not 4"),
    (None, {}, "workers must be a positive integer, not None"),
], ids=["zero", "bool", "float", "negative", "below-least", "above-most", "none"])
def test_a_value_out_of_bounds_is_refused_naming_the_option_and_the_value(value, kw, message):
    with pytest.raises(InvalidOptionError, match=f"^{message}$"):
        check_int(value, "workers", **kw)


@pytest.mark.parametrize(("value", "kw"), [(1, {}), (0, {"least": 0}), (3, {"least": 0, "most": 3}),
                                           (None, {"none_ok": True})], ids=["one", "zero", "most", "none-ok"])
def test_a_value_in_bounds_is_returned(value, kw):
    assert check_int(value, "workers", **kw) == value
