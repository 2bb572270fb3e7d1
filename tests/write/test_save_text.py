"""Strings that UTF-8 cannot hold are refused by name before anything is written (issue 24.12)."""
from __future__ import annotations

import numpy as np
import pytest

import ckptstore
from ckptstore.errors import InvalidOptionError


def test_a_string_value_with_a_lone_surrogate_is_refused_naming_the_parameter(tmp_path) -> None:
    with pytest.raises(InvalidOptionError, match=r"^parameter 's': its value holds '\\udc80' at character 3, "):
        ckptstore.save_rank({"s": "bad\udc80text"}, tmp_path, step=1)
    assert list(tmp_path.iterdir()) == []


def test_a_parameter_name_with_a_lone_surrogate_is_refused_naming_it(tmp_path) -> None:
    with pytest.raises(InvalidOptionError, match=r"^parameter 'w\\udc80': its name holds '\\udc80' at character 1, "):
        ckptstore.save_rank({"w\udc80": np.zeros(2, np.float32)}, tmp_path, step=1)
    assert list(tmp_path.iterdir()) == []
