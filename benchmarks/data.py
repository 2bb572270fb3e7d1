"""Sizes on the command line: ``--size 1GB`` (SI) or ``512MiB`` (binary)."""
from __future__ import annotations

import re

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """``"1GB"`` -> 10**9, ``"512MiB"`` -> 2**29, ``"1.5GB"`` -> 1.5e9 (SI and binary units)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"cannot read size {text!r}; write e.g. 1GB, 512MiB or 1000000")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])
